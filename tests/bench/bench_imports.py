"""Import cost of the client side: what an agent process pays to load ``recalld.ipc``.

Each module is imported in a fresh interpreter (``python -c``), which times the import
with ``time.perf_counter`` (what ``python -X importtime`` sums for it) and lists the
modules it loaded. Rounds run in turns (every module once per round), so a load spike
hits all of them alike. Baselines in the same run: the client modules of another
revision (``--ref``, default ``main``; its ``ipc/`` exported as in ``bench_aclient``), and
the event-loop libraries (``asyncio``, ``trio``, and ``anyio``, which the async client
uses).

    .venv/bin/python tests/bench/run.py imports [--rounds 15] [--ref main]
    .venv/bin/python tests/bench/bench_imports.py --modules recalld.ipc.aclient
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_aclient import export_ref

CLIENT_MODULES = ["recalld.ipc", "recalld.ipc.client", "recalld.ipc.aclient", "recalld.ipc.cli"]
BASELINES = ["asyncio", "trio", "anyio"]
#: What a trio or an asyncio program loads on top of its event loop to make a first call:
#: the client module and anyio's backend for that loop (``import`` lists, measured whole).
PROGRAMS = {
    "asyncio": ["asyncio", "asyncio, recalld.ipc.aclient, anyio._backends._asyncio"],
    "trio": ["trio", "trio, recalld.ipc.aclient, anyio._backends._trio"],
}
#: The same in a revision with a trio client and an asyncio client of their own.
REF_PROGRAMS = {
    "asyncio": "asyncio, recalld.ipc.asyncio_client",
    "trio": "trio, recalld.ipc.aclient",
}
#: Modules whose presence after an import is worth naming in the result.
WATCHED = ("trio", "asyncio", "anyio", "numpy", "hnswlib", "recalld.daemon")

_CHILD = (
    "import sys, time, json\n"
    "before = set(sys.modules)\n"
    "t = time.perf_counter()\n"
    "{stmt}\n"
    "took = time.perf_counter() - t\n"
    "print(json.dumps([took, sorted(set(sys.modules) - before)]))\n"
)


def _one(module: str, pythonpath: str | None = None) -> tuple[float, list[str]]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", _CHILD.format(stmt=f"import {module}")],
                         capture_output=True, text=True, check=True, timeout=60, env=env,
                         cwd=tempfile.gettempdir()).stdout
    took, loaded = json.loads(out)
    return float(took), list(loaded)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--modules", nargs="*", default=CLIENT_MODULES)
    ap.add_argument("--ref", default="main", help="the revision beside this tree")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rc-imports-", dir="/tmp") as tmp:
        ref_root = export_ref(args.ref, Path(tmp))
        ipc = ref_root / "recalld" / "ipc"
        ref_modules = [m for m in [*CLIENT_MODULES, "recalld.ipc.asyncio_client"]
                       if (ipc / (m.split(".")[-1] + ".py")).exists() or m == "recalld.ipc"]
        cases = ([(name, name, None) for name in BASELINES]
                 + [(name, name, None) for name in args.modules]
                 + [(f"{args.ref}:{name}", name, str(ref_root)) for name in ref_modules])
        if (ipc / "asyncio_client.py").exists():
            for loop, stmts in PROGRAMS.items():
                cases += [(f"{loop} program: {stmts[1]}", stmts[1], None),
                          (f"{loop} program: {args.ref}: {REF_PROGRAMS[loop]}",
                           REF_PROGRAMS[loop], str(ref_root))]
        times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
        loaded: dict[str, list[str]] = {}
        for r in range(args.rounds):
            for label, name, pythonpath in cases:
                took, mods = _one(name, pythonpath)
                times[label].append(took)
                loaded[label] = mods
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    result: dict[str, Any] = {"benchmark": "imports", "ref": args.ref, "rounds": args.rounds,
                              "loadavg": os.getloadavg(), "python": sys.version.split()[0],
                              "modules": {}}
    for label in times:
        ms = sorted(t * 1000 for t in times[label])
        result["modules"][label] = {
            "median_ms": round(statistics.median(ms), 2),
            "min_ms": round(ms[0], 2),
            "modules_loaded": len(loaded[label]),
            "loads": [w for w in WATCHED
                      if any(m == w or m.startswith(w + ".") for m in loaded[label])],
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
