"""Cold builds from process start of two daemons (two checkouts' venvs) in turns.

A lighter companion of ``bench_index.py``'s cold-build phase for comparing two trees'
first builds (no ReMe, no other phases): the CPU split, the peak memory and whether
both commit the same generation.

    .venv/bin/python tests/bench/cold_turns.py --ws bench-results/ws3k --files 3333 \\
        --tree main=/work/main/.venv/bin/python --tree new=.venv/bin/python --rounds 3

Each build: fresh state, spawn ``python -m recalld.daemon.main serve`` from that venv,
``workspace.open`` + ``index.sync`` until every file is counted; reports the wall clock,
the daemon's CPU and its reaped workers' CPU (``/proc/<pid>/stat``) at that moment (the
pool stops once the pass's last batch is prepared; a worker not reaped yet counts in
``cpu_to_commit_s``, taken once the build is committed, not in ``cpu_s``), the
peak PSS of the daemon and its workers until the first commit, the load average, and
a digest of the committed generation's files (decompressed) so that two trees' builds
can be compared byte for byte. JSON on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_index as bi
from procmem import TreeMemory

KINDS = ("bm25", "chunk_table", "chunks", "graph", "catalog")


def cpu_s(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of ``pid``."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return ((int(fields[11]) + int(fields[12])) / tck,
            (int(fields[13]) + int(fields[14])) / tck)


def _decompressed(path: Path) -> bytes:
    """A committed file's bytes, zstd frames decompressed (``.zst``), else as stored."""
    data = path.read_bytes()
    if path.suffix != ".zst":
        return data
    import zstandard

    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def generation_digest(meta: Path) -> dict[str, str]:
    """blake2b of each committed file kind (the newest generation), decompressed."""
    out: dict[str, str] = {}
    files = sorted(p for p in meta.rglob("*") if p.is_file())
    for kind in KINDS:
        mine = [p for p in files if p.name.startswith(kind + ".g")]
        if not mine:
            continue
        newest = max(mine, key=lambda p: p.name)
        out[kind] = hashlib.blake2b(_decompressed(newest), digest_size=8).hexdigest()
        out[kind + "_file"] = newest.name
    return out


def one_build(python: str, ws: Path, state_dir: Path, files: int) -> dict[str, Any]:
    shutil.rmtree(state_dir, ignore_errors=True)
    shutil.rmtree(ws / bi.METADATA_DIR, ignore_errors=True)
    bi.DAEMON_ARGV = (python, "-m", "recalld.daemon.main", "serve")
    d = bi.Daemon(state_dir, state_dir.parent / f"{state_dir.name}.log")
    load = os.getloadavg()[0]
    try:
        t0 = time.perf_counter()
        d.start()
        assert d.proc is not None
        with TreeMemory(d.proc.pid) as mem:
            c = bi.connect(d.socket_path, bi.OPEN_TIMEOUT_S)
            bi.open_and_sync(c, ws, files)
            wall = time.perf_counter() - t0
            own, kids = cpu_s(d.proc.pid)
            bi.wait_committed(c)
            own2, kids2 = cpu_s(d.proc.pid)
        c.close()
        hwm = d.peak_rss_mb()
    finally:
        d.cleanup()
    return {"wall_s": round(wall, 3), "daemon_cpu_s": own, "workers_cpu_s": kids,
            "cpu_s": own + kids, "cpu_to_commit_s": own2 + kids2,
            "peak_pss_mb": round(mem.peak["tree_pss_mb"], 1),
            "daemon_hwm_mb": hwm, "load": load,
            "digest": generation_digest(ws / bi.METADATA_DIR)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ws", type=Path, required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--tree", action="append", required=True, help="name=python")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--state", type=Path, default=Path("bench-results/cold-state"))
    args = ap.parse_args()
    trees = [(n, os.path.abspath(p)) for n, p in (t.split("=", 1) for t in args.tree)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, python in order:
            res = one_build(python, args.ws.resolve(), args.state.resolve() / name,
                            args.files)
            runs[name].append(res)
            print(name, json.dumps({k: v for k, v in res.items() if k != "digest"}),
                  file=sys.stderr, flush=True)
    summary = {name: {k: statistics.median(x[k] for x in rs)
                      for k in ("wall_s", "daemon_cpu_s", "workers_cpu_s", "cpu_s",
                                "peak_pss_mb")}
               for name, rs in runs.items()}
    digests = {name: rs[-1]["digest"] for name, rs in runs.items()}
    print(json.dumps({"runs": runs, "medians": summary, "digests": digests,
                      "same_generation": len({json.dumps({k: v for k, v in d.items()
                                                          if not k.endswith("_file")},
                                                         sort_keys=True)
                                              for d in digests.values()}) == 1},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
