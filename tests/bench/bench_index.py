"""Index speed of a real recalld daemon, side by side with ReMe 0.4.2 on the same files.

For each size (3k daily notes; 100k+ chunks; ``--quick``: 300 notes) the bench generates
two identical synthetic workspaces (``synth.generate`` with one seed), one for each system,
then measures:

- cold build: spawn ``recalld serve`` on fresh state, ``workspace.open`` the workspace,
  time until ``index.sync`` returns (and ``daemon.status`` shows every file, when it
  reports files);
- the first commit after the build (``first_commit_s``), waited for before timing queries;
- query latency p50/p99 with 1 and 16 concurrent clients (one blocking client per
  process, each with its own connection), over a fixed mix of queries;
- steady-state memory after the build: RSS and PSS (with their anonymous and
  file-backed parts, ``smaps_rollup``) once the build is committed and trimmed and a pass
  of searches has run, and again after the warm restarts;
- warm restart (median of 3): stop the daemon (SIGTERM), spawn it again on the same
  state, time from the spawn to the first correct answer of a search (the daemon reopens
  the workspace by itself; ``warm_restart_s``), and on to ``workspace.open`` +
  ``index.sync`` returning (``warm_restart_synced_s``: the startup scan for changes made
  while it was down is done);
- write-to-searchable p50/p95 over 50 edits: append a unique token to a note, then poll
  ``memory.search`` (without ``sync``) every 5 ms until the note is returned, so the
  watcher path is what is measured;
- warm restart after those edits (one run, ``warm_restart_after_edits``): the same timing
  once the edits are committed, with the keyword documents they left in the index's
  delta (``delta_docs``), which a start loads before its first answer;
- peak RSS of the daemon (``VmHWM`` from ``/proc/<pid>/status``);
- the ReMe baseline through ``reme_baseline.run_reme`` (cold build, warm restart, search
  job latency, write-to-searchable over fewer edits because its watcher polls every 5 s),
  and ReMe's warm restart from spawning its process to the first answer;
- ratios (ReMe / recalld: above 1 means recalld is faster) and the issue's targets.

The daemon runs as a child process with its own socket, config and data directory under
a temporary directory; it is stopped (SIGTERM, then SIGKILL after a grace period) on every
path out. ``run_index_bench`` returns the result dict; ``main`` writes it as JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reme_baseline
import synth
from procmem import TreeMemory

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT_DIR = REPO_ROOT / "bench-results" / "index"
AGENT = "bench"
# workspace.open may hold its answer until the first build is done: a 100k-chunk build
# must fit in one call.
OPEN_TIMEOUT_S = 1800.0
# Where a workspace keeps its derived state (the daemon's default metadata_dir).
METADATA_DIR = "mem_metadata"
# How the daemon is started; the socket and config options are appended.
DAEMON_ARGV: tuple[str, ...] = (sys.executable, "-m", "recalld.daemon.main", "serve")


def compile_sources() -> bool:
    """Write the daemon's bytecode, as installing the wheel does (pip compiles it), so a
    start is timed as installed even when PYTHONDONTWRITEBYTECODE is set or the sources
    changed since the last import; ReMe's venv was installed by pip, compiled the same
    way. Its dependencies too (trio, numpy, ...): installed with ``--no-compile`` and
    PYTHONDONTWRITEBYTECODE set, every start would compile them (~0.2 s of CPU). Returns
    whether every file compiled."""
    import compileall
    import sysconfig

    import recalld.daemon
    import recalld.ipc

    dirs = [str(Path(pkg.__file__).parent) for pkg in (recalld.daemon, recalld.ipc)
            if pkg.__file__]
    dirs.append(sysconfig.get_paths()["purelib"])
    return all([compileall.compile_dir(d, quiet=2) for d in dirs])


@dataclass(frozen=True)
class BenchSize:
    name: str
    notes: int | None = None
    target_chunks: int | None = None


SIZES: dict[str, BenchSize] = {
    "quick": BenchSize("quick-300-notes", notes=300),
    "3k": BenchSize("3k-notes", notes=3000),
    "100k": BenchSize("100k-chunks", target_chunks=110_000),
}


# ------------------------------------------------------------------------------ clients


class RpcClient(Protocol):
    def call(self, method: str, params: dict[str, Any] | None = None) -> Any: ...

    def close(self) -> None: ...


class RawClient:
    """Minimal blocking JSON-RPC 2.0 over a Unix socket (one line per message).

    Used only when ``recalld.ipc.client`` cannot be imported; notifications are skipped.
    """

    def __init__(self, path: Path, timeout_s: float = 60.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        self._sock.connect(str(path))
        self._buf = b""
        self._id = 0

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._id += 1
        msg = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params or {}}
        self._sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            while b"\n" not in self._buf:
                data = self._sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("daemon closed the connection")
                self._buf += data
            line, self._buf = self._buf.split(b"\n", 1)
            if not line.strip():
                continue
            reply = json.loads(line)
            if reply.get("id") != self._id:
                continue  # a notification
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply.get("result")

    def close(self) -> None:
        self._sock.close()


def connect(path: Path, timeout_s: float = 60.0) -> RpcClient:
    try:
        from recalld.ipc.client import Client
    except ImportError:
        return RawClient(path, timeout_s)
    client: RpcClient = Client(path, timeout_s=timeout_s, connect_timeout_s=timeout_s)
    return client


# ------------------------------------------------------------------------------- daemon


class Daemon:
    """A ``recalld serve`` child with private socket, config and data directories."""

    def __init__(self, state_dir: Path, log_path: Path) -> None:
        self.state_dir = state_dir
        # Unix socket paths are limited to ~108 bytes: keep the socket in a short tmp dir.
        self._sock_dir = Path(tempfile.mkdtemp(prefix="rcb-"))
        # Removed when this object goes or the bench ends, whether or not cleanup() ran.
        weakref.finalize(self, shutil.rmtree, self._sock_dir, ignore_errors=True)
        self.socket_path = self._sock_dir / "s.sock"
        self.config_path = state_dir / "config.toml"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        #: Applied over the environment below (None removes a variable).
        self.env_overrides: dict[str, str | None] = {}
        state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            f'[daemon]\ndata_dir = "{state_dir / "data"}"\n'
            f'socket_path = "{self.socket_path}"\n', encoding="utf-8")

    def start(self, timeout_s: float = 120.0) -> float:
        """Spawn and wait until ``daemon.ping`` answers; returns the seconds it took."""
        env = dict(os.environ)
        env.update(RECALLD_DATA_DIR=str(self.state_dir / "data"),
                   RECALLD_SOCKET=str(self.socket_path), XDG_RUNTIME_DIR=str(self._sock_dir),
                   XDG_CONFIG_HOME=str(self.state_dir / "cfg"), OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        for key in ("NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(key, None)
        for key, value in self.env_overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        t0 = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*DAEMON_ARGV, "--socket", str(self.socket_path), "--config",
                 str(self.config_path), "--log-level", "WARNING"],
                stdout=log, stderr=log, env=env, cwd=str(self.state_dir))
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}; see "
                                   f"{self.log_path}:\n{self._log_tail()}")
            try:
                c = RawClient(self.socket_path, timeout_s=5.0)
                try:
                    c.call("daemon.ping")
                finally:
                    c.close()
                return time.perf_counter() - t0
            except (OSError, ConnectionError, RuntimeError):
                if time.perf_counter() - t0 > timeout_s:
                    raise TimeoutError(f"daemon not ready after {timeout_s} s") from None
                time.sleep(0.005)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def peak_rss_mb(self) -> float | None:
        if self.proc is None:
            return None
        try:
            with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def memory_mb(self) -> dict[str, float] | None:
        """Resident memory now: ``rss``, ``pss`` and their anonymous / file-backed parts
        (``/proc/<pid>/smaps_rollup``; PSS shares file pages among the processes that
        map them), MB."""
        if self.proc is None:
            return None
        return process_memory_mb(self.proc.pid)

    def stop(self, grace_s: float = 15.0) -> float:
        """SIGTERM and wait (SIGKILL after ``grace_s``); returns the seconds it took."""
        t0 = time.perf_counter()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        return time.perf_counter() - t0

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._sock_dir, ignore_errors=True)


# ------------------------------------------------------------------------------ helpers


def pct(xs: Sequence[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


_SMAPS_FIELDS = {"Rss:": "rss", "Pss:": "pss", "Pss_Anon:": "pss_anon",
                 "Pss_File:": "pss_file", "Anonymous:": "anon"}


def process_memory_mb(pid: int) -> dict[str, float] | None:
    """RSS, PSS and their parts of process ``pid`` in MB, from ``smaps_rollup``."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] in _SMAPS_FIELDS:
                    out[_SMAPS_FIELDS[parts[0]]] = int(parts[1]) / 1024
    except OSError:
        return None
    return out or None


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far: on a loaded machine a
    steadier measure of start-up work than the wall clock."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steady_memory(d: Daemon, c: RpcClient, queries: Sequence[str],
                  settle_s: float = 3.0, idle_max_s: float = 120.0,
                  probe: str | None = None) -> dict[str, Any]:
    """The daemon's resident memory once the build is committed and its buffers trimmed:
    after a pass of keyword searches (serving touches the index), ``settle_s`` of quiet
    (the reading ``before_idle_trim``), then once the workspace's idle trim after them
    is done (``[daemon] idle_trim_s`` without a search: it lets go of the mapped pages
    the searches faulted in) and the daemon is idle (no CPU time used for 1 s; at most
    ``idle_max_s``) and two readings 1 s apart agree within 1 MB. Then the wall time of
    a ``probe`` search (a query not asked before), which maps back the pages it reads."""
    trims = _idle_trims(c)
    for q in queries:
        search(c, q)
    time.sleep(settle_s)
    before = d.memory_mb()
    pid = d.proc.pid if d.proc is not None else None
    t0 = time.perf_counter()
    trimmed = False
    while time.perf_counter() - t0 < idle_max_s:
        if trims is None or (_idle_trims(c) or 0) > trims:
            trimmed = trims is not None
            break
        time.sleep(0.5)
    last, cpu = d.memory_mb(), process_cpu_s(pid) if pid else None
    idle = False
    while time.perf_counter() - t0 < idle_max_s:
        time.sleep(1.0)
        now, cpu_now = d.memory_mb(), process_cpu_s(pid) if pid else None
        idle = cpu is not None and cpu_now is not None and cpu_now - cpu < 0.02
        stable = now is None or last is None or abs(now["rss"] - last["rss"]) < 1.0
        last, cpu = now, cpu_now
        if idle and stable:
            break
    waited = round(time.perf_counter() - t0, 1)
    probe_ms = None
    if probe is not None:
        t1 = time.perf_counter()
        search(c, probe)
        probe_ms = round((time.perf_counter() - t1) * 1000, 3)
    return {"after_searches": len(queries), "settle_s": settle_s, "idle": idle,
            "idle_trimmed": trimmed, "waited_s": waited, "before_idle_trim": before,
            "first_search_after_ms": probe_ms, **(last or {})}


