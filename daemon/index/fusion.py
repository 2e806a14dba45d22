"""Weighted reciprocal-rank fusion of the keyword and vector branches.

Plain weighted RRF (``w / (k + rank)``) lets any vector-only candidate outrank a
keyword-only exact match whenever the vector weight is larger: with QwenPaw's 0.7/0.3
and k=60, ``0.3/61 < 0.7/(60 + r)`` for every rank r < 82. An agent that asks for
``ECONNREFUSED`` or a rare name wants the note that contains it, not forty notes that are
"about" errors. So the caller marks keyword hits that contain every identifier-like or
rare term of the query as *exact*; exact hits are ranked ahead of the rest (among
themselves by fused score), and a branch that found nothing does not dilute the other:
with one branch empty, its weight is simply absent from every score.

A keyword branch can also be nearly blind without being empty: an English question over
Chinese notes matches a number or a Latin name in some passage and little else, and at
full weight those chance hits push the vector branch's good hits down. ``keyword_reach``
measures how much of the query the best keyword hit holds (its BM25 score against what a
chunk holding every query term would score), and ``guarded_weight`` lowers the keyword
weight when that reach is small, to nothing when it is very small. Exact hits are not
affected: a query with an exact hit keeps the full weight, and exact hits still rank first.

Fused scores can still push the keyword branch's best hit far down when the vector
branch likes a dozen other chunks a little more (a guarded weight, a keyword list whose
head is close to its tail). ``keep_within`` gives one chosen hit (the keyword branch's
best) a place among the first few results: a lexical match that BM25 ranks first is
rarely worthless, and it costs the vector branch one place at the end of the top few.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

#: The length a ``length_penalty`` is given per (the default largest chunk).
PENALTY_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Fused:
    """One chunk's fused score, with the keyword and vector scores it came from."""

    key: int
    score: float
    keyword: float | None
    vector: float | None
    exact: bool


def fuse(
    keyword: Sequence[tuple[int, float]],
    vector: Sequence[tuple[int, float]],
    *,
    keyword_weight: float,
    vector_weight: float,
    k: int,
    exact: Collection[int] = (),
    limit: int | None = None,
) -> list[Fused]:
    """Fuse two ranked lists (best first) into one, deduplicated by key."""
    kw_rank = {key: rank for rank, (key, _) in enumerate(keyword, start=1)}
    vec_rank = {key: rank for rank, (key, _) in enumerate(vector, start=1)}
    kw_score = dict(keyword)
    vec_score = dict(vector)
    fused: list[Fused] = []
    for key in kw_rank.keys() | vec_rank.keys():
        score = 0.0
        if key in kw_rank:
            score += keyword_weight / (k + kw_rank[key])
        if key in vec_rank:
            score += vector_weight / (k + vec_rank[key])
        fused.append(
            Fused(
                key=key,
                score=score,
                keyword=kw_score.get(key),
                vector=vec_score.get(key),
                exact=key in exact and key in kw_rank,
            )
        )
    # Exact keyword hits first, then by fused score; ties broken by key for determinism.
    fused.sort(key=lambda f: (not f.exact, -f.score, f.key))
    return fused if limit is None else fused[:limit]


def keyword_reach(
    query_terms: Sequence[str], best_score: float, doc_freq: Callable[[str], int],
    n_docs: int,
) -> float:
    """How much of the query the keyword branch sees: ``best_score`` (the top BM25 hit's)
    over the sum of the query terms' IDFs, which is what a chunk of average length holding
    each term once scores. A term no chunk holds counts with the IDF of a term one chunk
    holds (it is as specific as a term can be), so a query whose words the notes do not
    use at all has a reach near 0; one whose top hit holds its terms, about 1 or more."""
    if not query_terms or n_docs <= 0 or best_score <= 0:
        return 0.0
    total = 0.0
    for term, qf in Counter(query_terms).items():
        df = max(doc_freq(term), 1)
        total += math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)) * qf
    return best_score / total if total > 0 else 0.0


#: Where the guard's ramp starts, as a share of ``full_at``: at or below it the keyword
#: branch has no weight. Chosen with ``full_at`` by measurement (tests/bench, ``xling``).
GUARD_FLOOR = 0.4


def guarded_weight(weight: float, reach: float, *, full_at: float) -> float:
    """The keyword weight for a query of keyword ``reach``: full at ``full_at`` and above,
    none at ``GUARD_FLOOR * full_at`` and below, linear between (``full_at`` 0 turns the
    guard off). A proportional cut is not enough: in reciprocal-rank fusion a chance
    keyword match at rank 1 outscores the vector branch's rank 1 at any keyword weight
    above the vector weight."""
    if full_at <= 0:
        return weight
    low = GUARD_FLOOR * full_at
    return weight * min(1.0, max(0.0, (reach - low) / (full_at - low)))


def _scaled(hits: Sequence[tuple[int, float]]) -> dict[int, float]:
    """A branch's scores mapped onto [0, 1] over its own candidates (best = 1)."""
    if not hits:
        return {}
    scores = [s for _, s in hits]
    top, low = max(scores), min(scores)
    span = top - low
    if span <= 0:
        return {key: 1.0 for key, _ in hits}
    return {key: (s - low) / span for key, s in hits}


def fuse_scores(
    keyword: Sequence[tuple[int, float]],
    vector: Sequence[tuple[int, float]],
    *,
    keyword_weight: float,
    vector_weight: float,
    exact: Collection[int] = (),
    limit: int | None = None,
    lengths: Mapping[int, int] | None = None,
    length_penalty: float = 0.0,
) -> list[Fused]:
    """Fuse two scored lists by a convex combination of their min-max scaled scores.

    Unlike ranks, scaled scores keep how far apart the candidates are: a chunk the vector
    branch finds far closer than the rest keeps that lead, and a flat tail weighs little.
    A candidate missing from a branch counts as that branch's worst (0). Exact keyword
    hits first, as in :func:`fuse`; an empty branch drops out as there.

    ``length_penalty`` takes that much off a candidate's score per
    :data:`PENALTY_CHARS` characters of its text (``lengths``): the agent pays for every
    character a hit hands back, so of two nearly equal candidates the shorter wins.
    """
    kw = _scaled(keyword)
    vec = _scaled(vector)
    kw_score = dict(keyword)
    vec_score = dict(vector)
    w_kw = keyword_weight if kw else 0.0
    w_vec = vector_weight if vec else 0.0
    total = (w_kw + w_vec) or 1.0
    per_char = length_penalty / PENALTY_CHARS if lengths is not None else 0.0
    fused = [
        Fused(
            key=key,
            score=(w_kw * kw.get(key, 0.0) + w_vec * vec.get(key, 0.0)) / total
            - (per_char * lengths.get(key, 0) if lengths is not None else 0.0),
            keyword=kw_score.get(key),
            vector=vec_score.get(key),
            exact=key in exact and key in kw,
        )
        for key in kw.keys() | vec.keys()
    ]
    fused.sort(key=lambda f: (not f.exact, -f.score, f.key))
    return fused if limit is None else fused[:limit]


def keep_within(fused: list[Fused], key: int | None, within: int) -> list[Fused]:
    """``fused`` with the candidate ``key`` moved up to place ``within`` (1-based) when it
    ranks below it; the candidates it passes move down one place. ``within`` 0 or a key
    not among the candidates leaves the list as it is."""
    if within <= 0 or key is None:
        return fused
    for i, f in enumerate(fused):
        if f.key == key:
            if i >= within:
                return [*fused[:within - 1], f, *fused[within - 1:i], *fused[i + 1:]]
            return fused
    return fused
