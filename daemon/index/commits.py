"""Committing one workspace's index: the persist loop, commits, serving what was saved, damage.

:class:`Committer` counts the changes applied since the last commit and saves a new
generation to the :class:`IndexStore` (``persist.py``) once they settle:
:meth:`Committer.persist_loop`, a task the index service starts, retries a failed commit
(a save, or a snapshot out of memory) with backoff and stops by cancellation (the service
then makes its last commit, shielded under a deadline). A commit snapshots the state under
the index lock and saves it in a worker thread without the lock; then the index serves its
large arrays from the files just saved (memory-mapped), and after a large pass the whole
state loaded back from them, as a warm start would load it. Nothing is saved before the
loaded state's deferred checksums passed (``checked``). It also finds damage: files of the
current generation changed on disk (:meth:`Committer.check_files`) and a state in memory
that no longer matches its checksums (:meth:`Committer.check_live`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypedDict

import trio

from recalld.daemon import memtrim, safepath
from recalld.daemon.index.passes import Passes
from recalld.daemon.index.persist import (
    IndexStore,
    Snapshot,
    adopt_saved,
    map_saved,
    reload_saved,
    snapshot,
    state_stamp,
)
from recalld.daemon.index.reads import StateAccess
from recalld.daemon.index.state import IndexState
from recalld.daemon.store.arrays import Mapped
from recalld.daemon.store.errors import CorruptState, DiskFull, StorageError
from recalld.ipc.errors import UnknownWorkspace

log = logging.getLogger(__name__)

# Commits of at least this many chunks hand freed buffers back to the system afterwards.
TRIM_AFTER_CHUNKS = 2_000
PERSIST_RETRY_MAX_S = 300.0
BUSY_COMMIT_MAX_S = 60.0


class CommitRecord(TypedDict):
    """The last commit: its generation, wall time, duration and counts, and how long it
    waited between falling due and starting (locks and CPU tokens held by other work)."""

    generation: int
    time: float
    duration_s: float
    waited_s: float
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


class Committer:
    """The commits of one workspace's index.

    What its owner reads and sets: ``changes``, the applied changes not yet committed;
    ``dirty``, set when something waits to be saved (:meth:`mark_dirty`) and replaced by
    each commit; ``reload``, set when a large pass (first build, big reconcile, rebuild)
    changed the state: the commit after it serves the state loaded back from its files
    (``reload_saved``); ``checked``, set once the loaded state's deferred checksums passed
    (or it was replaced): nothing derived from unchecked bytes may be saved before;
    ``last_commit`` (None before one) and ``persist_error`` (None while saving works);
    :meth:`waiting_s`, how long the persist loop's commit that is due has waited.
    """

    def __init__(
        self,
        store: IndexStore,
        root: Path,
        *,
        state: Callable[[], IndexState],
        access: StateAccess,
        passes: Passes,
        cpu: trio.CapacityLimiter,
        background: trio.CapacityLimiter,
        persist_delay_s: float,
        agent_id: str,
    ) -> None:
        self.store = store
        self.root = root
        self._state = state
        self._access = access
        self._passes = passes
        self._cpu = cpu
        self._background = background
        self._persist_delay_s = persist_delay_s
        self._agent_id = agent_id
        self._commit_lock = trio.Lock()
        self.dirty = trio.Event()
        self.changes = 0  # applied changes not yet taken by a commit
        #: The changes the commit under way took: not on disk before its save ends.
        self.saving = 0
        self.reload = False
        self.checked = trio.Event()
        #: The index service stopped (its workspace closed or failed): no commit from now
        #: on, the folder may be another index's already (the workspace opened again).
        self.closed = False
        self.last_commit: CommitRecord | None = None
        self.persist_error: PersistError | None = None
        #: Files of the current generation that changed on disk after they were opened or
        #: written (logical name -> file, reason, generation, time); see ``check_files``.
        self.damaged: dict[str, DamagedFile] = {}
        #: What ``check_live`` found wrong with the state in memory (empty: nothing).
        self.live_damage: dict[str, str] = {}
        self._live_checked: IndexState | None = None  # the state ``live_damage`` is about
        #: When the persist loop's commit that waits to start fell due (None: none waits).
        self._due: float | None = None

    @property
    def unsaved(self) -> int:
        """Applied changes not yet on disk: those no commit took yet, and those of the
        commit under way (status says "uncommitted" of both)."""
        return self.changes + self.saving

    def mark_dirty(self) -> None:
        self.dirty.set()

    async def persist_loop(self) -> None:
        backoff = 1.0
        while True:
            # An explicit commit (``commit``: a compaction, a rebuild) replaces the event
            # this waits on and sets the old one: wait again, on its successor.
            while not self.dirty.is_set():
                await self.dirty.wait()
            # The startup checksums first: they take a background token themselves (one
            # is all there is on two cores), and a commit waits for them anyway.
            await self.checked.wait()
            # Let a burst of edits settle, and never spend more than ~1/5 of the time
            # writing state: a commit that took 1 s waits 5 s before the next one.
            took = self.last_commit["duration_s"] if self.last_commit else 0.0
            await trio.sleep(max(self._persist_delay_s, 5 * took))
            if self._passes.running:
                # A first build or a large reconcile: a commit now would write state
                # that is stale in seconds (at 100k chunks a commit costs ~4 s of CPU
                # the pass needs). Wait for its end, but save at least every
                # BUSY_COMMIT_MAX_S so a crash late in a long pass loses little.
                with trio.move_on_after(BUSY_COMMIT_MAX_S):
                    await self._passes.done.wait()
            # Nobody waits for this commit: background work, as health's scans and the
            # startup checksums are, so that while one of those runs too a CPU token is
            # still free for the next edit's apply and for searches (holding one each, a
            # scan and a commit left none: at 110k chunks an edit waited up to 2 s). The
            # commit lock before the token: a rebuild's commit under way must not keep
            # the token from other workspaces' background work.
            self._due = due = time.monotonic()
            try:
                async with self._commit_lock, self._background:
                    await self._commit_once(due)
                backoff = 1.0
            except StorageError as exc:
                self.persist_error = {
                    "time": time.time(), "error": exc.message,
                    "disk_full": isinstance(exc, DiskFull),
                }
                log.error("%s: saving the index failed (%s); retrying in %.0f s",
                          self._agent_id, exc, backoff)
                self._due = None
                await trio.sleep(backoff)
                backoff = min(backoff * 2, PERSIST_RETRY_MAX_S)
            finally:
                self._due = None

    async def commit(self) -> None:
        """Commit a generation now (once the loaded state is checked)."""
        # One commit at a time: the persist loop and a rebuild may both want one, and the
        # generation store is not meant for two writers.
        due = time.monotonic()
        async with self._commit_lock:
            if self.closed:  # a call handed the workspace before it closed (index.compact)
                raise UnknownWorkspace(
                    f"workspace {self._agent_id!r} was closed (or failed) while the call "
                    "ran: its index saved nothing; call again once it is open")
            await self._commit_once(due)

    async def commit_at_close(self) -> None:
        """The last commit of a closing workspace, if anything is unsaved. A failure (a
        full disk) is logged: the Markdown has every change, the next start catches up."""
        # Dirty without counted changes: state repaired on load, still unsaved. Not yet
        # checked: nothing is saved; the next start's reconcile applies every change.
        if not ((self.changes or self.dirty.is_set()) and self.checked.is_set()):
            return
        try:
            await self.commit()
        except StorageError as exc:
            log.warning("%s: the index was not saved at close (%s); the next start catches "
                        "up from the Markdown", self._agent_id, exc)

    def waiting_s(self) -> float | None:
        """How long the persist loop's commit that is due has waited to start (None: none
        waits; one that started saving no longer does)."""
        return None if self._due is None else round(time.monotonic() - self._due, 4)

    async def _commit_once(self, due: float) -> None:
        """Snapshot and save; ``due``: when this commit fell due (``time.monotonic``)."""
        await self.checked.wait()
        # The CPU slot is taken before the snapshot, not only for the save: after a first
        # build of many workspaces, every one of them commits at once, and snapshots
        # waiting for a slot would each hold a copy of their chunk text meanwhile.
        async with self._cpu:
            waited = time.monotonic() - due
            if due == self._due:
                self._due = None  # started: no longer waiting
            taken: int | None = None  # the changes this commit took (None: none yet)
            try:
                async with self._access.lock:
                    stale, self.dirty = self.dirty, trio.Event()
                    stale.set()  # the persist loop may wait on it (see persist_loop)
                    taken, self.changes = self.changes, 0
                    self.saving = taken
                    # No limiter: this task holds a CPU token already (taking a second
                    # one would deadlock once every token is held by a committing
                    # workspace).
                    snap = await trio.to_thread.run_sync(
                        partial(snapshot, self._state(),
                                saved_stamp=self.store.saved_vectors,
                                tmp_dir=self.store.store.state_dir,
                                saved_windows=self.store.saved_windows))
                started = time.monotonic()
                number = await trio.to_thread.run_sync(self._save_in_place, snap)
            except BaseException as exc:
                # Whatever failed (the snapshot, the save, a cancellation), what this
                # commit took waits for the next one, and status counts it meanwhile.
                if taken is not None:
                    self.changes += taken
                    self.mark_dirty()
                if isinstance(exc, MemoryError):
                    # Retried with backoff like a full disk, not the end of the index.
                    raise StorageError("the index was not saved: out of memory") from exc
                raise
            finally:
                self.saving = 0
        self.persist_error = None
        self.damaged = {k: v for k, v in self.damaged.items() if v["generation"] >= number}
        self.last_commit = {
            "generation": number, "time": time.time(),
            "duration_s": round(time.monotonic() - started, 4),
            "waited_s": round(waited, 4), "files": len(snap.files), "chunks": len(snap.chunks),
        }
        large = len(snap.chunks) >= TRIM_AFTER_CHUNKS
        stamp = snap.stamp
        del snap
        if await self._serve_saved(stamp, number):
            # The large pass's objects are garbage now, cycles among them too.
            await trio.to_thread.run_sync(memtrim.collect, limiter=self._cpu)
        elif large:  # the serialized generation was hundreds of MB of short-lived buffers
            await trio.to_thread.run_sync(memtrim.trim, limiter=self._cpu)

    def _save_in_place(self, snap: Snapshot) -> int:
        """Save ``snap`` (blocking), unless the workspace folder leads elsewhere now (a
        link took its place): the generation would land in another folder's index."""
        elsewhere = safepath.leads_elsewhere(self.root)
        if elsewhere is not None:
            raise StorageError(f"the index was not saved: the workspace folder {self.root} "
                               f"now leads to {elsewhere}")
        return self.store.save(snap)

    async def _serve_saved(self, stamp: tuple[int, int, int], number: int) -> bool:
        """Serve the index from the files just committed (memory-mapped: page cache, not
        this process's heap) if nothing changed since they were written; either way, let go
        of the mapped pages the save read. After a large pass (``reload``) the whole state
        is loaded back from those files, as a warm start loads it, rather than only its
        big arrays (``reload_saved``); returns whether it was. If that fails (damaged
        files, no memory for the copies) the index goes on serving what it holds: the
        generation is saved, and the persist loop must not end over it."""
        gen = self.store.store.current
        saved: tuple[Mapped, Mapped] | None = None
        if gen is not None and gen.number == number and state_stamp(self._state()) == stamp:
            # The private copies (ADR 0020) are made before the lock is taken, so searches
            # go on meanwhile: the generation's files never change, and no other commit can
            # replace it (this one holds the commit lock). Dropped if the state changes
            # meanwhile (unnamed files: nothing is left behind).
            try:
                saved = await trio.to_thread.run_sync(map_saved, gen)
            except (CorruptState, KeyError, ValueError, OSError, MemoryError) as exc:
                log.warning("%s: serving from generation %d failed (%s); kept in memory",
                            self._agent_id, number, exc)
        async with self._access.lock:
            state = self._state()
            if gen is None or saved is None or state_stamp(state) != stamp:
                await trio.to_thread.run_sync(state.evict)
                return False
            # Not while a large pass is still applying: it would need the whole keyword
            # dictionary back as strings at its next apply.
            whole = self.reload and not self._passes.running
            try:
                await trio.to_thread.run_sync(reload_saved if whole else adopt_saved,
                                              state, gen, saved)
            except (CorruptState, KeyError, ValueError, OSError, MemoryError) as exc:
                log.warning("%s: serving from generation %d failed (%s); kept in memory",
                            self._agent_id, number, exc)
                return False
            if whole:
                self.reload = False
            return whole

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
                        "new generation from memory", self._agent_id, gen.number,
                        "; ".join(f"{d['file']}: {d['reason']}" for d in
                                  (self.damaged[k] for k in found)))
            if "vectors" in found:
                self.store.saved_vectors = None  # not carried: written again
            if "windows" in found:
                self.store.saved_windows = None
            self.changes += 1
            self.mark_dirty()
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
                      "reindex --agent %s", self._agent_id, bad, self._agent_id)
        return bad

    def live_problems(self) -> dict[str, str]:
        """What the last ``check_live`` found, while that state is still the one served."""
        return self.live_damage if self._live_checked is self._state() else {}
