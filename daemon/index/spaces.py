"""Vector spaces: one embedding client and one persistent cache per space, daemon-wide.

A vector space is (backend, model, dimensions, endpoint): vectors from different spaces are
not comparable. :class:`VectorSpaces` hands every workspace the :class:`VectorSpace` of its
``embedding_model_config``; workspaces configured alike with the same API key share the
client (so its circuit breaker sees every failure of that provider for that key); every
workspace of a space, whatever its key, shares the text-keyed cache
(``<state_dir>/embeddings/<space>.log``, see ``embedcache.py``) and the strictest batch and
input limits of them all; a text one workspace is embedding now is waited for by the others
(``claim``), not sent again. A workspace whose key the provider refuses fails alone: the
others of its space keep sending their own keys. Each client also keeps a small in-memory
LRU of query vectors.

Nothing here starts a task; the cache opens lazily in a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
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
from recalld.daemon.providers.embedding_keys import resolve_api_key
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


class _Store:
    """What every workspace of one space shares, whatever API key it sends: the
    persistent cache, the texts being embedded now, the members and their clients."""

    def __init__(self, path: Path, dims: int, *, max_cache_size: int) -> None:
        self.cache = EmbeddingCache(path, dims, max_cache_size=max_cache_size)
        self.opened = False
        self.open_lock = trio.Lock()
        self.members: set[VectorWorker] = set()
        #: Text hashes a member is embedding now (set once that call has ended).
        self.inflight: dict[str, trio.Event] = {}
        #: The client of each API key the space's workspaces send.
        self.clients: list[EmbeddingClient] = []

    def share_limits(self) -> None:
        configs = [m.config for m in self.members]
        for client in self.clients:
            client.share_limits(configs)


class VectorSpace:
    """One space as one API key sends to it: its client and query-vector LRU, and the
    space's shared store (cache, texts in flight, members)."""

    def __init__(self, client: EmbeddingClient, cache_dir: Path, *, query_cache_size: int,
                 store: _Store | None = None) -> None:
        self.client = client
        self.key = client.vector_space_key()
        self.dims = client.dimensions
        self._store = store or _Store(cache_dir / f"{self.key}.log", self.dims,
                                      max_cache_size=client.config.max_cache_size)
        self._store.clients.append(client)
        self.cache = self._store.cache
        self.members = self._store.members
        self._inflight = self._store.inflight
        self._queries: OrderedDict[str, F32] = OrderedDict()
        self._query_cache_size = query_cache_size

    def with_client(self, client: EmbeddingClient, *, query_cache_size: int) -> VectorSpace:
        """The same space sent to with another API key (``client``'s): the cache and the
        members are this one's, the client and its breaker its own."""
        view = VectorSpace(client, Path(), query_cache_size=query_cache_size,
                           store=self._store)
        self._store.share_limits()
        return view

    def cache_key(self, text: str) -> str:
        """The key of ``text``'s vector in the cache: the hash of what the client sends for
        it now, so a vector made of a longer cut (before a stricter workspace joined the
        space) is not taken for it."""
        return text_hash(self.client.sent_text(text))

    def join(self, member: VectorWorker) -> None:
        """Add ``member``: the clients apply its limits too, if stricter."""
        self.members.add(member)
        self._store.share_limits()

    def leave(self, member: VectorWorker) -> None:
        """Remove ``member``: the limits of those left apply."""
        self.members.discard(member)
        self._store.share_limits()

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
        async with self._store.open_lock:
            if not self._store.opened:
                await trio.to_thread.run_sync(self.cache.open)
                self._store.opened = True

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
        #: The first space of each key, and the one of each (space, API key).
        self._by_key: dict[str, VectorSpace] = {}
        self._by_sender: dict[tuple[str, str], VectorSpace] = {}

    def client(self, config: EmbeddingModelConfig) -> EmbeddingClient:
        return EmbeddingClient(
            config, self._bridge, policy=self._policy,
            breaker=CircuitBreaker(self._breaker_config,
                                   name=f"embedding provider {config.backend}"),
            environ=self._environ, local_limiter=self._local_limiter,
            passage_lane=self._passage_lane, rng=self._rng,
        )

    def space(self, config: EmbeddingModelConfig) -> VectorSpace:
        """The space of ``config`` as its API key sends to it (created on first use).
        Configs alike with the same key share it; with another key (a rotated one, another
        agent's) they share its cache and members but each sends its own key, so a key
        the provider refuses fails only the workspaces that send it."""
        found = self._by_config.get(config)
        if found is not None:
            return found
        client = self.client(config)
        key = client.vector_space_key()
        first = self._by_key.get(key)
        sender = (key, resolve_api_key(config, os.environ if self._environ is None
                                       else self._environ))
        space = self._by_sender.get(sender)
        if space is None:
            if first is None or first.client.enabled != client.enabled:
                space = VectorSpace(client, self.cache_dir,
                                    query_cache_size=self._query_cache_size)
                if client.enabled:
                    self._by_key[key] = space
            else:
                space = first.with_client(client, query_cache_size=self._query_cache_size)
            if client.enabled:
                self._by_sender[sender] = space
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
        space = self.space(config)
        return space if space.client.enabled else None

    def statistics(self) -> dict[str, SpaceStatistics]:
        return {key: {"cache": s.cache.stats(), "workspaces": len(s.members)}
                for key, s in self._by_key.items()}


__all__ = ["VectorSpace", "VectorSpaces", "public_config"]
