"""More ways to combine the branches, measured on every fusion set beside the defaults.

    .venv/bin/python tests/bench/fusion_rescore.py [--sets locomo,scifact,cmrc2018,xling]
                                                   [--only PREFIXES] [--learned] [--out FILE]

In process on ``bench_fusion.Study`` (the daemon's chunks, BM25 + exact rule, the guarded
keyword weight, window vectors from ``bench-results/embstore``; nothing is embedded). Each
row changes one thing in the daemon's default fusion (``fuse_scores`` at the default
weights and length penalty, exact hits first, the keyword branch's best hit kept within
five: ``row default_check`` re-implements it and must equal ``default``):

- ``vprf_k<k>_b<beta>``: vector-space pseudo-relevance feedback: the query vector plus
  ``beta`` times the mean of the best windows of the vector branch's top ``k`` chunks,
  searched again;
- ``maxmean_<l>``: a chunk's vector score its best window's cosine plus ``l`` times the
  mean cosine of all its windows;
- ``conf_<how>_g<g>``: each branch's weight times its confidence for this query to the
  power ``g``: ``gap`` is one minus the mean scaled score of its ranks 2-5 (a clear
  head is confident, a flat head is not), ``entropy`` one minus the normalised entropy of
  its top 10 scaled scores;
- ``prox_n<n>_d<d>`` / ``cov_n<n>_d<d>``: a second stage over the fused top ``n``: each
  candidate gains ``d`` times its best window's lexical match with the query: the share
  of the query terms' IDF the window holds (``cov``), times a proximity factor from the
  shortest token span covering those terms (``prox``);
- ``rareprox_n<n>_d<d>``: ``prox`` over the query's rare terms only (held by at most
  5 % of the chunks);
- ``bm25_k<k1>_b<b>``: the keyword branch with other BM25 parameters (one setting for all
  sets; the exact rule and the guard recomputed on it);
- ``mix_a<a>_k<k>`` / ``mix_v<w>_a<a>_k<k>``: score fusion and weighted reciprocal rank
  (k) mixed, ``a`` the reciprocal rank's share (both on [0, 1]), at the default weights or
  with vector weight ``w`` (keyword ``1 - w``, guarded);
- ``qtw_<beta>``: the vector branch re-scored per window as cosine plus ``beta`` times the
  window's share of the query terms' IDF, a chunk by its best window;
- ``combo_...``: some of the above together.

``--learned`` adds ``learned_lr``: a logistic regression over these signals (``FEATURES``)
trained on LoCoMo's tuning half and applied, with the same weights, to every set; and
``learned_lr_nolength`` without the length signal. It bounds what any linear mix of them
can do.

LoCoMo rows carry the two halves by conversation (choose on ``tune_...``, check on
``held_out``); every row carries each set's change against ``bm25`` and ``default``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import bench_fusion as bf  # noqa: E402
import bench_quality as bq  # noqa: E402
from vecstore import VectorStore  # noqa: E402

from recalld.daemon.config import SearchConfig  # noqa: E402
from recalld.daemon.index.bm25 import BM25Index  # noqa: E402
from recalld.daemon.index.exact import exact_first  # noqa: E402
from recalld.daemon.index.fusion import (  # noqa: E402
    PENALTY_CHARS,
    Fused,
    guarded_weight,
    keep_within,
    keyword_reach,
)
from recalld.daemon.index.tokenizer import tokenize, tokenize_query  # noqa: E402

SIZE = 400
RARE_SHARE = 0.05
Hits = list[tuple[int, float]]
DEFAULT = SearchConfig()


def scaled(hits: Sequence[tuple[int, float]]) -> dict[int, float]:
    if not hits:
        return {}
    vals = [v for _, v in hits]
    hi, lo = max(vals), min(vals)
    return {k: (v - lo) / (hi - lo) if hi > lo else 1.0 for k, v in hits}


def min_span(positions: dict[str, list[int]]) -> int:
    """The fewest tokens of a window that hold one occurrence of every term given."""
    events = sorted((p, t) for t, ps in positions.items() for p in ps)
    need = len(positions)
    count: dict[str, int] = {}
    best = 1 << 30
    left = 0
    have = 0
    for p, t in events:
        count[t] = count.get(t, 0) + 1
        if count[t] == 1:
            have += 1
        while have == need:
            best = min(best, p - events[left][0] + 1)
            lt = events[left][1]
            count[lt] -= 1
            if count[lt] == 0:
                have -= 1
            left += 1
    return best


class Rescore:
    def __init__(self, st: bf.Study, store: VectorStore) -> None:
        self.st = st
        p = st.p
        units = p.units[SIZE]
        self.counts = np.array([len(ts) for ts in units])
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.win_of = np.repeat(np.arange(len(units)), self.counts)
        texts = [t for ts in units for t in ts]
        self.wvec = store.embed(texts, is_query=False).astype(np.float32)
        self.qvec = store.embed(p.qs.queries, is_query=True).astype(np.float32)
        self.lens = {i: len(c.text) for i, c in enumerate(p.chunks)}
        self.n = len(p.qs.queries)
        self.vec = st.vec[f"window{SIZE}"]
        self.win_tokens = [tokenize(t) for t in texts]
        self.win_sets = [set(t) for t in self.win_tokens]
        by_term: dict[str, list[int]] = {}
        for w, ts in enumerate(self.win_sets):
            for t in ts:
                by_term.setdefault(t, []).append(w)
        self.term_windows = {t: np.array(ws) for t, ws in by_term.items()}
        self.qterms = [list(dict.fromkeys(tokenize_query(q))) for q in p.qs.queries]
        n_docs = len(st.bm)
        self.qidf: list[dict[str, float]] = []
        for terms in self.qterms:
            w = {}
            for t in terms:
                df = max(st.bm.doc_freq(t), 1)
                w[t] = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
            self.qidf.append(w)
        # The query's rare terms: held by at most RARE_SHARE of the chunks (every term
        # when none is that rare).
        self.qrare = [{t: x for t, x in w.items()
                       if st.bm.doc_freq(t) <= RARE_SHARE * n_docs} or w for w in self.qidf]
        self._sims: dict[int, np.ndarray] = {}
        self.st_tokens = [set(tokenize(c.index_text)) for c in p.chunks]

    def sims(self, qi: int) -> np.ndarray:
        got = self._sims.get(qi)
        if got is None:
            got = self.wvec @ self.qvec[qi]
            if len(self._sims) > 64:
                self._sims.clear()
            self._sims[qi] = got
        return got

    # -- the fusion itself -------------------------------------------------------------

    def fuse(self, qi: int, *, kw: Hits | None = None, vec: Hits | None = None,
             exact: set[int] | None = None, kw_weight: float | None = None,
             conf: Callable[[Hits], float] | None = None, gamma: float = 0.0,
             mix: tuple[float, int] | None = None, vector_weight: float | None = None,
             second: Callable[[int, int], float] | None = None, second_n: int = 0,
             second_d: float = 0.0, extra: Sequence[tuple[Hits, float]] = ()) -> list[int]:
        """The default fusion with one thing changed; ``extra``: more ranked branches,
        each with its weight beside the keyword and vector weights."""
        kh = self.st.kw[qi] if kw is None else kw
        vh = self.vec[qi] if vec is None else vec
        ex = self.st.exact[qi] if exact is None else exact
        wk0 = self.st.kw_weight[qi] if kw_weight is None else kw_weight
        k, v = scaled(kh), scaled(vh)
        if vector_weight is not None:
            wk0 = wk0 / DEFAULT.keyword_weight * (1 - vector_weight)
        wk = wk0 if k else 0.0
        wv = (DEFAULT.vector_weight if vector_weight is None else vector_weight) if v else 0.0
        if conf is not None and gamma:
            wk *= conf(kh) ** gamma if k else 0.0
            wv *= conf(vh) ** gamma if v else 0.0
        more = [(h, scaled(h), w) for h, w in extra if h]
        total = (wk + wv + sum(w for _, _, w in more)) or 1.0
        per_char = DEFAULT.length_penalty / PENALTY_CHARS
        keys = k.keys() | v.keys()
        for _, e, _ in more:
            keys |= e.keys()
        score = {c: (wk * k.get(c, 0.0) + wv * v.get(c, 0.0)
                     + sum(w * e.get(c, 0.0) for _, e, w in more)) / total for c in keys}
        if mix is not None:
            a, rk = mix
            kr = {c: r for r, (c, _) in enumerate(kh, start=1)}
            vr = {c: r for r, (c, _) in enumerate(vh, start=1)}
            er = [({c: r for r, (c, _) in enumerate(h, start=1)}, w) for h, _, w in more]
            top = total / (rk + 1)
            rrf = {c: (wk / (rk + kr[c]) if c in kr else 0.0)
                   + (wv / (rk + vr[c]) if c in vr else 0.0)
                   + sum(w / (rk + r[c]) for r, w in er if c in r) for c in keys}
            score = {c: (1 - a) * s + a * rrf[c] / top for c, s in score.items()}
        score = {c: s - per_char * self.lens[c] for c, s in score.items()}
        fused = [Fused(c, score[c], None, None, c in ex and c in k) for c in keys]
        fused.sort(key=lambda f: (not f.exact, -f.score, f.key))
        if second is not None and second_n:
            head = fused[:second_n]
            head = [Fused(f.key, f.score + second_d * second(qi, f.key), None, None, f.exact)
                    for f in head]
            head.sort(key=lambda f: (not f.exact, -f.score, f.key))
            fused = head + fused[second_n:]
        fused = keep_within(fused, kh[0][0] if kh else None, DEFAULT.keyword_best_within)
        return [f.key for f in fused]

    # -- the vector branch, other ways -----------------------------------------------

    def chunk_top(self, win_scores: np.ndarray) -> Hits:
        return bf.top(np.maximum.reduceat(win_scores, self.starts), bf.POOL)

    def vprf(self, qi: int, k: int, beta: float) -> Hits:
        sims = self.sims(qi)
        best = []
        for c, _ in self.vec[qi][:k]:
            s0 = self.starts[c]
            best.append(int(s0 + np.argmax(sims[s0:s0 + self.counts[c]])))
        q = self.qvec[qi] + beta * self.wvec[best].mean(0)
        q /= np.linalg.norm(q)
        return self.chunk_top(self.wvec @ q)

    def maxmean(self, qi: int, lam: float) -> Hits:
        sims = self.sims(qi)
        mx = np.maximum.reduceat(sims, self.starts)
        mean = np.add.reduceat(sims, self.starts) / self.counts
        return bf.top(mx + lam * mean, bf.POOL)

    def coverage(self, qi: int, w: int) -> float:
        idf = self.qidf[qi]
        total = sum(idf.values()) or 1.0
        return sum(x for t, x in idf.items() if t in self.win_sets[w]) / total

    def qtw(self, qi: int, beta: float) -> Hits:
        sims = self.sims(qi).copy()
        idf = self.qidf[qi]
        total = sum(idf.values()) or 1.0
        # Only windows holding some query term change; the rest keep their cosine.
        for t, x in idf.items():
            held = self.term_windows.get(t)
            if held is not None:
                sims[held] += beta * x / total
        return self.chunk_top(sims)

    # -- second stage: the best window's lexical match ---------------------------------

    def window_match(self, qi: int, c: int, proximity: bool, rare: bool = False) -> float:
        idf = self.qrare[qi] if rare else self.qidf[qi]
        total = sum(idf.values()) or 1.0
        best = 0.0
        for w in range(self.starts[c], self.starts[c] + self.counts[c]):
            s = self.win_sets[w]
            held = [t for t in idf if t in s]
            if not held:
                continue
            cov = sum(idf[t] for t in held) / total
            if proximity and len(held) > 1:
                pos: dict[str, list[int]] = {t: [] for t in held}
                for i, tok in enumerate(self.win_tokens[w]):
                    if tok in pos:
                        pos[tok].append(i)
                span = min_span(pos)
                cov *= 1.0 / (1.0 + max(0, span - len(held)) / 10.0)
            best = max(best, cov)
        return best

    # -- the keyword branch with other BM25 parameters ---------------------------------

    def keyword_with(self, k1: float, b: float) -> tuple[list[Hits], list[set[int]],
                                                          list[float]]:
        bm = BM25Index(k1=k1, b=b)
        bm.add_many((i, tokenize(c.index_text)) for i, c in enumerate(self.st.p.chunks))
        kws, exs, wts = [], [], []
        for q in self.st.p.qs.queries:
            terms = tokenize_query(q)
            hits, exact = exact_first(q, bm, bm.search(terms, bf.POOL), self.st.stored,
                                      limit=bf.POOL)
            reach = keyword_reach(terms, hits[0][1] if hits else 0.0, bm.doc_freq, len(bm))
            kws.append(hits)
            exs.append(exact)
            wts.append(DEFAULT.keyword_weight if exact else guarded_weight(
                DEFAULT.keyword_weight, reach, full_at=DEFAULT.keyword_guard))
        return kws, exs, wts


def conf_gap(hits: Hits) -> float:
    s = scaled(hits)
    vals = [s[c] for c, _ in hits[1:5]]
    return max(1e-3, 1.0 - (sum(vals) / len(vals) if vals else 0.0))


def conf_entropy(hits: Hits) -> float:
    s = scaled(hits)
    vals = np.array([s[c] for c, _ in hits[:10]]) + 1e-6
    if len(vals) < 2:
        return 1.0
    p = vals / vals.sum()
    return max(1e-3, 1.0 - float(-(p * np.log(p)).sum() / math.log(len(vals))))


Row = Callable[[], list[list[int]]]


def rows(r: Rescore, bm25_grid: Sequence[tuple[float, float]]) -> dict[str, Row]:
    n = range(r.n)
    out: dict[str, Row] = {
        "default_check": lambda: [r.fuse(q) for q in n]}
    for k in (3, 5, 10):
        for beta in (0.3, 0.6, 1.0):
            out[f"vprf_k{k}_b{beta}"] = lambda k=k, b=beta: [
                r.fuse(q, vec=r.vprf(q, k, b)) for q in n]
    for lam in (0.1, 0.25, 0.5, 1.0):
        out[f"maxmean_{lam}"] = lambda lam=lam: [r.fuse(q, vec=r.maxmean(q, lam)) for q in n]
    for how, fn in (("gap", conf_gap), ("entropy", conf_entropy)):
        for g in (0.5, 1.0, 2.0):
            out[f"conf_{how}_g{g}"] = lambda fn=fn, g=g: [
                r.fuse(q, conf=fn, gamma=g) for q in n]
    for prox in (False, True):
        for nn in (8, 10):
            for d in (0.05, 0.1, 0.2, 0.4):
                out[f"{'prox' if prox else 'cov'}_n{nn}_d{d}"] = (
                    lambda prox=prox, nn=nn, d=d: [r.fuse(
                        q, second=lambda qi, c: r.window_match(qi, c, prox), second_n=nn,
                        second_d=d) for q in n])
    for nn in (8, 10):
        for d in (0.1, 0.2, 0.4):
            out[f"rareprox_n{nn}_d{d}"] = lambda nn=nn, d=d: [r.fuse(
                q, second=lambda qi, c: r.window_match(qi, c, True, True), second_n=nn,
                second_d=d) for q in n]
    for a in (0.25, 0.5, 0.75):
        for k in (2, 5, 10, 30, 60):
            out[f"mix_a{a}_k{k}"] = lambda a=a, k=k: [r.fuse(q, mix=(a, k)) for q in n]
    for vw in (0.3, 0.5):
        for a in (0.25, 0.5):
            for k in (5, 60):
                out[f"mix_v{vw}_a{a}_k{k}"] = lambda vw=vw, a=a, k=k: [
                    r.fuse(q, mix=(a, k), vector_weight=vw) for q in n]
    for beta in (0.02, 0.05, 0.1):
        out[f"qtw_{beta}"] = lambda b=beta: [r.fuse(q, vec=r.qtw(q, b)) for q in n]
    # Combinations: the best of two kinds on LoCoMo's tuning half, and the rows that
    # helped SciFact most.
    cov = lambda qi, c: r.window_match(qi, c, False)  # noqa: E731
    out["combo_qtw0.05+cov_n8_d0.4"] = lambda: [
        r.fuse(q, vec=r.qtw(q, 0.05), second=cov, second_n=8, second_d=0.4) for q in n]
    out["combo_maxmean0.25+mix_a0.5_k5"] = lambda: [
        r.fuse(q, vec=r.maxmean(q, 0.25), mix=(0.5, 5)) for q in n]
    out["combo_maxmean0.25+cov_n8_d0.2"] = lambda: [
        r.fuse(q, vec=r.maxmean(q, 0.25), second=cov, second_n=8, second_d=0.2) for q in n]
    out["combo_maxmean0.25+conf_gap_g0.5"] = lambda: [
        r.fuse(q, vec=r.maxmean(q, 0.25), conf=conf_gap, gamma=0.5) for q in n]
    out["combo_maxmean0.25+mix_a0.25_k5+cov_n8_d0.1"] = lambda: [
        r.fuse(q, vec=r.maxmean(q, 0.25), mix=(0.25, 5), second=cov, second_n=8,
               second_d=0.1) for q in n]
    for k1, b in bm25_grid:
        def bm(k1: float = k1, b: float = b) -> list[list[int]]:
            kws, exs, wts = r.keyword_with(k1, b)
            return [r.fuse(q, kw=kws[q], exact=exs[q], kw_weight=wts[q]) for q in n]
        out[f"bm25_k{k1}_b{b}"] = bm
    return out


# -- a learned combination: how far any linear mix of these signals goes ---------------

FEATURES = ("kw", "vec", "in_kw", "in_vec", "kw_rank", "vec_rank", "best_cos", "mean_cos",
            "cov", "prox", "chunk_cov", "length", "guarded_kw")


def features(r: Rescore, qi: int) -> tuple[list[int], np.ndarray]:
    """Every candidate of either branch and its signals (cosines relative to the query's
    best chunk, so they compare across queries)."""
    kh, vh = r.st.kw[qi], r.vec[qi]
    k, v = scaled(kh), scaled(vh)
    kr = {c: i for i, (c, _) in enumerate(kh)}
    vr = {c: i for i, (c, _) in enumerate(vh)}
    keys = sorted(k.keys() | v.keys())
    sims = r.sims(qi)
    best = np.maximum.reduceat(sims, r.starts)
    mean = np.add.reduceat(sims, r.starts) / r.counts
    top = float(best.max())
    idf = r.qidf[qi]
    total = sum(idf.values()) or 1.0
    wk = r.st.kw_weight[qi] / DEFAULT.keyword_weight
    rows = []
    for c in keys:
        cset = r.st_tokens[c]
        rows.append([k.get(c, 0.0), v.get(c, 0.0), float(c in k), float(c in v),
                     1.0 / (kr.get(c, 60) + 5), 1.0 / (vr.get(c, 60) + 5),
                     float(best[c]) - top, float(mean[c]) - top,
                     r.window_match(qi, c, False), r.window_match(qi, c, True),
                     sum(x for t, x in idf.items() if t in cset) / total,
                     r.lens[c] / PENALTY_CHARS, wk * k.get(c, 0.0)])
    return keys, np.array(rows, dtype=np.float64)


def labels(r: Rescore, qi: int, keys: list[int]) -> np.ndarray:
    ts = r.st.p.qs.targets[qi]
    chunks = r.st.p.chunks
    return np.array([float(any(
        chunks[c].path == t[0] and (t[1] is None or chunks[c].start_line <= t[1]
                                    <= chunks[c].end_line) for t in ts)) for c in keys])


def train(x: np.ndarray, y: np.ndarray, l2: float = 1e-3,
          steps: int = 3000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logistic regression by gradient descent on standardised features."""
    mu, sd = x.mean(0), x.std(0) + 1e-9
    z = (x - mu) / sd
    z = np.hstack([z, np.ones((len(z), 1))])
    w = np.zeros(z.shape[1])
    pos = y.mean()
    weight = np.where(y > 0, 0.5 / max(pos, 1e-9), 0.5 / max(1 - pos, 1e-9))
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(z @ w)))
        grad = z.T @ (weight * (p - y)) / len(y) + l2 * w
        w -= 0.5 * grad
    return w, mu, sd


