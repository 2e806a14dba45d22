"""The one entry point for recalld's benchmarks.

    .venv/bin/python tests/bench/run.py NAME [NAME ...] [--quick] [--out FILE] [BENCH OPTIONS]
    .venv/bin/python tests/bench/run.py all [--quick] [--out-dir bench-results]
    .venv/bin/python tests/bench/run.py --list

A benchmark is a module in this folder named ``bench_<name>.py`` (or listed in ``EXTRA``)
with ``main(argv: list[str] | None) -> int`` that prints ONE JSON document on stdout and its
progress on stderr. New benchmarks plug in by following that naming; nothing here changes.
Each one runs in its own interpreter (``python <file> BENCH OPTIONS``) so that daemons,
threads and memory of one never leak into the next. The JSON goes to ``--out`` (default
``bench-results/<name>.json``); ``all`` also writes ``bench-results/all.json`` with each
benchmark's exit status and result.

Options run.py does not know (and everything after ``--``) go to the benchmark(s) as they
are: ``run.py quality --sets locomo --no-reme``. ``--quick`` is run.py's own: it gives each
benchmark its own small-size option from ``QUICK`` (benchmarks not listed run as usual).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEFAULT_OUT_DIR = REPO_ROOT / "bench-results"
#: Benchmarks whose file does not follow the bench_<name>.py naming: name -> file stem.
EXTRA = {"quality-lexical": "quality_lexical"}
#: What ``--quick`` means for each benchmark (its own option for a small run).
QUICK: dict[str, list[str]] = {
    "index": ["--quick"],
    "quality": ["--quick"],
    "reme_chunks": ["--quick"],
    "agents": ["--quick"],
    "vectors": ["--quick", "300"],
    "lanes": ["--quick"],
    "fusion": ["--quick"],
    "xling": ["--quick"],
    "search_backfill": ["--quick"],
    "search_cpu": ["--notes", "300", "--rounds", "2", "--per-round", "200"],
    "ping": ["--seconds", "1"],
    "remote": ["--notes", "20", "--bulk", "200"],
    "pgsearch": ["--queries", "50"],
    "idle": ["--seconds", "10"],
    "imports": ["--rounds", "3"],
    "aclient": ["--seconds", "1", "--rounds", "1"],
    "mapped": ["--quick"],
    "serve_saved": ["--quick"],
    "compaction": ["--notes", "300", "--rounds", "1"],
    "quality-lexical": ["--sizes", "1600"],
}
#: run.py's own options; the ones in the first set take a value.
_OWN_WITH_VALUE = {"--out", "--out-dir"}
_OWN_FLAGS = {"--list", "--quick", "-h", "--help"}


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """(run.py's arguments, the benchmark's): names lead; unknown options go through."""
    own: list[str] = []
    extra: list[str] = []
    in_names = True
    i = 0
    while i < len(args):
        a = args[i]
        key = a.split("=", 1)[0]
        if a == "--":
            extra += args[i + 1:]
            break
        if key in _OWN_WITH_VALUE:
            own.append(a)
            if "=" not in a and i + 1 < len(args):
                i += 1
                own.append(args[i])
        elif key in _OWN_FLAGS or (in_names and not a.startswith("-")):
            own.append(a)
        else:
            in_names = False
            extra.append(a)
        i += 1
    return own, extra


def discover() -> dict[str, Path]:
    found = {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}
    found.update({name: HERE / f"{stem}.py" for name, stem in EXTRA.items()
                  if (HERE / f"{stem}.py").exists()})
    return dict(sorted(found.items()))


def describe(path: Path) -> str:
    """First line of the module docstring."""
    text = path.read_text(encoding="utf-8")
    for quote in ('"""', "'''"):
        if quote in text:
            return text.split(quote, 2)[1].strip().splitlines()[0]
    return ""


def run_one(name: str, path: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    print(f"== {name}: {path.name} {' '.join(extra)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(path), *extra], cwd=REPO_ROOT,
                          stdout=subprocess.PIPE, check=False)
    elapsed = round(time.monotonic() - started, 1)
    text = proc.stdout.decode("utf-8", errors="replace")
    try:
        result: Any = json.loads(text)
    except json.JSONDecodeError:
        result = None
        print(f"== {name}: no JSON on stdout (exit {proc.returncode})", file=sys.stderr)
    if result is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n",
                       encoding="utf-8")
        print(f"== {name}: exit {proc.returncode} in {elapsed} s, wrote {out}",
              file=sys.stderr)
    return {"name": name, "exit": proc.returncode, "seconds": elapsed,
            "out": str(out) if result is not None else None, "result": result}


def main(argv: list[str] | None = None) -> int:
    args, extra = split_args(list(sys.argv[1:] if argv is None else argv))
    benches = discover()
    ap = argparse.ArgumentParser(description="Run recalld benchmarks; results as JSON.")
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"benchmarks to run: {', '.join(benches)}, or all")
    ap.add_argument("--out", type=Path, help="result file (one benchmark only)")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    ap.add_argument("--list", action="store_true", help="list benchmarks and exit")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes: each benchmark's own quick option (see QUICK)")
    ns = ap.parse_args(args)
    if ns.list or not ns.names:
        for name, path in benches.items():
            print(f"{name:18s} {describe(path)}")
        return 0 if ns.list else 2
    names = list(benches) if ns.names == ["all"] else ns.names
    unknown = [n for n in names if n not in benches]
    if unknown:
        print(f"run.py: unknown benchmark(s) {', '.join(unknown)}; "
              f"known: {', '.join(benches)}", file=sys.stderr)
        return 2
    if ns.out and len(names) > 1:
        print("run.py: --out takes one benchmark; use --out-dir for several", file=sys.stderr)
        return 2
    runs = []
    for name in names:
        out = ns.out or ns.out_dir / f"{name}.json"
        quick = QUICK.get(name, []) if ns.quick else []
        runs.append(run_one(name, benches[name], out, [*quick, *extra]))
        if len(names) == 1:
            # One benchmark: its JSON on stdout too, for pipes.
            if runs[0]["result"] is not None:
                print(json.dumps(runs[0]["result"], indent=2, ensure_ascii=False))
    if len(names) > 1:
        summary = ns.out_dir / "all.json"
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"runs": runs}, indent=2, ensure_ascii=False) + "\n",
                           encoding="utf-8")
        print(f"== summary: {summary}", file=sys.stderr)
    return max((r["exit"] for r in runs), default=0)


if __name__ == "__main__":
    raise SystemExit(main())
