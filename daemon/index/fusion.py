"""Weighted reciprocal-rank fusion of the keyword and vector branches.

Plain weighted RRF (``w / (k + rank)``) lets any vector-only candidate outrank a
keyword-only exact match whenever the vector weight is larger: with QwenPaw's 0.7/0.3
and k=60, ``0.3/61 < 0.7/(60 + r)`` for every rank r < 82. An agent that asks for
``ECONNREFUSED`` or a rare name wants the note that contains it, not forty notes that are
"about" errors. So the caller marks keyword hits that contain every identifier-like or
rare term of the query as *exact*; exact hits are ranked ahead of the rest (among
themselves by fused score), and a branch that found nothing does not dilute the other:
with one branch empty, its weight is simply absent from every score.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

#: The length a ``length_penalty`` is given per (the default largest chunk).
PENALTY_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Fused:
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