def learned_order(r: Rescore, qi: int, model: tuple[np.ndarray, np.ndarray, np.ndarray],
                  keys: list[int], x: np.ndarray) -> list[int]:
    w, mu, sd = model
    score = ((x - mu) / sd) @ w[:-1]
    kh = r.st.kw[qi]
    kd = dict(kh)
    ex = r.st.exact[qi]
    fused = [Fused(c, float(s) - 0.0, None, None, c in ex and c in kd)
             for c, s in zip(keys, score, strict=True)]
    fused.sort(key=lambda f: (not f.exact, -f.score, f.key))
    fused = keep_within(fused, kh[0][0] if kh else None, DEFAULT.keyword_best_within)
    return [f.key for f in fused]


def summary(row: dict[str, Any], base: dict[str, Any], default: dict[str, Any],
            vec: dict[str, Any]) -> dict[str, Any]:
    out = {m: row[m] for m in ("recall@5", "ndcg@10", "ctx_chars@5")}
    for m in ("recall@5", "ndcg@10"):
        out[f"vs_bm25_{m}"] = round(row[m] - base[m], 4)
        out[f"vs_default_{m}"] = round(row[m] - default[m], 4)
        out[f"vs_vec_{m}"] = round(row[m] - vec[m], 4)
    out["ctx_vs_bm25"] = round(row["ctx_chars@5"] / base["ctx_chars@5"], 3)
    for half, h in row.items():
        if isinstance(h, dict) and "recall@5" in h:
            out[half] = {"recall@5": h["recall@5"],
                         "vs_bm25": round(h["recall@5"] - base[half]["recall@5"], 4),
                         "ctx_vs_bm25": round(h["ctx_chars@5"] / base[half]["ctx_chars@5"], 3)}
    return out


