"""Passes over one workspace's notes: read, chunk and tokenize them, apply them to the index.

:class:`Passes` owns the pipeline of a pass (``apply_paths``, the watcher's apply; a
rebuild runs its own through :meth:`Passes.prepare_each`): reading, chunking and
tokenizing happen in worker threads under the daemon-wide CPU limiter, or in the worker
processes of the prepare pool for a large pass, without the index lock; the applies take
the lock (:meth:`StateAccess.run_locked`). It also counts the large passes under way (the
persist loop waits for their end) and keeps the notes whose last read failed. It has no
background task: every pass runs in its caller's task; a pass cancelled or failed before
its last apply merges what it staged, shielded, within ``PASS_END_MAX_S``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypedDict

import trio

from recalld.daemon import memtrim, metrics
from recalld.daemon.index.prepare import Prepared, PreparedBatch, prepare_files
from recalld.daemon.index.procpool import PoolUnavailable, PreparePool
from recalld.daemon.index.reads import StateAccess
from recalld.daemon.index.records import ApplyStats
from recalld.daemon.index.reme_source import ReMeSource
from recalld.daemon.index.state import IndexState
from recalld.daemon.memory.secret_names import mask_path, secret_notice

log = logging.getLogger(__name__)

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
# A pass that ends early merges what it staged (at most STAGED_MAX_DOCS documents) even
# while cancelled, for at most this long; a commit merges whatever is left.
PASS_END_MAX_S = 30.0


class UnreadableNote(TypedDict):
    """A note that could not be read when last tried (an I/O error): the index keeps
    what it had of it."""

    error: str
    time: float


class Passes:
    """The passes of one workspace's index.

    ``state`` gives the :class:`IndexState` served now (a rebuild swaps in a new object);
    ``changed(count, large)`` is called after an apply or a pass's end changed ``count``
    notes, ``large`` when a large pass did. ``running`` counts the large passes
    (``POOL_MIN_FILES`` files or more) under way; ``done`` is set (and replaced) when the
    last one ends.
    """

    def __init__(
        self,
        root: Path,
        *,
        state: Callable[[], IndexState],
        access: StateAccess,
        cpu: trio.CapacityLimiter,
        pool: PreparePool | None,
        max_chars: int,
        agent_id: str,
        changed: Callable[[int, bool], None],
    ) -> None:
        self.root = root
        self._state = state
        self._access = access
        self._cpu = cpu
        self._pool = pool
        self._max_chars = max_chars
        self._agent_id = agent_id
        self._changed = changed
        self.running = 0  # apply_paths calls of POOL_MIN_FILES+ files under way
        self.done = trio.Event()  # set (and replaced) when the last one ends
        #: Notes whose last read failed (path -> error, time), the index keeping the
        #: version it had of each, if any, until they read again or are gone
        #: (``note_reads``; ``known_files`` lists them to the watcher).
        self.unreadable: dict[str, UnreadableNote] = {}
        #: ReMe's chunk store: its boundaries are kept for the notes that match them.
        self.reme: ReMeSource | None = None
        #: Notes of the passes under way not prepared yet (read, chunked, tokenized).
        self.preparing = 0
        #: Notes of the passes under way new to the index and not applied yet: how many
        #: more ``files`` counts once they end (less those that cannot be read).
        self.adding = 0
        #: Applies under way: while one runs (in a worker thread) ``files`` of the state
        #: grows before ``adding`` shrinks, so counts read meanwhile do not add up.
        self.applying = 0

    async def apply_paths(self, paths: set[str]) -> None:
        """Re-read ``paths`` (workspace-relative) and update the index to match the disk.

        Files are read and tokenized in small batches (short worker-thread calls), then
        applied together: one keyword-index merge for a startup reconcile of thousands of
        files instead of one per small batch.
        """
        ordered = sorted(paths)
        big = len(ordered) >= POOL_MIN_FILES
        if big:
            self.running += 1
        try:
            await self._apply_sorted(ordered, big)
        finally:
            if big:
                self.running -= 1
                if not self.running:
                    self.done.set()
                    self.done = trio.Event()
        if len(ordered) >= APPLY_MIN_FILES:  # a first build's token lists are garbage now
            await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)

    async def wait_ended(self) -> None:
        """Return once no large pass (a first build, a large reconcile) is under way."""
        while self.running:
            await self.done.wait()

    async def _apply_sorted(self, ordered: list[str], big: bool) -> None:
        started = time.monotonic()
        known = self._state().files
        adding = sum(1 for p in ordered if p not in known)
        self.adding += adding

        async def apply(batches: list[PreparedBatch], last: bool) -> None:
            nonlocal started, adding
            # A keyword delta still as loaded gets its dicts first, off the lock (else
            # the apply makes them under it: 0.35 s at 110k chunks, searches waiting).
            await self._access.thaw_delta()
            # Notes named by a secret are told of once, when first indexed, not at
            # each of their edits.
            told = self._state().secret_named
            # Outside large passes the keyword index compacts off the lock (StateAccess);
            # a large pass merges in bulk, as it always has.
            self.applying += 1
            try:
                stats: ApplyStats = await self._access.run_locked(
                    partial(self._state().apply, batches, stage=not last, compact=big))
            finally:
                self.applying -= 1
            added = min(stats.added, adding)
            adding -= added
            self.adding -= added
            metrics.observe("recalld_index_apply_seconds", time.monotonic() - started)
            metrics.count("recalld_index_apply_files_total", sum(len(b.files) for b in batches))
            started = time.monotonic()
            note_reads(self.unreadable, batches)
            if stats.unreadable:
                log.warning("%s: %d notes could not be read (%s); the index keeps what it had "
                            "of them, if anything, and reads them again at their next change "
                            "or reconcile", self._agent_id, len(stats.unreadable),
                            "; ".join(f"{mask_path(path)}: {why}"
                                      for path, why in stats.unreadable[:5]))
            named = [p.path for b in batches for p in b.files
                     if p.secret_name and p.path not in told
                     and not (p.gone or p.error or p.unchanged)]
            if named:
                log.warning("%s: %s", self._agent_id, secret_notice(named))
            if stats.changed or stats.restat:  # a new stat alone is saved too (no change)
                self._changed(stats.added + stats.updated + stats.deleted, big)

        try:
            await self.prepare_each(ordered, lambda p: self._state().digest_of(p), apply,
                                    indexed=len(self._state().files))
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
                            self._agent_id, PASS_END_MAX_S)
            raise
        finally:
            self.adding -= adding  # unreadable, or not reached: not to be added now

    async def _end_pass(self) -> None:
        dropped = await self._access.run_locked(self._state().end_pass)
        if dropped:
            log.warning("%s: %d files of a pass that ended early could not be merged; "
                        "the next reconcile reads them again", self._agent_id, len(dropped))
            self._changed(len(dropped), False)

    async def prepare_each(
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
        # A worker's vocabulary grows by its batches in the order it gets them, and the
        # applies look them up in batch order: so batches go to the pool in batch order,
        # whatever order their tasks run in and however long ReMe's lookups take.
        turns = [trio.Event() for _ in batches]
        slots = trio.Semaphore(window)
        left = len(ordered)  # of this pass, not prepared yet (counted in self.preparing)

        state = self._state()
        folders = (state.daily_dir + "/", state.digest_dir + "/")

        async def one(i: int, named: list[str]) -> None:
            nonlocal left
            # A note outside the note folders (one named otherwise in the settings since
            # it was indexed) is no note any more, wherever it is on disk.
            paths = [p for p in named if p.startswith(folders)]
            gone = [Prepared(path=p, gone=True) for p in named if not p.startswith(folders)]
            digests = {p: digest_of(p) for p in paths}
            reme = moved = None
            if self.reme is not None:
                reme = await self.reme.boundaries(paths, self._cpu)
                moved = await self.reme.moved(paths, self._cpu)
            job = partial(prepare_files, self.root, paths, max_chars=self._max_chars,
                          digests=digests, reme=reme or None, moved=moved or None)
            if pool is not None:
                if i:
                    await turns[i - 1].wait()
                # Set before the call: it hands the batch to the pool before it first
                # waits, so the next batch, woken by this, comes after it.
                turns[i].set()
                with contextlib.suppress(PoolUnavailable):  # else: in a thread after all
                    results[i] = await pool.call(partial(job, vocab=vocab))
            if results[i] is None:
                # A cancel (a stop, a close) ends the thread at its next note or step:
                # notes of megabytes take seconds each, and the next reconcile (at the
                # next start) reads them again.
                try:
                    results[i] = await trio.to_thread.run_sync(
                        partial(job, check=trio.from_thread.check_cancelled),
                        limiter=self._cpu)
                except trio.Cancelled:
                    log.info("%s: stopped preparing %d notes (%s...): they are read again "
                             "at the next reconcile", self._agent_id, len(paths),
                             mask_path(paths[0]))
                    raise
            result = results[i]
            if gone and result is not None:
                result.files += gone
            left -= len(named)
            self.preparing -= len(named)
            ready[i].set()

        # The worker processes are let go once the last batch is prepared: the applies
        # and the commit that follow need memory, not workers.
        def unprepared() -> None:  # the pass ended: none of its notes is to come
            self.preparing -= left

        self.preparing += left
        with contextlib.ExitStack() as hold:
            hold.callback(unprepared)
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


_PASSES = itertools.count()


def note_reads(unreadable: dict[str, UnreadableNote], batches: list[PreparedBatch]) -> None:
    """Record in ``unreadable`` which notes of ``batches`` (applied) could not be read,
    and forget those that were read (or found gone) this time."""
    now = time.time()
    for batch in batches:
        for prep in batch.files:
            if prep.error:
                unreadable[prep.path] = {"error": prep.error, "time": now}
            else:
                unreadable.pop(prep.path, None)
