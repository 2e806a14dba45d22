"""The blind-keyword guard of hybrid search: English questions over Chinese notes, and what
the guard costs on the other sets, in process with the local e5 model.

    .venv/bin/python tests/bench/run.py xling [-- --reach 0.3,0.5 --scifact-queries 100]

Sets (each on the very chunks the daemon makes of its notes):

- ``xling``: CMRC 2018 dev passages, the questions glossed into English keywords
  (``xling.py``: jieba + CC-CEDICT, only questions with a reasonable gloss);
- ``cmrc2018``: the same passages, a seeded sample of the Chinese questions;
- ``locomo``: the first ``--conversations`` LoCoMo dev conversations (category 5 excluded);
- ``scifact``: the first ``--scifact-queries`` SciFact test claims, their judged abstracts
  and seeded other abstracts up to ``--scifact-docs`` (embedding all 5,183 takes hours here).

Systems per set, all through the daemon's own functions (``tokenize``, ``BM25Index``,
``exact_first``, ``fusion.fuse``, ``fusion.keyword_reach``, ``fusion.guarded_weight``) with
the daemon's default weights, RRF k and candidate pool: ``bm25`` (exact-term promotion),
``vector`` (one vector per chunk, ``query:``/``passage:`` prefixes), ``hybrid`` (the fusion
before the guard) and ``hybrid_guard_<r>`` (the keyword weight scaled down below reach
``r``, to none at 0.4 of ``r``). Per set also the distribution of the keyword reach.
Embeddings are cached in ``bench-results/embcache/`` (``bench_vectors.Embedder``);
``--prepare`` only fills that
cache (start it early: the first run embeds for tens of minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import bench_quality as bq  # noqa: E402
import bench_vectors as bv  # noqa: E402
import xling  # noqa: E402

from recalld.daemon.config import SearchConfig  # noqa: E402
from recalld.daemon.index.bm25 import BM25Index  # noqa: E402
from recalld.daemon.index.chunker import Chunk  # noqa: E402
from recalld.daemon.index.exact import exact_first  # noqa: E402
from recalld.daemon.index.fusion import fuse, guarded_weight, keyword_reach  # noqa: E402
from recalld.daemon.index.state import StoredChunk  # noqa: E402
from recalld.daemon.index.tokenizer import tokenize, tokenize_query  # noqa: E402

K = 10
Hits = list[tuple[int, float]]
METRICS = ("recall@5", "recall@10", "mrr", "ndcg@10", "ctx_chars@5")


def locomo_part(data: Path, conversations: int) -> bq.QualitySet:
    """The first ``conversations`` LoCoMo dev conversations and their questions."""
    full = bq.locomo_set(data / "locomo")

    def conv(path: str) -> str:
        return path.rsplit("/", 1)[1].split("-session")[0]

    keep = set(sorted({conv(p) for p in full.notes})[:conversations])
    notes = {p: t for p, t in full.notes.items() if conv(p) in keep}
    idx = [i for i, t in enumerate(full.targets) if all(p in notes for p, _ in t)]
    return bq.QualitySet("locomo", notes, [full.queries[i] for i in idx],
                         [full.targets[i] for i in idx], [full.categories[i] for i in idx],
                         {"conversations": sorted(keep)})


def scifact_part(data: Path, queries: int, docs: int, seed: int) -> bq.QualitySet:
    """The first ``queries`` SciFact test claims, their judged abstracts and seeded others
    up to ``docs`` notes."""
    full = bq.load_set("scifact", data)
    n = min(queries, len(full.queries))
    judged = {p for t in full.targets[:n] for p, _ in t}
    others = sorted(set(full.notes) - judged)
    extra = random.Random(f"scifact-{seed}").sample(others, max(0, min(docs - len(judged),
                                                                         len(others))))
    notes = {p: full.notes[p] for p in sorted(judged | set(extra))}
    return bq.QualitySet("scifact", notes, full.queries[:n], full.targets[:n], [0] * n,
                         {"queries": n, "docs": len(notes), "of_docs": len(full.notes)})


def sets(a: argparse.Namespace) -> list[bq.QualitySet]:
    out = [xling.xling_set(a.data),
           bq.subset(bq.load_set("cmrc2018", a.data), a.cmrc_queries, a.seed),
           locomo_part(a.data, a.conversations),
           scifact_part(a.data, a.scifact_queries, a.scifact_docs, a.seed)]
    return [qs for qs in out if qs.name in a.sets]


def report(qs: bq.QualitySet, chunks: list[Chunk], ranked: list[list[int]]) -> dict[str, Any]:
    hits = [[(chunks[i].path, chunks[i].start_line, chunks[i].end_line, len(chunks[i].text))
             for i in got[:K]] for got in ranked]
    m = bq.score(qs, hits)
    return {k: round(m[k], 4) for k in METRICS}


def top(scores: np.ndarray, n: int) -> Hits:
    idx = np.argsort(-scores, kind="stable")[:n]
    return [(int(i), float(scores[i])) for i in idx]


def run_set(qs: bq.QualitySet, emb: bv.Embedder, reaches: list[float],
            cfg: SearchConfig) -> dict[str, Any]:
    chunks = bq.chunks_of(qs)
    print(f"xling: {qs.name}: {len(chunks)} chunks, {len(qs.queries)} queries",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    cvec = emb.embed([c.text for c in chunks], is_query=False)
    qvec = emb.embed(qs.queries, is_query=True)
    embed_s = time.perf_counter() - t0
    pool = min(K * cfg.candidate_multiplier, cfg.max_candidates)
    bm = BM25Index()
    bm.add_many((i, tokenize(c.index_text)) for i, c in enumerate(chunks))
    stored = {i: StoredChunk(i, str(i), c.path, c.start_line, c.end_line, c.text, c.heading, {})
              for i, c in enumerate(chunks)}
    kw: list[Hits] = []
    vec: list[Hits] = []
    exacts: list[set[int]] = []
    reach: list[float] = []
    for qi, q in enumerate(qs.queries):
        terms = tokenize_query(q)
        hits, exact = exact_first(q, bm, bm.search(terms, pool), stored, limit=pool)
        kw.append(hits)
        exacts.append(exact)
        reach.append(keyword_reach(terms, hits[0][1] if hits else 0.0, bm.doc_freq, len(bm)))
        vec.append(top(cvec @ qvec[qi], pool))

    def fused(full_at: float) -> list[list[int]]:
        out = []
        for qi in range(len(qs.queries)):
            w = cfg.keyword_weight if exacts[qi] else guarded_weight(
                cfg.keyword_weight, reach[qi], full_at=full_at)
            out.append([f.key for f in fuse(kw[qi], vec[qi], keyword_weight=w,
                                             vector_weight=cfg.vector_weight, k=cfg.rrf_k,
                                             exact=exacts[qi])])
        return out

    systems = {"bm25": report(qs, chunks, [[k for k, _ in h] for h in kw]),
               "vector": report(qs, chunks, [[k for k, _ in h] for h in vec]),
               "hybrid": report(qs, chunks, fused(0.0))}
    for r in reaches:
        systems[f"hybrid_guard_{r}"] = report(qs, chunks, fused(r))
    qr = np.array(reach)
    return {
        "queries": len(qs.queries), "chunks": len(chunks), "embed_s": round(embed_s, 1),
        "info": {k: v for k, v in qs.info.items() if k != "originals"},
        "reach": {"p10": round(float(np.percentile(qr, 10)), 3),
                  "median": round(statistics.median(reach), 3),
                  "p90": round(float(np.percentile(qr, 90)), 3),
                  **{f"share_below_{r}": round(float((qr < r).mean()), 3) for r in reaches}},
        "exact_queries": sum(1 for e in exacts if e),
        "systems": systems,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="blind-keyword guard of hybrid fusion")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--model", default="multilingual-e5-small")
    ap.add_argument("--sets", default="xling,cmrc2018,locomo,scifact")
    ap.add_argument("--reach", default="0.3,0.5,0.7",
                    help="guard thresholds (keyword_guard values) to compare")
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--cmrc-queries", type=int, default=300)
    ap.add_argument("--scifact-queries", type=int, default=100)
    ap.add_argument("--scifact-docs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prepare", action="store_true", help="only fill the embedding cache")
    ap.add_argument("--quick", action="store_true",
                    help="xling and cmrc2018 only, one LoCoMo conversation")
    a = ap.parse_args(argv)
    if a.quick:
        a.sets, a.conversations = "xling,cmrc2018,locomo", 1
    a.sets = set(a.sets.split(","))
    t_all = time.perf_counter()
    emb = bv.Embedder(a.model)
    chosen = sets(a)
    if a.prepare:
        for qs in chosen:
            chunks = bq.chunks_of(qs)
            print(f"xling: embedding {qs.name}: {len(chunks)} chunks", file=sys.stderr,
                  flush=True)
            emb.embed(qs.queries, is_query=True)
            emb.embed([c.text for c in chunks], is_query=False)
        return 0
    cfg = SearchConfig()
    reaches = [float(x) for x in a.reach.split(",")]
    res: dict[str, Any] = {"bench": "xling", "model": a.model, "loadavg_at_start":
                           os.getloadavg(), "weights": {"keyword": cfg.keyword_weight,
                                                        "vector": cfg.vector_weight,
                                                        "rrf_k": cfg.rrf_k},
                           "sets": {}}
    for qs in chosen:
        res["sets"][qs.name] = run_set(qs, emb, reaches, cfg)
    targets: dict[str, Any] = {}
    if "xling" in res["sets"]:
        s = res["sets"]["xling"]["systems"]
        name = f"hybrid_guard_{cfg.keyword_guard}"
        if name in s:
            targets["xling_hybrid_at_least_vector"] = {
                "system": name, "ndcg@10": s[name]["ndcg@10"],
                "vector": s["vector"]["ndcg@10"],
                "pass": s[name]["ndcg@10"] >= s["vector"]["ndcg@10"]}
    drops: dict[str, Any] = {}
    for set_name, r in res["sets"].items():
        if set_name == "xling":
            continue
        s = r["systems"]
        for name in s:
            if name.startswith("hybrid_guard_"):
                drops.setdefault(name, {})[set_name] = round(
                    min(s[name][m] - s["hybrid"][m] for m in bq.RANKING_METRICS), 4)
    res["guard_worst_change_vs_hybrid"] = drops
    res["targets"] = targets
    res["loadavg_at_end"] = os.getloadavg()
    res["total_s"] = round(time.perf_counter() - t_all, 1)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