def _idle_trims(c: RpcClient) -> int | None:
    """How often the workspace trimmed itself when idle (None: a daemon without it)."""
    found = workspace_status(c).get("index", {}).get("idle_trims")
    return found if isinstance(found, int) else None


def _results(reply: Any) -> list[dict[str, Any]]:
    if isinstance(reply, dict):
        res = reply.get("results", [])
    else:  # typed client objects
        res = reply
    out = []
    for r in res or []:
        out.append(r if isinstance(r, dict) else asdict(r) if hasattr(r, "__dataclass_fields__")
                   else {"path": getattr(r, "path", None)})
    return out


def search(c: RpcClient, query: str, k: int = 5) -> list[dict[str, Any]]:
    return _results(c.call("memory.search", {"agent_id": AGENT, "query": query,
                                             "max_results": k}))


def _find_key(obj: Any, key: str) -> Any:
    """First value of ``key`` anywhere in a nested JSON value."""
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], int | float):
            return obj[key]
        for v in obj.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def workspace_status(c: RpcClient) -> dict[str, Any]:
    st = c.call("daemon.status")
    for ws in st.get("workspaces", []) if isinstance(st, dict) else []:
        if isinstance(ws, dict) and ws.get("agent_id") == AGENT:
            return ws
    return {}


def open_and_sync(c: RpcClient, ws: Path, expect_files: int,
                  timeout_s: float = 600.0) -> dict[str, Any]:
    """``workspace.open`` + ``index.sync``; then wait until status counts every file."""
    t0 = time.perf_counter()
    c.call("workspace.open", {"agent_id": AGENT, "path": str(ws)})
    t_open = time.perf_counter() - t0
    while True:
        try:
            c.call("index.sync", {"agent_id": AGENT})
            break
        except Exception as exc:
            # A workspace still opening in the background is not an error yet.
            if "opening" not in str(exc) or time.perf_counter() - t0 > timeout_s:
                raise
            time.sleep(0.01)
    t_sync = time.perf_counter() - t0
    files = _find_key(workspace_status(c), "files")
    while files is not None and files < expect_files and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.01)
        files = _find_key(workspace_status(c), "files")
    status = workspace_status(c)
    return {"open_s": t_open, "sync_s": t_sync, "done_s": time.perf_counter() - t0,
            "files": _find_key(status, "files"), "chunks": _find_key(status, "chunks")}


