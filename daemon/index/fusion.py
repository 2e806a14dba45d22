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

from collections.abc import Collection, Sequence
from dataclasses import dataclass


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
