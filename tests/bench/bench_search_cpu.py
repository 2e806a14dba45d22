"""The daemon's CPU time per keyword search, source trees side by side, in turns.

Wall-clock latency on a shared machine drifts by tens of percent within seconds; the CPU
time the daemon spends per ``memory.search`` (its process CPU clock, nanoseconds, every
thread included; the client's own thread CPU time beside it) is far steadier, so two
trees compare on it within a few percent. Each tree runs its own ``recalld serve`` (the tree's
``daemon/`` and ``ipc/`` put first on the import path) on its own copy of the workspace,
whose derived state it builds once (kept under ``--state-root`` for later runs); every
measurement is of a warm start, as the index bench's query rounds are (``--fresh``:
of the daemons that built, each built anew). Rounds of
sequential searches alternate between the trees (the first side alternating too), after
two discarded warm-up passes each.

``--dump DIR`` writes every tree's full answers (all fields but ``took_ms``) to one
JSON-lines file per tree, over the bench's queries and a few hundred more drawn from the
workspace's own text; ``dump.identical`` says whether they are.

    .venv/bin/python tests/bench/run.py search_cpu -- --tree base=/path/to/a/worktree \\
        --tree this=.                                  # synth.py's 3k notes, made once
    .venv/bin/python tests/bench/bench_search_cpu.py --ws /tmp/ws --tree ...  # any workspace
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reme_baseline
import synth
from bench_index import (
    AGENT,
    OPEN_TIMEOUT_S,
    Daemon,
    RawClient,
    connect,
    open_and_sync,
    pct,
    wait_committed,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]{2,}|[\u4e00-\u9fff]{2,4}")


def daemon_cpu_ns(pid: int) -> int:
    """Nanoseconds of CPU time process ``pid`` has used, every thread it ever had included
    (its process CPU-time clock: ``clock_getcpuclockid``, which Python does not wrap;
    per-thread counters lose a thread's time when it ends, as idle worker threads do)."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the process


def shim(tree: Path, where: Path) -> Path:
    """A directory whose ``recalld`` package is ``tree``'s daemon/ and ipc/."""
    pkg = where / "recalld"
    shutil.rmtree(where, ignore_errors=True)
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    for name in ("daemon", "ipc"):
        (pkg / name).symlink_to(tree.resolve() / name)
    return where


def ref_tree(ref: str, where: Path) -> tuple[str, Path]:
    """``ref``'s daemon/ and ipc/ (``git archive``) under ``where``; (name, tree), the
    name carrying the commit, so a moved ref gets its own state."""
    sha = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = where / f"src-{sha}"
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", sha, "daemon", "ipc"], cwd=REPO_ROOT,
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return f"{ref}-{sha}", tree


def workspace_queries(ws: Path, n: int, seed: int = 1) -> list[str]:
    """``n`` queries of one to four words drawn from the workspace's notes (seeded)."""
    rng = random.Random(seed)
    files = sorted(p for p in ws.rglob("*.md") if "mem_metadata" not in p.parts)
    out: list[str] = []
    while len(out) < n and files:
        words = _WORD.findall(rng.choice(files).read_text(encoding="utf-8"))
        if len(words) < 4:
            continue
        i = rng.randrange(len(words) - 4)
        out.append(" ".join(words[i:i + rng.randint(1, 4)]))
    return out


class Side:
    def __init__(self, name: str, tree: Path, ws: Path, state_root: Path) -> None:
        self.name, self.tree = name, tree
        self.state = state_root / f"state-{name}"
        # One daemon serves a workspace at a time, and its derived state lives inside it:
        # each side searches its own copy.
        self.ws = state_root / f"ws-{name}"
        if not (self.state / "built").exists():
            shutil.rmtree(self.ws, ignore_errors=True)
            shutil.copytree(ws, self.ws, ignore=shutil.ignore_patterns("mem_metadata"))
        self.shim = shim(tree, state_root / f"shim-{name}")
        self.daemon: Daemon | None = None
        self.client: Any = None

    def _new_daemon(self) -> Daemon:
        d = Daemon(self.state, self.state.parent / f"{self.state.name}.log")
        d.env_overrides["PYTHONPATH"] = str(self.shim)
        return d

    def build(self, files: int) -> None:
        if (self.state / "built").exists():
            return
        d = self._new_daemon()
        try:
            d.start()
            c = connect(d.socket_path, OPEN_TIMEOUT_S)
            open_and_sync(c, self.ws, files)
            wait_committed(c, or_loaded=True)
            c.close()
        finally:
            d.cleanup()
        (self.state / "built").write_text("", encoding="utf-8")

    def build_and_serve(self, source: Path, files: int) -> None:
        """Build anew and go on serving from the daemon that built (no restart)."""
        for d in (self.ws, self.state):
            shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(source, self.ws, ignore=shutil.ignore_patterns("mem_metadata"))
        self.start(files)
        wait_committed(self.client, or_loaded=True)
        (self.state / "built").write_text("", encoding="utf-8")

    def start(self, files: int) -> None:
        self.daemon = d = self._new_daemon()
        d.start()
        self.client = connect(d.socket_path, OPEN_TIMEOUT_S)
        open_and_sync(self.client, self.ws, files)

    def search(self, q: str, k: int = 5) -> None:
        self.client.call("memory.search", {"agent_id": AGENT, "query": q, "max_results": k})

    def wait_idle(self, timeout_s: float = 120.0) -> float:
        """Until the daemon uses under 5 ms of CPU in a second (a warm start's deferred
        checks, a commit); the milliseconds it used in the last second."""
        assert self.daemon is not None and self.daemon.proc is not None
        pid, t0 = self.daemon.proc.pid, time.perf_counter()
        while True:
            cpu0 = daemon_cpu_ns(pid)
            time.sleep(1.0)
            used_ms = (daemon_cpu_ns(pid) - cpu0) / 1e6
            if used_ms < 5.0 or time.perf_counter() - t0 > timeout_s:
                return used_ms

    def round(self, queries: list[str], n: int, offset: int) -> tuple[list[float], int, int]:
        """Wall milliseconds of each search; the daemon's and this client's CPU ns."""
        assert self.daemon is not None and self.daemon.proc is not None
        pid = self.daemon.proc.pid
        lat = []
        cpu0, own0 = daemon_cpu_ns(pid), time.thread_time_ns()
        for j in range(n):
            q = queries[(offset + j) % len(queries)]
            t0 = time.perf_counter()
            self.search(q)
            lat.append((time.perf_counter() - t0) * 1e3)
        return lat, daemon_cpu_ns(pid) - cpu0, time.thread_time_ns() - own0

    def dump(self, queries: list[str], path: Path) -> str:
        assert self.daemon is not None
        raw = RawClient(self.daemon.socket_path, timeout_s=60.0)
        h = hashlib.sha256()
        with path.open("w", encoding="utf-8") as f:
            for q in queries:
                for k in (5, 10):
                    ans = raw.call("memory.search",
                                   {"agent_id": AGENT, "query": q, "max_results": k})
                    ans.pop("took_ms", None)
                    line = json.dumps({"q": q, "k": k, "a": ans}, ensure_ascii=False,
                                      sort_keys=True)
                    f.write(line + "\n")
                    h.update(line.encode())
        raw.close()
        return h.hexdigest()

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.daemon is not None:
            self.daemon.cleanup()
        self.daemon = self.client = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ws", type=Path, default=None,
                    help="a workspace (default: synth.py's of --notes notes, made once)")
    ap.add_argument("--notes", type=int, default=3000)
    ap.add_argument("--tree", action="append", default=[],
                    help="NAME=PATH of a source tree with daemon/ and ipc/ (repeat; "
                         "default: --before-ref's and this tree)")
    ap.add_argument("--before-ref", default="main",
                    help="the git ref measured beside this tree when no --tree is given")
    ap.add_argument("--state-root", type=Path, default=None,
                    help="where built state is kept between runs (default: beside --ws)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=400)
    ap.add_argument("--fresh", action="store_true",
                    help="build every tree anew and measure the daemons that built (no "
                         "warm start)")
    ap.add_argument("--dump", type=Path, default=None, help="write full answers here")
    ap.add_argument("--dump-queries", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ws = args.ws
    if ws is None:
        ws = REPO_ROOT / "bench-results" / "search_cpu" / f"ws-{args.notes}"
        if not ws.exists():
            synth.generate(ws, notes=args.notes, seed=0)
    ws = ws.resolve()
    state_root = (args.state_root or ws.parent / f"qcpu-{ws.name}").resolve()
    files = sum(1 for p in ws.rglob("*.md") if "mem_metadata" not in p.parts)
    state_root.mkdir(parents=True, exist_ok=True)
    trees = [t.split("=", 1) for t in args.tree]
    if not trees:
        name, tree = ref_tree(args.before_ref, state_root)
        trees = [[name, str(tree)], ["this", str(REPO_ROOT)]]
    sides = [Side(name, Path(path), ws, state_root) for name, path in trees]
    queries = reme_baseline.default_queries(0)
    result: dict[str, Any] = {"ws": str(ws), "files": files, "fresh": args.fresh,
                              "load_before": os.getloadavg(),
                              "sides": {}}
    try:
        if not args.fresh:
            for s in sides:
                s.build(files)
        for s in sides:
            if args.fresh:
                s.build_and_serve(ws, files)
            else:
                s.start(files)
            for _ in range(2):
                for q in queries:
                    s.search(q)
        if args.dump is not None:
            args.dump.mkdir(parents=True, exist_ok=True)
            more = workspace_queries(ws, args.dump_queries)
            digests = {s.name: s.dump(queries + more, args.dump / f"{s.name}.jsonl")
                       for s in sides}
            result["dump"] = {"queries": len(queries) + len(more), "sha256": digests,
                              "identical": len(set(digests.values())) == 1}
        idle_ms = {s.name: s.wait_idle() for s in sides}
        lat: dict[str, list[float]] = {s.name: [] for s in sides}
        cpu: dict[str, list[float]] = {s.name: [] for s in sides}
        client: dict[str, list[float]] = {s.name: [] for s in sides}
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for s in order:
                ms, ns, own_ns = s.round(queries, args.per_round, r * args.per_round)
                lat[s.name] += ms
                cpu[s.name].append(ns / args.per_round / 1e3)
                client[s.name].append(own_ns / args.per_round / 1e3)
        for s in sides:
            result["sides"][s.name] = {
                "tree": str(s.tree), "searches": len(lat[s.name]),
                "p50_ms": pct(lat[s.name], 50), "p90_ms": pct(lat[s.name], 90),
                "cpu_us_per_search": sorted(cpu[s.name]),
                "cpu_us_median": pct(cpu[s.name], 50),
                "cpu_us_by_round": cpu[s.name],  # in turns with the other sides' rounds
                "client_cpu_us_median": pct(client[s.name], 50),
                "idle_cpu_ms_per_s_before": idle_ms[s.name]}
        result["load_after"] = os.getloadavg()
    finally:
        for s in sides:
            s.stop()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
