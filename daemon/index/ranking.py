"""Ranking the postings a keyword search found: sums per document and the best of them.

Pure functions over numpy arrays, used by :class:`bm25.BM25Index`: ``row_keys`` maps a
main-segment row to its document key; ``rows`` / ``weights`` are the postings of the
query's terms one term after another (so a row repeats only across terms). Ties rank by
ascending key everywhere. The weight of a posting is ``tf / (norm + tf) * factor``
(``factor``: the term's ``(k1 + 1) * idf``), computed alike on every path.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from recalld.daemon.index.postings import I32, I64

F64 = npt.NDArray[np.float64]


def few_scores(row_keys: npt.NDArray[np.uint32], norms: F64, row_parts: list[I32],
               tf_parts: list[npt.NDArray[np.float32]], factors: list[float], *,
               extra: dict[int, float]) -> dict[int, float]:
    """Every matched key's score from a few postings (one part per term, ``norms`` per
    row) and the ``extra`` scores, in plain Python: below a few dozen postings that beats
    a dozen numpy calls. Summed term after term, as bincount sums (the sorting path may
    differ in the last bit)."""
    scores: dict[int, float] = {}
    for rows, tfs, factor in zip(row_parts, tf_parts, factors, strict=True):
        for key, norm, tf in zip(row_keys.take(rows).tolist(), norms.take(rows).tolist(),
                                 tfs.tolist(), strict=True):
            scores[key] = scores.get(key, 0.0) + tf / (norm + tf) * factor
    scores.update(extra)  # a key is a row's or an extra one, never both
    return scores


def top_few(scores: dict[int, float], limit: int, *,
            allowed: BitMap | None) -> list[tuple[int, float]]:
    """The best ``limit`` of :func:`few_scores`' scores, only keys in ``allowed`` if given."""
    return _ranked(scores.items() if allowed is None else
                   ((k, v) for k, v in scores.items() if k in allowed), limit)


def row_sums(rows: I32, weights: F64, n_rows: int) -> F64:
    """Each row's summed weights (0.0 for rows without postings), one bincount: postings
    add up in their order, term after term, as a Python loop over them adds."""
    acc: F64 = np.bincount(rows, weights=weights, minlength=n_rows).astype(
        np.float64, copy=False)
    return acc


def top_dense(row_keys: npt.NDArray[np.uint32], rows: I32, weights: F64, terms: int,
              acc: F64 | None, extra: dict[int, float], limit: int) -> list[tuple[int, float]]:
    """The best ``limit`` (key, score) of the postings and the ``extra`` scores (of
    documents outside ``row_keys``, such as the delta's).

    ``acc``: the rows' sums (:func:`row_sums`) when the postings are of several
    ``terms``, None for one term. Sums are read back per posting (a row's copies carry its sum), and
    only the best ``limit * terms`` postings are looked at: they hold every row of the
    best ``limit``. A dozen numpy calls where :func:`summed` and :func:`top_k` make two
    dozen; each costs a few microseconds when the caches are cold, as they are when a
    search arrives over a socket.
    """
    if acc is not None:
        weights = acc[rows]
    want = limit * terms
    if len(weights) > want:
        kth = np.partition(weights, len(weights) - want)[len(weights) - want]
        keep = weights >= kth
        rows, weights = rows[keep], weights[keep]
    best = dict(zip(row_keys[rows].tolist(), weights.tolist(), strict=True))
    best.update(extra)  # a key is a row's or an extra one, never both
    return _ranked(best.items(), limit)


def _ranked(items: Iterable[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    """The best ``limit`` (key, score) pairs, ties by ascending key."""
    return sorted(items, key=lambda kv: (-kv[1], kv[0]))[:limit]


def summed(row_keys: npt.NDArray[np.uint32], rows: I32, weights: F64,
           terms: int) -> tuple[I64, F64]:
    """Keys and summed weights of the distinct rows among the postings."""
    if terms == 1:
        cand, scores = rows, weights
    elif len(rows) * 4 < len(row_keys):
        # Few postings against many rows: sort them rather than sweep an array as long
        # as the index. Each row's sum adds the same terms; numpy groups
        # them differently, so a score may differ from bincount's in the last bit.
        order = np.argsort(rows, kind="stable")
        rows, weights = rows[order], weights[order]
        first = np.empty(len(rows), dtype=np.bool_)
        first[0] = True
        np.not_equal(rows[1:], rows[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        cand, scores = rows[starts], np.add.reduceat(weights, starts)
    else:
        acc = row_sums(rows, weights, len(row_keys))
        cand = np.flatnonzero(acc).astype(np.int32)
        scores = acc[cand]
    return row_keys[cand].astype(np.int64), scores


def top_k(keys: I64, scores: F64, limit: int, *, extra: dict[int, float] | None = None,
          allowed: BitMap | None = None) -> list[tuple[int, float]]:
    """Best ``limit`` of the candidates and the ``extra`` scores, only keys in ``allowed``
    if given; without sorting every candidate."""
    if extra:
        items = sorted(extra.items())
        keys = np.concatenate([keys, np.fromiter((k for k, _ in items), dtype=np.int64,
                                                 count=len(items))])
        scores = np.concatenate([scores, np.fromiter((s for _, s in items), dtype=np.float64,
                                                     count=len(items))])
    if allowed is None:
        return _best(keys, scores, limit)
    if len(allowed) * 4 < len(keys):
        # A narrow filter: one vectorized membership test over all candidates.
        allowed_arr = np.frombuffer(allowed.to_array(), dtype=np.uint32).astype(np.int64)
        if len(allowed_arr) == 0:
            return []
        pos = np.minimum(np.searchsorted(allowed_arr, keys), len(allowed_arr) - 1)
        ok = allowed_arr[pos] == keys
        return _best(keys[ok], scores[ok], limit)
    # A wide filter: walk the best candidates in order, widening until enough pass.
    want = limit * 4
    while True:
        ranked = _best(keys, scores, want)
        out = [kv for kv in ranked if kv[0] in allowed][:limit]
        if len(out) == limit or want >= len(keys):
            return out
        want *= 4


def _best(keys: I64, scores: F64, limit: int) -> list[tuple[int, float]]:
    if len(keys) > limit:
        kth = np.partition(scores, len(scores) - limit)[len(scores) - limit]
        sel = scores >= kth
        keys, scores = keys[sel], scores[sel]
    order = np.lexsort((keys, -scores))[:limit]
    # tolist() converts in C: a third of the function's time at 50 hits.
    return list(zip(keys[order].tolist(), scores[order].tolist(), strict=True))