def wait_committed(c: RpcClient, timeout_s: float = 600.0, *,
                   or_loaded: bool = False) -> float | None:
    """Wait until the index has committed everything it applied; the commit's seconds.

    The first build's state is saved once the build is done (about 4 s of CPU at 100k
    chunks); latency measured meanwhile would be of that commit, not of searching.
    ``or_loaded``: a generation loaded at start with nothing applied since counts as
    saved too (0.0 s).
    """
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        index = workspace_status(c).get("index")
        if not isinstance(index, dict):
            return None  # a daemon that does not report it: nothing to wait for
        commit = index.get("last_commit")
        if not index.get("uncommitted_changes"):
            if commit:
                return float(commit.get("duration_s") or 0.0)
            if or_loaded and index.get("loaded_generation"):
                return 0.0
        time.sleep(0.05)
    return None


def needle_hits(c: RpcClient, needles: Sequence[tuple[str, str]], k: int = 5) -> float:
    hits = sum(any(r.get("path") == path for r in search(c, q, k)) for q, path in needles)
    return hits / max(1, len(needles))


def _query_worker(sock: str, queries: Sequence[str], i: int, per: int,
                  start_at: float) -> tuple[list[float], float, float]:
    """One client process: connect, warm up, wait for the common start, time ``per`` calls."""
    c = connect(Path(sock))
    try:
        # A burst of connects may meet a full listen backlog (EAGAIN): retry briefly.
        for attempt in range(200):
            try:
                search(c, queries[i % len(queries)])
                break
            except Exception as exc:
                retryable = isinstance(exc, OSError) or type(exc).__name__ == "DaemonNotRunning"
                if not retryable or attempt == 199:
                    raise
                time.sleep(0.01)
        time.sleep(max(0.0, start_at - time.time()))
        lat = []
        t_start = time.time()
        for j in range(per):
            q = queries[(i * 7 + j) % len(queries)]
            t0 = time.perf_counter()
            search(c, q)
            lat.append((time.perf_counter() - t0) * 1e3)
        return lat, t_start, time.time()
    finally:
        c.close()


