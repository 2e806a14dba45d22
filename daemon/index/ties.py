"""Hits of equal score in the order of their places: path, then line.

The indexes break ties by document key, and keys follow the order notes were indexed in:
two hosts holding the same notes (or one host before and after a rebuild) would rank the
same hits differently, and the server of a shared workspace ranks by path. So a search
puts each run of tied hits in the order of their chunks' places, everywhere: keyword
hits, vector hits and fused ones. Scores within :data:`TIE_REL` of each other are a tie:
the same text scored by two paths of the keyword index (its merged rows and its recent
delta) may differ in the last bits.

A tie can also straddle the cut of a branch's pool: which of the tied hits made it in
would then follow the keys again. :func:`settled` searches wider until the tie at the cut
is whole. Places are looked up for tied hits only, so a search without ties pays one pass
over its scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
Hit = tuple[int, float]
Place = tuple[str, int]

#: Scores closer than this (relative to their magnitudes) are tied.
TIE_REL = 1e-9


def tied(a: float, b: float) -> bool:
    """Are scores ``a`` and ``b`` a tie?"""
    return abs(a - b) <= TIE_REL * (abs(a) + abs(b))


def by_place(items: Sequence[T], score: Callable[[T], float],
             place: Callable[[T], Place]) -> list[T]:
    """``items`` (best first) with every run of tied scores in ``place`` order."""
    scores = [score(item) for item in items]
    return _runs_by_place(items, scores, place) if _any_tie(scores) else list(items)


def _any_tie(scores: list[float], upto: int | None = None) -> bool:
    """Does any of the first ``upto`` scores tie the next? (Best first: a plain loop, the
    common answer is no.)"""
    prev = scores[0] if scores else 0.0
    for score in scores[1:None if upto is None else upto + 1]:
        if prev - score <= TIE_REL * (abs(prev) + abs(score)):
            return True
        prev = score
    return False


def _runs_by_place(items: Sequence[T], scores: list[float], place: Callable[[T], Place],
                   upto: int | None = None) -> list[T]:
    """``items`` with each run of ties that begins among the first ``upto`` sorted."""
    out = list(items)
    n = len(out)
    last = n if upto is None else min(n, upto)
    start = 0
    for i in range(1, n + 1):
        # A run ends before a score that does not tie the one before it (as ``tied``).
        if i < n and scores[i - 1] - scores[i] <= TIE_REL * (abs(scores[i - 1])
                                                             + abs(scores[i])):
            continue
        if i - start > 1:
            out[start:i] = sorted(out[start:i], key=place)
        start = i
        if start >= last:
            break
    return out


def hits_by_place(hits: Sequence[Hit], place: Callable[[int], Place], *,
                  upto: int | None = None) -> list[Hit]:
    """:func:`by_place` of (key, score) hits; with ``upto``, only the runs that begin
    among the first ``upto`` (those that decide which hits come first)."""
    scores = [s for _, s in hits]
    if not _any_tie(scores, upto):
        return list(hits)
    return _runs_by_place(hits, scores, lambda kv: place(kv[0]), upto)


def exact_by_place(hits: Sequence[Hit], exact: set[int],
                   place: Callable[[int], Place]) -> list[Hit]:
    """``exact.exact_first``'s hits (the ``exact`` ones first) with the exact ones in
    :func:`by_place` order among themselves; the others keep their order."""
    lead = [kv for kv in hits if kv[0] in exact]
    return [*hits_by_place(lead, place), *hits[len(lead):]]


def settled(search: Callable[[int], list[Hit]], limit: int, place: Callable[[int], Place],
            *, keep: int | None = None) -> list[Hit]:
    """The best ``limit`` hits of ``search(n)`` (its best ``n``, best first) with the runs
    of ties among the first ``keep`` (default: all ``limit``) by place, taken whole
    when they reach the cut: the search is asked for one more than ``limit``, and for
    four times as many while the run holding the ``keep``-th hit reaches its last."""
    want = limit + 1
    need = limit if keep is None else max(1, min(keep, limit))
    hits = search(want)
    while len(hits) == want and _run_reaches_end(hits, need - 1):
        want *= 4
        hits = search(want)
    return hits_by_place(hits, place, upto=need)[:limit]


def _run_reaches_end(hits: list[Hit], i: int) -> bool:
    """Does every hit from the ``i``-th on tie the one before it?"""
    return i < len(hits) - 1 and all(
        tied(a[1], b[1]) for a, b in zip(hits[i:], hits[i + 1:], strict=False))


__all__ = ["TIE_REL", "by_place", "exact_by_place", "hits_by_place", "settled", "tied"]
