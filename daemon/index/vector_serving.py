"""The search side of a workspace's vector service: a query's vector and the status.

:class:`VectorServing` is the part of :class:`~.embedder.VectorWorker` that a search and
``daemon.status`` call: which space answers a query's vector now, that vector (within the
query deadline), the backfill's rate and the vector status. It reads what the backfill
keeps (declared below, set by the worker) and starts no task: nothing to stop.
"""

from __future__ import annotations

import unicodedata
from collections import deque
from typing import TYPE_CHECKING

import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.passages import PassageCalls
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.service_status import MAX_LISTED
from recalld.daemon.index.spaces import VectorSpace
from recalld.daemon.index.vector_fill import VectorFill
from recalld.daemon.index.vector_status import VectorStatus, eta_s

if TYPE_CHECKING:
    from recalld.daemon.index.embedder import BackfillConfig


class VectorServing:
    """Query vectors, rate and status of one workspace's vector service."""

    index: WorkspaceIndex
    target: VectorSpace
    fill: VectorFill
    cfg: BackfillConfig
    calls: PassageCalls
    state: str
    total: int
    embedded: int
    _counted: bool
    #: (time, chunks) of recent rounds (see ``VectorWorker``).
    _done: deque[tuple[float, int]]
    #: Until when (trio clock) the backoff or the health check's wait runs (a ping's
    #: retries too), and the error it waits after.
    _wait_until: float
    _wait_error: str
    cache_texts: int
    seeded: int
    reme_cache_texts: int
    last_error: str | None
    parked_error: str | None

    @property
    def enabled(self) -> bool:
        return self.target.client.enabled

    @property
    def migrating(self) -> bool:
        return self.fill.migrating

    def _serving_now(self) -> VectorSpace | None:
        """The space that answers a query's vector now (None: no vectors can serve)."""
        serving = self.fill.serving
        state = self.index.state
        if (serving is None or not serving.client.enabled or state.vectors is None
                or not len(state.vectors) or state.vector_space != serving.key):
            return None
        return serving

    def embeds_queries(self) -> bool:
        """Whether a search embeds its query now (and so may wait for the provider)."""
        return self._serving_now() is not None

    async def query_vector(self, query: str) -> tuple[str, F32] | None:
        """``(space, vector)`` for ``query``, or None when no vectors can serve.

        Raises ProviderError when the provider fails or misses the deadline.
        """
        serving = self._serving_now()
        if serving is None:
            return None
        # Composed or decomposed (NFC, NFD), the same text is one query: the keyword
        # branch reads both alike, and the vector branch must not rank them apart.
        query = unicodedata.normalize("NFC", query)
        vec = await serving.embed_query(query, timeout_s=self.cfg.query_timeout_s)
        return serving.key, vec

    @property
    def provider_texts(self) -> int:
        """Texts this backfill had the provider embed."""
        return self.calls.provider_texts

    def rate(self) -> float | None:
        """Chunks embedded per second over the recent rounds of the current (or last)
        stretch of work, idle time left out (None before its first round is done)."""
        done = self._done
        if len(done) < 2:
            return None
        span = done[-1][0] - done[0][0]
        if span <= 0:
            return None
        return sum(n for _, n in list(done)[1:]) / span

    def counted(self) -> bool:
        """Whether the coverage counts are known: taken from the index after its first
        look at the disk (before, a workspace full of notes counts 0 of 0)."""
        # While a large pass adds notes, their chunks (and so the total) are not known.
        return (self._counted and self.index.watcher.status()["last_reconcile"] is not None
                and not self.index.large_pass_running)

    def _wait_state(self) -> tuple[str, float | None, str | None]:
        """The state, the seconds until the next try while the backfill waits for the
        provider, and the error it waits after (a call's retry waits behind it)."""
        state = self.state
        if state == "embedding":
            retry = self.calls.retry_wait()
            if retry is not None:
                return "backoff", retry[0], retry[1]
        if state in ("backoff", "health_check"):
            left = self._wait_until - trio.current_time()
            if left > 0:
                return state, left, self._wait_error or None
        return state, None, None

    def status(self) -> VectorStatus:
        client = self.target.client
        state, wait_s, waits_after = self._wait_state()
        counted = self.counted() or not self.enabled
        total = self.total or len(self.index.state.chunks)
        rate = self.rate()
        pending = max(total - self.embedded, 0)
        return {
            "enabled": self.enabled,
            "state": state,
            "wait_s": None if wait_s is None else round(wait_s, 1),
            "space": self.target.key,
            "serving_space": None if self.fill.serving is None else self.fill.serving.key,
            "migrating": self.migrating,
            "dims": self.target.dims,
            "embedded": self.embedded,
            "counted": counted,
            "total": total if counted else None,
            "coverage": None if not counted else round(self.embedded / total, 4) if total
            else 1.0,
            "pending": pending if counted else None,
            "rate_per_s": None if rate is None else round(rate, 3),
            "eta_s": eta_s(pending, len(self.fill.failed), rate) if counted else None,
            "provider_texts": self.provider_texts,
            "cache_texts": self.cache_texts,
            "reused_vectors": self.seeded,
            "reme_cache_texts": self.reme_cache_texts,
            "parked": len(self.fill.failed),
            "parked_paths": self.fill.parked_places(self.index.state, MAX_LISTED),
            "parked_error": self.parked_error if self.fill.failed else None,
            "health": client.health,
            # The error that holds now: once the provider answers again, the one it met
            # before is past (``provider.last_error`` keeps it, with its time).
            "last_error": waits_after or self.last_error or (
                client.last_error if client.health == "fail" else None),
            "provider": client.status(),
            "cache": self.target.cache.stats(),
        }


__all__ = ["VectorServing"]
