"""Fusion study: why hybrid adds little over BM25 on LoCoMo, configuration by configuration.

    .venv/bin/python tests/bench/run.py fusion [-- --conversations 2 --model multilingual-e5-small]

In process, on the very chunks the daemon makes of LoCoMo dev sessions (the first
``--conversations`` conversations; category 5 excluded, as in ``quality``), with the local
model's embeddings cached under ``bench-results/embcache/`` (``bench_vectors.Embedder``).
A retrieval report (recall@5/@10, MRR, nDCG@10, ctx_chars@5) for every configuration:

- ``bm25``: our keyword ranking with exact-term promotion (the baseline every other row is
  compared with, ``delta_recall@5``);
- vector branch alone: ``vec_chunk`` (one vector per chunk, ``passage:``/``query:``
  prefixes as shipped), ``vec_chunk_symmetric`` (the query embedded as a passage: what
  the prefixes are worth), ``vec_window`` (each chunk scored by its best window of about
  ``--window`` characters, whole lines);
- ``hybrid_<branch>_<vw>:<kw>_k<k>``: weighted RRF (``fusion.fuse``, exact keyword hits
  first) of BM25 with that vector branch, for each weight pair and RRF k;
- ``hybrid_<branch>_guard_...``: the same with a blind-branch guard: when the query has
  no keyword hit at all the vector list ranks alone, and when BM25's best score is weak
  (below ``--guard`` times its median over the queries) the keyword weight is halved.

Candidate pools are 30 (the daemon's ``max_results`` 10 times its multiplier 3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import bench_quality as bq  # noqa: E402
import bench_vectors as bv  # noqa: E402

from recalld.daemon.index.bm25 import BM25Index  # noqa: E402
from recalld.daemon.index.chunker import Chunk  # noqa: E402
from recalld.daemon.index.exact import exact_first  # noqa: E402
from recalld.daemon.index.fusion import fuse  # noqa: E402
from recalld.daemon.index.state import StoredChunk  # noqa: E402
from recalld.daemon.index.tokenizer import tokenize, tokenize_query  # noqa: E402

K = 10
POOL = 30
Hits = list[tuple[int, float]]


def windows(chunk: Chunk, size: int) -> list[str]:
    """``chunk``'s text in windows of whole lines, each about ``size`` characters."""
    out: list[str] = []
    cur: list[str] = []
    n = 0
    for line in chunk.text.split("\n"):
        if cur and n + len(line) > size:
            out.append("\n".join(cur))
            cur, n = [], 0
        if line.strip():
            cur.append(line)
            n += len(line) + 1
    if cur:
        out.append("\n".join(cur))
    return out or [chunk.text]


def top(scores: np.ndarray, n: int) -> Hits:
    idx = np.argsort(-scores, kind="stable")[:n]
    return [(int(i), float(scores[i])) for i in idx]


