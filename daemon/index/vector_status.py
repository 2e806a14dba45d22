"""What the vector service of one workspace reports: its status and what it found of
ReMe's vectors (types only; :class:`~.embedder.VectorWorker` fills them)."""

from __future__ import annotations

from typing import Literal, TypedDict

from recalld.daemon.providers.embedding import EmbeddingStatus


class ReMeVectors(TypedDict, total=False):
    """What was found of ReMe's vectors (empty until seeding is done)."""

    space: str  # the configured space, as ReMe names it
    cache_vectors: int  # vectors in ReMe's cache file of that space
    other_spaces: list[str]  # ReMe cache files of other spaces
    refused: dict[str, str]  # cache file -> why it was not read
    store_vectors: int  # vectors in ReMe's chunk store
    store_vectors_used: int  # of those, the ones reused (of this space, these dimensions)
    store_vectors_other_space: int  # of those, the ones shown to be of another space
    store_vectors_other_dims: int  # of those, the ones of other dimensions than configured


class VectorStatus(TypedDict):
    """The vector service's part of a workspace's status (``vectors``)."""

    enabled: bool
    state: str
    #: Seconds until the next try while ``state`` is "backoff" (between rounds, or a call
    #: waiting out a Retry-After or a failed attempt) or "health_check" waits between
    #: pings; None otherwise.
    wait_s: float | None
    space: str
    serving_space: str | None
    migrating: bool
    dims: int
    embedded: int
    #: False until the counts below were taken after the index's first look at the disk
    #: (they are null until then: not counted yet).
    counted: bool
    total: int | None
    coverage: float | None
    pending: int | None
    rate_per_s: float | None
    eta_s: float | None
    provider_texts: int
    cache_texts: int
    reused_vectors: int
    reme_cache_texts: int
    parked: int
    parked_paths: list[str]  # ``path:start-end`` of the first parked chunks, by path
    parked_error: str | None
    health: Literal["unknown", "ok", "fail"]
    last_error: str | None
    provider: EmbeddingStatus
    cache: dict[str, int]


__all__ = ["ReMeVectors", "VectorStatus"]


def eta_s(pending: int, parked: int, rate: float | None) -> float | None:
    """Seconds to full coverage: 0.0 once nothing is pending, None when unknown (no rate
    yet, or only parked chunks left: they wait an hour whatever the rate, and may be
    refused again), else at least 0.1, never the 0 that means covered."""
    if not pending:
        return 0.0
    working = max(pending - parked, 0)
    if not working or not rate:
        return None
    return max(round(working / rate, 1), 0.1)
