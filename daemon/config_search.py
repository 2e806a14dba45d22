"""Hybrid search settings (a workspace's ``search`` table), frozen as all configuration;
``recalld.daemon.config`` builds them from the file and re-exports the class."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """Hybrid search settings; QwenPaw's weights stay available as configuration."""

    # Chosen by measurement (docs/adr/0021-score-fusion-and-window-vectors.md, the
    # ``fusion`` benchmark); QwenPaw's 0.7/0.3 with RRF stays available as configuration.
    vector_weight: float = 0.4
    keyword_weight: float = 0.6
    rrf_k: int = 60
    #: The keyword reach (``fusion.keyword_reach``) at and above which the keyword branch
    #: keeps its full weight in fusion; below it the weight shrinks to none at 0.4 of it
    #: (``fusion.guarded_weight``), so a near-blind keyword branch (an English question
    #: over Chinese notes) cannot bury the vector branch's hits. 0 turns the guard off.
    #: Chosen by measurement (docs/adr/0022-blind-keyword-guard.md).
    keyword_guard: float = 0.5
    #: Hybrid: the keyword branch's best hit ranks no lower than this place (1-based) of
    #: the fused list, however the fusion scored it (0: no such place). Chosen by
    #: measurement (docs/adr/0027-keyword-best-keeps-a-place.md).
    keyword_best_within: int = 5
    #: "score" (convex combination of each branch's min-max scaled scores) or "rrf"
    #: (weighted reciprocal rank, k = ``rrf_k``), both with exact keyword hits first
    #: (docs/adr/0021-score-fusion-and-window-vectors.md).
    fusion: str = "score"
    #: Score fusion only: taken off a candidate's score per 2,000 characters of its text.
    length_penalty: float = 0.1
    #: The vector unit: windows of about this many characters of a chunk, a chunk scored by
    #: its best window (0: one vector per whole chunk).
    vector_window_chars: int = 400
    #: A hybrid hit hands back its best window and this many lines each side of it (-1:
    #: the whole chunk).
    context_lines: int = -1
    candidate_multiplier: int = 3
    max_candidates: int = 200
    link_expansion: bool = True
