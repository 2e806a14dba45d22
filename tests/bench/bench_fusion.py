"""Hybrid retrieval, configuration by configuration, with BM25 beside it on the same run.

    .venv/bin/python tests/bench/run.py fusion [-- --sets locomo,scifact,cmrc2018]
    .venv/bin/python tests/bench/bench_fusion.py --prefetch    # only fill the vector store

In process, on the very chunks the daemon makes of the quality sets (``bench_quality``:
LoCoMo dev, every conversation; SciFact test, the whole corpus; CMRC 2018 dev), with the
daemon's own functions: ``chunker.chunk_markdown``, ``bm25`` + ``exact.exact_first`` (the
keyword branch), ``windows.windows`` (the vector unit), ``fusion.fuse`` (every fusion
mode) and ``fusion.context_lines`` (what a hit hands back). The local model's vectors come
from ``vecstore.VectorStore`` (``bench-results/embstore/``: every distinct text embedded
once, ever), so each configuration is a cheap re-score.

Rows (a retrieval report each: recall@5/@10, MRR, nDCG@10, ctx_chars@5, and the change
against ``bm25`` on the same run):

- ``bm25``: the keyword branch as the daemon ranks it (exact-term promotion);
- ``vec_chunk`` / ``vec_window<size>``: the vector branch alone, one vector per chunk or a
  chunk scored by its best window;
- ``default_<unit>``: what ``search.py`` does with the default ``SearchConfig``: the
  blind-keyword guard's keyword weight, ``search.fuse_branches`` (score fusion, the
  length penalty, the keyword branch's best hit kept within the first five);
  ``default_nokeep`` without that last rule, ``default_noguard`` without the guard;
- ``<mode>_<unit>_...``: fusion of the two: ``rrf`` (weighted reciprocal rank, weights
  vector:keyword, RRF k) or ``score`` (a convex combination of each branch's scores
  scaled to [0, 1] over the candidates), each with exact keyword hits first; ``+ctx``
  rows hand back the best window's lines (and their neighbours) instead of the chunk.

LoCoMo rows also carry two halves by conversation (``tune_...`` and ``held_out``): a
choice made on one half is checked on the other. ``xling`` is CMRC 2018's passages with
English glosses of its questions (``xling.py``): its hybrid must not fall below the
vector branch alone.

Candidate pools are 30 (``max_results`` 10 times the daemon's multiplier 3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import bench_quality as bq  # noqa: E402
import quality_lexical as ql  # noqa: E402
from vecstore import VectorStore  # noqa: E402

from recalld.daemon.config import SearchConfig  # noqa: E402
from recalld.daemon.index.bm25 import BM25Index  # noqa: E402
from recalld.daemon.index.chunker import Chunk  # noqa: E402
from recalld.daemon.index.exact import exact_first  # noqa: E402
from recalld.daemon.index.fusion import (  # noqa: E402
    fuse,
    fuse_scores,
    guarded_weight,
    keyword_reach,
)
from recalld.daemon.index.search import fuse_branches  # noqa: E402
from recalld.daemon.index.state import StoredChunk  # noqa: E402
from recalld.daemon.index.tokenizer import tokenize, tokenize_query  # noqa: E402
from recalld.daemon.index.windows import Window, around, chunk_windows, embed_units  # noqa: E402

K = 10
POOL = 30
SETS = ("locomo", "scifact", "cmrc2018", "xling")
Hits = list[tuple[int, float]]


@dataclass
class Prepared:
    qs: bq.QualitySet
    chunks: list[Chunk]
    wins: dict[int, list[list[Window]]]  # window size -> per chunk: its windows (lines)
    units: dict[int, list[list[str]]]  # window size -> per chunk: the texts embedded


def load(name: str, data: Path) -> bq.QualitySet:
    """A quality set by name; ``xling``: CMRC 2018's passages with the English glosses of
    its questions (``xling.py``), the set of the blind-keyword guard."""
    if name != "xling":
        return bq.load_set(name, data)
    import xling

    return xling.xling_set(data)


def prepare(name: str, data: Path, sizes: Sequence[int]) -> Prepared:
    qs = load(name, data)
    chunks = bq.chunks_of(qs)
    return Prepared(qs, chunks, {s: [chunk_windows(c.text, s) for c in chunks] for s in sizes},
                    {s: [embed_units(c.text, s) for c in chunks] for s in sizes})


def note_order(p: Prepared) -> list[str]:
    """Notes by how much the study needs their vectors: judged ones, then those in any
    query's BM25 top 30 (by best rank), then the rest."""
    judged = dict.fromkeys(path for ts in p.qs.targets for path, _ in ts)
    bm = BM25Index()
    bm.add_many((i, tokenize(c.index_text)) for i, c in enumerate(p.chunks))
    rank: dict[str, int] = {}
    for q in p.qs.queries:
        for r, (i, _) in enumerate(bm.search(tokenize_query(q), POOL)):
            path = p.chunks[i].path
            rank[path] = min(rank.get(path, POOL), r)
    near = sorted((path for path in rank if path not in judged), key=lambda x: (rank[x], x))
    rest = sorted(set(p.qs.notes) - judged.keys() - rank.keys())
    return [*judged, *near, *rest]