def report(qs: bq.QualitySet, chunks: Sequence[Chunk], ranked: list[list[int]]) -> dict[str, Any]:
    hits = [[(chunks[i].path, chunks[i].start_line, chunks[i].end_line, len(chunks[i].text))
             for i in got[:K]] for got in ranked]
    m = bq.score(qs, hits)
    return {k: m[k] for k in ("recall@5", "recall@10", "mrr", "ndcg@10", "ctx_chars@5")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fusion study on LoCoMo dev (in process)")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--model", default="multilingual-e5-small")
    ap.add_argument("--window", type=int, default=400)
    ap.add_argument("--weights", default="0.35:0.65,0.5:0.5,0.7:0.3")
    ap.add_argument("--rrf-k", default="60,10")
    ap.add_argument("--guard", type=float, default=0.5)
    ap.add_argument("--quick", action="store_true", help="one conversation")
    a = ap.parse_args(argv)
    t_all = time.perf_counter()
    full = bq.locomo_set(a.data / "locomo")
    convs = sorted({p.rsplit("/", 1)[1].split("-session")[0] for p in full.notes})
    keep = set(convs[:1 if a.quick else a.conversations])
    notes = {p: t for p, t in full.notes.items()
             if p.rsplit("/", 1)[1].split("-session")[0] in keep}
    idx = [i for i, t in enumerate(full.targets) if all(p in notes for p, _ in t)]
    qs = bq.QualitySet("locomo", notes, [full.queries[i] for i in idx],
                       [full.targets[i] for i in idx], [full.categories[i] for i in idx],
                       {"conversations": sorted(keep)})
    chunks = bq.chunks_of(qs)
    wins = [windows(c, a.window) for c in chunks]
    flat = [w for ws in wins for w in ws]
    owner = np.repeat(np.arange(len(chunks)), [len(ws) for ws in wins])
    print(f"fusion: {len(chunks)} chunks, {len(flat)} windows, {len(qs.queries)} questions",
          file=sys.stderr, flush=True)
    emb = bv.Embedder(a.model)
    t0 = time.perf_counter()
    cvec = emb.embed([c.text for c in chunks], is_query=False)
    wvec = emb.embed(flat, is_query=False)
    qvec = emb.embed(qs.queries, is_query=True)
    qsym = emb.embed(qs.queries, is_query=False)
    embed_s = time.perf_counter() - t0

    bm = BM25Index()
    bm.add_many((i, tokenize(c.index_text)) for i, c in enumerate(chunks))
    stored = {i: StoredChunk(i, str(i), c.path, c.start_line, c.end_line, c.text, c.heading, {})
              for i, c in enumerate(chunks)}
    kw_hits: list[Hits] = []
    exacts: list[set[int]] = []
    for q in qs.queries:
        hits, exact = exact_first(q, bm, bm.search(tokenize_query(q), POOL), stored, limit=POOL)
        kw_hits.append(hits)
        exacts.append(exact)
    best_kw = [h[0][1] if h else 0.0 for h in kw_hits]
    median_kw = statistics.median([b for b in best_kw if b > 0] or [1.0])

    branches: dict[str, list[Hits]] = {"chunk": [], "chunk_symmetric": [], "window": []}
    for qi in range(len(qs.queries)):
        branches["chunk"].append(top(cvec @ qvec[qi], POOL))
        branches["chunk_symmetric"].append(top(cvec @ qsym[qi], POOL))
        per_chunk = np.full(len(chunks), -1.0)
        np.maximum.at(per_chunk, owner, wvec @ qvec[qi])
        branches["window"].append(top(per_chunk, POOL))

    systems: dict[str, Any] = {"bm25": report(qs, chunks, [[k for k, _ in h] for h in kw_hits])}
    for name, lists in branches.items():
        systems[f"vec_{name}"] = report(qs, chunks, [[k for k, _ in h] for h in lists])
    weights = [tuple(float(x) for x in w.split(":")) for w in a.weights.split(",")]
    for branch in ("chunk", "window"):
        for vw, kw in weights:
            for k in (int(x) for x in a.rrf_k.split(",")):
                for guard in (False, True):
                    ranked = []
                    for qi, vh in enumerate(branches[branch]):
                        kh, w_kw = kw_hits[qi], kw
                        if guard and not kh:
                            ranked.append([key for key, _ in vh])
                            continue
                        if guard and best_kw[qi] < a.guard * median_kw:
                            w_kw = kw / 2
                        fused = fuse(kh, vh, keyword_weight=w_kw, vector_weight=vw, k=k,
                                     exact=exacts[qi])
                        ranked.append([f.key for f in fused])
                    name = (f"hybrid_{branch}{'_guard' if guard else ''}_{vw}:{kw}_k{k}")
                    systems[name] = report(qs, chunks, ranked)
    base = systems["bm25"]
    for row in systems.values():
        row["delta_recall@5"] = round(row["recall@5"] - base["recall@5"], 4)
        row["ctx_vs_bm25"] = round(row["ctx_chars@5"] / base["ctx_chars@5"], 3)
    best = max((n for n in systems if n.startswith("hybrid")),
               key=lambda n: (systems[n]["recall@5"], -systems[n]["ctx_chars@5"]))
    out = {"bench": "fusion", "model": a.model, "conversations": sorted(keep),
           "chunks": len(chunks), "windows": len(flat), "window_chars": a.window,
           "questions": len(qs.queries), "embed_s": round(embed_s, 1),
           "loadavg": os.getloadavg(), "systems": systems,
           "best_hybrid": {"name": best, **systems[best]},
           "target": "LoCoMo recall@5 >= BM25 + 0.04 with ctx_chars@5 <= BM25's",
           "target_met_by": sorted(n for n, r in systems.items()
                                   if r["delta_recall@5"] >= 0.04 and r["ctx_vs_bm25"] <= 1.0),
           "total_s": round(time.perf_counter() - t_all, 1)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
