"""How a warm daemon serves its saved index arrays: the file mapped, a private copy mapped,
or the file read into memory. Real daemons on one synthetic 3k-note workspace, in turns.

The keyword index's main segment and the chunk table are served from their generation
files (``mem_metadata/index/bm25.*.arr``, ``chunk_table.*.arr``). Three ways, each run as
a real ``recalld serve`` (this file starts the daemon after choosing the way):

- ``shared`` (the baseline): a read-only mapping of the published file itself. Someone
  truncating the file kills the daemon with SIGBUS on the next page read, and bytes written
  into it show up in searches.
- ``private`` (what recalld does): the file copied into an unnamed file of the daemon's
  (``O_TMPFILE``, an in-kernel copy) and that copy mapped; nothing outside can reach it.
- ``read``: the file read into anonymous memory.

First, in this process, the median time to open each array file the ``shared`` and the
``private`` way (the cost of the copy). Then, after one start not counted (the build's
last commit settled), for each way, ``--rounds`` times in turns (the
first way alternating): spawn the daemon on the built state, time ``workspace.open`` +
``index.sync`` + a first search (``open_s``), wait until the deferred checksums ran, time
``--queries`` sequential searches (p50/p99), let it settle and read the daemon's RSS and
PSS (anonymous and file parts) from ``/proc/<pid>/smaps_rollup``. Medians over the rounds;
the JSON also has each round.

    .venv/bin/python tests/bench/run.py mapped [--notes 3000] [--rounds 3]
    .venv/bin/python tests/bench/bench_mapped.py --notes 300 --rounds 1   # quick
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_index
import synth

WAYS = ("shared", "private", "read")
SETTLE_S = 3.0


# ------------------------------------------------------------- the ways, in the daemon


def _choose(way: str) -> None:
    """Make this process's daemon serve mapped arrays the ``way`` given."""
    from recalld.daemon.store import arrays
    from recalld.daemon.store.errors import CorruptState

    if way == "private":
        return  # the daemon's own

    def map_arrays(path: Path, expected: Any = None, *, trusted: bool = False) -> Any:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if expected is not None and size != expected.size:
                raise CorruptState(path, f"size {size} != expected {expected.size}")
            if way == "shared":
                mm: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                data: bytes | None = None
                view = memoryview(mm)  # type: ignore[arg-type]
            else:
                mm, data = None, f.read()
                view = memoryview(data)
        if expected is not None and not trusted and (
                arrays.checksum(view) != expected.checksum):
            raise CorruptState(path, "checksum mismatch")
        found, meta = arrays._parse(path, view, "arrays", whole_verified=expected is not None)
        return arrays.Mapped(found, meta, mm, data)

    arrays.map_arrays = map_arrays  # type: ignore[assignment]
    if way == "shared":
        # As before private copies: the deferred checksums read the file, not the map.
        from recalld.daemon.store.fsio import verify_file
        from recalld.daemon.store.generation import Generation

        def check_file(self: Generation, logical: str, served: Any) -> None:
            verify_file(self.path(logical), self.files[logical])

        Generation._check_served = check_file  # type: ignore[method-assign]


def time_maps(files: list[Path], repeat: int = 5) -> dict[str, Any]:
    """Median milliseconds to open each array file the ``shared`` and ``private`` ways
    (structure checked, data checksums skipped as a warm start does), in this process."""
    from recalld.daemon.store import arrays

    out: dict[str, Any] = {}
    for path in files:
        times: dict[str, list[float]] = {"shared": [], "private": []}
        for _ in range(repeat):
            for way in ("shared", "private"):
                t = time.perf_counter()
                if way == "private":
                    mapped = arrays.map_arrays(path)
                else:
                    with path.open("rb") as f:
                        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    found = arrays._parse(path, memoryview(mm), "arrays", whole_verified=True)
                    mapped = arrays.Mapped(*found, mm)
                times[way].append((time.perf_counter() - t) * 1e3)
                del mapped
        out[path.name.split(".")[0]] = {
            "bytes": path.stat().st_size,
            **{f"{w}_ms": round(statistics.median(v), 2) for w, v in times.items()}}
    return out


def serve(way: str, argv: list[str]) -> int:
    _choose(way)
    from recalld.daemon.main import main

    return main(argv)


# ------------------------------------------------------------------- measuring outside


