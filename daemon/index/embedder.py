"""The vector backfill of one workspace: fills missing vectors without blocking anything.

:class:`VectorWorker` is a workspace service started after the index. It owns:

- the health check at start (``[EMBEDDING HEALTH CHECK] ... -> OK`` / ``-> FAIL <reason>``),
  repeated with growing waits until OK; a failure is visible in ``daemon.status`` and never
  turns vectors off for good;
- the backfill loop (its rate and time to full coverage in status): pending work is
  derived (chunks without a vector in the active space), so it survives restarts without
  a queue of its own (after a restart, read once the workspace has looked at its folder:
  a note deleted meanwhile is not sent); a round's texts go to the provider sorted by
  length. Each round takes the index lock only to read the next batch (newest content
  first: daily notes by date, other notes by mtime) and again to install the vectors;
  embedding happens outside the lock, through the text-keyed cache of the space first,
  the provider only for what the cache lacks. Keyword indexing and search never wait
  for the provider, nor does a query's embedding wait behind a backfill call (the local
  backend gives queries a lane of their own, ``providers/local.py``);
- outages: a transient provider error waits (exponential backoff with jitter, at least until
  the circuit breaker admits a probe and the provider's Retry-After ends) instead of
  spinning; an error for good (a rejected key, an unknown model, vectors of other
  dimensions) sends the backfill back to health-check pings, no text sent or parked until
  one is answered well; a batch refused for its input is sent again text by text, and only
  the refused texts' chunks are parked for ``permanent_retry_s`` (every text of a round
  refused: the round's), saying why in status; a text the provider keeps failing on (5xx,
  timeouts) while it embeds the others is singled out and parked the same way
  (``passages.py``);
- model changes: when the index holds vectors of another space, they keep serving searches
  (with the old space's client) while the new space fills a second :class:`VectorIndex`;
  at full coverage the new index is swapped in and the chunk embeddings rewritten;
- reuse of an existing QwenPaw workspace: vectors found in ReMe's chunk store seed the cache
  of the configured space (when ReMe's embedding cache does not place them in another
  space), and ReMe's cache file of this space answers before the provider does.

What it does under the index lock (binding to a rebuilt state, reading a round, installing
vectors, the swap at the end of a model change, and the window vectors a search reads) is
:class:`~.vector_fill.VectorFill`'s (``vector_fill.py``), which the worker holds as
``fill``. What a search and the status read (a query's vector, the rate, the status) is
:class:`~.vector_serving.VectorServing`'s, which it extends.

Stops by cancellation; nothing it holds needs a shielded cleanup (installed vectors are
committed by the index's own persist task, pending work is re-derived at the next start).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.index import reme_import
from recalld.daemon.index.embedcache import text_hash
from recalld.daemon.index.parking import PARKED_LOG, Parked, ParkedTexts, config_digest
from recalld.daemon.index.passages import PassageCalls
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.spaces import VectorSpace, VectorSpaces, public_config
from recalld.daemon.index.vector_fill import VectorFill
from recalld.daemon.index.vector_serving import VectorServing
from recalld.daemon.index.vector_status import ReMeVectors
from recalld.daemon.index.vectors import mean_unit
from recalld.daemon.providers.errors import ProviderError, ProviderPermanent, input_refused

log = logging.getLogger(__name__)
#: Rounds the backfill rate is measured over.
RATE_ROUNDS = 16


@dataclass(frozen=True, slots=True)
class BackfillConfig:
    """Tuning of the backfill; the defaults suit a real provider."""

    #: Texts per round: the client's ``max_batch_size`` times this (one lock hop each way).
    batches_per_round: int = 4
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    #: How long a batch the provider refused for good waits before it is tried again.
    permanent_retry_s: float = 3600.0
    #: Failed calls holding a text before it is sent alone, and may be parked as the
    #: provider's fault of that text (``passages.py``).
    isolate_after: int = 3
    query_timeout_s: float = 3.0


class VectorWorker(VectorServing):
    """Backfill, query embedding and vector status of one workspace."""

    def __init__(
        self,
        index: WorkspaceIndex,
        spaces: VectorSpaces,
        config: EmbeddingModelConfig,
        *,
        backfill: BackfillConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.index = index
        self.spaces = spaces
        self.config = config
        self.cfg = backfill or BackfillConfig()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self.target: VectorSpace = spaces.space(config)
        #: Window size of the vector unit (``SearchConfig.vector_window_chars``; 0: the
        #: whole chunk is the unit, one vector each).
        self.window_chars = index.ws.settings.search.vector_window_chars
        #: The index being filled, the space that serves searches meanwhile, the window
        #: vectors and the parked chunks (its methods run under the index lock).
        self.fill = VectorFill(index.ws.agent_id, spaces, config, self.target,
                               self.window_chars, log=log)
        # A chunk whose whole vector ReMe made keeps it (one window spanning the chunk)
        # rather than paying the provider for its windows, and a restart takes that
        # window from the chunk's saved vector.
        self.fill.whole = self._reme_made
        self.total = 0
        self.embedded = 0
        #: Whether the counts above were taken from the index at least once.
        self._counted = False
        self.calls = PassageCalls(index.ws, self.target, use_cache=config.enable_cache,
                                  isolate_after=self.cfg.isolate_after)
        self.calls.cache_key = self.cache_key
        self.cache_texts = 0
        self.seeded = 0
        #: ReMe's embedding cache of this space (ReMe text key -> vector) and its hits.
        self._reme_cache: dict[str, reme_import.F16] = {}
        #: Text hashes of the vectors taken from ReMe's chunk store.
        self.reme_hashes: set[str] = set()
        self.reme_cache_texts = 0
        #: What was found of ReMe's vectors (see ``reme_report``); set once seeding is done.
        self.reme: ReMeVectors = {}
        self.seeded_event = trio.Event()
        self.last_error: str | None = None
        #: Why the chunks parked now were parked (a later error says nothing of them).
        self.parked_error: str | None = None
        self.state = "starting"
        # (time, chunks) of recent rounds, for the rate and the time to full coverage; the
        # first entry of a stretch of work is its start (0 chunks).
        self._done: deque[tuple[float, int]] = deque(maxlen=RATE_ROUNDS)
        #: Whether a stretch of backfill work is under way (False while idle).
        self._working = False
        #: Until when (trio clock) the backoff or the health check's wait runs, and the
        #: error it waits after.
        self._wait_until = -math.inf
        self._wait_error = ""

    # -- service ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.index.vectors = self
        self.target.join(self)
        try:
            if not self.enabled:
                self.state = "disabled"
                self.index.reme.drop_vectors()
                self.seeded_event.set()
                client = self.target.client
                if client.config.model_name:  # meant to be on: say why it is not
                    log.warning("%s: vectors are off: %s", self.index.ws.agent_id,
                                client.disabled_reason)
                task_status.started()
                await trio.sleep_forever()
            await self.target.ensure_open()
            await self._open_parked()
            await self.index.locked(self.fill.adopt)
            task_status.started()
            await self._seed_foreign()
            await self._wait_healthy()
            # After the daemon's start: it competes with the first answers, and a shared
            # workspace embeds through its replica, which starts in the start's second stage.
            await self.index.after_start()
            await self._wait_checked()
            await self._backfill()
        finally:
            if self.fill.texts is not None:
                self.fill.texts.close()
            self.target.leave(self)
            if self.index.vectors is self:
                self.index.vectors = None

    async def _open_parked(self) -> None:
        """Read the texts parked before the restart (``parking.py``)."""
        texts = ParkedTexts(self.index.store.metadata_dir / PARKED_LOG, self.target.key,
                            config_digest(public_config(self.target.client.config)))
        count = await trio.to_thread.run_sync(texts.open)
        newest = texts.newest()
        if newest is not None:
            self.parked_error = newest.why
            log.info("%s: %d text(s) stay parked from before the restart (%s)",
                     self.index.ws.agent_id, count, newest.why)
        self.fill.texts = texts

    async def _wait_healthy(self) -> None:
        """Health-check pings until the provider answers well (``wait_healthy``)."""
        self.state = "health_check"
        await self._counting(partial(
            self.target.client.wait_healthy, self.index.root, name=self.index.ws.agent_id,
            backoff_base_s=self.cfg.backoff_base_s, backoff_max_s=self.cfg.backoff_max_s,
            on_wait=self._waiting))

    async def _wait_checked(self) -> None:
        """Until the workspace's first look at its folder, when the index was loaded with
        chunks: those of a note deleted or edited while the daemon was down are still
        there, and their texts must not go to the provider (a first build goes at once)."""
        if await self.index.locked(lambda state: len(state.chunks) > 0):
            self.state = "starting"
            await self.index.watcher.wait_reconciled()

    def _waiting(self, delay_s: float, error: str) -> None:
        self._wait_until, self._wait_error = trio.current_time() + delay_s, error

    async def _seed_foreign(self) -> None:
        """Reuse what ReMe embedded (``ReMeSource.seed``): its chunk store's vectors go
        into the cache of the configured space, and its cache file of this space is kept
        for lookups by ReMe's key."""
        def seed() -> int:
            got = self.index.reme.seed(self.config, self.target.key, self.target.cache)
            self._reme_cache, self.reme_hashes, self.reme = got.cache, got.hashes, got.report
            return got.stored

        try:
            self.seeded = await trio.to_thread.run_sync(seed)
        finally:
            self.seeded_event.set()

    def _reme_made(self, text: str) -> bool:
        """Whether ReMe made the vector of ``text`` (its chunk store or its cache)."""
        return text_hash(text) in self.reme_hashes or self.reme_vector(text) is not None

    def cache_key(self, text: str) -> str:
        """The key of ``text``'s vector in the space's cache (``VectorSpace.cache_key``);
        a vector taken from ReMe's chunk store is its text's, however it was cut."""
        h = text_hash(text)
        return h if h in self.reme_hashes else self.target.cache_key(text)

    def reme_vector(self, text: str) -> F32 | None:
        """The vector ReMe's cache holds for ``text`` in this space, if any."""
        if not self._reme_cache:
            return None
        row = self._reme_cache.get(reme_import.text_key(text, self.config.max_input_length))
        return None if row is None else np.asarray(row, dtype=np.float32)

    # -- the loop --------------------------------------------------------------------

    async def _backfill(self) -> None:
        client = self.target.client
        backoff = self.cfg.backoff_base_s
        while True:
            changed = self.index.changed
            now = trio.current_time()
            # Read each round: a workspace joining the space may lower the batch size.
            limit = client.max_batch_size * max(1, self.cfg.batches_per_round)
            rnd = await self.index.locked(partial(self.fill.next_round, limit=limit, now=now))
            if not rnd.more:  # else it counted only the chunks looked at so far
                self.total, self.embedded = rnd.total, rnd.total - rnd.pending
                self._counted = True
            if rnd.more and not rnd.items:
                continue  # more chunks to look at, a slice per call: searches go between
            if not rnd.items:
                # An idle spell is no part of the rate: the next round starts a new stretch.
                self._working = False
                if not rnd.pending:
                    # A failed round's error held for its chunks, which are embedded or gone
                    # now (``provider.last_error`` keeps it, with its time).
                    self.last_error = None
                if self.fill.migrating and rnd.pending == len(self.fill.failed):
                    swapped = await self.index.locked(self.fill.swap)
                    if swapped:
                        self.index.vectors_changed(swapped)
                        refused = (f" but for {rnd.pending} chunk(s) its model refused"
                                   if rnd.pending else "")
                        log.info("%s: vectors of %s complete%s; now serving them",
                                 self.index.ws.agent_id, self.target.key, refused)
                        continue
                await self._unpark_gone()
                self.state = "idle" if not rnd.pending else "waiting"
                await self.target.compact_cache(self.total * (4 if self.window_chars else 1))
                wake = min(self.fill.failed.values(), default=math.inf) - trio.current_time()
                with trio.move_on_after(max(wake, 0.0)):
                    await changed.wait()
                continue
            self.state = "embedding"
            if not self._working:
                self._working = True
                self._done.clear()
                self._done.append((now, 0))
            embedded, parked = self.embedded, len(self.fill.failed)
            try:
                await self._embed_round(rnd.items, rnd.texts)
            except ProviderError as exc:
                self.last_error = str(exc)
                if self.embedded > embedded or len(self.fill.failed) > parked:
                    backoff = self.cfg.backoff_base_s  # the round got somewhere: no outage
                # A round refused for its input (every text of it: ``passages.py``) waits
                # its hour; other failures for good are the provider's or the config's.
                if isinstance(exc, ProviderPermanent) and input_refused(exc):
                    self.parked_error = self.last_error
                    until = trio.current_time() + self.cfg.permanent_retry_s
                    self.fill.failed.update((key, until) for key, _ in rnd.items
                                            if not self.fill.holds(key))
                    log.warning("%s: embedding %d chunk(s) failed for good (%s); retrying "
                                "them in %.0f s", self.index.ws.agent_id, len(rnd.items), exc,
                                self.cfg.permanent_retry_s)
                self.state = "backoff"
                delay = max(backoff / 2 + self._rng.uniform(0.0, backoff / 2), client.hold_s())
                self._waiting(delay, self.last_error)
                await self._counting(partial(trio.sleep, delay))
                backoff = min(backoff * 2, self.cfg.backoff_max_s)
                if isinstance(exc, ProviderPermanent) and not input_refused(exc):
                    # A rejected key, an unknown model, vectors of other dimensions: no
                    # round goes out (and none is parked) until a ping is answered well.
                    await self._wait_healthy()
                continue
            backoff = self.cfg.backoff_base_s
            self._done.append((trio.current_time(), len(rnd.items)))

    async def _counting(self, wait: Callable[[], Awaitable[None]], *,
                        after: trio.Event | None = None) -> None:
        """``await wait()`` (a wait on the provider, which an outage makes last hours) while
        the coverage counts follow the index: read now (``after``: once it is set) and
        again after each change, not left at what the last round saw. Its error is
        raised as it is."""
        async def count() -> None:
            if after is not None:
                await after.wait()
            while True:
                changed = self.index.changed
                rnd = await self.index.locked(
                    partial(self.fill.next_round, limit=0, now=trio.current_time()))
                while rnd.more:  # a slice per call; counted once all are looked at
                    rnd = await self.index.locked(
                        partial(self.fill.next_round, limit=0, now=trio.current_time()))
                self.total, self.embedded = rnd.total, rnd.total - rnd.pending
                self._counted = True
                await changed.wait()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(count)
                await wait()
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            if len(group.exceptions) == 1:  # the wait's own, as it would come without count
                raise group.exceptions[0] from None
            raise

    async def _embed_round(self, items: list[tuple[int, str]],
                           units: list[list[str]] | None = None) -> int:
        """Vectors for ``items``: the cache first, the provider for the rest; install them.
        With ``enable_cache`` off the cache is neither read nor written, except for the
        vectors taken from ReMe's chunk store.

        ``units``: per item the texts embedded for it (its windows); the chunk's own
        vector is then their normalised mean (what is persisted with the chunk, and what
        serves a search until the chunk's windows are back after a restart)."""
        space = self.target
        use_cache = self.config.enable_cache
        if units is None:
            units = [[text] for _, text in items]
        texts = list(dict.fromkeys(t for ts in units for t in ts))
        hashes = [text_hash(t) for t in texts]
        keys = [self.cache_key(t) for t in texts]
        # With the cache off, the vectors taken from ReMe's chunk store (kept in the
        # cache) are still read: ReMe paid for them.
        lookup = [i for i, h in enumerate(hashes) if use_cache or h in self.reme_hashes]
        # Texts another workspace of the space is embedding now are waited for and read
        # from the cache; this round's misses are its own until its provider calls end.
        async with space.claim(keys, lookup, claim=use_cache) as cached:
            vectors: dict[str, F32] = {}
            missing: list[int] = []
            for i, vec in enumerate(cached):
                if vec is None:
                    missing.append(i)
                else:
                    vectors[texts[i]] = vec
            self.cache_texts += len(texts) - len(missing)
            from_reme = [(i, v) for i in missing if (v := self.reme_vector(texts[i])) is not None]
            if from_reme:
                await trio.to_thread.run_sync(
                    space.cache.put_many, [(keys[i], v) for i, v in from_reme])
                for i, v in from_reme:
                    vectors[texts[i]] = v
                self.reme_cache_texts += len(from_reme)
                missing = [i for i in missing if texts[i] not in vectors]
            # Similar lengths in one provider batch (a local model pads to the longest);
            # texts whose calls failed go last, so the others are not held behind them.
            self.calls.start_round(hashes)
            # A text parked before that is tried again goes alone: if it fails again, one
            # call (not ``isolate_after`` rounds of calls, each up to its deadline) parks it.
            parked = self.fill.texts
            if parked:
                self.calls.suspect([h for h in hashes if h in parked])
            missing.sort(key=lambda i: (self.calls.order(hashes[i]), len(texts[i])))
            step = space.client.max_batch_size
            refused: dict[str, str] = {}  # text -> why the provider will not embed it

            async def send() -> None:
                # Batch by batch, each kept as it arrives: a later batch's failure must not
                # throw away (and so pay again for) what the provider already answered.
                for start in range(0, len(missing), step):
                    part = missing[start:start + step]
                    await self.calls.send([hashes[i] for i in part],
                                          [texts[i] for i in part], vectors, refused)

            try:
                # A call waiting to retry (a Retry-After may last a minute) leaves the
                # counts following the index meanwhile, as the backoff between rounds does.
                await self._counting(send, after=self.calls.watch_waits())
            except ProviderError:
                # What was refused is parked though a later batch failed (else it would
                # be sent again, and fail again, first thing next round).
                self._park(items, units, refused)
                await self._keep_parked(refused)
                done = [(item, ts) for item, ts in zip(items, units, strict=True)
                        if all(t in vectors for t in ts)]
                if done:
                    await self._install([item for item, _ in done], [ts for _, ts in done],
                                        vectors)
                raise
        self.last_error = next(iter(refused.values()), None)
        items, units = self._park(items, units, refused)
        await self._keep_parked(refused)
        return await self._install(items, units, vectors)

    def _park(self, items: list[tuple[int, str]], units: list[list[str]],
              refused: dict[str, str]) -> tuple[list[tuple[int, str]], list[list[str]]]:
        """Park the chunks of the texts in ``refused``; the other items and their units.
        Only those chunks wait (a text refused once is refused again), so one bad note
        does not hold back its round."""
        if not refused:
            return items, units
        pairs = list(zip(items, units, strict=True))
        bad = [key for (key, _), ts in pairs if refused.keys() & set(ts)]
        until = trio.current_time() + self.cfg.permanent_retry_s
        self.fill.failed.update((key, until) for key in bad)
        self.parked_error = next(iter(refused.values()))
        log.warning("%s: the provider refused or kept failing on %d chunk(s) (%s); trying "
                    "again in %.0f s", self.index.ws.agent_id, len(bad), self.parked_error,
                    self.cfg.permanent_retry_s)
        kept = [(item, ts) for item, ts in pairs if not refused.keys() & set(ts)]
        return [item for item, _ in kept], [ts for _, ts in kept]

    async def _keep_parked(self, refused: dict[str, str]) -> None:
        """Keep the texts in ``refused`` parked across restarts."""
        texts = self.fill.texts
        if texts is None or not refused:
            return
        wall = time.time()
        until = wall + self.cfg.permanent_retry_s
        await trio.to_thread.run_sync(texts.park, {
            text_hash(t): Parked(why, wall, until) for t, why in refused.items()})

    async def _unpark_gone(self) -> None:
        """Drop the parked texts no chunk holds any more (a deleted or edited note's),
        once the index has looked at the disk (before, a rebuilt index holds nothing)."""
        texts = self.fill.texts
        if not texts or not self.counted():
            return
        used = await self.index.locked(self.fill.parked_in_use)
        if used is not None and len(used) < len(texts):
            await trio.to_thread.run_sync(texts.keep, used)

    async def _install(self, items: list[tuple[int, str]], units: list[list[str]],
                       vectors: dict[str, F32]) -> int:
        """Install the vectors of ``items`` (each has all of its ``units`` in ``vectors``)
        and count them; how many were installed."""
        if self.window_chars:
            per_item = [np.stack([vectors[t] for t in ts]).astype(np.float32) for ts in units]
            found = [(key, text, mean_unit(rows))
                     for (key, text), rows in zip(items, per_item, strict=True)]
            installed = await self.index.locked(
                partial(self.fill.install, found=found, windows=per_item))
        else:
            found = [(key, text, vectors[text]) for key, text in items]
            installed = await self.index.locked(partial(self.fill.install, found=found))
        self.embedded += installed
        # Windows refilled from the cache for an unchanged vector are saved too (once).
        windows, self.fill.new_windows = self.fill.new_windows, 0
        self.index.vectors_changed(max(installed, windows))
        parked = self.fill.texts
        if parked:
            done = [h for ts in units for t in ts if (h := text_hash(t)) in parked]
            if done:
                await trio.to_thread.run_sync(parked.drop, done)
        return installed


__all__ = ["BackfillConfig", "VectorWorker"]