def restrict(p: Prepared, store: VectorStore, size: int) -> Prepared:
    """``p`` cut down to the notes whose windows are all embedded (queries whose judged
    notes are all among them), when a corpus is too large to embed in one sitting."""
    keep: set[str] = set()
    by_note: dict[str, list[int]] = {}
    for i, c in enumerate(p.chunks):
        by_note.setdefault(c.path, []).append(i)
    for path, idx in by_note.items():
        if store.has([t for i in idx for t in p.units[size][i]], is_query=False):
            keep.add(path)
    if len(keep) == len(p.qs.notes):
        return p
    qs = p.qs
    sel = [i for i, ts in enumerate(qs.targets) if all(path in keep for path, _ in ts)]
    sub = bq.QualitySet(qs.name, {k: v for k, v in qs.notes.items() if k in keep},
                        [qs.queries[i] for i in sel], [qs.targets[i] for i in sel],
                        [qs.categories[i] for i in sel],
                        {**qs.info, "restricted_to_embedded": {
                            "notes": len(keep), "of_notes": len(qs.notes),
                            "queries": len(sel), "of_queries": len(qs.queries)}})
    chunks = [c for c in p.chunks if c.path in keep]
    return Prepared(sub, chunks, {s: [chunk_windows(c.text, s) for c in chunks]
                                  for s in p.wins},
                    {s: [embed_units(c.text, s) for c in chunks] for s in p.units})


def query_subset(p: Prepared, store: VectorStore, n: int) -> Prepared:
    """All queries when every one is embedded, else the seeded ``n`` (``bq.subset``)."""
    if not n or store.has(p.qs.queries, is_query=True):
        return p
    return Prepared(bq.subset(p.qs, n, 0), p.chunks, p.wins, p.units)