def smaps(pid: int) -> dict[str, float]:
    """RSS and PSS (total, anonymous, file) of ``pid`` in MB."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Anonymous"):
                out[name.lower() + "_mb"] = round(int(rest.split()[0]) / 1024, 2)
    return out


def _run_way(way: str, ws: Path, state_dir: Path, expect: int, queries: list[str],
             n_queries: int) -> dict[str, Any]:
    bench_index.DAEMON_ARGV = (sys.executable, str(Path(__file__).resolve()), "--serve", way)
    d = bench_index.Daemon(state_dir, state_dir.parent / f"{state_dir.name}-{way}.log")
    try:
        t0 = time.perf_counter()
        d.start()
        c = bench_index.connect(d.socket_path, 600.0)
        bench_index.open_and_sync(c, ws, expect)
        bench_index.search(c, queries[0])
        open_s = time.perf_counter() - t0
        # Everything committed before the daemon stops: a stop that cut a long commit
        # short would leave the next start a catch-up, not a warm start.
        deadline = time.monotonic() + 3600
        while True:
            idx = bench_index.workspace_status(c).get("index") or {}
            if idx.get("load_checked") and not idx.get("uncommitted_changes") and (
                    idx.get("last_commit") or idx.get("loaded_generation")):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the index did not settle within an hour")
            time.sleep(0.05)
        lat = []
        for i in range(n_queries):
            q = queries[i % len(queries)]
            t = time.perf_counter()
            bench_index.search(c, q)
            lat.append((time.perf_counter() - t) * 1e3)
        time.sleep(SETTLE_S)
        assert d.proc is not None
        mem = smaps(d.proc.pid)
        idx = bench_index.workspace_status(c).get("index") or {}
        c.close()
        return {"open_s": round(open_s, 3), "query_p50_ms": bench_index.pct(lat, 50),
                "query_p99_ms": bench_index.pct(lat, 99), **mem,
                "chunks": idx.get("chunks"), "load_corrupt": idx.get("load_corrupt")}
    finally:
        d.cleanup()


def run(notes: int | None, rounds: int, n_queries: int, seed: int = 0, *,
        chunks: int | None = None, ways: tuple[str, ...] = WAYS) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="rcl-mapped-"))
    try:
        ws = tmp / "ws"
        stats = synth.generate(ws, notes=notes, target_chunks=chunks, seed=seed)
        expect = stats.notes + stats.digests
        queries = [q for q, _ in synth.needles(seed, notes=stats.notes)] or ["project"]
        print(f"building the index of {expect} notes", file=sys.stderr, flush=True)
        bench_index.recalld_cold_build(ws, tmp / "state", expect)
        arr_files = sorted((ws / bench_index.METADATA_DIR / "index").glob("*.arr"))
        files = {p.name.split(".")[0]: p.stat().st_size for p in arr_files}
        open_ms = time_maps(arr_files)
        # One start first, not counted: the cold build's daemon may have stopped before
        # its last commit, and the first start after it would catch up, not warm start.
        print("warm-up start", file=sys.stderr, flush=True)
        _run_way(ways[0], ws, tmp / "state", expect, queries, 10)
        per: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
        for r in range(rounds):
            order = ways[r % len(ways):] + ways[:r % len(ways)]
            for way in order:
                print(f"round {r + 1}/{rounds}: {way}", file=sys.stderr, flush=True)
                per[way].append(_run_way(way, ws, tmp / "state", expect, queries, n_queries))
        summary = {
            way: {key: statistics.median(x[key] for x in runs)
                  for key in ("open_s", "query_p50_ms", "query_p99_ms", "rss_mb", "pss_mb",
                              "pss_anon_mb", "pss_file_mb")
                  if all(isinstance(x.get(key), int | float) for x in runs)}
            for way, runs in per.items()}
        base = summary["shared"]
        ratios = {way: {k: round(v / base[k], 3) for k, v in s.items() if base.get(k)}
                  for way, s in summary.items() if way != "shared"}
        return {
            "bench": "mapped", "notes": expect, "chunks": per["shared"][0].get("chunks"),
            "array_file_bytes": files, "open_file_ms": open_ms, "rounds": rounds,
            "queries": n_queries,
            "loadavg": os.getloadavg(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "baseline": "shared",
            "summary": summary, "vs_shared": ratios, "runs": per,
            "targets": {"daemon_rss_mb_max": 80,
                        "private_rss_mb": summary.get("private", {}).get("rss_mb")},
        }
    finally:
        if os.environ.get("RECALLD_BENCH_KEEP"):
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        return serve(args[1], args[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--notes", type=int, default=3000)
    ap.add_argument("--chunks", type=int, default=None,
                    help="size the workspace by chunks instead (e.g. 110000)")
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated, of " + str(WAYS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="300 notes, one round")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args(args)
    if ns.quick:
        ns.notes, ns.rounds = 300, 1
    ways = tuple(w for w in ns.ways.split(",") if w)
    if "shared" not in ways or not set(ways) <= set(WAYS):
        ap.error(f"--ways: some of {WAYS}, with the baseline 'shared'")
    result = run(None if ns.chunks else ns.notes, ns.rounds, ns.queries, chunks=ns.chunks,
                 ways=ways)
    text = json.dumps(result, indent=2)
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
