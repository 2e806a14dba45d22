"""Many agents: N workspaces in one daemon vs N single-workspace daemons (memory, start, search).

The way per-agent embedded memory works today is one indexer per agent; recalld is one
daemon for all. Both setups serve the same N generated workspaces (``synth.generate``,
seed = workspace number, generated once and reused from ``--data``):

- ``one_daemon``: one ``recalld serve`` with all N workspaces in its config;
- ``per_agent``: N ``recalld serve`` processes, each with its own data dir, socket and
  one workspace (the baseline, run side by side in the same invocation).

Each setup starts cold (derived state under each workspace's ``mem_metadata`` removed)
and is measured for the points below, then restarted warm (committed indexes on disk)
for time to READY, memory and idle search again:

- time to READY: from launch until every daemon answers ``daemon.ping`` and ``index.sync``
  returned for every workspace;
- memory once ready: the sum over the setup's processes, and every process below them
  (the daemons' indexing worker processes during and after a first build), of PSS
  (``/proc/<pid>/smaps_rollup``, shared pages split fairly) and of VmRSS; taken right
  after READY (``right_after_ready``, while first builds are still being saved) and once
  every workspace has committed what it indexed and the indexing workers have stopped
  (``commit_wait_s``), which the ratios use;
- search latency in workspace 1 while workspace 0 reindexes (``jobs.submit reindex``,
  resubmitted until enough samples), and without a reindex, as p50 / p99 / max of the
  client-side round trip.

Targets (issue "Many agents, one indexer"): one daemon's memory under a fifth of the N
daemons', and search p99 under 20 ms during a reindex elsewhere.

    .venv/bin/python tests/bench/run.py agents -- --quick      # 8 workspaces x 500 notes
    .venv/bin/python tests/bench/run.py agents                 # 36 x 3000 (long)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import synth  # noqa: E402

from recalld.ipc import errors  # noqa: E402
from recalld.ipc.client import Client  # noqa: E402

START_DEADLINE_S = 3600.0
STOP_DEADLINE_S = 60.0
_STRIPPED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS",
                 "LISTEN_FDNAMES")
P99_TARGET_MS = 20.0
MEMORY_TARGET_RATIO = 0.2


def log(msg: str) -> None:
    print(f"[agents] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------- data


def prepare(data: Path, n: int, notes: int) -> list[Path]:
    """N generated workspaces under ``data`` (reused when already complete)."""
    roots = []
    for i in range(n):
        root = data / f"ws{i:02d}"
        marker = root / ".generated"
        if not marker.exists() or marker.read_text() != f"{notes}":
            if root.exists():
                shutil.rmtree(root)
            synth.generate(root, notes=notes, seed=i)
            marker.write_text(f"{notes}")
        roots.append(root)
    return roots


def make_cold(roots: Sequence[Path]) -> None:
    for root in roots:
        shutil.rmtree(root / "mem_metadata", ignore_errors=True)


# ---------------------------------------------------------------------- daemons


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    socket_path: Path
    agents: list[str]


def _env(home: Path, runtime: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RECALLD_") and k not in _STRIPPED_ENV}
    env.update({"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
                "XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": str(home / "config"),
                "PYTHONUNBUFFERED": "1"})
    return env


def daemon_command(switch_interval_s: float | None) -> list[str]:
    if switch_interval_s is None:
        return [sys.executable, "-m", "recalld.daemon.main"]
    # An experiment knob: how long a thread may hold the GIL before another gets it.
    return [sys.executable, "-c",
            f"import sys; sys.setswitchinterval({switch_interval_s!r}); "
            "from recalld.daemon.main import main; sys.exit(main(sys.argv[1:]))"]


def launch(base: Path, name: str, workspaces: dict[str, Path],
           switch_interval_s: float | None = None) -> Daemon:
    home = base / name
    runtime = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))  # AF_UNIX paths are short
    os.chmod(runtime, 0o700)
    config = home / "config" / "recalld" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("".join(f'[workspaces.{agent}]\npath = "{root}"\ndream_cron_enabled = '
                              "false\n\n" for agent, root in workspaces.items()),
                      encoding="utf-8")
    log_file = open(home / "daemon.log", "wb")  # the child keeps its own copy
    proc = subprocess.Popen(
        [*daemon_command(switch_interval_s), "serve", "--log-level", "WARNING"],
        env=_env(home, runtime), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
        start_new_session=True)
    log_file.close()
    return Daemon(proc, runtime / "recalld" / "recalld.sock", list(workspaces))


def wait_ready(daemon: Daemon, started: float) -> dict[str, float]:
    """Seconds from ``started`` until ping answers and every workspace is synced."""
    deadline = time.monotonic() + START_DEADLINE_S
    ping_s: float | None = None
    with Client(daemon.socket_path, timeout_s=START_DEADLINE_S) as c:
        while ping_s is None:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {daemon.proc.returncode}")
            try:
                c.ping()
                ping_s = time.monotonic() - started
            except (errors.DaemonNotRunning, errors.ConnectionLost, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        for agent in daemon.agents:
            while True:
                try:
                    c.index_sync(agent)
                    break
                except errors.UnknownWorkspace:  # still opening
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
    return {"ping_s": ping_s, "ready_s": time.monotonic() - started}


def wait_committed(daemons: Sequence[Daemon], timeout_s: float = 600.0) -> float:
    """Seconds until every workspace has saved what it indexed (its index reports a commit
    and no uncommitted changes) and every daemon's indexing worker processes have stopped
    (30 s after their last batch): memory is compared in that steady state, not while the
    first builds' state is being written or some setups still hold workers."""
    t0 = time.monotonic()
    for daemon in daemons:
        with Client(daemon.socket_path, timeout_s=60) as c:
            while time.monotonic() - t0 < timeout_s:
                status = c.status()
                indexes = [w.get("index") or {} for w in status.get("workspaces", [])
                           if w.get("agent_id") in daemon.agents]
                pool = (status.get("queues") or {}).get("prepare_pool") or {}
                if all(i.get("last_commit") and not i.get("uncommitted_changes")
                       for i in indexes) and not pool.get("alive"):
                    break
                time.sleep(0.2)
    return round(time.monotonic() - t0, 3)


