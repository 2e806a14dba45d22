"""Other ways to combine the branches, measured on LoCoMo dev beside the defaults.

    .venv/bin/python tests/bench/fusion_ideas.py [--out FILE]

In process on ``bench_fusion.Study`` (the daemon's chunks, BM25 + exact rule, window
vectors from ``bench-results/embstore``; nothing is embedded), each row a retrieval
report like ``bench_fusion``'s, with the two halves by conversation (``tune_...``,
``held_out``). The rows re-implement the score fusion of ``fusion.fuse_scores`` with one
change each:

- ``agg_*``: a chunk's vector score from more than its best window (max + a share of the
  second best, the mean of the best two, a softmax pool);
- ``pool_<n>``: both branches' candidate pools of n instead of 30;
- ``rank_scaled``: each branch by rank (1 - rank / n) instead of min-max;
- ``filled_union``: the branch score a candidate lacks filled in (BM25 of vector-only
  candidates, cosine of keyword-only ones), both scaled over the union;
- ``window_bm25_*``: BM25 over the windows too (a chunk by its best window), as a third
  signal or instead of the chunks' BM25;
- ``window_fusion_*``: cosine and BM25 of the same window fused per window, a chunk by
  its best, as a third signal;
- ``rocchio_*`` (the query vector plus the mean of the fused top k's best windows) and
  ``rm3_*`` (the keyword query plus the top terms of the fused top k);
- ``same_note_*`` (a chunk raised by its note's best other candidate), ``diverse_*`` (a
  note's second chunk in the list penalised), ``names_*`` (candidates without the
  query's capitalised names penalised), ``coverage_*`` (the share of the query's IDF a
  chunk holds added);
- ``merge_adjacent``: adjacent chunks of one note in the list handed back as one hit;
- ``keep_kw1`` / ``keep_kw1_vec1``: the branches' best hits kept within the first five.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import bench_fusion as bf  # noqa: E402
import bench_quality as bq  # noqa: E402
import quality_lexical as ql  # noqa: E402
from vecstore import VectorStore  # noqa: E402

from recalld.daemon.index.bm25 import BM25Index  # noqa: E402
from recalld.daemon.index.tokenizer import tokenize, tokenize_query  # noqa: E402

SIZE = 400
Hits = list[tuple[int, float]]


def scaled(hits: Sequence[tuple[int, float]]) -> dict[int, float]:
    if not hits:
        return {}
    vals = [v for _, v in hits]
    hi, lo = max(vals), min(vals)
    return {k: (v - lo) / (hi - lo) if hi > lo else 1.0 for k, v in hits}


def rank_scaled(hits: Sequence[tuple[int, float]]) -> dict[int, float]:
    return {k: 1.0 - r / max(len(hits), 1) for r, (k, _) in enumerate(hits)}


class Ideas:
    def __init__(self, st: bf.Study, store: VectorStore) -> None:
        self.st = st
        p = st.p
        units = p.units[SIZE]
        self.counts = np.array([len(ts) for ts in units])
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.win_texts = [t for ts in units for t in ts]
        self.wvec = store.embed(self.win_texts, is_query=False)
        self.qvec = store.embed(p.qs.queries, is_query=True)
        self.sims = self.qvec @ self.wvec.T
        self.lens = np.array([len(c.text) for c in p.chunks])
        self.paths = [c.path for c in p.chunks]
        self.n = len(p.qs.queries)
        self.vec = st.vec[f"window{SIZE}"]
        self.tokens = [tokenize(c.index_text) for c in p.chunks]
        self.token_sets = [set(t) for t in self.tokens]
        self.wbm = BM25Index()
        self.wbm.add_many((i, tokenize(t)) for i, t in enumerate(self.win_texts))
        self.default = [self.fuse(qi) for qi in range(self.n)]

    def idf(self, term: str) -> float:
        n = len(self.st.bm)
        df = self.st.bm.doc_freq(term)
        return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0

    def fuse(self, qi: int, kw: Hits | None = None, vec: Hits | None = None, *,
             norm: Callable[[Sequence[tuple[int, float]]], dict[int, float]] = scaled,
             extra: Hits | None = None, extra_w: float = 0.0,
             bonus: Callable[[int, dict[int, float]], float] | None = None) -> list[int]:
        """``fusion.fuse_scores`` at the defaults (0.6 keyword, 0.4 vector, length
        penalty 0.1, exact hits first), with an optional third signal and bonus."""
        kh = self.st.kw[qi] if kw is None else kw
        vh = self.vec[qi] if vec is None else vec
        k, v = norm(kh), norm(vh)
        x = norm(extra) if extra else {}
        wk, wv = (0.6 if k else 0.0), (0.4 if v else 0.0)
        total = (wk + wv + extra_w) or 1.0
        keys = k.keys() | v.keys() | x.keys()
        score = {c: (wk * k.get(c, 0.0) + wv * v.get(c, 0.0) + extra_w * x.get(c, 0.0))
                 / total - 0.1 / 2000 * self.lens[c] for c in keys}
        if bonus is not None:
            score = {c: s + bonus(c, score) for c, s in score.items()}
        exact = {c for c in self.st.exact[qi] if c in k}
        return sorted(keys, key=lambda c: (c not in exact, -score[c], c))

    def chunk_vec(self, qi: int, how: str, a: float = 0.0) -> Hits:
        sims = self.sims[qi]
        out = np.empty(len(self.counts))
        for ci, (s0, n) in enumerate(zip(self.starts, self.counts, strict=True)):
            w = np.sort(sims[s0:s0 + n])[::-1]
            if how == "max2":
                out[ci] = w[0] + a * (w[1] if n > 1 else w[0])
            elif how == "mean2":
                out[ci] = float(w[:2].mean())
            else:  # softmax pool at temperature a
                out[ci] = a * math.log(float(np.exp(w / a).sum()))
        return bf.top(out, bf.POOL)

    def window_bm25(self, qi: int) -> Hits:
        best: dict[int, float] = {}
        for w, s in self.wbm.search(tokenize_query(self.st.p.qs.queries[qi]), 200):
            c = int(np.searchsorted(self.starts, w, side="right") - 1)
            best[c] = max(best.get(c, 0.0), s)
        return sorted(best.items(), key=lambda kv: -kv[1])[:bf.POOL]

    def window_fusion(self, qi: int, a: float) -> Hits:
        cos = self.sims[qi]
        cos = (cos - cos.min()) / (cos.max() - cos.min() + 1e-9)
        bm = np.zeros(len(self.win_texts))
        for w, s in self.wbm.search(tokenize_query(self.st.p.qs.queries[qi]),
                                    len(self.win_texts)):
            bm[w] = s
        bm = bm / (bm.max() + 1e-9)
        return bf.top(np.maximum.reduceat(a * cos + (1 - a) * bm, self.starts), bf.POOL)

    def rocchio(self, qi: int, beta: float, k: int) -> Hits:
        sims = self.sims[qi]
        best = [int(self.starts[c] + np.argmax(sims[self.starts[c]:self.starts[c]
                                                     + self.counts[c]]))
                for c in self.default[qi][:k]]
        q = self.qvec[qi] + beta * self.wvec[best].mean(0)
        q /= np.linalg.norm(q)
        return bf.top(np.maximum.reduceat(self.wvec @ q, self.starts), bf.POOL)

    def rm3(self, qi: int, k: int, m: int, alpha: float) -> Hits:
        q = self.st.p.qs.queries[qi]
        terms = set(tokenize_query(q))
        weight: Counter[str] = Counter()
        for c in self.default[qi][:k]:
            for t, n in Counter(self.tokens[c]).items():
                if t not in terms:
                    weight[t] += n / len(self.tokens[c]) * self.idf(t)
        expansion = [t for t, _ in weight.most_common(m)]
        exp = dict(self.st.bm.search(expansion, 200)) if expansion else {}
        kd = dict(self.st.kw[qi])
        missing = [c for c in exp if c not in kd]
        kd.update(self.st.bm.score_keys(tokenize_query(q), missing))
        emax = max(exp.values(), default=1.0)
        kmax = max(kd.values(), default=1.0)
        comb = {c: kd.get(c, 0.0) / kmax + alpha * exp.get(c, 0.0) / emax
                for c in kd.keys() | exp.keys()}
        return sorted(comb.items(), key=lambda kv: -kv[1])[:bf.POOL]

    def filled(self, qi: int) -> list[int]:
        kh, vh = self.st.kw[qi], self.vec[qi]
        keys = list(dict.fromkeys([c for c, _ in kh] + [c for c, _ in vh]))
        kd = dict(kh)
        kd.update(self.st.bm.score_keys(tokenize_query(self.st.p.qs.queries[qi]),
                                        [c for c in keys if c not in kd]))
        full = np.maximum.reduceat(self.sims[qi], self.starts)
        return self.fuse(qi, [(c, kd.get(c, 0.0)) for c in keys],
                         [(c, float(full[c])) for c in keys])

    def names(self, qi: int, delta: float) -> list[int]:
        words = re.findall(r"[A-Za-z][\w'’]*", self.st.p.qs.queries[qi])
        names = [set(tokenize_query(re.sub(r"['’]s$", "", w))) for w in words[1:]
                 if w[0].isupper() and w != "I"]

        def bonus(c: int, _: dict[int, float]) -> float:
            lacks = names and not all(n & self.token_sets[c] for n in names)
            return -delta if lacks else 0.0

        return self.fuse(qi, bonus=bonus)

    def coverage(self, qi: int, gamma: float) -> list[int]:
        terms = set(tokenize_query(self.st.p.qs.queries[qi]))
        w = {t: self.idf(t) for t in terms}
        total = sum(w.values()) or 1.0
        return self.fuse(qi, bonus=lambda c, _: gamma * sum(
            w[t] for t in terms if t in self.token_sets[c]) / total)

    def same_note(self, qi: int, beta: float) -> list[int]:
        def bonus(c: int, score: dict[int, float]) -> float:
            others = [s for o, s in score.items() if o != c and self.paths[o] == self.paths[c]]
            return beta * max(others, default=0.0)

        return self.fuse(qi, bonus=bonus)

    def diverse(self, qi: int, penalty: float) -> list[int]:
        order = self.default[qi]
        rank = {c: -r for r, c in enumerate(order)}  # stands in for the fused score
        exact = {c for c in self.st.exact[qi] if c in dict(self.st.kw[qi])}
        out: list[int] = []
        seen: Counter[str] = Counter()
        rest = list(order)
        while rest and len(out) < 10:
            best = max(rest, key=lambda c: (c in exact, rank[c] / len(order)
                                            - penalty * seen[self.paths[c]]))
            out.append(best)
            rest.remove(best)
            seen[self.paths[best]] += 1
        return out + rest

    def keep(self, qi: int, vec_too: bool) -> list[int]:
        out = list(self.default[qi])
        heads = [self.st.kw[qi][:1], self.vec[qi][:1] if vec_too else []]
        for head in heads:
            for c, _ in head:
                if c in out and out.index(c) >= 5:
                    out.remove(c)
                    out.insert(4, c)
        return out

    def merged_report(self) -> dict[str, Any]:
        chunks = self.st.p.chunks
        hits: list[list[ql.Hit]] = []
        for order in self.default:
            row: list[list[Any]] = []
            for c in order:
                ch = chunks[c]
                for h in row:
                    if h[0] == ch.path and ch.start_line <= h[2] + 1 and ch.end_line >= h[1] - 1:
                        h[1], h[2] = min(h[1], ch.start_line), max(h[2], ch.end_line)
                        h[3] += len(ch.text) + 1
                        break
                else:
                    row.append([ch.path, ch.start_line, ch.end_line, len(ch.text)])
                if len(row) >= 10:
                    break
            hits.append([(str(h[0]), int(h[1]), int(h[2]), int(h[3])) for h in row])
        qs = self.st.p.qs
        out: dict[str, Any] = {k: v for k, v in bq.score(qs, hits).items()
                               if k in ("recall@5", "recall@10", "mrr", "ndcg@10",
                                        "ctx_chars@5")}
        for half, idx in bf.halves(qs).items():
            h = ql.mean_metrics([ql.hit_metrics(hits[i], qs.targets[i]) for i in idx])
            out[half] = {k: h[k] for k in ("recall@5", "ndcg@10", "ctx_chars@5")}
        return out


def rows(ideas: Ideas) -> dict[str, Callable[[int], list[int]]]:
    i = ideas
    out: dict[str, Callable[[int], list[int]]] = {"default_before": lambda q: i.default[q]}
    for how, a in (("max2", 0.3), ("max2", 0.5), ("mean2", 0.0), ("softmax", 0.02)):
        out[f"agg_{how}_{a}"] = lambda q, how=how, a=a: i.fuse(q, vec=i.chunk_vec(q, how, a))
    out["rank_scaled"] = lambda q: i.fuse(q, norm=rank_scaled)
    out["filled_union"] = i.filled
    for w in (0.2, 0.4):
        out[f"window_bm25_third_{w}"] = lambda q, w=w: i.fuse(q, extra=i.window_bm25(q),
                                                              extra_w=w)
    out["window_bm25_instead"] = lambda q: i.fuse(q, kw=i.window_bm25(q))
    for a in (0.5, 0.7):
        out[f"window_fusion_third_{a}"] = lambda q, a=a: i.fuse(
            q, extra=i.window_fusion(q, a), extra_w=0.3)
    for beta, k in ((0.3, 5), (0.7, 5)):
        out[f"rocchio_{beta}_top{k}"] = lambda q, b=beta, k=k: i.fuse(q, vec=i.rocchio(q, b, k))
    for k, m, alpha in ((5, 10, 0.3), (5, 20, 0.5)):
        out[f"rm3_top{k}_{m}terms_{alpha}"] = lambda q, k=k, m=m, a=alpha: i.fuse(
            q, kw=i.rm3(q, k, m, a))
    out["same_note_0.1"] = lambda q: i.same_note(q, 0.1)
    out["diverse_0.05"] = lambda q: i.diverse(q, 0.05)
    out["names_0.2"] = lambda q: i.names(q, 0.2)
    out["coverage_0.2"] = lambda q: i.coverage(q, 0.2)
    out["keep_kw1"] = lambda q: i.keep(q, False)
    out["keep_kw1_vec1"] = lambda q: i.keep(q, True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="other fusion ideas on LoCoMo dev")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    store = VectorStore("multilingual-e5-small")
    p = bf.prepare("locomo", a.data, [SIZE])
    st = bf.Study(p, store, [SIZE], chunk_vectors=False)
    ideas = Ideas(st, store)
    systems: dict[str, Any] = {"bm25": st.report([[c for c, _ in h] for h in st.kw])}
    for name, fn in rows(ideas).items():
        systems[name] = st.report([fn(q) for q in range(ideas.n)])
    systems["merge_adjacent"] = ideas.merged_report()
    base = systems["bm25"]
    for row in systems.values():
        row["delta_recall@5"] = round(row["recall@5"] - base["recall@5"], 4)
        row["ctx_vs_bm25"] = round(row["ctx_chars@5"] / base["ctx_chars@5"], 3)
        for half in bf.halves(p.qs):
            row[half]["delta_recall@5"] = round(row[half]["recall@5"]
                                                - base[half]["recall@5"], 4)
    by_targets: dict[str, Any] = defaultdict(dict)
    default = [ideas.default[q] for q in range(ideas.n)]
    hits = st.hits_of(default)
    for n_t in range(1, 7):
        idx = [q for q in range(ideas.n) if min(len(p.qs.targets[q]), 6) == n_t]
        m = ql.mean_metrics([ql.hit_metrics(hits[q], p.qs.targets[q]) for q in idx])
        by_targets[f"{n_t}{'+' if n_t == 6 else ''}"] = {"questions": len(idx),
                                                          "recall@5": m["recall@5"]}
    out = {"bench": "fusion_ideas", "loadavg": os.getloadavg(), "queries": ideas.n,
           "systems": systems, "default_by_evidence_turns": by_targets}
    return bf.emit(out, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
