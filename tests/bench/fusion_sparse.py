"""The e5 model's sparse "latent terms" as a branch of the daemon's fusion, on every set.

    .venv/bin/python tests/bench/fusion_sparse.py [--sets locomo,scifact,cmrc2018,xling]
                                                  [--only PREFIXES] [--out FILE]

In process on ``fusion_rescore.Rescore`` (the daemon's chunks, BM25 + exact rule, the
guarded keyword weight, window vectors from ``bench-results/embstore``) with the sparse
codes of ``sparsestore.SparseStore`` (``bench-results/sparsestore``; run
``sparsestore.py`` first: this script encodes nothing). A set whose sparse codes are
not all stored is cut to the notes whose chunks (and windows) are (as
``bench_fusion.restrict``), and says so in its ``info``.

A query's sparse score of a text is the dot product of their codes (``dot``), or that
divided by the text's code norm (``cos``: long texts pool more features), or the dot
product with the text's code cut to its 64 strongest features (``dot_t64``); a chunk's
``chunk`` score is its own code's, ``win`` its best window's (the windows of the vector
branch). Rows, each beside ``bm25``, ``vector`` and ``default`` of the same run
(``default_check`` must equal ``default``):

- ``sp3_<unit>_<norm>_w<w>``: the sparse top 30 as a third branch of the score fusion,
  weight ``w`` beside the default keyword (guarded) and vector weights;
  ``sp3mix_..._a<a>_k<k>``: the same with weighted reciprocal rank (k) mixed in at share a;
- ``spvec_<unit>_<norm>``: the sparse branch in the dense branch's place;
- ``spdense_<unit>_<norm>_l<l>``: the vector branch re-scored as the dense best-window
  cosine plus ``l`` times the sparse score scaled by the query's best;
- ``sp2nd_<unit>_<norm>_n<n>_d<d>``: a second stage over the fused top n: each candidate
  gains ``d`` times its sparse score over the query's best sparse score;
- ``spcombo_<unit>_<norm>_w<w>``: the third branch added to ``fusion_rescore``'s
  ``combo_maxmean0.25+mix_a0.25_k5+cov_n8_d0.1``;
- ``sponly_<unit>_<norm>``: the sparse branch alone (no fusion).
"""

from __future__ import annotations

import argparse
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
import fusion_rescore as fr  # noqa: E402
from sparsestore import SparseStore, matrix  # noqa: E402
from vecstore import VectorStore  # noqa: E402

Hits = list[tuple[int, float]]
Row = Callable[[], list[list[int]]]


class Both:
    """``bench_fusion.restrict``'s view of the two stores: a note counts as embedded when
    its windows have vectors and its chunks (and windows, if ``windows``) sparse codes."""

    def __init__(self, p: bf.Prepared, dense: VectorStore, sparse: SparseStore,
                 windows: bool) -> None:
        self.dense = dense
        by_note: dict[str, list[int]] = {}
        for i, c in enumerate(p.chunks):
            by_note.setdefault(c.path, []).append(i)
        self.ok: set[str] = set()
        for idx in by_note.values():
            texts = [p.chunks[i].text for i in idx]
            wins = [t for i in idx for t in p.units[fr.SIZE][i]]
            if not sparse.missing(texts + (wins if windows else [])):
                self.ok.update(wins)

    def has(self, texts: Sequence[str], *, is_query: bool, share: float = 1.0) -> bool:
        return all(t in self.ok for t in texts) and self.dense.has(texts, is_query=is_query,
                                                                  share=share)


class Sparse:
    """Every query's sparse score of every chunk (``chunk``) and best window (``win``);
    ``<unit>_dot_t<m>``: with each text's code cut to its ``m`` strongest features (a
    smaller index)."""

    def __init__(self, r: fr.Rescore, store: SparseStore, windows: bool,
                 short: Sequence[int] = (64,)) -> None:
        p = r.st.p
        q = store.codes(p.qs.queries)
        self.scores: dict[str, np.ndarray] = {}  # "<unit>_<norm>" -> (queries, chunks)
        units = {"chunk": (store.codes([c.text for c in p.chunks]), None)}
        if windows:
            units["win"] = (store.codes([t for ts in p.units[fr.SIZE] for t in ts]), r.starts)
        dim = 1 + max(int(ids.max()) for codes in [q, *(c for c, _ in units.values())]
                      for ids, _ in codes if len(ids))
        for unit, (codes, starts) in units.items():
            for keep in (0, *short):
                d = matrix([(i[:keep], v[:keep]) for i, v in codes] if keep else codes, dim)
                dot = np.stack([d[:, ids] @ vals for ids, vals in q]) if q else np.zeros(
                    (0, len(d)), dtype=np.float32)
                norm = np.linalg.norm(d, axis=1)
                norm[norm == 0] = 1.0
                del d
                both = (("dot", dot), ("cos", dot / norm)) if not keep else (
                    (f"dot_t{keep}", dot),)
                for name, m in both:
                    self.scores[f"{unit}_{name}"] = (
                        m if starts is None else np.maximum.reduceat(m, starts, axis=1))
        self.hits = {k: [bf.top(row, bf.POOL) for row in m] for k, m in self.scores.items()}
        self.best = {k: np.maximum(m.max(axis=1), 1e-9) for k, m in self.scores.items()}

    def relative(self, key: str, qi: int, c: int) -> float:
        return float(self.scores[key][qi, c] / self.best[key][qi])