def _with_descendants(pids: Sequence[int]) -> list[int]:
    """``pids`` and every process below them (the daemon's indexing workers count too)."""
    out: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return out


def memory_kb(pids: Sequence[int]) -> dict[str, int]:
    pss = rss = 0
    procs = _with_descendants(pids)
    for pid in procs:
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
                pss += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                rss += sum(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except OSError:  # a worker that exited meanwhile
            continue
    return {"pss_kb": pss, "rss_kb": rss, "processes": len(procs)}


def stop(daemons: Sequence[Daemon]) -> None:
    for d in daemons:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
    for d in daemons:
        try:
            d.proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
        shutil.rmtree(d.socket_path.parent.parent, ignore_errors=True)


@contextmanager
def running(daemons: list[Daemon]) -> Iterator[list[Daemon]]:
    try:
        yield daemons
    finally:
        stop(daemons)


# ----------------------------------------------------------------------- search


def pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def summary(lat_s: Sequence[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in lat_s]
    return {"n": len(ms), "p50_ms": round(pct(ms, 50), 3), "p99_ms": round(pct(ms, 99), 3),
            "max_ms": round(max(ms), 3), "mean_ms": round(statistics.fmean(ms), 3)}


def queries_for(seed: int, notes: int) -> list[str]:
    qs = [q for q, _ in synth.needles(seed, notes=notes)]
    return qs or ["the", "work", "time"]


def search_latency(searcher: Daemon, agent: str, queries: Sequence[str], samples: int,
                   reindexer: Daemon | None, reindex_agent: str | None) -> dict[str, Any]:
    """Latencies of searches in ``agent``; with a reindexer, only those that overlapped a
    running reindex count (resubmitted as needed)."""
    lat: list[float] = []
    server: list[float] = []  # the daemon's own took_ms: search work without the hops
    reindexes = 0
    with Client(searcher.socket_path, timeout_s=120) as c, \
            Client((reindexer or searcher).socket_path, timeout_s=120) as r:
        job: str | None = None
        i = 0
        deadline = time.monotonic() + 1800
        while len(lat) < samples and time.monotonic() < deadline:
            if reindexer is not None and reindex_agent is not None:
                if job is None or r.jobs_get(reindex_agent, job)["state"] not in (
                        "queued", "running"):
                    job = r.jobs_submit(reindex_agent, "reindex")["job_id"]
                    reindexes += 1
                    time.sleep(0.05)  # let it get going
            t0 = time.perf_counter()
            answer = c.search(agent, queries[i % len(queries)])
            took = time.perf_counter() - t0
            i += 1
            if reindexer is not None and reindex_agent is not None:
                assert job is not None
                if r.jobs_get(reindex_agent, job)["state"] != "running":
                    continue  # did not overlap a running reindex: not counted
            lat.append(took)
            server.append((answer.took_ms or 0.0) / 1000)
        if job is not None and reindex_agent is not None:
            with suppress(errors.RecalldError):
                r.jobs_cancel(reindex_agent, job)
    return {**summary(lat), "server": summary(server), "reindexes": reindexes}


# ------------------------------------------------------------------------- runs


def start_setup(kind: str, base: Path, agents: dict[str, Path],
                switch_interval_s: float | None) -> tuple[list[Daemon], dict[str, float]]:
    """Launch the setup's daemons; wait until all are ready."""
    started = time.monotonic()
    if kind == "one_daemon":
        daemons = [launch(base, "one", agents, switch_interval_s)]
    else:
        daemons = [launch(base, f"d{i:02d}", {a: r}, switch_interval_s)
                   for i, (a, r) in enumerate(agents.items())]
    try:
        ready = [wait_ready(d, started) for d in daemons]
    except BaseException:
        stop(daemons)
        raise
    return daemons, {"ping_s": round(max(x["ping_s"] for x in ready), 3),
                     "ready_s": round(max(x["ready_s"] for x in ready), 3)}


def memory_mb(daemons: Sequence[Daemon]) -> dict[str, float]:
    mem = memory_kb([d.proc.pid for d in daemons])
    return {"pss_mb": round(mem["pss_kb"] / 1024, 1), "rss_mb": round(mem["rss_kb"] / 1024, 1),
            "measured_processes": mem["processes"]}


def run_setup(kind: str, base: Path, roots: Sequence[Path], notes: int,
              samples: int, switch_interval_s: float | None = None) -> dict[str, Any]:
    """Cold start (nothing derived on disk), measurements, then a warm restart."""
    make_cold(roots)
    agents = {f"agent{i:02d}": root for i, root in enumerate(roots)}
    names = list(agents)
    searcher, busy = names[1], names[0]
    queries = queries_for(1, notes)
    daemons, ready = start_setup(kind, base, agents, switch_interval_s)
    out: dict[str, Any] = {"processes": len(daemons), **ready}
    log(f"{kind}: cold start, ready in {out['ready_s']} s")

    def owner(agent: str) -> Daemon:
        return next(d for d in daemons if agent in d.agents)

    with running(daemons):
        out["right_after_ready"] = memory_mb(daemons)
        out["commit_wait_s"] = wait_committed(daemons)
        idle = search_latency(owner(searcher), searcher, queries, samples, None, None)
        out.update({**memory_mb(daemons), "search_idle": idle})
        log(f"{kind}: pss {out['pss_mb']} MB, idle search p99 {idle['p99_ms']} ms")
        out["search_during_reindex"] = search_latency(owner(searcher), searcher, queries,
                                                      samples, owner(busy), busy)
        log(f"{kind}: search p99 during a reindex "
            f"{out['search_during_reindex']['p99_ms']} ms")
    # A warm restart loads the committed indexes: the steady state of a running machine,
    # without what a cold build leaves allocated.
    daemons, ready = start_setup(kind, base, agents, switch_interval_s)
    with running(daemons):
        warm_idle = search_latency(owner(searcher), searcher, queries, samples, None, None)
        out["warm"] = {**ready, **memory_mb(daemons), "search_idle": warm_idle}
        log(f"{kind}: warm start, ready in {ready['ready_s']} s, "
            f"pss {out['warm']['pss_mb']} MB")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 workspaces x 500 notes")
    ap.add_argument("--workspaces", type=int, help="number of workspaces (default 36)")
    ap.add_argument("--notes", type=int, help="notes per workspace (default 3000)")
    ap.add_argument("--samples", type=int, default=300, help="searches per measurement")
    ap.add_argument("--data", type=Path, help="where generated workspaces are kept "
                    "(default: $TMPDIR/recalld-bench-agents/<N>x<M>)")
    ap.add_argument("--only", choices=("one_daemon", "per_agent"),
                    help="run one setup only (no ratio then)")
    ap.add_argument("--switch-interval", type=float, metavar="S",
                    help="run the daemons with sys.setswitchinterval(S) (experiment)")
    args = ap.parse_args(argv)
    n = args.workspaces or (8 if args.quick else 36)
    notes = args.notes or (500 if args.quick else 3000)
    if n < 2:
        ap.error("need at least 2 workspaces")
    data = args.data or Path(tempfile.gettempdir()) / "recalld-bench-agents" / f"{n}x{notes}"
    t0 = time.monotonic()
    roots = prepare(data, n, notes)
    log(f"{n} workspaces of {notes} notes in {data} ({time.monotonic() - t0:.1f} s)")
    result: dict[str, Any] = {
        "bench": "agents", "workspaces": n, "notes_per_workspace": notes,
        "samples": args.samples, "data": str(data), "switch_interval_s": args.switch_interval,
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
    }
    base = Path(tempfile.mkdtemp(prefix="recalld-bench-agents-"))
    try:
        for kind in ("one_daemon", "per_agent"):
            if args.only and kind != args.only:
                continue
            result[kind] = run_setup(kind, base, roots, notes, args.samples,
                                     args.switch_interval)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        make_cold(roots)
    one, per = result.get("one_daemon"), result.get("per_agent")
    if one and per:
        ratio = one["pss_mb"] / per["pss_mb"]
        p99 = one["search_during_reindex"]["p99_ms"]
        warm_ratio = one["warm"]["pss_mb"] / per["warm"]["pss_mb"]
        result["comparison"] = {
            "memory_ratio_pss": round(ratio, 3),
            "memory_ratio_pss_warm": round(warm_ratio, 3),
            "ready_ratio_warm": round(one["warm"]["ready_s"] / per["warm"]["ready_s"], 3),
            "memory_ratio_rss": round(one["rss_mb"] / per["rss_mb"], 3),
            "ready_ratio": round(one["ready_s"] / per["ready_s"], 3),
            "targets": {
                "memory_under_a_fifth": {"value": round(ratio, 3), "target": "< 0.2",
                                         "met": ratio < MEMORY_TARGET_RATIO},
                "memory_under_a_fifth_warm": {"value": round(warm_ratio, 3), "target": "< 0.2",
                                              "met": warm_ratio < MEMORY_TARGET_RATIO},
                "search_p99_during_reindex": {"value_ms": p99, "target": "< 20 ms",
                                              "met": p99 < P99_TARGET_MS},
            },
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