Report = dict[str, Any]


def baselines(r: Rescore) -> tuple[Report, Report, Report, dict[str, Report]]:
    """BM25, the vector branch alone and the daemon's default fusion, and the systems
    table that starts with their summaries."""
    st = r.st
    base = st.report([[c for c, _ in h] for h in st.kw])
    vec = st.report([[c for c, _ in h] for h in r.vec])
    default_fn = bf.fusers([], [], [], [])["default"]
    default = st.report([default_fn(st.kw[q], r.vec[q], st.exact[q], st.stored,
                                    st.kw_weight[q]) for q in range(r.n)])
    systems = {"bm25": summary(base, base, default, vec),
               "vector": summary(vec, base, default, vec),
               "default": summary(default, base, default, vec)}
    return base, vec, default, systems


def measure(name: str, r: Rescore, table: dict[str, Row], only: Sequence[str],
            systems: dict[str, Report], base: Report, vec: Report, default: Report) -> None:
    """Each row of ``table`` (those starting with one of ``only``, if any, and
    ``default_check``) summarised into ``systems`` beside the baselines given."""
    for row, fn in table.items():
        if only and not any(row.startswith(x) for x in only) and row != "default_check":
            continue
        t1 = time.perf_counter()
        systems[row] = summary(r.st.report(fn()), base, default, vec)
        systems[row]["s"] = round(time.perf_counter() - t1, 1)
        print(f"{name} {row}: {json.dumps(systems[row])}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="second-stage and per-query fusion ideas")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--sets", default="locomo,scifact,cmrc2018,xling")
    ap.add_argument("--only", default="", help="comma-separated row name prefixes")
    ap.add_argument("--bm25", default="1.2:0.75,0.9:0.4,1.5:0.75,1.2:0.5,2.0:0.75,1.2:0.9")
    ap.add_argument("--queries", type=int, default=0,
                    help="a seeded sample of this many queries per set (0: all)")
    ap.add_argument("--learned", action="store_true",
                    help="also a logistic regression over the signals, trained on LoCoMo's "
                         "tuning half (LoCoMo must come first in --sets)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    model: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    short = model
    store = VectorStore("multilingual-e5-small")
    grid = [tuple(float(x) for x in p.split(":")) for p in a.bm25.split(",") if p]
    only = [p for p in a.only.split(",") if p]
    out: dict[str, Any] = {"bench": "fusion_rescore", "loadavg_at_start": os.getloadavg(),
                           "sets": {}}
    t0 = time.perf_counter()
    for name in [s for s in a.sets.split(",") if s]:
        p = bf.prepare(name, a.data, [SIZE])
        p = bf.restrict(p, store, SIZE)
        if a.queries and len(p.qs.queries) > a.queries:
            p = bf.Prepared(bq.subset(p.qs, a.queries, 0), p.chunks, p.wins, p.units)
        st = bf.Study(p, store, [SIZE], chunk_vectors=False)
        r = Rescore(st, store)
        base, vec, default, systems = baselines(r)
        if a.learned:
            feats = [features(r, q) for q in range(r.n)]
            # Without the length signal too: a model free to prefer long chunks buys
            # recall with context.
            cut = FEATURES.index("length")
            if name == "locomo":
                tune = bf.halves(p.qs)
                idx = next(v for h, v in tune.items() if h.startswith("tune"))
                x = np.vstack([feats[q][1] for q in idx])
                y = np.concatenate([labels(r, q, feats[q][0]) for q in idx])
                model = train(x, y)
                short = train(np.delete(x, cut, axis=1), y)
                out["learned_weights"] = dict(zip([*FEATURES, "bias"], (
                    round(float(v), 4) for v in model[0]), strict=True))
            if model is not None:
                for row, m, drop in (("learned_lr", model, False),
                                     ("learned_lr_nolength", short, True)):
                    systems[row] = summary(st.report([learned_order(
                        r, q, m, feats[q][0],
                        np.delete(feats[q][1], cut, axis=1) if drop else feats[q][1])
                        for q in range(r.n)]), base, default, vec)
                    print(f"{name} {row}: {json.dumps(systems[row])}", file=sys.stderr,
                          flush=True)
        measure(name, r, rows(r, grid), only, systems, base, vec, default)
        out["sets"][name] = {"queries": r.n, "chunks": len(p.chunks),
                             "info": p.qs.info, "systems": systems}
    out["loadavg_at_end"] = os.getloadavg()
    out["total_s"] = round(time.perf_counter() - t0, 1)
    return bf.emit(out, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
