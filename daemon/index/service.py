"""The per-workspace index service: load, watch, apply, persist, search, rebuild.

Owns one workspace's :class:`IndexState`, its :class:`Watcher` and its
:class:`IndexStore`. ``run`` loads the last committed generation (rebuilding what is
corrupt), starts the watcher (whose startup reconcile re-reads only files changed while
the daemon was down), then a persist task, and only then reports started; with a
``hold`` (the daemon's start) it reports started once loaded, and sets up the watch,
reconciles and checks the loaded files after it. It stops by cancellation: the persist
task's last commit runs shielded under a deadline.

Concurrency: reading, chunking and tokenizing happen in worker threads under the
daemon-wide CPU limiter without the index lock; mutations and searches take the lock and
run in a worker thread, so the event loop never waits on them and searches always see a
whole batch or none of it. A rebuild (``reindex``) builds a new state beside the old one,
which keeps answering, and swaps it in at the end.

Vectors: a backfill (``embedder.py``, a separate workspace service) attaches itself as
``vectors``; it reads pending work and installs vectors through :meth:`WorkspaceIndex.locked`
and waits on :attr:`WorkspaceIndex.changed`. When the workspace has a ReMe (QwenPaw) chunk
store, it is read at every start (ReMe may have run in between): its ``_embedding_f16_b64``
vectors seed the embedding cache and its chunk boundaries are kept for the notes that still
match them (``reme_import.py``, ``reme_chunks.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar, TypeVarTuple

import trio

from recalld.daemon import memtrim, metrics
from recalld.daemon.arraytypes import F32
from recalld.daemon.config import DaemonConfig
from recalld.daemon.index import reme_import
from recalld.daemon.index.exact import exact_first
from recalld.daemon.index.memo import Memo
from recalld.daemon.index.persist import (
    IndexStore,
    LoadReport,
    adopt_saved,
    map_saved,
    reload_saved,
    snapshot,
    state_stamp,
)
from recalld.daemon.index.prepare import PreparedBatch, prepare_files
from recalld.daemon.index.procpool import PoolUnavailable, PreparePool
from recalld.daemon.index.state import (
    ApplyStats,
    Filters,
    IndexState,
    StoredChunk,
    carry_vectors,
)
from recalld.daemon.index.tokenizer import tokenize_query
from recalld.daemon.index.windows import Window
from recalld.daemon.store.arrays import Mapped
from recalld.daemon.store.errors import CorruptState, DiskFull, StorageError
from recalld.daemon.watcher import Watcher, WatcherConfig, WatcherStatus
from recalld.daemon.workspaces import Workspace

if TYPE_CHECKING:
    from recalld.daemon.index.embedder import VectorStatus, VectorWorker

log = logging.getLogger(__name__)
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Files prepared per worker call: big enough to amortise the thread or process hop and
# to share a vocabulary (the daemon maps each batch's distinct terms, not every token),
# small enough that a cancel or a search waiting for the lock is served quickly.
PREPARE_BATCH = 64
# From this many files on, a pass is prepared in the worker processes (when there is a
# pool): below it, starting processes costs more than the threads' single core.
POOL_MIN_FILES = 512
# Files per worker-process call: larger than in threads, since each batch's vocabulary is
# mapped once; small enough that a worker's working set stays small (tens of MB at 256).
POOL_BATCH = 128
# Prepared files applied at once: the keyword index merges once per apply, so a large
# reconcile applies in a few merges, not hundreds. A merge rewrites the whole main
# segment, so the batch grows with the index (a quarter of the files indexed), from
# APPLY_MIN_FILES (prepared files wait in memory until applied: a small index's build
# holds few) up to APPLY_BATCH.
APPLY_BATCH = 2048
APPLY_MIN_FILES = 512
# A search runs on the event loop, rather than paying a worker-thread round trip, only
# while its keyword scoring surely takes under about a millisecond: scoring walks the
# postings of every query term, so its cost grows with chunks x terms (a 16-character
# Chinese query, 15 bigrams, over 15k chunks is about that). Anything larger goes to a
# worker thread under the CPU limiter.
INLINE_READ_MAX_CHUNKS = 20_000
INLINE_SEARCH_BUDGET = 200_000  # chunks x query terms
INLINE_QUERY_MAX_CHARS = 256  # longer queries are not even tokenized on the loop
# Commits of at least this many chunks hand freed buffers back to the system afterwards.
TRIM_AFTER_CHUNKS = 2_000
PERSIST_RETRY_MAX_S = 300.0
# A pass that ends early merges what it staged (at most STAGED_MAX_DOCS documents) even
# while cancelled, for at most this long; a commit merges whatever is left.
PASS_END_MAX_S = 30.0
BUSY_COMMIT_MAX_S = 60.0


class CommitRecord(TypedDict):
    """The last commit: its generation, wall time, duration and counts."""

    generation: int
    time: float
    duration_s: float
    files: int
    chunks: int


class PersistError(TypedDict):
    time: float
    error: str
    disk_full: bool


class DamagedFile(TypedDict):
    """A file of the current generation changed on disk since it was opened or written."""

    file: str
    reason: str
    generation: int
    time: float


class UnreadableNote(TypedDict):
    """A note that could not be read when last tried (an I/O error): the index keeps
    what it had of it."""

    error: str
    time: float


class Rebuilt(TypedDict):
    files: int
    chunks: int
    duration_s: float


class IndexStatus(TypedDict):
    files: int
    chunks: int
    links: int
    pending_changes: int
    uncommitted_changes: int
    rebuilding: bool
    watcher: WatcherStatus
    last_commit: CommitRecord | None
    persist_error: PersistError | None
    loaded_generation: int | None
    load_checked: bool
    load_corrupt: dict[str, str]
    damaged_files: dict[str, DamagedFile]
    live_damage: dict[str, str]
    unreadable: int
    unreadable_paths: list[str]
    searches: int
    idle_trims: int
    keyword: dict[str, int]
    vectors: VectorStatus | None


@dataclass(frozen=True, slots=True)
class Candidates:
    """What one search needs from the index, read under one lock acquisition."""

    keyword: list[tuple[int, float]]
    vector: list[tuple[int, float]]
    exact: set[int]
    chunks: dict[int, StoredChunk]
    links: dict[str, list[str]]  # candidate path -> linked paths
    #: linked path -> its chunk that best matches the query, else its first with body text
    firsts: dict[str, StoredChunk]
    #: How much of the query the keyword branch sees (``fusion.keyword_reach``); measured
    #: only when there is a vector branch to fuse with.
    reach: float = 1.0
    #: candidate key -> its window nearest the query (when asked for and known)
    windows: dict[int, Window] = field(default_factory=dict)


class WorkspaceIndex:
    """Keyword index, link graph and freshness for one workspace.

    What other modules read (maintenance, the vector backfill, the RPC handlers): ``root``
    (the workspace directory); ``state``, the :class:`IndexState` served now (a rebuild
    swaps in a new object: read it again rather than keep it; lookups are safe beside a
    running apply, anything more goes through :meth:`locked`); ``store``, the
    :class:`IndexStore` of the committed generations; ``watcher``, the :class:`Watcher`
    of the indexed directories (its ``scan`` and ``scan_listeners`` serve the health
    scans); ``changed``, an event set and replaced whenever chunks change; and
    ``last_commit``, the generation, time, duration and counts of the last commit (None before
    one). Maintenance goes through :meth:`locked`, :meth:`compact`, :meth:`check_files`,
    :meth:`check_live`, :meth:`live_problems` and :meth:`status`.
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
        self._max_chars = config.chunk_max_chars
        self._persist_delay_s = config.persist_delay_s
        self._idle_trim_s = config.idle_trim_s
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
        self._lock = trio.Lock()
        self._commit_lock = trio.Lock()
        self._dirty = trio.Event()
        self._changes = 0  # applied changes not yet committed
        self._big_passes = 0  # apply_paths calls of POOL_MIN_FILES+ files under way
        self._passes_done = trio.Event()  # set (and replaced) when the last one ends
        # A large pass (first build, big reconcile, rebuild) changed the state: the commit
        # after it serves the state loaded back from its files (``reload_saved``).
        self._reload = False
        # Set once the loaded state's deferred checksums passed (or it was replaced):
        # nothing derived from unchecked bytes may be saved before.
        self._checked = trio.Event()
        self._rebuilding = False
        self.watcher = Watcher(
            self.root,
            [self.daily_dir, self.digest_dir],
            apply=self.apply_paths,
            # Through self: a rebuild swaps in a new state object.
            known=self.known_files,
            config=watcher_config
            or WatcherConfig(reconcile_interval_s=config.reconcile_interval_s,
                             reconcile_before_ready=False,
                             # One call for a whole reconcile: ``apply_paths`` pipelines
                             # its own batches, and every call drains the pipeline.
                             apply_batch_max=1 << 30),
            limiter=cpu,
            background=self._background,
            hold=hold,
        )
        if pool is not None:
            self.watcher.scan_reached = (POOL_MIN_FILES, self._scan_found_many)
        self._token: trio.lowlevel.TrioToken | None = None
        self.load_report: LoadReport | None = None
        self.last_commit: CommitRecord | None = None
        self.persist_error: PersistError | None = None
        #: Files of the current generation that changed on disk after they were opened or
        #: written (logical name -> file, reason, generation, time); see ``check_files``.
        self.damaged: dict[str, DamagedFile] = {}
        #: What ``check_live`` found wrong with the state in memory (empty: nothing).
        self.live_damage: dict[str, str] = {}
        #: Notes whose last read failed (path -> error, time), the index keeping the
        #: version it had of each, if any, until they read again or are gone
        #: (``_note_reads``; ``known_files`` lists them to the watcher).
        self.unreadable: dict[str, UnreadableNote] = {}
        self._live_checked: IndexState | None = None  # the state ``live_damage`` is about
        self.searches = 0
        #: When a search or an apply last used the state (``trio.current_time``), whether
        #: one did since the last idle trim, and how many idle trims there were.
        self._last_use = 0.0
        self._used = trio.Event()
        self.idle_trims = 0
        #: Set (and replaced) whenever chunks change; the vector backfill waits on it.
        self.changed = trio.Event()
        #: The vector backfill of this workspace, once it attached itself.
        self.vectors: VectorWorker | None = None
        #: ``(text, _embedding_f16_b64)`` pairs found in ReMe's chunk store at start.
        self.foreign_vectors: list[tuple[str, str]] = []
        #: ReMe's chunk boundaries by note (texts, no vectors), kept for notes that match.
        self.reme_boundaries: dict[str, list[reme_import.ReMeChunk]] = {}
        #: What ReMe's chunk store held when the index started (None: no store).
        self.reme_store: dict[str, int] | None = None

    # -- service ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.load_report = await trio.to_thread.run_sync(
            partial(self.store.load, self.state, defer_checks=True), limiter=self._cpu)
        # Loading read whole state files into short-lived buffers; hand them back.
        await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)
        await trio.to_thread.run_sync(self._read_reme_store, self.load_report.fresh,
                                      limiter=self._cpu)
        if self.load_report.corrupt:
            log.warning("%s: derived state was corrupt (%s); rebuilding %s from the Markdown",
                        self.ws.agent_id, self.load_report.corrupt, self.load_report.rebuilt)
            self._mark_dirty()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.watcher.run)
                nursery.start_soon(self._persist_loop)
                nursery.start_soon(self._check_loaded)
                nursery.start_soon(self._trim_when_idle)
                task_status.started()
        finally:
            with trio.move_on_after(10.0) as cleanup:
                cleanup.shield = True
                # Dirty without counted changes: state repaired on load, still unsaved.
                # Not yet checked: nothing is saved; the Markdown has every change and
                # the next start's reconcile applies it.
                if (self._changes or self._dirty.is_set()) and self._checked.is_set():
                    await self._commit()

    async def after_start(self) -> None:
        """Until the daemon's start let background work go (at once without a ``hold``):
        work nobody waits for must not compete with the first answers."""
        if self._hold is not None:
            await self._hold()

    async def _check_loaded(self) -> None:
        """Checksum the state files the load mapped unchecked (searches are served from
        them meanwhile). On damage, load again with every checksum, which falls back to
        an older good generation or rebuilds from the Markdown, and swap that in."""
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
                async with self._lock:
                    if self.state is loaded:  # a rebuild may have replaced it meanwhile
                        self.state, self.load_report = fresh, report
                self._notify_changed()
                self._checked.set()
                await self.watcher.reconcile("after loading again", unattended=True)
            else:
                assert self.load_report is not None
                self.load_report.corrupt.update(corrupt)
            self._mark_dirty()
        self._checked.set()

    # -- applying changes ------------------------------------------------------------

    async def apply_paths(self, paths: set[str]) -> None:
        """Re-read ``paths`` (workspace-relative) and update the index to match the disk.

        Files are read and tokenized in small batches (short worker-thread calls), then
        applied together: one keyword-index merge for a startup reconcile of thousands of
        files instead of one per small batch.
        """
        ordered = sorted(paths)
        big = len(ordered) >= POOL_MIN_FILES
        if big:
            self._big_passes += 1
        try:
            await self._apply_sorted(ordered, big)
        finally:
            if big:
                self._big_passes -= 1
                if not self._big_passes:
                    self._passes_done.set()
                    self._passes_done = trio.Event()
        if len(ordered) >= APPLY_MIN_FILES:  # a first build's token lists are garbage now
            await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)

    def _scan_found_many(self) -> None:
        # From a scan's worker thread: an empty index (a first build) about to get this
        # many files will prepare them in the worker processes. Their start (an
        # interpreter and its imports each) overlaps the rest of the listing.
        if self._pool is not None and self._token is not None and not self.state.files:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._pool.warm)

    def known_files(self, indexed: dict[str, tuple[int, int]] | None = None,
                    ) -> dict[str, tuple[int, int]]:
        """What the watcher (and health) compare the disk with: path -> (mtime_ns, size)
        of every indexed note (``indexed``: ``IndexState.known`` read already), and of
        every note whose last read failed, so that a scan or a directory event that finds
        one gone applies that (and it leaves ``unreadable``); one never indexed has
        ``NO_STAT``."""
        known = self.state.known() if indexed is None else indexed
        for path in self.unreadable.keys() - known.keys():
            known[path] = NO_STAT
        return known

    async def passes_ended(self) -> None:
        """Return once no large pass (a first build, a large reconcile) is under way."""
        while self._big_passes:
            await self._passes_done.wait()

    async def _apply_sorted(self, ordered: list[str], big: bool) -> None:
        started = time.monotonic()

        async def apply(batches: list[PreparedBatch], last: bool) -> None:
            nonlocal started
            stats: ApplyStats = await self._locked(
                partial(self.state.apply, batches, stage=not last))
            metrics.observe("recalld_index_apply_seconds", time.monotonic() - started)
            metrics.count("recalld_index_apply_files_total", sum(len(b.files) for b in batches))
            started = time.monotonic()
            _note_reads(self.unreadable, batches)
            if stats.unreadable:
                log.warning("%s: %d notes could not be read (%s); the index keeps what it had "
                            "of them, if anything, and reads them again at their next change "
                            "or reconcile", self.ws.agent_id, len(stats.unreadable),
                            "; ".join(f"{path}: {why}" for path, why in stats.unreadable[:5]))
            if stats.changed:
                self._changes += stats.added + stats.updated + stats.deleted
                self._reload = self._reload or big
                self._mark_dirty()
                self._notify_changed()

        try:
            await self._prepare_each(ordered, lambda p: self.state.digest_of(p), apply,
                                     indexed=len(self.state.files))
        except BaseException:
            # Ended before its last apply: what the pass staged would wait unsearchable
            # (while listed as indexed, so no reconcile reads it again) until another
            # write or a commit merged it. Merged now, even while cancelled, so the
            # state is whole; what was not applied is unknown, and the next reconcile
            # (the watcher owes one after a failed apply) reads it.
            with trio.move_on_after(PASS_END_MAX_S) as ending:
                ending.shield = True
                await self._end_pass()
            if ending.cancelled_caught:
                log.warning("%s: a pass that ended early could not merge what it staged "
                            "within %.0f s; the next write or commit merges it",
                            self.ws.agent_id, PASS_END_MAX_S)
            raise

    async def _end_pass(self) -> None:
        dropped = await self._locked(self.state.end_pass)
        if dropped:
            log.warning("%s: %d files of a pass that ended early could not be merged; "
                        "the next reconcile reads them again", self.ws.agent_id, len(dropped))
            self._changes += len(dropped)
            self._mark_dirty()
            self._notify_changed()

    async def _prepare_each(
        self,
        ordered: list[str],
        digest_of: Callable[[str], str | None],
        apply: Callable[[list[PreparedBatch], bool], Awaitable[None]],
        progress: Callable[[int], None] | None = None,
        *,
        indexed: int = 0,
    ) -> None:
        """Prepare ``ordered`` in batches and hand them to ``apply`` in order, from
        ``APPLY_MIN_FILES`` up to ``APPLY_BATCH`` files at a time (one keyword-index merge
        for a startup reconcile of thousands of files instead of one per small batch),
        with whether they are the last (until then the keyword index may stage them and merge
        several applies at once); ``indexed``: how many files the index held before.

        Many files go to the worker processes, a few batches ahead of ``apply``; few files
        (an edit, a small reconcile) are prepared in worker threads, where a process hop
        would cost more than it saves.
        """
        pool = self._pool if len(ordered) >= POOL_MIN_FILES else None
        size = PREPARE_BATCH if pool is None else POOL_BATCH
        # Each worker process counts this pass's batches against one vocabulary, so a
        # batch carries (and the apply looks up) only the terms new to its worker.
        vocab = f"{os.getpid()}-{next(_PASSES)}"
        batches = [ordered[i:i + size] for i in range(0, len(ordered), size)]
        window = 2 * pool.workers if pool is not None else 1
        results: list[PreparedBatch | None] = [None] * len(batches)
        ready = [trio.Event() for _ in batches]
        slots = trio.Semaphore(window)

        async def one(i: int, paths: list[str]) -> None:
            digests = {p: digest_of(p) for p in paths}
            reme = {p: self.reme_boundaries[p] for p in paths if p in self.reme_boundaries}
            job = partial(prepare_files, self.root, paths, max_chars=self._max_chars,
                          digests=digests, reme=reme or None)
            if pool is not None:
                with contextlib.suppress(PoolUnavailable):  # else: in a thread after all
                    results[i] = await pool.call(partial(job, vocab=vocab))
            if results[i] is None:
                results[i] = await trio.to_thread.run_sync(job, limiter=self._cpu)
            ready[i].set()

        # The worker processes are let go once the last batch is prepared: the applies
        # and the commit that follow need memory, not workers.
        with contextlib.ExitStack() as hold:
            if pool is not None:
                hold.enter_context(pool.holding())
            async with trio.open_nursery() as nursery:
                async def feed() -> None:
                    for i, paths in enumerate(batches):
                        await slots.acquire()
                        nursery.start_soon(one, i, paths)

                nursery.start_soon(feed)
                pending: list[PreparedBatch] = []
                files = done = 0
                for i in range(len(batches)):
                    await ready[i].wait()
                    batch, results[i] = results[i], None
                    slots.release()
                    assert batch is not None
                    pending.append(batch)
                    files += len(batch.files)
                    last = i == len(batches) - 1
                    if last:
                        hold.close()
                    elif progress is not None:
                        progress(done + files)  # prepared: counts move per batch
                    at = min(APPLY_BATCH, max(APPLY_MIN_FILES, (indexed + done) // 4))
                    if files >= at or last:
                        await apply(pending, last)
                        done += files
                        pending, files = [], 0
                        batch = None
                        if pool is not None:
                            # A merge's buffers are freed, but glibc keeps them: hand
                            # them back before the next one, so they do not add up.
                            await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)
                        if progress is not None:
                            progress(done)

    async def _locked(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        # The CPU token before the index lock, as a commit takes them: in the other order
        # a commit holding the last token and an apply holding the lock would wait for
        # each other for ever.
        self._note_use()  # from the call on: a trim waiting for the lock stands back
        async with self._cpu, self._lock:
            return await trio.to_thread.run_sync(partial(fn, *args))

    def reads_now(self, query: str) -> bool:
        """Whether a search for ``query`` runs at once, on the event loop: its scoring is
        short (see :data:`INLINE_SEARCH_BUDGET`) and no writer holds the lock."""
        if len(query) > INLINE_QUERY_MAX_CHARS or self._lock.locked():
            return False
        chunks = len(self.state.chunks)
        return chunks <= INLINE_READ_MAX_CHUNKS and (
            chunks * max(1, _query_terms(query)) <= INLINE_SEARCH_BUDGET)

    async def _read(self, fn: Callable[[], T], query: str) -> T:
        """Run a search's read-only ``fn`` under the lock: inline when :meth:`reads_now`
        (a worker-thread hop costs more than the search itself; nothing else can run
        while ``fn`` does, so the free lock need not be taken), in a worker thread under
        the CPU limiter otherwise, so the event loop never waits on a long one."""
        self._note_use()
        if self.reads_now(query):
            return fn()
        return await self._locked(fn)

    async def locked(self, fn: Callable[[IndexState], T]) -> T:
        """Run ``fn(state)`` in a worker thread, holding a CPU token and the index lock."""
        async with self._cpu, self._lock:
            state = self.state
            return await trio.to_thread.run_sync(fn, state)

    def _note_use(self) -> None:
        """A search or an apply read the state (housekeeping through :meth:`locked`, such
        as health's periodic scan, does not count: it would wake the idle trim for ever)."""
        self._last_use = trio.current_time()
        self._used.set()

    async def _trim_when_idle(self) -> None:
        """Once no search or apply used the state for ``idle_trim_s``, let go of the pages
        of its mapped files that searches faulted in (they stay in the page cache: the
        next search maps back the few it needs) and give freed heap back to the system.
        Sleeps while nothing uses the state: an idle daemon does no work for this."""
        if self._idle_trim_s <= 0:
            return
        def idle_since() -> float:  # when the state counts as idle (uses move it on)
            return self._last_use + self._idle_trim_s

        while True:
            await self._used.wait()
            await trio.sleep_until(idle_since())
            if trio.current_time() < idle_since():
                continue
            async with self._lock:  # a swap in a worker thread replaces the mapped files
                if trio.current_time() < idle_since():
                    continue  # used while the lock was held: not idle after all
                self._used = trio.Event()
                # On the event loop: both take about a millisecond (madvise over the
                # resident pages, malloc_trim over a heap of tens of MB), once per idle
                # period, and nothing can use the state meanwhile.
                self.state.evict()
                memtrim.trim()
                self.idle_trims += 1

    def _mark_dirty(self) -> None:
        self._dirty.set()

    def _notify_changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def vectors_changed(self, count: int) -> None:
        """The backfill installed ``count`` vectors: commit them with the chunks."""
        if count:
            self._changes += count
            self._mark_dirty()

    def _read_reme_store(self, fresh: bool) -> None:
        """ReMe's chunk store, if the workspace has one: its vectors for the embedding
        cache and its boundaries for the notes it chunked (``reme_chunks.py``). Copies an
        older version of recalld wrote under ReMe's names go once our own index is saved
        (before, they still give their vectors)."""
        if not fresh:
            removed = reme_import.remove_own_mirrors(self.store.metadata_dir)
            if removed:
                log.info("%s: removed the copies of the index an older version wrote under "
                         "ReMe's names: %s", self.ws.agent_id, ", ".join(removed))
        found = reme_import.read_store(self.store.metadata_dir)
        if found is None:
            return
        self.foreign_vectors = found.vectors
        self.reme_boundaries = {
            path: [reme_import.ReMeChunk(c.start_line, c.end_line, c.text) for c in chunks]
            for path, chunks in found.chunks.items()}
        self.reme_store = {"records": found.records, "chunks": len(found),
                           "notes": len(found.chunks), "skipped": found.skipped,
                           "vectors": len(self.foreign_vectors)}
        log.info("%s: ReMe's chunk store holds %d chunks of %d notes (%d with vectors)",
                 self.ws.agent_id, len(found), len(found.chunks), len(self.foreign_vectors))

    # -- persistence -----------------------------------------------------------------

    async def _persist_loop(self) -> None:
        backoff = 1.0
        while True:
            await self._dirty.wait()
            # The startup checksums first: they take a background token themselves (one
            # is all there is on two cores), and a commit waits for them anyway.
            await self._checked.wait()
            # Let a burst of edits settle, and never spend more than ~1/5 of the time
            # writing state: a commit that took 1 s waits 5 s before the next one.
            took = self.last_commit["duration_s"] if self.last_commit else 0.0
            await trio.sleep(max(self._persist_delay_s, 5 * took))
            if self._big_passes:
                # A first build or a large reconcile: a commit now would write state
                # that is stale in seconds (at 100k chunks a commit costs ~4 s of CPU
                # the pass needs). Wait for its end, but save at least every
                # BUSY_COMMIT_MAX_S so a crash late in a long pass loses little.
                with trio.move_on_after(BUSY_COMMIT_MAX_S):
                    await self._passes_done.wait()
            # Nobody waits for this commit: background work, as health's scans and the
            # startup checksums are, so that while one of those runs too a CPU token is
            # still free for the next edit's apply and for searches (holding one each, a
            # scan and a commit left none: at 110k chunks an edit waited up to 2 s). The
            # commit lock before the token: a rebuild's commit under way must not keep
            # the token from other workspaces' background work.
            try:
                async with self._commit_lock, self._background:
                    await self._commit_once()
                backoff = 1.0
            except StorageError as exc:
                self.persist_error = {
                    "time": time.time(), "error": exc.message,
                    "disk_full": isinstance(exc, DiskFull),
                }
                log.error("%s: saving the index failed (%s); retrying in %.0f s",
                          self.ws.agent_id, exc, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, PERSIST_RETRY_MAX_S)

    async def _commit(self) -> None:
        # One commit at a time: the persist loop and a rebuild may both want one, and the
        # generation store is not meant for two writers.
        async with self._commit_lock:
            await self._commit_once()

    async def _commit_once(self) -> None:
        await self._checked.wait()
        # The CPU slot is taken before the snapshot, not only for the save: after a first
        # build of many workspaces, every one of them commits at once, and snapshots
        # waiting for a slot would each hold a copy of their chunk text meanwhile.
        async with self._cpu:
            async with self._lock:
                self._dirty = trio.Event()
                changes, self._changes = self._changes, 0
                # No limiter: this task holds a CPU token already (taking a second one
                # would deadlock once every token is held by a committing workspace).
                snap = await trio.to_thread.run_sync(
                    partial(snapshot, self.state, saved_stamp=self.store.saved_vectors,
                            tmp_dir=self.store.store.state_dir))
            started = time.monotonic()
            try:
                number = await trio.to_thread.run_sync(self.store.save, snap)
            except BaseException:
                self._changes += changes
                self._mark_dirty()
                raise
        self.persist_error = None
        self.damaged = {k: v for k, v in self.damaged.items() if v["generation"] >= number}
        self.last_commit = {
            "generation": number, "time": time.time(),
            "duration_s": round(time.monotonic() - started, 4), "files": len(snap.files),
            "chunks": len(snap.chunks),
        }
        large = len(snap.chunks) >= TRIM_AFTER_CHUNKS
        stamp = snap.stamp
        del snap
        if await self._serve_saved(stamp, number):
            # The large pass's objects are garbage now, cycles among them too.
            await trio.to_thread.run_sync(memtrim.collect, limiter=self._cpu)
        elif large:  # the serialized generation was hundreds of MB of short-lived buffers
            await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)

    async def _serve_saved(self, stamp: tuple[int, int, int], number: int) -> bool:
        """Serve the index from the files just committed (memory-mapped: page cache, not
        this process's heap) if nothing changed since they were written; either way, let go
        of the mapped pages the save read. After a large pass (``_reload``) the whole state
        is loaded back from those files, as a warm start loads it, rather than only its
        big arrays (``reload_saved``); returns whether it was."""
        gen = self.store.store.current
        saved: tuple[Mapped, Mapped] | None = None
        if gen is not None and gen.number == number and state_stamp(self.state) == stamp:
            # The private copies (ADR 0020) are made before the lock is taken, so searches
            # go on meanwhile: the generation's files never change, and no other commit can
            # replace it (this one holds the commit lock). Dropped if the state changes
            # meanwhile (unnamed files: nothing is left behind).
            try:
                saved = await trio.to_thread.run_sync(map_saved, gen)
            except (CorruptState, KeyError, ValueError, OSError) as exc:
                log.warning("%s: serving from generation %d failed (%s); kept in memory",
                            self.ws.agent_id, number, exc)
        async with self._lock:
            state = self.state
            if gen is None or saved is None or state_stamp(state) != stamp:
                await trio.to_thread.run_sync(state.evict)
                return False
            # Not while a large pass is still applying: it would need the whole keyword
            # dictionary back as strings at its next apply.
            whole = self._reload and not self._big_passes
            try:
                await trio.to_thread.run_sync(reload_saved if whole else adopt_saved,
                                              state, gen, saved)
            except (CorruptState, KeyError, ValueError, OSError) as exc:
                log.warning("%s: serving from generation %d failed (%s); kept in memory",
                            self.ws.agent_id, number, exc)
                return False
            if whole:
                self._reload = False
            return whole

    async def compact(self) -> None:
        """Merge the keyword index's segments now, then commit a generation.

        The merge runs in a worker thread under the index lock (searches see the index
        before or after it, never half of it); the commit follows even with no edit
        pending. Cancelled during the merge, the thread still finishes it and the next
        commit of the persist loop saves it.
        """
        async with self._lock:
            await trio.to_thread.run_sync(self.state.bm25.compact)
        self._changes += 1  # a commit with no edits would be skipped otherwise
        await self._commit()

    # -- damage ----------------------------------------------------------------------

    def check_files(self) -> dict[str, DamagedFile]:
        """Files of the current generation someone changed on disk (truncated, written
        to, replaced, removed) since they were opened or written; returns ``damaged``.

        A few ``stat`` calls. The index serves from private copies (``map_arrays``) and
        memory, so what it holds is intact: a new generation is saved from it, which
        clears the damage; until then health is ``degraded`` and names the files.
        """
        gen = self.store.store.current
        found = {} if gen is None else gen.changed_on_disk()
        # A commit in a worker thread may have replaced ``gen`` meanwhile and removed its
        # files: only the files of the generation still current count.
        if found and gen is not None and gen is self.store.store.current:
            now = time.time()
            for logical, why in found.items():
                self.damaged[logical] = {
                    "file": str(gen.path(logical).relative_to(self.root)),
                    "reason": why, "generation": gen.number, "time": now}
            log.warning("%s: index files of generation %d changed on disk (%s); saving a "
                        "new generation from memory", self.ws.agent_id, gen.number,
                        "; ".join(f"{d['file']}: {d['reason']}" for d in
                                  (self.damaged[k] for k in found)))
            if "vectors" in found:
                self.store.saved_vectors = None  # not carried: written again
            self._changes += 1
            self._mark_dirty()
        return self.damaged

    def check_live(self, state: IndexState) -> dict[str, str]:
        """Check the state in memory (call under the index lock, in a worker thread): the
        chunk table's structure, and every array file it is served from against its
        manifest checksum. Records and returns what is wrong (a rebuild clears it)."""
        bad: dict[str, str] = {}
        try:
            state.chunks.check()
        except ValueError as exc:
            bad["chunk_table"] = f"in memory: {exc}"
        for mapped in state.mapped:
            try:
                if not mapped.matches():
                    name = mapped.source.name if mapped.source is not None else "?"
                    bad[name] = "the copy in use does not match its checksum"
            finally:
                mapped.evict()
        self.live_damage, self._live_checked = bad, state
        if bad:
            log.error("%s: the index in memory is damaged (%s); rebuild it: recalld "
                      "reindex --agent %s", self.ws.agent_id, bad, self.ws.agent_id)
        return bad

    def live_problems(self) -> dict[str, str]:
        """What the last ``check_live`` found, while that state is still the one served."""
        return self.live_damage if self._live_checked is self.state else {}

    # -- queries ---------------------------------------------------------------------

    async def sync(self) -> None:
        """Return once every change made to the workspace before the call is indexed."""
        await self.watcher.sync()

    async def candidates(
        self, query: str, limit: int, filters: Filters, query_vector: tuple[str, F32] | None,
        *, link_limit: int = 0, keep: int | None = None, windows: bool = False,
    ) -> Candidates:
        """Keyword hits, vector hits, exact keys, their chunks and their link
        neighbourhood, from one consistent view in one worker-thread call.

        ``keep``: only the best ``keep`` keyword hits can become results (a search without
        a vector branch), so only their chunks and links are read; chunk objects are built
        on demand, and building them is most of a small index's search time.
        """

        def run() -> Candidates:
            state = self.state
            allowed = state.allowed(filters)
            # The exact check reads the top hits' chunks; the results read them again
            # (the chunk table keeps the chunks it built lately).
            table = state.chunks
            # Once for every step below; a short query's are remembered (_query_tokens).
            tokens = list(_query_tokens(query))
            hits, exact = exact_first(
                query, state.bm25, state.keyword_search(query, limit, allowed, tokens=tokens),
                table, limit=limit, allowed=allowed, tokens=tokens)
            chunks = {key: table[key] for key, _ in (hits if keep is None else hits[:keep])}
            vec_hits: list[tuple[int, float]] = []
            reach = 1.0
            if query_vector is not None and query_vector[0] == state.vector_space:
                worker = self.vectors
                vec_hits = (state.vector_search(query_vector[1], limit, allowed)
                            if worker is None else
                            worker.search(state, query_vector[1], limit, allowed))
                chunks.update((key, state.chunks[key]) for key, _ in vec_hits)
                reach = state.keyword_reach(tokens, hits)
            links: dict[str, list[str]] = {}
            firsts: dict[str, StoredChunk] = {}
            if link_limit:
                hit_paths = dict.fromkeys(c.path for c in chunks.values())
                targets: dict[str, None] = {}
                for path in hit_paths:
                    links[path] = state.neighbours(path)
                    for other in links[path]:
                        # With ``keep`` the hits are the results, which expansion skips.
                        if other in targets or (keep is not None and other in hit_paths):
                            continue
                        if len(targets) < link_limit and other in state.files:
                            targets[other] = None
                firsts = state.linked_chunks(query, list(targets), tokens=tokens)
            best: dict[int, Window] = {}
            if windows and query_vector is not None and self.vectors is not None:
                best = self.vectors.best_windows(state, query_vector[1], chunks)
            return Candidates(hits, vec_hits, exact, chunks, links, firsts, reach, best)

        self.searches += 1
        return await self._read(run, query)

    # -- rebuild ---------------------------------------------------------------------

    async def rebuild(self, progress: Callable[[int, int, str], None]) -> Rebuilt:
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
                _note_reads(unreadable, batches)

            await self._prepare_each(paths, lambda _: None, apply,
                                     lambda done: progress(done, total, "indexing"))
            # Vectors of unchanged texts move over, so search stays hybrid after the swap.
            old = await self.locked(lambda st: (
                {st.chunks.text(k): v for k, v in st.chunks.embeddings().items()},
                st.vector_space, st.vector_config))
            await trio.to_thread.run_sync(
                partial(carry_vectors, fresh, old[0], old[1], old[2]), limiter=self._cpu)
            async with self._lock:
                self.state = fresh
            self.unreadable = unreadable
            self._notify_changed()
            # Changes made while building are caught by a reconcile against the new state.
            await self.watcher.reconcile("after rebuild")
            self._changes += 1
            self._reload = True
            progress(total, total, "saving")
            await self._commit()
            progress(total, total, "done")
            return {"files": len(fresh.files), "chunks": len(fresh.chunks),
                    "duration_s": round(time.monotonic() - started, 3)}
        finally:
            self._rebuilding = False

    # -- status ----------------------------------------------------------------------

    def status(self) -> IndexStatus:
        """This index's part of ``daemon.status``: counts, pending and uncommitted
        changes, the last commit, load and persist problems, the watcher's state."""
        watcher = self.watcher.status()
        pending = watcher.get("pending", 0)
        report = self.load_report
        return {
            "files": len(self.state.files),
            "chunks": len(self.state.chunks),
            "links": len(self.state.graph),
            "pending_changes": pending,
            "uncommitted_changes": self._changes,
            "rebuilding": self._rebuilding,
            "watcher": watcher,
            "last_commit": self.last_commit,
            "persist_error": self.persist_error,
            "loaded_generation": None if report is None else report.generation,
            "load_checked": self._checked.is_set(),
            "load_corrupt": {} if report is None else report.corrupt,
            "damaged_files": dict(self.damaged),
            "live_damage": dict(self.live_problems()),
            "unreadable": len(self.unreadable),
            "unreadable_paths": sorted(self.unreadable)[:MAX_LISTED],
            "searches": self.searches,
            "idle_trims": self.idle_trims,
            "keyword": self.state.bm25.stats(),
            "vectors": None if self.vectors is None else self.vectors.status(),
        }


_PASSES = itertools.count()
#: Paths listed in status and health per kind (counts are always complete).
MAX_LISTED = 20
#: The stat ``known_files`` gives a note it could never read: it differs from any on
#: disk (a reconcile counts the note as changed while it is there).
NO_STAT = (-1, -1)


def _note_reads(unreadable: dict[str, UnreadableNote], batches: list[PreparedBatch]) -> None:
    """Record in ``unreadable`` which notes of ``batches`` (applied) could not be read,
    and forget those that were read (or found gone) this time."""
    now = time.time()
    for batch in batches:
        for prep in batch.files:
            if prep.error:
                unreadable[prep.path] = {"error": prep.error, "time": now}
            else:
                unreadable.pop(prep.path, None)


def metadata_dir(ws: Workspace) -> Path:
    return ws.root / ws.settings.metadata_dir


def _tokens(query: str) -> tuple[str, ...]:
    return tuple(tokenize_query(query))


#: ``tokenize_query(query)``, remembered for a short query (at most
#: :data:`INLINE_QUERY_MAX_CHARS`): an inline search asks for its terms to decide where it
#: runs, then searches with them; agents repeat queries.
_query_tokens = Memo(_tokens, 256, max_chars=INLINE_QUERY_MAX_CHARS).__getitem__


def _query_terms(query: str) -> int:
    """How many terms ``query`` has."""
    return len(_query_tokens(query))