def prefetch(store: VectorStore, data: Path, names: Sequence[str], sizes: Sequence[int],
             chunk_vectors: bool, first_queries: int = 0) -> None:
    """Embed what the study needs, cheapest and most needed first; a large corpus note
    group by note group (``note_order``), so a partial run is usable (``restrict``)."""
    for name in names:
        p = prepare(name, data, sizes)
        print(f"prefetch {name}: {len(p.qs.queries)} queries", file=sys.stderr, flush=True)
        if first_queries:
            # A seeded sample first, the corpus, then the remaining queries.
            store.embed(bq.subset(p.qs, first_queries, 0).queries, is_query=True)
        else:
            store.embed(p.qs.queries, is_query=True)
        order = note_order(p)
        for s in sizes:
            by_note: dict[str, list[str]] = {}
            for c, ts in zip(p.chunks, p.units[s], strict=True):
                by_note.setdefault(c.path, []).extend(ts)
            total = sum(len(t) for ts in by_note.values() for t in ts)
            print(f"prefetch {name}: {sum(map(len, by_note.values()))} windows of {s}, "
                  f"{total} chars", file=sys.stderr, flush=True)
            for g in range(0, len(order), 250):
                group = order[g:g + 250]
                store.embed([t for path in group for t in by_note[path]], is_query=False)
                print(f"prefetch {name}: notes {g + len(group)}/{len(order)} embedded "
                      f"({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        store.embed(p.qs.queries, is_query=True)
        if chunk_vectors:
            print(f"prefetch {name}: {len(p.chunks)} chunks", file=sys.stderr, flush=True)
            store.embed([c.text for c in p.chunks], is_query=False)


class Study:
    """One set's branches, ready to re-score under any configuration."""

    def __init__(self, p: Prepared, store: VectorStore, sizes: Sequence[int],
                 chunk_vectors: bool) -> None:
        self.p = p
        qs, chunks = p.qs, p.chunks
        self.bm = BM25Index()
        self.bm.add_many((i, tokenize(c.index_text)) for i, c in enumerate(chunks))
        self.stored = stored = {i: StoredChunk(i, str(i), c.path, c.start_line, c.end_line, c.text,
                                 c.heading, {}) for i, c in enumerate(chunks)}
        self.kw: list[Hits] = []
        self.exact: list[set[int]] = []
        #: the keyword weight of each query after the blind-keyword guard, as search.py
        self.kw_weight: list[float] = []
        default = SearchConfig()
        for q in qs.queries:
            terms = tokenize_query(q)
            hits, exact = exact_first(q, self.bm, self.bm.search(terms, POOL),
                                      stored, limit=POOL)
            self.kw.append(hits)
            self.exact.append(exact)
            reach = keyword_reach(terms, hits[0][1] if hits else 0.0, self.bm.doc_freq,
                                  len(self.bm))
            self.kw_weight.append(default.keyword_weight if exact else guarded_weight(
                default.keyword_weight, reach, full_at=default.keyword_guard))
        qvec = store.embed(qs.queries, is_query=True)
        #: unit -> per query: per chunk score (best window), and the best window's index
        self.vec: dict[str, list[Hits]] = {}
        self.best: dict[str, np.ndarray] = {}
        if chunk_vectors and store.has([c.text for c in chunks], is_query=False, share=0.97):
            cvec = store.embed([c.text for c in chunks], is_query=False)
            sims = qvec @ cvec.T
            self.vec["chunk"] = [top(row, POOL) for row in sims]
        for size in sizes:
            texts = [t for ts in p.units[size] for t in ts]
            if not store.has(texts, is_query=False, share=0.97):
                print(f"fusion {qs.name}: windows of {size} not all embedded yet: skipped",
                      file=sys.stderr, flush=True)
                continue
            wvec = store.embed(texts, is_query=False)
            counts = np.array([len(ts) for ts in p.units[size]])
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            per_chunk = []
            best = np.zeros((len(qs.queries), len(chunks)), dtype=np.int32)
            for qi in range(len(qs.queries)):
                sims = wvec @ qvec[qi]
                score = np.maximum.reduceat(sims, starts)
                # index of the best window inside its chunk
                arg = np.zeros(len(chunks), dtype=np.int32)
                for ci in np.flatnonzero(counts > 1):
                    s0 = starts[ci]
                    arg[ci] = int(np.argmax(sims[s0:s0 + counts[ci]]))
                best[qi] = arg
                per_chunk.append(top(score, POOL))
            self.vec[f"window{size}"] = per_chunk
            self.best[f"window{size}"] = best

    def hits_of(self, ranked: Sequence[Sequence[int]], unit: str | None = None,
                neighbours: int = -1) -> list[list[ql.Hit]]:
        out = []
        for qi, got in enumerate(ranked):
            row: list[ql.Hit] = []
            for ci in got[:K]:
                c = self.p.chunks[ci]
                if neighbours < 0 or unit is None or unit not in self.best:
                    row.append((c.path, c.start_line, c.end_line, len(c.text)))
                    continue
                size = int(unit.removeprefix("window"))
                w = self.p.wins[size][ci][int(self.best[unit][qi, ci])]
                first, last, text = around(c.text, w, neighbours)
                row.append((c.path, c.start_line + first, c.start_line + last, len(text)))
            out.append(row)
        return out

    def report(self, ranked: Sequence[Sequence[int]], unit: str | None = None,
               neighbours: int = -1) -> dict[str, Any]:
        hits = self.hits_of(ranked, unit, neighbours)
        m = bq.score(self.p.qs, hits)
        out = {k: m[k] for k in ("recall@5", "recall@10", "mrr", "ndcg@10", "ctx_chars@5")}
        for half, idx in halves(self.p.qs).items():
            h = ql.mean_metrics([ql.hit_metrics(hits[i], self.p.qs.targets[i]) for i in idx])
            out[half] = {k: h[k] for k in ("recall@5", "ndcg@10", "ctx_chars@5")}
        return out


def halves(qs: bq.QualitySet) -> dict[str, list[int]]:
    """LoCoMo's questions in two halves by conversation (every other one, sorted): a
    configuration chosen on ``tune`` is honest only if it holds on ``held_out``."""
    if qs.name != "locomo":
        return {}
    conv = [t[0][0].rsplit("/", 1)[1].split("-session")[0] if t else "" for t in qs.targets]
    tune = set(sorted(set(conv))[0::2])
    return {f"tune_{'+'.join(sorted(tune))}": [i for i, c in enumerate(conv) if c in tune],
            "held_out": [i for i, c in enumerate(conv) if c not in tune]}


def top(scores: np.ndarray, n: int) -> Hits:
    n = min(n, len(scores))
    idx = np.argpartition(-scores, n - 1)[:n]
    idx = idx[np.argsort(-scores[idx], kind="stable")]
    return [(int(i), float(scores[i])) for i in idx]


#: (keyword hits, vector hits, exact keys, chunks, the guarded keyword weight) -> ranking
Fuser = Callable[[Hits, Hits, set[int], dict[int, StoredChunk], float], list[int]]


def fusers(weights: Sequence[tuple[float, float]], ks: Sequence[int],
           convex: Sequence[float], penalties: Sequence[float]) -> dict[str, Fuser]:
    default = SearchConfig()
    no_keep = SearchConfig(keyword_best_within=0)
    # ``default`` is search.py's path: the guarded keyword weight, fusion, the keyword
    # branch's best hit kept within the first five; ``default_nokeep`` without that place.
    out: dict[str, Fuser] = {
        "default": lambda kh, vh, ex, ch, w: [
            f.key for f in fuse_branches(kh, vh, ex, default, ch, keyword_weight=w)],
        "default_nokeep": lambda kh, vh, ex, ch, w: [
            f.key for f in fuse_branches(kh, vh, ex, no_keep, ch, keyword_weight=w)],
        "default_noguard": lambda kh, vh, ex, ch, w: [
            f.key for f in fuse_branches(kh, vh, ex, default, ch)]}
    for vw, kw in weights:
        for k in ks:
            out[f"rrf_{vw}:{kw}_k{k}"] = (
                lambda kh, vh, ex, ch, w, vw=vw, kw=kw, k=k: [f.key for f in fuse(
                    kh, vh, keyword_weight=kw, vector_weight=vw, k=k, exact=ex)])
    for a in convex:
        for lp in penalties:
            out[f"score_{a}:{round(1 - a, 2)}_lp{lp}"] = (
                lambda kh, vh, ex, ch, w, a=a, lp=lp: [f.key for f in fuse_scores(
                    kh, vh, keyword_weight=1 - a, vector_weight=a, exact=ex,
                    lengths={k: len(c.text) for k, c in ch.items()}, length_penalty=lp)])
    return out


def study(st: Study, weights: Sequence[tuple[float, float]], ks: Sequence[int],
          convex: Sequence[float], penalties: Sequence[float],
          neighbours: Sequence[int]) -> dict[str, Any]:
    n = len(st.p.qs.queries)
    systems: dict[str, Any] = {"bm25": st.report([[k for k, _ in h] for h in st.kw])}
    for unit, lists in st.vec.items():
        systems[f"vec_{unit}"] = st.report([[k for k, _ in h] for h in lists])
    for unit, lists in st.vec.items():
        for name, fn in fusers(weights, ks, convex, penalties).items():
            ranked = [fn(st.kw[qi], lists[qi], st.exact[qi], st.stored, st.kw_weight[qi])
                      for qi in range(n)]
            systems[f"{name}_{unit}"] = st.report(ranked)
            if unit in st.best and name == "default":
                for nb in neighbours:
                    systems[f"{name}_{unit}+ctx{nb}"] = st.report(ranked, unit, nb)
    base = systems["bm25"]
    for row in systems.values():
        for m in ("recall@5", "ndcg@10"):
            row[f"delta_{m}"] = round(row[m] - base[m], 4)
        row["ctx_vs_bm25"] = round(row["ctx_chars@5"] / base["ctx_chars@5"], 3)
        for half in halves(st.p.qs):
            row[half]["delta_recall@5"] = round(
                row[half]["recall@5"] - base[half]["recall@5"], 4)
            row[half]["ctx_vs_bm25"] = round(
                row[half]["ctx_chars@5"] / base[half]["ctx_chars@5"], 3)
    return systems


def run_daemon(p: Prepared, store: VectorStore, out_dir: Path, *, seed_cache: bool,
               wait_s: float) -> dict[str, Any]:
    """The chosen defaults end to end: one real daemon, the set as two workspaces of the
    same notes, ``kw`` (no embedding model: BM25) and ``hy`` (the local model, every
    search setting at its default), each query through ``memory.search``."""
    import bench_index

    from recalld.daemon.config import EmbeddingModelConfig
    from recalld.daemon.index.embedcache import EmbeddingCache, text_hash
    from recalld.daemon.providers.embedding import EmbeddingClient

    qs = p.qs
    roots = {"kw": out_dir / "ws-kw", "hy": out_dir / "ws-hy"}
    for root in roots.values():
        bq.write_workspace(root, qs.notes)
    state = out_dir / "state"
    import shutil

    shutil.rmtree(state, ignore_errors=True)
    d = bench_index.Daemon(state, out_dir / "daemon.log")
    model = EmbeddingModelConfig(backend="local", model_name=store.model, dimensions=384)
    size = SearchConfig().vector_window_chars
    seeded = 0
    if seed_cache:
        # The vectors this bench already made with the same model, put where the daemon's
        # backfill looks first (its text-keyed cache): the daemon still windows, averages,
        # indexes, searches and fuses by itself.
        key = EmbeddingClient(model, None).vector_space_key()
        cache = EmbeddingCache(state / "data" / "state" / "embeddings" / f"{key}.log", 384)
        texts = list(dict.fromkeys(t for c in p.chunks for t in embed_units(c.text, size)))
        rows = store.embed(texts, is_query=False)
        cache.path.parent.mkdir(parents=True, exist_ok=True)
        # The daemon keeps its data folders private and refuses ones open to others.
        for folder in (cache.path.parent, *cache.path.parent.parents):
            if folder == state.parent:
                break
            folder.chmod(0o700)
        cache.open()
        try:
            seeded = cache.put_many((text_hash(t), r) for t, r in zip(texts, rows, strict=True))
        finally:
            cache.close()
    with d.config_path.open("a", encoding="utf-8") as fh:
        fh.write(f'[workspaces.kw]\npath = "{roots["kw"]}"\n'
                 f'[workspaces.hy]\npath = "{roots["hy"]}"\n'
                 f'embedding_model_config = {{backend = "local", model_name = "{store.model}",'
                 f' dimensions = 384}}\n')
    out: dict[str, Any] = {"seeded_vectors": seeded, "window_chars": size}
    try:
        out["ready_s"] = round(d.start(), 2)
        c = bench_index.connect(d.socket_path, bench_index.OPEN_TIMEOUT_S)
        try:
            for agent in roots:
                c.call("index.sync", {"agent_id": agent})
            t0 = time.perf_counter()
            while True:
                st = c.call("daemon.status")
                vec = next(w for w in st["workspaces"] if w["agent_id"] == "hy")
                vec = vec["index"]["vectors"]
                if vec["total"] and vec["coverage"] >= 1.0 and vec["state"] == "idle":
                    break
                if time.perf_counter() - t0 > wait_s:
                    raise TimeoutError(f"vectors not complete after {wait_s} s: {vec}")
                time.sleep(1.0)
            out["backfill_s"] = round(time.perf_counter() - t0, 1)
            out["vectors"] = {k: vec[k] for k in ("embedded", "total", "provider_texts",
                                                 "cache_texts")}
            for agent in roots:
                hits: list[list[ql.Hit]] = []
                modes: set[str] = set()
                lat: list[float] = []
                for q in qs.queries:
                    t1 = time.perf_counter()
                    reply = c.call("memory.search", {"agent_id": agent, "query": q,
                                                     "max_results": K})
                    lat.append((time.perf_counter() - t1) * 1e3)
                    modes.add(reply["mode"])
                    hits.append([bq._hit(r) for r in reply["results"]])
                m = bq.score(qs, hits)
                out[agent] = {**{k: m[k] for k in ("recall@5", "recall@10", "mrr", "ndcg@10",
                                                   "ctx_chars@5")},
                              "modes": sorted(modes),
                              "query_p50_ms": bench_index.pct(lat, 50)}
        finally:
            c.close()
    finally:
        d.cleanup()
    if "kw" in out and "hy" in out:
        out["delta_recall@5"] = round(out["hy"]["recall@5"] - out["kw"]["recall@5"], 4)
        out["ctx_vs_bm25"] = round(out["hy"]["ctx_chars@5"] / out["kw"]["ctx_chars@5"], 3)
    return out


def emit(out: dict[str, Any], path: Path | None) -> int:
    """Print ``out`` as JSON and, given a path, write it there too; the exit code."""
    text = json.dumps(out, indent=1)
    if path:
        path.write_text(text, encoding="utf-8")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="hybrid retrieval study (in process)")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--model", default="multilingual-e5-small")
    ap.add_argument("--sizes", default="400")
    ap.add_argument("--no-chunk-vectors", action="store_true")
    ap.add_argument("--prefetch", action="store_true")
    ap.add_argument("--weights", default="0.35:0.65,0.5:0.5,0.65:0.35")
    ap.add_argument("--rrf-k", default="60,10,5")
    ap.add_argument("--convex", default="0.3,0.4,0.5,0.6")
    ap.add_argument("--neighbours", default="4,8",
                    help="context rows: the best window and this many lines each side")
    ap.add_argument("--length-penalty", default="0,0.05,0.1")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--queries", type=int, default=1000,
                    help="a seeded sample of this many queries of a set whose queries are "
                         "not all embedded yet (and embedded first by --prefetch)")
    ap.add_argument("--quick", action="store_true", help="LoCoMo only, 300 seeded questions")
    ap.add_argument("--daemon", action="store_true",
                    help="also confirm the defaults through a real daemon (LoCoMo)")
    ap.add_argument("--no-seed-cache", action="store_true",
                    help="let the daemon embed everything itself (slow)")
    ap.add_argument("--daemon-wait-s", type=float, default=7200.0)
    a = ap.parse_args(argv)
    store = VectorStore(a.model)
    names = ["locomo"] if a.quick else [n for n in a.sets.split(",") if n]
    sizes = [int(s) for s in a.sizes.split(",") if s]
    if a.prefetch:
        prefetch(store, a.data, names, sizes, not a.no_chunk_vectors, a.queries)
        return 0
    weights = [tuple(float(x) for x in w.split(":")) for w in a.weights.split(",") if w]
    ks = [int(x) for x in a.rrf_k.split(",") if x]
    convex = [float(x) for x in a.convex.split(",") if x]
    neighbours = [int(x) for x in a.neighbours.split(",") if x]
    penalties = [float(x) for x in a.length_penalty.split(",") if x]
    out: dict[str, Any] = {"bench": "fusion", "model": a.model, "pool": POOL,
                           "loadavg_at_start": os.getloadavg(), "sets": {}}
    t0 = time.perf_counter()
    for name in names:
        p = prepare(name, a.data, sizes)
        p = query_subset(restrict(p, store, sizes[0]), store, a.queries)
        if a.quick:
            p.qs = bq.subset(p.qs, bq.QUICK_QUERIES, 0)
        st = Study(p, store, sizes, not a.no_chunk_vectors)
        systems = study(st, weights, ks, convex, penalties, neighbours)
        out["sets"][name] = {"info": p.qs.info,
                             "queries": len(p.qs.queries), "chunks": len(p.chunks),
                             "windows": {s: sum(map(len, p.wins[s])) for s in sizes},
                             "systems": systems}
        if a.daemon and name == "locomo":
            out["sets"][name]["daemon"] = run_daemon(
                p, store, bq.DEFAULT_OUT_DIR.parent / "fusion", seed_cache=not a.no_seed_cache,
                wait_s=a.daemon_wait_s)
    out["loadavg_at_end"] = os.getloadavg()
    out["embedded_now"] = {"texts": store.embedded_texts, "chars": store.embedded_chars,
                           "seconds": round(store.embed_s, 1)}
    out["total_s"] = round(time.perf_counter() - t0, 1)
    return emit(out, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
