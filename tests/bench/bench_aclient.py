"""``daemon.ping`` through the async client on trio and on asyncio, beside the async clients
of another revision (by default ``main``) in the same run.

One real daemon (``recalld serve`` on an isolated data dir, started as ``bench_ping``
starts it). Each measurement is a fresh interpreter that opens ONE client connection and
keeps ``--concurrency`` tasks calling ``ping`` on it for ``--seconds`` (after a warm-up),
then reports calls/s and the p50/p99 latency. Both revisions and both event loops are
measured in turns within each round, so a load spike hits all of them alike.

The other revision's ``ipc/`` folder is exported with ``git archive`` into a temporary
``recalld`` package that goes first on the child's ``PYTHONPATH``; there the trio client is
``recalld.ipc.aclient.AsyncClient`` and, where it exists, the asyncio one
``recalld.ipc.asyncio_client.AsyncioClient``.

    .venv/bin/python tests/bench/run.py aclient [--seconds 2] [--rounds 3] [--ref main]
    .venv/bin/python tests/bench/bench_aclient.py --concurrency 1 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench_ping import servers  # noqa: E402

LOOPS = ("trio", "asyncio")

_CHILD = '''
import json, statistics, sys, time
loop, module, name, path, concurrency, seconds = sys.argv[1:7]
concurrency, seconds = int(concurrency), float(seconds)
cls = getattr(__import__(module, fromlist=[name]), name)
lat = []

async def worker(client, stop_at, record_from):
    while True:
        t = time.perf_counter()
        if t >= stop_at:
            return
        await client.ping()
        if t >= record_from:
            lat.append(time.perf_counter() - t)

async def main():
    async with cls(path) as client:
        await client.ping()
        now = time.perf_counter()
        record_from, stop_at = now + min(0.5, seconds / 4), now + seconds
        if loop == "trio":
            import trio
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker, client, stop_at, record_from)
        else:
            import asyncio
            await asyncio.gather(*(worker(client, stop_at, record_from)
                                   for _ in range(concurrency)))
    return record_from, stop_at

if loop == "trio":
    import trio
    record_from, stop_at = trio.run(main)
else:
    import asyncio
    record_from, stop_at = asyncio.run(main())
lat.sort()
print(json.dumps({"calls_per_s": len(lat) / (stop_at - record_from),
                  "p50_ms": 1000 * lat[len(lat) // 2],
                  "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))]}))
'''


def export_ref(ref: str, into: Path) -> Path:
    """The ``ipc/`` folder of ``ref`` as the package ``recalld.ipc`` under ``into``."""
    pkg = into / "recalld"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", ref, "ipc"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive, check=True)
    return into


def clients(ref_root: Path) -> list[tuple[str, str, str, str, str | None]]:
    """(label, loop, module, class, PYTHONPATH) of every client measured."""
    old_asyncio = (ref_root / "recalld" / "ipc" / "asyncio_client.py").exists()
    return [
        ("this tree", "trio", "recalld.ipc.aclient", "AsyncClient", None),
        ("this tree", "asyncio", "recalld.ipc.aclient", "AsyncClient", None),
        ("ref", "trio", "recalld.ipc.aclient", "AsyncClient", str(ref_root)),
        ("ref", "asyncio", *(("recalld.ipc.asyncio_client", "AsyncioClient") if old_asyncio
                             else ("recalld.ipc.aclient", "AsyncClient")), str(ref_root)),
    ]


def measure(loop: str, module: str, name: str, pythonpath: str | None, sock: Path,
            concurrency: int, seconds: float) -> dict[str, float]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, loop, module, name, str(sock), str(concurrency),
         str(seconds)],
        env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True,
        timeout=seconds + 120).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--ref", default="main", help="the revision beside this tree")
    args = ap.parse_args(argv)
    runs: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rc-aclient-", dir="/tmp") as tmp_name:
        tmp = Path(tmp_name)
        measured = clients(export_ref(args.ref, tmp / "ref"))
        with servers(tmp / "srv") as started:
            sock = next(s.socket_path for s in started if s.name == "recalld")
            for r in range(args.rounds):
                for conc in args.concurrency:
                    for label, loop, module, name, pythonpath in measured:
                        runs.setdefault((label, loop, conc), []).append(
                            measure(loop, module, name, pythonpath, sock, conc, args.seconds))
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for (label, loop, conc), got in runs.items():
        rows.append({
            "client": label, "loop": loop, "concurrency": conc,
            "calls_per_s": round(statistics.median(g["calls_per_s"] for g in got)),
            "p50_ms": round(statistics.median(g["p50_ms"] for g in got), 3),
            "p99_ms": round(statistics.median(g["p99_ms"] for g in got), 3),
        })
    by = {(r["client"], r["loop"], r["concurrency"]): r for r in rows}
    ratios = {f"{loop}@{conc}": round(by["this tree", loop, conc]["calls_per_s"]
                                      / max(by["ref", loop, conc]["calls_per_s"], 1), 2)
              for loop in LOOPS for conc in args.concurrency}
    print(json.dumps({"benchmark": "aclient", "ref": args.ref, "seconds": args.seconds,
                      "rounds": args.rounds, "loadavg": os.getloadavg(), "rows": rows,
                      "calls_per_s_vs_ref": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
