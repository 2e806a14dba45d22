"""Vector spaces: one embedding client and one persistent cache per space, daemon-wide.

A vector space is (backend, model, dimensions, endpoint): vectors from different spaces are
not comparable. :class:`VectorSpaces` hands every workspace the :class:`VectorSpace` of its
``embedding_model_config``; workspaces configured alike share the client (so its circuit
breaker sees every failure of that provider, and its batch and input limits are the strictest
of its members') and the text-keyed cache
(``<state_dir>/embeddings/<space>.log``, see ``embedcache.py``); a text one workspace is
embedding now is waited for by the others (``claim``), not sent again. Each space also
keeps a small in-memory LRU of query vectors.

Nothing here starts a task; the cache opens lazily in a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.index.embedcache import EmbeddingCache, text_hash
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.providers.breaker import BreakerConfig, CircuitBreaker
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.embedding import DEADLINE_MARGIN_S, EmbeddingClient
from recalld.daemon.providers.errors import (
    DimensionMismatch,
    ProviderTimeout,
)
from recalld.daemon.providers.local import PassageLane
from recalld.daemon.providers.retry import RetryPolicy

if TYPE_CHECKING:
    from recalld.daemon.index.embedder import VectorWorker
    from recalld.daemon.index.state import IndexState

log = logging.getLogger(__name__)

_PUBLIC_FIELDS = ("backend", "base_url", "model_name", "dimensions", "use_dimensions",
                  "max_input_length", "max_batch_size")


def public_config(config: EmbeddingModelConfig) -> JsonObject:
    """The fields that define a space, without secrets (persisted with the vectors)."""
    return {name: getattr(config, name) for name in _PUBLIC_FIELDS}


class SpaceStatistics(TypedDict):
    cache: dict[str, int]  # the embedding cache's entries, hits, misses, ...
    workspaces: int  # the vector workers that use the space


class VectorSpace:
    """The client, the persistent cache and the query-vector LRU of one space."""

    def __init__(self, client: EmbeddingClient, cache_dir: Path, *, query_cache_size: int) -> None:
        self.client = client
        self.key = client.vector_space_key()
        self.dims = client.dimensions
        self.cache = EmbeddingCache(cache_dir / f"{self.key}.log", self.dims,
                                    max_cache_size=client.config.max_cache_size)
        self._opened = False
        self._open_lock = trio.Lock()
        self._queries: OrderedDict[str, F32] = OrderedDict()
        self._query_cache_size = query_cache_size
        self.members: set[VectorWorker] = set()
        #: Text hashes a member is embedding now (set once that call has ended).
        self._inflight: dict[str, trio.Event] = {}

    def cache_key(self, text: str) -> str:
        """The key of ``text``'s vector in the cache: the hash of what the client sends for
        it now, so a vector made of a longer cut (before a stricter workspace joined the
        space) is not taken for it."""
        return text_hash(self.client.sent_text(text))

    def join(self, member: VectorWorker) -> None:
        """Add ``member``: the client applies its limits too, if stricter."""
        self.members.add(member)
        self.client.share_limits([m.config for m in self.members])

    def leave(self, member: VectorWorker) -> None:
        """Remove ``member``: the limits of those left apply."""
        self.members.discard(member)
        self.client.share_limits([m.config for m in self.members])

    async def compact_cache(self, live_estimate: int) -> None:
        """Drop the cached texts no member's chunk holds (``EmbeddingCache.compact``) once
        the log has grown past its bound for ``live_estimate`` live texts, and only once
        every member has looked at its disk: before, notes written while the daemon was
        down are no chunks yet, and their cached vectors would be paid for again. The
        keys of the texts a member paid for since it opened (``PassageCalls.paid``) are
        kept while fewer than twice the live texts, else only those a chunk holds."""
        compact = self.cache.needs_compaction(live_estimate)
        bound = 2 * max(live_estimate, 1000)  # a look at every chunk, now and then
        grown = {m: set(m.calls.paid) for m in self.members if len(m.calls.paid) > bound}
        if not (compact or grown) or not all(member.counted() for member in self.members):
            return
        live: set[str] = set()
        for member in list(self.members):

            def hashes(st: IndexState, m: VectorWorker = member) -> set[str]:
                return {m.cache_key(unit) for _, text in st.chunks.texts()
                        for unit in {text, *m.fill.units(text)}}

            live |= await member.index.locked(hashes)
        for member, paid in grown.items():  # texts paid meanwhile are kept: not looked at
            member.calls.paid = member.calls.paid - (paid - live)
        if not compact:
            return
        dropped = await trio.to_thread.run_sync(self.cache.compact, live)
        log.info("embedding cache %s: compacted, %d entries dropped", self.key, dropped)

    async def ensure_open(self) -> None:
        """Open the cache once (replaying its log in a worker thread)."""
        async with self._open_lock:
            if not self._opened:
                await trio.to_thread.run_sync(self.cache.open)
                self._opened = True

    @contextlib.asynccontextmanager
    async def claim(self, hashes: Sequence[str], lookup: Sequence[int], *,
                    claim: bool) -> AsyncIterator[list[F32 | None]]:
        """The cached vector of each of ``hashes`` at the positions ``lookup`` (None
        elsewhere and where missing); the texts another member of the space is embedding
        now are waited for first, so workspaces holding the same notes pay for them once.
        With ``claim`` (the caller writes what it embeds to the cache) the misses are the
        caller's until the block ends: another member needing them waits meanwhile. It
        waits while claiming nothing, so two members never wait for each other."""
        out: list[F32 | None] = [None] * len(hashes)
        todo = list(lookup)
        while todo:
            for i in todo:
                event = self._inflight.get(hashes[i])
                if event is not None:
                    await event.wait()
            hits = await trio.to_thread.run_sync(self.cache.get_many,
                                                 [hashes[i] for i in todo])
            for i, hit in zip(todo, hits, strict=True):
                out[i] = hit
            # Another member may have claimed a miss while the cache was read.
            todo = [i for i in todo if out[i] is None and hashes[i] in self._inflight]
        mine = {h: trio.Event() for h, v in zip(hashes, out, strict=True)
                if claim and v is None and h not in self._inflight}
        self._inflight.update(mine)
        try:
            yield out
        finally:
            for h, event in mine.items():
                del self._inflight[h]
                event.set()

    async def embed_query(self, text: str, *, timeout_s: float) -> F32:
        """The query vector of ``text`` (LRU-cached), within ``timeout_s``.

        Raises a ProviderError (ProviderTimeout past the deadline; at once, sending
        nothing, while the provider's last Retry-After runs); cancellation cancels the
        request in flight.
        """
        cached = self._queries.get(text)
        if cached is not None:
            self._queries.move_to_end(text)
            return cached
        quiet = self.client.quiet_error()
        if quiet is not None:
            # The provider asked to be left alone (Retry-After): a search does not wait
            # for it, and every search would send it another request to refuse.
            raise quiet
        # The retries stop at ``timeout_s`` with the provider's own error (a Retry-After
        # past it, or failures until then); the scope bounds the rest (a local model).
        with trio.move_on_after(timeout_s + DEADLINE_MARGIN_S) as scope:
            rows = await self.client.embed([text], kind="query", deadline_s=timeout_s)
        if scope.cancelled_caught:
            error = f"query embedding took longer than {timeout_s:g}s"
            self.client.health = "fail"
            self.client.note_error(error)
            raise ProviderTimeout(error)
        if rows.shape != (1, self.dims):
            raise DimensionMismatch(f"query vector of shape {rows.shape}, expected {self.dims}")
        vec: F32 = rows[0]
        self._queries[text] = vec
        while len(self._queries) > self._query_cache_size:
            self._queries.popitem(last=False)
        return vec


class VectorSpaces:
    """Every vector space in use, keyed by space; shared by all workspaces."""

    def __init__(
        self,
        cache_dir: Path,
        bridge: ProviderBridge | None,
        *,
        policy: RetryPolicy | None = None,
        breaker_config: BreakerConfig | None = None,
        environ: Mapping[str, str] | None = None,
        local_limiter: trio.CapacityLimiter | None = None,
        passage_lane: PassageLane | None = None,
        query_cache_size: int = 256,
        rng: random.Random | None = None,
    ) -> None:
        self.cache_dir = cache_dir
        self._bridge = bridge
        self._policy = policy
        self._breaker_config = breaker_config
        self._environ = environ
        self._local_limiter = local_limiter
        self._passage_lane = passage_lane
        self._query_cache_size = query_cache_size
        self._rng = rng
        self._by_config: dict[EmbeddingModelConfig, VectorSpace] = {}
        self._by_key: dict[str, VectorSpace] = {}

    def client(self, config: EmbeddingModelConfig) -> EmbeddingClient:
        return EmbeddingClient(
            config, self._bridge, policy=self._policy,
            breaker=CircuitBreaker(self._breaker_config,
                                   name=f"embedding provider {config.backend}"),
            environ=self._environ, local_limiter=self._local_limiter,
            passage_lane=self._passage_lane, rng=self._rng,
        )

    def space(self, config: EmbeddingModelConfig, *, rekey: bool = True) -> VectorSpace:
        """The space of ``config`` (created on first use; alike configs share it). Its
        client sends the API key of the config asked for last (a workspace opened again
        with a rotated key), unless ``rekey`` is false."""
        found = self._by_config.get(config)
        if found is not None:
            if rekey:
                found.client.use_key(config)
            return found
        client = self.client(config)
        key = client.vector_space_key()
        space = self._by_key.get(key)
        if space is None or space.client.enabled != client.enabled:
            space = VectorSpace(client, self.cache_dir, query_cache_size=self._query_cache_size)
            if client.enabled:
                self._by_key[key] = space
        elif rekey:
            space.client.use_key(config)
        self._by_config[config] = space
        return space

    def old_space(self, public: JsonObject | None,
                  current: EmbeddingModelConfig) -> VectorSpace | None:
        """The space vectors were made in, from their persisted public config.

        Its API key is the current config's when the backend is the same (keys are not
        persisted), else whatever the environment provides. None when it cannot be rebuilt.
        """
        if not public:
            return None
        fields = {f.name for f in dataclasses.fields(EmbeddingModelConfig)}
        try:
            values = {k: v for k, v in public.items() if k in fields and k != "api_key"}
            same = values.get("backend") == current.backend
            config = EmbeddingModelConfig(**values, api_key=current.api_key if same else "")
        except TypeError:
            return None
        space = self.space(config, rekey=False)  # its workspaces keep their key
        return space if space.client.enabled else None

    def statistics(self) -> dict[str, SpaceStatistics]:
        return {key: {"cache": s.cache.stats(), "workspaces": len(s.members)}
                for key, s in self._by_key.items()}


__all__ = ["VectorSpace", "VectorSpaces", "public_config"]
