"""``daemon.ping`` round trips against a real daemon, side by side with raw echo servers.

Three servers run as child processes on Unix sockets under one temporary directory:

- ``recalld``: ``recalld serve`` on an isolated data dir (the full path: framing, JSON-RPC
  parsing, dispatch, the ``daemon.ping`` handler, encoding);
- ``echo_raw``: a minimal stdlib ``selectors`` server that reads a line and writes it back
  (what the socket and one Python process cost, nothing else);
- ``echo_trio``: the same echo on trio, the daemon's runtime (what trio's I/O costs).

For 1, 8 and 32 concurrent clients (each its own connection, driven by one trio load
generator in this process, the same for every server) it sends the same JSON-RPC ping
frame, waits for the answer, checks its id, and records the latency. Each level runs for
``--seconds`` after a short warm-up, bounded by ``--max-requests``, servers interleaved per
level. Output: requests/s, p50 and p99 latency per server and level, the ratios against the
echo servers, and the issue's targets (p50 under 0.3 ms at 1 client; at 32 clients at least
half of the echo server's throughput).

Then fairness: a new client connects and pings, 40 times, while eight clients keep their
sockets full of pipelined requests answered at once (``daemon.status``; the echo servers
get the same frames), beside the same probe on an idle server.

    .venv/bin/python tests/bench/run.py ping [--seconds 2] [--out bench-results/ping.json]
    .venv/bin/python tests/bench/bench_ping.py --seconds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio

LEVELS = (1, 8, 32)
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
WARMUP_S = 0.3
REPO_ROOT = Path(__file__).resolve().parents[2]
_STRIPPED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS",
                 "LISTEN_FDNAMES")


# --------------------------------------------------------------------- echo servers


def echo_raw(path: str) -> None:
    """Read lines, write each back; one thread, non-blocking sockets, no framework."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path)
    listener.listen(128)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    buffers: dict[socket.socket, bytearray] = {}
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                conn, _ = listener.accept()
                conn.setblocking(True)  # replies are tiny; a blocking send never waits long
                sel.register(conn, selectors.EVENT_READ)
                buffers[conn] = bytearray()
                continue
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                sel.unregister(sock)
                sock.close()
                buffers.pop(sock, None)
                continue
            buf = buffers[sock]
            buf += data
            end = buf.rfind(b"\n")
            if end >= 0:
                sock.sendall(bytes(buf[: end + 1]))
                del buf[: end + 1]


async def _echo_trio_main(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)

    async def handle(stream: trio.SocketStream) -> None:
        buf = bytearray()
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async for data in stream:
                buf += data
                end = buf.rfind(b"\n")
                if end >= 0:
                    await stream.send_all(bytes(buf[: end + 1]))
                    del buf[: end + 1]

    await trio.serve_listeners(handle, [trio.SocketListener(sock)])


def echo_trio(path: str) -> None:
    trio.run(_echo_trio_main, path)


# ------------------------------------------------------------------------ servers


@dataclass
class Server:
    name: str
    socket_path: Path
    proc: subprocess.Popen[bytes]


def _wait_answers(server: Server, frame: bytes) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2.0)
                s.connect(str(server.socket_path))
                s.sendall(frame)
                if s.recv(65536).endswith(b"\n"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{server.name} did not answer within {START_DEADLINE_S} s")
        time.sleep(0.05)


@contextlib.contextmanager
def servers(tmp: Path) -> Iterator[list[Server]]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RECALLD_") and k not in _STRIPPED_ENV}
    home = tmp / "home"
    runtime = tmp / "run"
    for d in (home, runtime):
        d.mkdir(mode=0o700, parents=True)
    env.update({"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
                "XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": str(home / "config"),
                "RECALLD_SOCKET": str(runtime / "recalld.sock")})
    log = open(tmp / "servers.log", "wb")  # closed in the finally below
    started: list[Server] = []
    try:
        specs = [
            ("recalld", runtime / "recalld.sock",
             [sys.executable, "-m", "recalld.daemon.main", "serve", "--log-level", "WARNING"]),
            ("echo_raw", runtime / "echo-raw.sock",
             [sys.executable, __file__, "--serve-echo", "raw", str(runtime / "echo-raw.sock")]),
            ("echo_trio", runtime / "echo-trio.sock",
             [sys.executable, __file__, "--serve-echo", "trio", str(runtime / "echo-trio.sock")]),
        ]
        for name, path, cmd in specs:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, start_new_session=True)
            started.append(Server(name, path, proc))
        for server in started:
            _wait_answers(server, ping_frame(0))
        yield started
    finally:
        for server in started:
            if server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
        for server in started:
            try:
                server.proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
        log.close()