def query_latency(sock: Path, queries: Sequence[str], samples: int,
                  clients: int) -> dict[str, Any]:
    """p50/p99 of ``memory.search`` with ``clients`` client processes, one connection each.

    Processes, not threads, so the clients do not serialize on one interpreter lock: the
    daemon sees ``clients`` independent agents, as in real use.
    """
    per = max(1, samples // clients)
    if clients == 1:
        lat, t0, t1 = _query_worker(str(sock), queries, 0, per, 0.0)
        runs = [(lat, t0, t1)]
    else:
        ctx = multiprocessing.get_context("fork")
        start_at = time.time() + 1.0 + 0.05 * clients  # after every client has connected
        with concurrent.futures.ProcessPoolExecutor(clients, mp_context=ctx) as pool:
            futs = [pool.submit(_query_worker, str(sock), list(queries), i, per, start_at)
                    for i in range(clients)]
            runs = [f.result() for f in futs]
    lat = [x for r in runs for x in r[0]]
    wall = max(r[2] for r in runs) - min(r[1] for r in runs)
    return {"clients": clients, "samples": len(lat), "p50_ms": pct(lat, 50),
            "p99_ms": pct(lat, 99), "qps": len(lat) / wall if wall > 0 else None}


def _in_turns(rounds: int) -> Iterator[tuple[int, str]]:
    """(round, side) for each side of each round, the side going first alternating."""
    for i in range(rounds):
        for side in (("recalld", "reme") if i % 2 == 0 else ("reme", "recalld")):
            yield i, side


def interleaved_query_latency(ws: Path, state_dir: Path, reme_ws: Path, *,
                              expect_files: int, queries: Sequence[str], rounds: int = 20,
                              per_round: int = 100) -> dict[str, Any]:
    """Query p50/p99 of recalld and ReMe measured in alternating rounds.

    Both systems stay open on their built workspaces (a warm daemon; ReMe in its driver
    process) and take turns, ``per_round`` sequential searches each, starting side
    alternating; a warm-up round each is discarded. On a shared machine the speed drifts
    by tens of percent within seconds; in turns, a drift affects both sides alike.
    """
    d = Daemon(state_dir, state_dir.parent / f"{state_dir.name}.log")
    reme = reme_baseline.RemeRounds(reme_ws, queries)
    try:
        d.start()
        c = connect(d.socket_path, OPEN_TIMEOUT_S)
        open_and_sync(c, ws, expect_files)
        reme.start()

        def ours(offset: int) -> list[float]:
            lat = []
            for j in range(per_round):
                q = queries[(offset + j) % len(queries)]
                t0 = time.perf_counter()
                search(c, q)
                lat.append((time.perf_counter() - t0) * 1e3)
            return lat

        ours(0)
        reme.round(per_round)
        lat: dict[str, list[float]] = {"recalld": [], "reme": []}
        for i, side in _in_turns(rounds):
            offset = i * per_round
            lat[side] += ours(offset) if side == "recalld" else reme.round(per_round, offset)
        c.close()
    finally:
        reme.close()
        d.cleanup()
    return {"rounds": rounds, "per_round": per_round,
            **{side: {"samples": len(v), "p50_ms": pct(v, 50), "p99_ms": pct(v, 99)}
               for side, v in lat.items()}}


def reme_warm_from_process_start(reme_ws: Path, queries: Sequence[str],
                                 runs: int = 3) -> dict[str, Any]:
    """ReMe's warm restart as recalld's is timed: from spawning its process (interpreter,
    imports, loading its saved index, the scan that finds nothing) to the first search
    answered; median of ``runs``. ``warm_restart_s`` of ``run_reme`` starts after the
    imports, in a process that is already running."""
    times: list[float] = []
    cpus: list[float] = []
    for _ in range(runs):
        reme = reme_baseline.RemeRounds(reme_ws, queries)
        try:
            t0 = time.perf_counter()
            reme.start()
            reme.round(1)
            times.append(time.perf_counter() - t0)
            cpu = process_cpu_s(reme.pid) if reme.pid is not None else None
            if cpu is not None:
                cpus.append(cpu)
        finally:
            reme.close()
    return {"runs_s": times, "median_s": statistics.median(times), "cpu_runs_s": cpus,
            "cpu_median_s": statistics.median(cpus) if cpus else None}


def recalld_cold_build(ws: Path, state_dir: Path, expect_files: int) -> float:
    """Seconds from spawning a daemon on fresh state to ``index.sync`` of ``ws`` returning
    with every file indexed (the workspace's own derived state deleted first)."""
    shutil.rmtree(state_dir, ignore_errors=True)
    shutil.rmtree(ws / METADATA_DIR, ignore_errors=True)
    d = Daemon(state_dir, state_dir.parent / f"{state_dir.name}.log")
    try:
        t0 = time.perf_counter()
        d.start()
        c = connect(d.socket_path, OPEN_TIMEOUT_S)
        open_and_sync(c, ws, expect_files)
        seconds = time.perf_counter() - t0
        c.close()
    finally:
        d.cleanup()
    return seconds


def cold_builds_interleaved(ws: Path, state_dir: Path, reme_ws: Path, *, expect_files: int,
                            runs: int = 3) -> dict[str, Any]:
    """Cold builds of recalld and ReMe from process start, in turns (starting side
    alternating), ``runs`` each; medians compared, as the query rounds are."""
    times: dict[str, list[float]] = {"recalld": [], "reme": []}
    for _, side in _in_turns(runs):
        if side == "recalld":
            times["recalld"].append(recalld_cold_build(ws, state_dir, expect_files))
        else:
            r = reme_baseline.run_reme(reme_ws, warm_runs=0, edits=0)
            times["reme"].append(float(r["import_s"]) + float(r["cold_build_s"]))
    return {"runs": runs, **{f"{side}_s": v for side, v in times.items()},
            **{f"{side}_median_s": statistics.median(v) for side, v in times.items()}}


def restart_to_first_answer(d: Daemon, ws: Path, expect_files: int,
                            needle: tuple[str, str]) -> dict[str, Any]:
    """Stop the daemon, spawn it again and time its first search (``needle`` must be
    found), then the startup scan's sync; seconds from the spawn."""
    stop_s = d.stop()
    q, path = needle
    t0 = time.perf_counter()
    ready = d.start()
    c = connect(d.socket_path, OPEN_TIMEOUT_S)
    try:
        # The workspace was opened before the restart: the daemon reopens it by itself,
        # and the first search answers from the committed state.
        if not any(r.get("path") == path for r in search(c, q)):
            raise RuntimeError(f"after restart, {q!r} does not find {path}")
        first = time.perf_counter() - t0
        cpu = process_cpu_s(d.proc.pid) if d.proc is not None else None
        open_and_sync(c, ws, expect_files)
        return {"first_answer_s": first, "ready_s": ready, "synced_s": time.perf_counter() - t0,
                "first_answer_cpu_s": cpu, "stop_s": stop_s}
    finally:
        c.close()


def write_to_searchable(c: RpcClient, ws: Path, edits: int, seed: int,
                        poll_s: float = 0.005, timeout_s: float = 10.0) -> dict[str, Any]:
    """Append tokens; poll ``memory.search`` (no sync) until the edited note comes back."""
    stream = synth.EditStream(ws, seed=seed + 1000)
    rng = random.Random(seed)
    lat: list[float] = []
    missed = 0
    for _ in range(edits):
        e = stream.next()
        t0 = time.perf_counter()
        found = False
        while time.perf_counter() - t0 < timeout_s:
            if any(r.get("path") == e.path for r in search(c, e.token)):
                found = True
                break
            time.sleep(poll_s)
        if found:
            lat.append(time.perf_counter() - t0)
        else:
            missed += 1
        time.sleep(rng.uniform(0.0, 0.05))
    return {"edits": edits, "missed": missed, "p50_s": pct(lat, 50), "p95_s": pct(lat, 95),
            "max_s": max(lat, default=None), "poll_s": poll_s}


@contextlib.contextmanager
def _phase(out: dict[str, Any], name: str) -> Iterator[None]:
    """Record a failing phase in the result instead of losing the whole run."""
    try:
        yield
    except Exception as exc:
        out.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:2000]