def dense_plus(r: fr.Rescore, sp: Sparse, key: str, qi: int, lam: float) -> Hits:
    best = np.maximum.reduceat(r.sims(qi), r.starts)
    return bf.top(best + lam * sp.scores[key][qi] / sp.best[key][qi], bf.POOL)


def rows(r: fr.Rescore, sp: Sparse) -> dict[str, Row]:
    n = range(r.n)
    out: dict[str, Row] = {"default_check": lambda: [r.fuse(q) for q in n]}
    cov = lambda qi, c: r.window_match(qi, c, False)  # noqa: E731
    for key in sp.scores:
        out[f"sponly_{key}"] = lambda key=key: [[c for c, _ in sp.hits[key][q]] for q in n]
        out[f"spvec_{key}"] = lambda key=key: [r.fuse(q, vec=sp.hits[key][q]) for q in n]
        for w in (0.1, 0.2, 0.3, 0.5):
            out[f"sp3_{key}_w{w}"] = lambda key=key, w=w: [
                r.fuse(q, extra=[(sp.hits[key][q], w)]) for q in n]
        for w in (0.2, 0.4):
            for a, k in ((0.5, 5), (0.5, 60)):
                out[f"sp3mix_{key}_w{w}_a{a}_k{k}"] = lambda key=key, w=w, a=a, k=k: [
                    r.fuse(q, extra=[(sp.hits[key][q], w)], mix=(a, k)) for q in n]
        for lam in (0.05, 0.1, 0.2):
            out[f"spdense_{key}_l{lam}"] = lambda key=key, lam=lam: [
                r.fuse(q, vec=dense_plus(r, sp, key, q, lam)) for q in n]
        # Beside the one earlier row better than the default on every set.
        for w in (0.2, 0.3):
            out[f"spcombo_{key}_w{w}"] = lambda key=key, w=w: [r.fuse(
                q, vec=r.maxmean(q, 0.25), mix=(0.25, 5), second=cov, second_n=8,
                second_d=0.1, extra=[(sp.hits[key][q], w)]) for q in n]
        for nn in (10, 20):
            for d in (0.05, 0.1, 0.2, 0.4):
                out[f"sp2nd_{key}_n{nn}_d{d}"] = lambda key=key, nn=nn, d=d: [r.fuse(
                    q, second=lambda qi, c: sp.relative(key, qi, c), second_n=nn,
                    second_d=d) for q in n]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="sparse latent terms as a fusion branch")
    ap.add_argument("--data", type=Path, default=bq.DEFAULT_DATA)
    ap.add_argument("--sets", default="locomo,cmrc2018,xling,scifact")
    ap.add_argument("--only", default="", help="comma-separated row name prefixes")
    ap.add_argument("--windows", default="locomo",
                    help="sets whose windows have sparse codes too (comma-separated)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    dense = VectorStore("multilingual-e5-small")
    store = SparseStore()
    only = [x for x in a.only.split(",") if x]
    with_windows = {x for x in a.windows.split(",") if x}
    out: dict[str, Any] = {"bench": "fusion_sparse", "loadavg_at_start": os.getloadavg(),
                           "sets": {}}
    t0 = time.perf_counter()
    for name in [s for s in a.sets.split(",") if s]:
        windows = name in with_windows
        p = bf.prepare(name, a.data, [fr.SIZE])
        p = bf.restrict(p, Both(p, dense, store, windows), fr.SIZE)  # type: ignore[arg-type]
        st = bf.Study(p, dense, [fr.SIZE], chunk_vectors=False)
        r = fr.Rescore(st, dense)
        if store.missing(p.qs.queries):
            raise SystemExit(f"{name}: queries without a sparse code (run sparsestore.py)")
        sp = Sparse(r, store, windows)
        base, vec, default, systems = fr.baselines(r)
        fr.measure(name, r, rows(r, sp), only, systems, base, vec, default)
        out["sets"][name] = {"queries": r.n, "chunks": len(p.chunks), "info": p.qs.info,
                             "systems": systems}
    out["loadavg_at_end"] = os.getloadavg()
    out["total_s"] = round(time.perf_counter() - t0, 1)
    return bf.emit(out, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