# ----------------------------------------------------------------------- the load


def ping_frame(id_: int) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": "daemon.ping", "id": id_}) + b"\n"


@dataclass
class LevelResult:
    requests: int
    errors: int
    seconds: float
    latencies_ns: list[int]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ns)

        def pct(p: float) -> float:
            if not lat:
                return float("nan")
            return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6

        return {
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "rps": round(self.requests / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": round(pct(0.50), 4),
            "p99_ms": round(pct(0.99), 4),
        }


async def _client(path: Path, first_id: int, stop_at: float, record_from: float,
                  max_requests: int, out: LevelResult) -> None:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        buf = b""
        id_ = first_id
        while True:
            now = time.perf_counter()
            if now >= stop_at or out.requests >= max_requests:
                return
            id_ += 1
            frame = ping_frame(id_)
            t0 = time.perf_counter_ns()
            await stream.send_all(frame)
            while b"\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    raise ConnectionError("server closed the connection")
                buf += data
            line, _, buf = buf.partition(b"\n")
            t1 = time.perf_counter_ns()
            answer = orjson.loads(line)
            ok = answer.get("id") == id_ and "error" not in answer
            if now >= record_from:
                out.requests += 1
                out.latencies_ns.append(t1 - t0)
                if not ok:
                    out.errors += 1


async def run_level(path: Path, clients: int, seconds: float, max_requests: int) -> LevelResult:
    out = LevelResult(0, 0, 0.0, [])
    start = time.perf_counter()
    record_from = start + WARMUP_S
    stop_at = record_from + seconds
    async with trio.open_nursery() as nursery:
        for i in range(clients):
            nursery.start_soon(_client, path, i * 10_000_000, stop_at, record_from,
                               max_requests, out)
    out.seconds = min(time.perf_counter(), stop_at) - record_from
    return out


# ------------------------------------------------------- a new client beside pipeliners

FLOODERS = 8
FLOOD_BATCH = 50  # frames per send: each flooder keeps its socket full
PROBES = 40


def status_frame(id_: int) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": "daemon.status", "id": id_}) + b"\n"


async def _flood(path: Path, stop: trio.Event, answered: list[int]) -> None:
    """Send batches of requests answered at once without waiting for the answers, and
    read whatever comes back (counted in ``answered[0]``), until ``stop``."""
    stream = await trio.open_unix_socket(str(path))
    batch = b"".join(status_frame(i) for i in range(FLOOD_BATCH))
    async with stream:
        async def drain() -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while data := await stream.receive_some(1 << 16):
                    answered[0] += data.count(b"\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while not stop.is_set():
                    await stream.send_all(batch)
            nursery.cancel_scope.cancel()


async def _probe_once(path: Path, id_: int) -> int:
    """Connect, ping, read the answer: the nanoseconds a new client waits."""
    t0 = time.perf_counter_ns()
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        await stream.send_all(ping_frame(id_))
        buf = b""
        while b"\n" not in buf:
            data = await stream.receive_some(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            buf += data
    if orjson.loads(buf.partition(b"\n")[0]).get("id") != id_:
        raise RuntimeError("answer to another request")
    return time.perf_counter_ns() - t0


async def run_fairness(path: Path, flooders: int) -> dict[str, Any]:
    """A new client's connect + ping, ``PROBES`` times, while ``flooders`` clients
    pipeline requests that are answered at once (0: on an idle server, the baseline)."""
    stop = trio.Event()
    lat: list[int] = []
    answered = [0]
    async with trio.open_nursery() as nursery:
        for _ in range(flooders):
            nursery.start_soon(_flood, path, stop, answered)
        if flooders:
            await trio.sleep(WARMUP_S)  # let the flood fill the sockets
        answered[0], started = 0, time.perf_counter()
        for i in range(PROBES):
            lat.append(await _probe_once(path, i + 1))
        took = time.perf_counter() - started
        stop.set()
        nursery.cancel_scope.cancel()
    lat.sort()
    return {"probes": len(lat), "pipelined_answers_per_s": round(answered[0] / took),
            "p50_ms": round(lat[len(lat) // 2] / 1e6, 3),
            "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] / 1e6, 3),
            "max_ms": round(lat[-1] / 1e6, 3)}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def run_ping_bench(*, seconds: float = 2.0, max_requests: int = 500_000,
                   levels: tuple[int, ...] = LEVELS) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    fairness: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rb-", dir="/tmp") as tmp:  # short AF_UNIX paths
        with servers(Path(tmp)) as running:
            for clients in levels:
                for server in running:
                    level = trio.run(run_level, server.socket_path, clients, seconds,
                                     max_requests)
                    results.setdefault(server.name, {})[str(clients)] = level.summary()
                    print(f"{server.name:10s} clients={clients:3d} "
                          f"{level.summary()}", file=sys.stderr)
            for server in running:
                for flooders in (0, FLOODERS):
                    got = trio.run(run_fairness, server.socket_path, flooders)
                    fairness.setdefault(server.name, {})[f"beside_{flooders}"] = got
                    print(f"{server.name:10s} new client beside {flooders} pipeliners {got}",
                          file=sys.stderr)
    ratios: dict[str, dict[str, Any]] = {}
    for base in ("echo_raw", "echo_trio"):
        ratios[f"throughput_vs_{base}"] = {
            k: _ratio(results["recalld"][k]["rps"], results[base][k]["rps"])
            for k in results["recalld"]
        }
        ratios[f"p50_vs_{base}"] = {
            k: _ratio(results["recalld"][k]["p50_ms"], results[base][k]["p50_ms"])
            for k in results["recalld"]
        }
    # The targets; None where this run did not measure that level.
    targets = {
        "p50_ms_at_1_client_under_0.3":
            results["recalld"]["1"]["p50_ms"] < 0.3 if 1 in levels else None,
        "throughput_at_32_clients_at_least_half_echo_raw":
            (ratios["throughput_vs_echo_raw"]["32"] or 0) >= 0.5 if 32 in levels else None,
        # A reader lets the loop go every 1 ms, so a new client waits for a few such turns
        # of each pipelining client, not for their whole backlog (about 3 s before).
        f"new_client_p99_ms_beside_{FLOODERS}_pipeliners_under_1000":
            fairness["recalld"][f"beside_{FLOODERS}"]["p99_ms"] < 1000,
    }
    return {
        "bench": "ping",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "config": {"seconds_per_level": seconds, "warmup_s": WARMUP_S,
                   "max_requests": max_requests, "levels": list(levels),
                   "load_generator": "one trio process, one connection per client"},
        "results": results,
        "new_client_beside_pipeliners": fairness,
        "ratios": ratios,
        "targets": targets,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="daemon.ping round trips vs raw echo servers")
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per level")
    ap.add_argument("--max-requests", type=int, default=500_000, help="cap per level")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)),
                    help="comma list of concurrent client counts")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--serve-echo", nargs=2, metavar=("IMPL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_echo:
        impl, path = args.serve_echo
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        (echo_raw if impl == "raw" else echo_trio)(path)
        return 0
    levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    result = run_ping_bench(seconds=args.seconds, max_requests=args.max_requests,
                            levels=levels)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    errors = sum(v["errors"] for r in result["results"].values() for v in r.values())
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