# -------------------------------------------------------------------------------- bench


def bench_recalld(ws: Path, state_dir: Path, *, expect_files: int,
                  queries: Sequence[str], needles: Sequence[tuple[str, str]],
                  edits: int, query_samples: int, concurrency: Sequence[int],
                  warm_runs: int, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    shutil.rmtree(state_dir, ignore_errors=True)
    d = Daemon(state_dir, state_dir.parent / f"{state_dir.name}.log")
    try:
        with _phase(out, "cold_build"):
            t0 = time.perf_counter()
            out["ready_s"] = d.start()
            assert d.proc is not None
            # The first build's memory: the daemon and its indexing workers, up to the
            # end of the build's first commit.
            with TreeMemory(d.proc.pid) as mem:
                c = connect(d.socket_path, OPEN_TIMEOUT_S)
                info = open_and_sync(c, ws, expect_files)
                out["cold_build_s"] = time.perf_counter() - t0
                out["cold"] = info
                out["needle_hit_at_5"] = needle_hits(c, needles)
                out["first_commit_s"] = wait_committed(c)
                c.close()
            out["first_build_memory"] = mem.result()
            out["peak_rss_mb_first_build"] = d.peak_rss_mb()
        with _phase(out, "steady_memory"):
            c = connect(d.socket_path, OPEN_TIMEOUT_S)
            out["steady_memory_mb"] = steady_memory(d, c, queries[:20], probe=queries[-1])
            c.close()
        with _phase(out, "query_latency"):
            out["query"] = [query_latency(d.socket_path, queries, query_samples, n)
                            for n in concurrency]
        out["peak_rss_mb_cold"] = d.peak_rss_mb()
        with _phase(out, "warm_restart"):
            runs = []
            for i in range(warm_runs):
                # A needle the daemon has not been asked for since its build.
                runs.append(restart_to_first_answer(d, ws, expect_files,
                                                    needles[(i + 1) % len(needles)]))
                out["stop_s"] = runs[-1].pop("stop_s")
            out["warm_restart_runs"] = runs
            out["warm_restart_s"] = statistics.median(r["first_answer_s"] for r in runs)
            out["warm_restart_synced_s"] = statistics.median(r["synced_s"] for r in runs)
            cpus = [r["first_answer_cpu_s"] for r in runs if r["first_answer_cpu_s"] is not None]
            out["warm_restart_cpu_s"] = statistics.median(cpus) if cpus else None
            with _phase(out, "warm_memory"):
                c = connect(d.socket_path, OPEN_TIMEOUT_S)
                out["steady_memory_warm_mb"] = steady_memory(d, c, queries[:20], 1.0,
                                                             probe=queries[-2])
                c.close()
        with _phase(out, "write_to_searchable"):
            c = connect(d.socket_path, OPEN_TIMEOUT_S)
            out["write_to_searchable"] = write_to_searchable(c, ws, edits, seed)
            c.close()
        # The process that ran the queries, the warm memory pass and the edits.
        peaks = [out.get("peak_rss_mb_cold"), d.peak_rss_mb()]
        with _phase(out, "warm_restart_after_edits"):
            # The edits left documents in the keyword index's delta, which the last
            # commit saved and a restart loads before its first answer.
            c = connect(d.socket_path, OPEN_TIMEOUT_S)
            if wait_committed(c) is None:
                raise RuntimeError("the edits were not committed")
            delta = _get(workspace_status(c), "index", "keyword", "delta_docs")
            c.close()
            after = restart_to_first_answer(d, ws, expect_files, needles[0])
            out["warm_restart_after_edits"] = {**after, "delta_docs": delta}
        out["peak_rss_mb"] = max((x for x in peaks if x is not None), default=None)
    finally:
        d.cleanup()
    return out


def _get(d: dict[str, Any], *keys: str | int) -> Any:
    cur: Any = d
    for k in keys:
        try:
            cur = cur[k]
        except (KeyError, IndexError, TypeError):
            return None
    return cur


def compare(recalld: dict[str, Any], reme: dict[str, Any], size: str,
            interleaved: dict[str, Any] | None = None,
            cold: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ratios (ReMe / recalld: > 1 means recalld is faster) and the issue's targets.

    The query p50 and cold build targets are judged on the measurements taken in turns
    (``interleaved``, ``cold``) when there are any: each system's own phases run at
    other times of the run, and this machine's speed drifts.
    """
    il = interleaved or {}
    cb = cold or {}
    pairs: dict[str, tuple[Any, Any]] = {
        "cold_build_interleaved": (_get(cb, "reme_median_s"), _get(cb, "recalld_median_s")),
        "query_p50_interleaved": (_get(il, "reme", "p50_ms"), _get(il, "recalld", "p50_ms")),
        "query_p99_interleaved": (_get(il, "reme", "p99_ms"), _get(il, "recalld", "p99_ms")),
        "cold_build": (_get(reme, "cold_build_s"), _get(recalld, "cold_build_s")),
        "warm_restart": (_get(reme, "warm_restart_s"), _get(recalld, "warm_restart_s")),
        "query_p50": (_get(reme, "search", "p50_ms"), _get(recalld, "query", 0, "p50_ms")),
        "query_p99": (_get(reme, "search", "p99_ms"), _get(recalld, "query", 0, "p99_ms")),
        "query_p50_concurrent": (_get(reme, "search", "concurrent_p50_ms"),
                                 _get(recalld, "query", -1, "p50_ms")),
        "write_to_searchable_p50": (_get(reme, "write_to_searchable", "p50_s"),
                                    _get(recalld, "write_to_searchable", "p50_s")),
        "write_to_searchable_p95": (_get(reme, "write_to_searchable", "p95_s"),
                                    _get(recalld, "write_to_searchable", "p95_s")),
        "peak_rss": (_get(reme, "peak_rss_mb"), _get(recalld, "peak_rss_mb")),
        # Both from spawning the process to the first answer (recalld's warm_restart_s is
        # that; ReMe's own warm_restart_s leaves its start-up and imports out).
        "warm_restart_from_process_start": (
            _get(reme, "warm_restart_from_process_start", "median_s"),
            _get(recalld, "warm_restart_s")),
        "warm_restart_cpu_from_process_start": (
            _get(reme, "warm_restart_from_process_start", "cpu_median_s"),
            _get(recalld, "warm_restart_cpu_s")),
        # The first build (recalld: up to its first commit; ReMe: its whole driver run,
        # whose peak is its build). PSS of the process tree: workers included, shared
        # pages counted once; RSS: the main process's high-water mark.
        "peak_pss_first_build": (_get(reme, "memory", "tree_pss_mb"),
                                 _get(recalld, "first_build_memory", "tree_pss_mb")),
        "peak_rss_first_build": (_get(reme, "peak_rss_mb"),
                                 _get(recalld, "peak_rss_mb_first_build")),
        "peak_tree_rss_first_build": (_get(reme, "memory", "tree_rss_mb"),
                                      _get(recalld, "first_build_memory", "tree_rss_mb")),
    }
    # Like for like: both from a fresh process (ReMe's import time + its build, against
    # recalld's process start + open + sync). "cold_build" alone leaves ReMe's imports out.
    reme_import, reme_cold = _get(reme, "import_s"), _get(reme, "cold_build_s")
    pairs["cold_build_from_process_start"] = (
        reme_import + reme_cold if isinstance(reme_import, int | float)
        and isinstance(reme_cold, int | float) else None, _get(recalld, "cold_build_s"))
    ratios = {k: (a / b if isinstance(a, int | float) and isinstance(b, int | float) and b
                  else None) for k, (a, b) in pairs.items()}

    def check(value: Any, ok: Callable[[float], bool], target: str) -> dict[str, Any]:
        return {"value": value, "target": target,
                "pass": bool(ok(value)) if isinstance(value, int | float) else None}

    targets = {
        "write_to_searchable_p95_s": check(_get(recalld, "write_to_searchable", "p95_s"),
                                           lambda v: v <= 0.05, "<= 50 ms"),
        "cold_build_speedup": check(ratios["cold_build_from_process_start"],
                                    lambda v: v >= 8.0, ">= 8x ReMe, both from process start"),
        "first_build_peak_pss": check(ratios["peak_pss_first_build"], lambda v: v >= 1.0,
                                      "no higher than ReMe's (ratio >= 1), daemon + workers"),
        "first_build_peak_rss": check(ratios["peak_rss_first_build"], lambda v: v >= 1.0,
                                      "no higher than ReMe's (ratio >= 1), main process"),
    }
    if ratios["cold_build_interleaved"] is not None:
        targets["cold_build_speedup"] = check(
            ratios["cold_build_interleaved"], lambda v: v >= 8.0,
            ">= 8x ReMe, both from process start, medians of builds taken in turns")
    targets["warm_restart_vs_reme"] = check(
        ratios["warm_restart"], lambda v: v >= 2.0,
        "at most half of ReMe's (ratio >= 2); recalld from process start to the first "
        "answer, ReMe from after its imports")
    if size.startswith("3k") or size.startswith("quick"):
        targets["steady_rss_mb"] = check(_get(recalld, "steady_memory_mb", "rss"),
                                         lambda v: v <= 80.0,
                                         "<= 80 MB after the build, caches trimmed")
        if ratios["query_p50_interleaved"] is not None:
            targets["query_p50_vs_reme"] = check(
                ratios["query_p50_interleaved"], lambda v: v >= 1.0,
                "no slower than ReMe (ratio >= 1), measured in alternating rounds")
        else:
            targets["query_p50_vs_reme"] = check(ratios["query_p50"], lambda v: v >= 1.0,
                                                 "no slower than ReMe (ratio >= 1)")
    if "chunks" in size:
        targets["query_p50_ms"] = check(_get(recalld, "query", 0, "p50_ms"),
                                        lambda v: v < 5.0, "< 5 ms")
        targets["warm_restart_s"] = check(_get(recalld, "warm_restart_s"),
                                          lambda v: v < 1.0, "< 1 s")
        targets["warm_restart_after_edits_s"] = check(
            _get(recalld, "warm_restart_after_edits", "first_answer_s"), lambda v: v < 1.0,
            "< 1 s, with the delta the edits left")
    return {"ratios_reme_over_recalld": ratios, "targets": targets}


def run_index_bench(sizes: Sequence[str | BenchSize] = ("3k", "100k"), *, seed: int = 0,
                    out_dir: Path = DEFAULT_OUT_DIR, edits: int = 50, reme: bool = True,
                    reme_edits: int = reme_baseline.DEFAULT_EDITS, query_samples: int = 400,
                    concurrency: Sequence[int] = (1, 16), warm_runs: int = 3,
                    keep_workspaces: bool = False, large_cold_runs: int = 0) -> dict[str, Any]:
    """Run the index bench for each size; returns the JSON-ready result dict."""
    t_all = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "bench": "index", "seed": seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "sizes": {},
        "bytecode_compiled": compile_sources(),
    }
    queries = reme_baseline.default_queries(seed)
    for s in sizes:
        size = SIZES[s] if isinstance(s, str) else s
        entry: dict[str, Any] = {}
        result["sizes"][size.name] = entry
        ws_r = out_dir / f"ws-{size.name}-recalld"
        ws_m = out_dir / f"ws-{size.name}-reme"
        for ws in (ws_r, ws_m):
            shutil.rmtree(ws, ignore_errors=True)
        gen = synth.generate(ws_r, notes=size.notes, target_chunks=size.target_chunks,
                             seed=seed)
        entry["workspace"] = {"notes": gen.notes, "digests": gen.digests,
                              "approx_chunks": gen.blocks, "bytes": gen.bytes,
                              "generate_s": gen.seconds}
        needles = list(gen.needles)
        entry["recalld"] = bench_recalld(
            ws_r, out_dir / f"state-{size.name}", expect_files=gen.files, queries=queries,
            needles=needles, edits=edits, query_samples=query_samples,
            concurrency=concurrency, warm_runs=warm_runs, seed=seed)
        if reme:
            synth.generate(ws_m, notes=size.notes, target_chunks=size.target_chunks, seed=seed)
            rm: dict[str, Any] = {}
            with _phase(rm, "reme"):
                rm = reme_baseline.run_reme(
                    ws_m, queries=queries, result_queries=[q for q, _ in needles],
                    edits=reme_edits, warm_runs=warm_runs, concurrency=max(concurrency))
                res = rm.pop("results")
                rm["needle_hit_at_5"] = sum(
                    any(r["path"] == p for r in hits[:5])
                    for (_, p), hits in zip(needles, res, strict=True)) / max(1, len(needles))
            entry["reme"] = rm
            il: dict[str, Any] = {}
            with _phase(il, "query_interleaved"):
                il.update(interleaved_query_latency(
                    ws_r, out_dir / f"state-{size.name}", ws_m, expect_files=gen.files,
                    queries=queries))
            entry["query_interleaved"] = il
            with _phase(rm, "reme_warm_from_process_start"):
                rm["warm_restart_from_process_start"] = reme_warm_from_process_start(
                    ws_m, queries, warm_runs)
            # ReMe takes minutes per build at 100k chunks: there only on request.
            runs = large_cold_runs if size.name.startswith("100k") else 3
            if runs:
                cb: dict[str, Any] = {}
                with _phase(cb, "cold_interleaved"):
                    cb.update(cold_builds_interleaved(
                        ws_r, out_dir / f"state-{size.name}", ws_m, expect_files=gen.files,
                        runs=runs))
                entry["cold_interleaved"] = cb
            entry.update(compare(entry["recalld"], rm, size.name, il,
                                 entry.get("cold_interleaved")))
        if not keep_workspaces:  # the daemon's log stays next to them
            for d in (ws_r, ws_m, out_dir / f"state-{size.name}"):
                shutil.rmtree(d, ignore_errors=True)
    result["total_s"] = time.perf_counter() - t_all
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="recalld index bench vs ReMe 0.4.2")
    ap.add_argument("--quick", action="store_true", help="one small size (300 notes)")
    ap.add_argument("--sizes", default="3k,100k", help=f"comma list of {sorted(SIZES)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--edits", type=int, default=50)
    ap.add_argument("--reme-edits", type=int, default=reme_baseline.DEFAULT_EDITS)
    ap.add_argument("--no-reme", action="store_true")
    ap.add_argument("--keep-workspaces", action="store_true")
    ap.add_argument("--large-cold-runs", type=int, default=0,
                    help="cold builds in turns at 100k chunks too (each side, minutes each)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "bench-results" / "index.json")
    a = ap.parse_args(argv)
    sizes = ["quick"] if a.quick else [s.strip() for s in a.sizes.split(",") if s.strip()]
    res = run_index_bench(sizes, seed=a.seed, edits=a.edits, reme=not a.no_reme,
                          reme_edits=a.reme_edits, keep_workspaces=a.keep_workspaces,
                          large_cold_runs=a.large_cold_runs)
    text = json.dumps(res, indent=2, ensure_ascii=False)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    failed = any("errors" in e.get(part, {})
                 for e in res["sizes"].values()
                 for part in ("recalld", "reme", "query_interleaved", "cold_interleaved"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
