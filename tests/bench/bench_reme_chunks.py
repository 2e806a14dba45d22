"""What keeping ReMe's chunk boundaries costs in retrieval quality (docs/adr/0015).

A workspace ReMe 0.4.2 indexed keeps ReMe's chunks (boundaries and text) for every note
that has not changed since, so their vectors can be reused (daemon/index/reme_chunks.py).
This runs the shared sets of ``bench_quality`` twice through one real recalld daemon, in
the same run:

- ``recalld``: the notes alone (recalld's own chunker: the baseline);
- ``recalld_reme_boundaries``: the same notes after ReMe 0.4.2 indexed them (in its own
  venv, ``reme_baseline``; keyword-only, as QwenPaw runs it without an embedding model),
  so every chunk is ReMe's: the worst case, a workspace where nothing changed since ReMe.

Both are scored alike (``quality_lexical.hit_metrics``: recall@5/@10, MRR, nDCG@10, and
the characters the top 5 hand back); ``delta`` is the second minus the first.

    .venv/bin/python tests/bench/run.py reme_chunks [--quick] [--sets locomo,scifact]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_quality as bq
import reme_baseline

METRICS = ("recall@5", "recall@10", "mrr", "ndcg@10", "ctx_chars@5")


def run(names: list[str], *, quick: int, seed: int, out_dir: Path, data: Path = bq.DEFAULT_DATA,
        keep: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    sets = [bq.subset(bq.load_set(n, data), quick, seed) for n in names]
    plain = {qs.name: out_dir / f"ws-{qs.name}-plain" for qs in sets}
    reme = {qs.name: out_dir / f"ws-{qs.name}-reme" for qs in sets}
    built: dict[str, Any] = {}
    for qs in sets:
        bq.write_workspace(plain[qs.name], qs.notes)
        bq.write_workspace(reme[qs.name], qs.notes)
        print(f"reme-chunks: ReMe 0.4.2 indexes {qs.name}", file=sys.stderr, flush=True)
        t1 = time.perf_counter()
        got = reme_baseline.run_reme(reme[qs.name], queries=[], result_queries=[], edits=0,
                                     warm_runs=0)
        built[qs.name] = {"reme_chunks": got.get("chunks"), "files": got.get("files"),
                          "s": round(time.perf_counter() - t1, 1)}
    print("reme-chunks: recalld on the plain notes", file=sys.stderr, flush=True)
    ours = bq.run_recalld(sets, plain, out_dir / "state-plain")
    print("reme-chunks: recalld on the notes ReMe indexed", file=sys.stderr, flush=True)
    kept = bq.run_recalld(sets, reme, out_dir / "state-reme")
    result: dict[str, Any] = {
        "bench": "reme-chunks", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick_queries_per_set": quick or None, "seed": seed,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "scoring": bq.ql.hit_metrics.__doc__, "sets": {},
    }
    for qs in sets:
        a = {**bq.score(qs, ours[qs.name]["hits"]), "chunks": ours[qs.name]["chunks"]}
        b = {**bq.score(qs, kept[qs.name]["hits"]), "chunks": kept[qs.name]["chunks"]}
        result["sets"][qs.name] = {
            "info": qs.info, "reme_build": built[qs.name],
            "recalld": {k: a[k] for k in (*METRICS, "chunks", "queries")},
            "recalld_reme_boundaries": {k: b[k] for k in (*METRICS, "chunks", "queries")},
            "delta": {k: round(b[k] - a[k], 4) for k in METRICS},
        }
    result["summary"] = {n: e["delta"]["recall@5"] for n, e in result["sets"].items()}
    if not keep:
        for p in [*plain.values(), *reme.values(), out_dir / "state-plain",
                  out_dir / "state-reme"]:
            shutil.rmtree(p, ignore_errors=True)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="quality cost of keeping ReMe's chunk boundaries")
    ap.add_argument("--quick", action="store_true",
                    help=f"{bq.QUICK_QUERIES} seeded queries per set (corpora stay whole)")
    ap.add_argument("--sets", default=",".join(bq.SETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--keep-workspaces", action="store_true")
    ap.add_argument("--out-dir", type=Path, default=bq.REPO_ROOT / "bench-results" / "reme-chunks")
    a = ap.parse_args(argv)
    names = [s.strip() for s in a.sets.split(",") if s.strip()]
    res = run(names, quick=bq.QUICK_QUERIES if a.quick else 0, seed=a.seed, out_dir=a.out_dir,
              data=a.data, keep=a.keep_workspaces)
    print(json.dumps(res, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
