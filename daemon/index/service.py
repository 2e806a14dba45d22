"""The per-workspace index service: load, watch, apply, persist, search, rebuild.

Owns one workspace's :class:`IndexState`, its :class:`Watcher` and its
:class:`IndexStore`, and the parts that work on them: :class:`StateAccess`, the index lock
and the searches (``reads.py``), :class:`Passes`, reading and applying notes
(``passes.py``), and :class:`Committer`, the commits (``commits.py``); what the index
reports about itself (its status, the damage checks) is in ``service_status.py``.

``run`` loads the last committed generation (rebuilding what is corrupt), starts the
watcher (whose startup reconcile re-reads only files changed while the daemon was down),
then a persist task and an idle trim, and only then reports started; with a ``hold`` (the
daemon's start) it reports started once loaded, and sets up the watch, reconciles and
checks the loaded files after it. It stops by cancellation: the last commit runs shielded
under a deadline.

A rebuild (``reindex``) builds a new state beside the old one, which keeps answering, and
swaps it in at the end.

Vectors: a backfill (``embedder.py``, a separate workspace service) attaches itself as
``vectors``; it reads pending work and installs vectors through :meth:`WorkspaceIndex.locked`
and waits on :attr:`WorkspaceIndex.changed`. When the workspace has a ReMe (QwenPaw) chunk
store, its ``_embedding_f16_b64`` vectors seed the embedding cache and its chunk boundaries
are kept for the notes that still match them (``reme_source.py``, which reads the store
only when a start finds it changed, ReMe having run in between, or when its boundaries or
vectors are needed).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, TypedDict, TypeVar

import trio

from recalld.daemon import memtrim
from recalld.daemon.arraytypes import F32
from recalld.daemon.config import DaemonConfig
from recalld.daemon.index.carry import carry_vectors
from recalld.daemon.index.commits import Committer
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.passes import POOL_MIN_FILES, Passes, UnreadableNote, note_reads
from recalld.daemon.index.persist import IndexStore, LoadReport
from recalld.daemon.index.prepare import PreparedBatch
from recalld.daemon.index.procpool import PreparePool
from recalld.daemon.index.reads import Candidates, StateAccess, gather
from recalld.daemon.index.records import note_stamp
from recalld.daemon.index.reme_source import ReMeSource
from recalld.daemon.index.service_status import IndexReport
from recalld.daemon.index.state import IndexState
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace

if TYPE_CHECKING:
    from recalld.daemon.index.embedder import VectorWorker
    from recalld.daemon.index.linked import Target
    from recalld.daemon.index.state import StoredChunk

log = logging.getLogger(__name__)
T = TypeVar("T")


class Rebuilt(TypedDict):
    files: int
    chunks: int
    duration_s: float


class WorkspaceIndex(IndexReport):
    """Keyword index, link graph and freshness for one workspace.

    What other modules read (maintenance, the vector backfill, the RPC handlers): ``root``
    (the workspace directory); ``state``, the :class:`IndexState` served now (a rebuild
    swaps in a new object: read it again rather than keep it; lookups are safe beside a
    running apply, anything more goes through :meth:`locked`); ``store``, the
    :class:`IndexStore` of the committed generations; ``watcher``, the :class:`Watcher`
    of the indexed directories (its ``scan`` and ``scan_listeners`` serve the health
    scans); ``changed``, an event set and replaced whenever chunks change; and
    ``last_commit``, the generation, time, duration, wait and counts of the last commit
    (None before one); ``persist_error``, ``unreadable`` and ``idle_trims``, read from the
    parts that keep them. Maintenance goes through :meth:`locked`, :meth:`compact`,
    :meth:`check_files`, :meth:`check_live`, :meth:`live_problems` and :meth:`status`.
    """

    def __init__(
        self,
        ws: Workspace,
        config: DaemonConfig,
        *,
        cpu: trio.CapacityLimiter,
        background: trio.CapacityLimiter | None = None,
        publish: Callable[[str, Mapping[str, object]], object] | None = None,
        watcher_config: WatcherConfig | None = None,
        pool: PreparePool | None = None,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.ws = ws
        self.root = ws.root
        settings = ws.settings
        self.daily_dir = settings.daily_dir
        self.digest_dir = settings.digest_dir
        self._cpu = cpu
        # Work nobody waits for takes a token of this before a CPU token (see services).
        self._background = background or trio.CapacityLimiter(1)
        self._pool = pool
        self._publish = publish
        # Awaited before the work a start queues and nobody waits for (the checksums of
        # the loaded files, the watch and its startup reconcile): the daemon's start, so
        # that it does not compete with the first answers.
        self._hold = hold
        self.state = IndexState(daily_dir=self.daily_dir, digest_dir=self.digest_dir)
        self.store = IndexStore(self.root / settings.metadata_dir)
        # The parts read the state through self: a rebuild swaps in a new object.
        self._access = StateAccess(lambda: self.state, cpu=cpu, idle_trim_s=config.idle_trim_s)
        self._passes = Passes(self.root, state=lambda: self.state, access=self._access,
                              cpu=cpu, pool=pool, max_chars=config.chunk_max_chars,
                              agent_id=ws.agent_id, changed=self._applied)
        self._commits = Committer(self.store, self.root, state=lambda: self.state,
                                  access=self._access, passes=self._passes, cpu=cpu,
                                  background=self._background,
                                  persist_delay_s=config.persist_delay_s, agent_id=ws.agent_id)
        self._rebuilding = False
        self.watcher = Watcher(
            self.root,
            [self.daily_dir, self.digest_dir],
            apply=self.apply_paths,
            # Through self: a rebuild swaps in a new state object.
            known=self.known_files,
            config=watcher_config
            or WatcherConfig(reconcile_interval_s=config.reconcile_interval_s,
                             reconcile_before_ready=False, outside_roots_gone=True,
                             # One call for a whole reconcile: ``apply_paths`` pipelines
                             # its own batches, and every call drains the pipeline.
                             apply_batch_max=1 << 30),
            limiter=cpu,
            background=self._background,
            hold=hold,
            stamp=note_stamp,  # as ``prepare`` stamps the notes it reads
        )
        if pool is not None:
            self.watcher.scan_reached = (POOL_MIN_FILES, self._scan_found_many)
        self._token: trio.lowlevel.TrioToken | None = None
        self.load_report: LoadReport | None = None
        self.searches = 0
        #: Set (and replaced) whenever chunks change; the vector backfill waits on it.
        self.changed = trio.Event()
        #: The vector backfill of this workspace, once it attached itself.
        self.vectors: VectorWorker | None = None
        #: ReMe's chunk store, if the workspace has one: its vectors for the embedding
        #: cache and its boundaries for the notes it chunked, each read when needed.
        self.reme = ReMeSource(
            self.store.metadata_dir, ws.agent_id, root=self.root,
            max_input_length=settings.embedding_model_config.max_input_length)
        self._passes.reme = self.reme

    # -- service ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.load_report = await trio.to_thread.run_sync(
            partial(self.store.load, self.state, defer_checks=True), limiter=self._cpu)
        # Loading read whole state files into short-lived buffers; hand them back.
        await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)
        await trio.to_thread.run_sync(self.reme.open, self.load_report.fresh,
                                      limiter=self._cpu)
        commits = self._commits
        if self.load_report.corrupt:
            log.warning("%s: derived state was corrupt (%s); %s", self.ws.agent_id,
                        self.load_report.corrupt, self.load_report.recovery())
            commits.mark_dirty()
        elif self.load_report.rebuilt:  # saved by an older version: not damage
            log.info("%s: the saved index was made under older rules; %s", self.ws.agent_id,
                     self.load_report.recovery())
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.watcher.run)
                nursery.start_soon(commits.persist_loop)
                nursery.start_soon(self._check_loaded)
                nursery.start_soon(self._access.trim_when_idle)
                nursery.start_soon(self._access.compact_when_due, self._background,
                                   self._compacted)
                task_status.started()
        finally:
            try:
                with trio.move_on_after(10.0) as cleanup:
                    cleanup.shield = True
                    await commits.commit_at_close()
            finally:
                commits.closed = True

    async def after_start(self) -> None:
        """Until the daemon's start let background work go (at once without a ``hold``):
        work nobody waits for must not compete with the first answers."""
        if self._hold is not None:
            await self._hold()

    async def _check_loaded(self) -> None:
        """Checksum the state files the load mapped unchecked (searches are served from
        them meanwhile). On damage, load again with every checksum, which falls back to
        an older good generation or rebuilds from the Markdown, and swap that in. Then
        make the dicts of the keyword delta the load left as saved."""
        loaded = self.state
        await self.after_start()
        async with self._background:
            corrupt = await trio.to_thread.run_sync(self.store.verify_deferred,
                                                    limiter=self._cpu)
            # Hashing streamed the files through short-lived buffers; hand them back.
            await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)
        if corrupt:
            log.warning("%s: derived state failed its checksums (%s); loading again",
                        self.ws.agent_id, corrupt)
            if set(corrupt) != {"chunks"} and self.state is loaded:  # else: rewritten below
                fresh = IndexState(daily_dir=self.daily_dir, digest_dir=self.digest_dir)
                report = await trio.to_thread.run_sync(self.store.load, fresh,
                                                       limiter=self._cpu)
                report.corrupt = {**corrupt, **report.corrupt}
                async with self._access.lock:
                    if self.state is loaded:  # a rebuild may have replaced it meanwhile
                        self.state, self.load_report = fresh, report
                self._notify_changed()
                self._commits.checked.set()
                await self.watcher.reconcile("after loading again", unattended=True)
            else:
                assert self.load_report is not None
                self.load_report.corrupt.update(corrupt)
            self._commits.mark_dirty()
        self._commits.checked.set()
        async with self._background:
            await self._access.thaw_delta()

    # -- applying changes ------------------------------------------------------------

    async def apply_paths(self, paths: set[str]) -> None:
        """Re-read ``paths`` (workspace-relative) and update the index to match the disk
        (the watcher's apply; see :meth:`Passes.apply_paths`)."""
        await self._passes.apply_paths(paths)

    def _scan_found_many(self) -> None:
        # From a scan's worker thread: an empty index (a first build) about to get this
        # many files will prepare them in the worker processes. Their start (an
        # interpreter and its imports each) overlaps the rest of the listing.
        if self._pool is not None and self._token is not None and not self.state.files:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._pool.warm)

    def known_files(self, indexed: dict[str, tuple[int, int]] | None = None,
                    ) -> dict[str, tuple[int, int]]:
        """What the watcher (and health) compare the disk with: path -> (mtime_ns, size),
        ``mtime_ns`` the last change (``note_stamp``), of every indexed note
        (``indexed``: ``IndexState.known`` read already), and of every note whose last
        read failed, so that a scan or a directory event that finds
        one gone applies that (and it leaves ``unreadable``); one never indexed has
        ``NO_STAT``."""
        known = self.state.known() if indexed is None else indexed
        for path in self.unreadable.keys() - known.keys():
            known[path] = NO_STAT
        return known

    @property
    def large_pass_running(self) -> bool:
        """Whether a large pass (a first build, a large reconcile) is under way."""
        return self._passes.running > 0

    async def passes_ended(self) -> None:
        """Return once no large pass (a first build, a large reconcile) is under way."""
        await self._passes.wait_ended()

    def _applied(self, count: int, large: bool) -> None:
        """An apply (of a large pass: ``large``) or a pass's end changed ``count`` notes."""
        commits = self._commits
        commits.changes += count
        commits.reload = commits.reload or large
        commits.mark_dirty()
        self._notify_changed()
        if self.state.bm25.compaction_due():  # read without the lock: a hint, checked again
            self._access.want_compaction()

    def _compacted(self) -> None:
        """The keyword index was compacted off the lock: save the new main."""
        self._commits.changes += 1
        self._commits.mark_dirty()

    def reads_now(self, query: str) -> bool:
        """Whether a search for ``query`` runs at once, on the event loop (see
        :meth:`StateAccess.reads_now`)."""
        return self._access.reads_now(query)

    async def locked(self, fn: Callable[[IndexState], T]) -> T:
        """Run ``fn(state)`` in a worker thread, holding a CPU token and the index lock."""
        return await self._access.locked(fn)

    def _notify_changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def vectors_changed(self, count: int) -> None:
        """The backfill installed ``count`` vectors: commit them with the chunks."""
        if count:
            self._commits.changes += count
            self._commits.mark_dirty()

    async def compact(self) -> None:
        """Merge the keyword index's segments now, then commit a generation.

        The merge runs in a worker thread under the index lock (searches see the index
        before or after it, never half of it); the commit follows even with no edit
        pending. Cancelled during the merge, the thread still finishes it and the next
        commit of the persist loop saves it.
        """
        async with self._access.lock:
            await trio.to_thread.run_sync(self.state.bm25.compact)
        self._commits.changes += 1  # a commit with no edits would be skipped otherwise
        await self._commits.commit()

    # -- queries ---------------------------------------------------------------------

    async def sync(self) -> None:
        """Return once every change made to the workspace before the call is indexed."""
        await self.watcher.sync()

    async def candidates(
        self, query: str, limit: int, filters: Filters, query_vector: tuple[str, F32] | None,
        *, link_limit: int = 0, keep: int | None = None, windows: bool = False,
    ) -> Candidates:
        """Keyword hits, vector hits, exact keys, their chunks and their link
        neighbourhood, from one consistent view in one worker-thread call (inline when
        :meth:`reads_now`).

        ``keep``: only the best ``keep`` keyword hits can become results (a search without
        a vector branch), so only their chunks and links are read; chunk objects are built
        on demand, and building them is most of a small index's search time.
        """

        def run() -> Candidates:
            return gather(self.state, lambda: self.vectors, query, limit, filters,
                          query_vector, link_limit=link_limit, keep=keep, windows=windows)

        self.searches += 1
        return await self._access.read(run, query)

    async def allows_any(self, filters: Filters, query: str) -> bool:
        """:meth:`IndexState.allows_any` of the state served now, read as the search of
        ``query`` reads it."""
        if filters.empty:
            return True
        return await self._access.read(lambda: self.state.allows_any(filters), query)

    async def linked_chunks(self, query: str,
                            targets: list[Target]) -> dict[Target, StoredChunk]:
        """:meth:`IndexState.linked_chunks` of the state served now, read as searches read."""
        return await self._access.read(lambda: self.state.linked_chunks(query, targets), query)

    # -- rebuild ---------------------------------------------------------------------

    async def rebuild(self, progress: Callable[[int, int | None, str], None]) -> Rebuilt:
        """Build a fresh index from the Markdown beside the live one, then swap it in.

        Searches keep answering from the old state until the swap. Cancellation leaves the
        old state in place.
        """
        self._rebuilding = True
        try:
            started = time.monotonic()
            disk = await trio.to_thread.run_sync(self.watcher.scan, limiter=self._cpu)
            paths = sorted(disk)
            fresh = IndexState(daily_dir=self.daily_dir, digest_dir=self.digest_dir)
            total = len(paths)
            progress(0, total, "scanning")
            unreadable: dict[str, UnreadableNote] = {}

            async def apply(batches: list[PreparedBatch], last: bool) -> None:
                await trio.to_thread.run_sync(partial(fresh.apply, batches, stage=not last),
                                              limiter=self._cpu)
                note_reads(unreadable, batches)

            await self._passes.prepare_each(paths, lambda _: None, apply,
                                            lambda done: progress(done, total, "indexing"))
            # What follows (vectors carried over, the swap, changes made meanwhile, the
            # commit) has no count of its own: no 100% while it goes on.
            progress(0, None, "saving")
            # Vectors of unchanged texts move over, so search stays hybrid after the swap.
            old = await self.locked(lambda st: (
                {st.chunks.text(k): v for k, v in st.chunks.embeddings().items()},
                st.vector_space, st.vector_config))
            await trio.to_thread.run_sync(
                partial(carry_vectors, fresh, old[0], old[1], old[2]), limiter=self._cpu)
            async with self._access.lock:
                self.state = fresh
            self._passes.unreadable = unreadable
            self._notify_changed()
            # Changes made while building are caught by a reconcile against the new state.
            await self.watcher.reconcile("after rebuild")
            self._commits.changes += 1
            self._commits.reload = True
            await self._commits.commit()
            progress(total, total, "done")
            return {"files": len(fresh.files), "chunks": len(fresh.chunks),
                    "duration_s": round(time.monotonic() - started, 3)}
        finally:
            self._rebuilding = False

#: The stat ``known_files`` gives a note it could never read: it differs from any on
#: disk (a reconcile counts the note as changed while it is there).
NO_STAT = (-1, -1)
