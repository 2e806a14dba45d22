"""The replica's side of one shared workspace's files: what is on disk, what the replica
knows of it, and the outbox that local changes are queued in.

:class:`ReplicaFiles` owns the outbox and replica state (``<metadata_dir>/remote/``),
the lock under which files are read, written and compared with them, and, per path, the
last content the replica knows (the server's, or the last queued change) and the stat it
last saw. It reads what the watcher reports and queues what differs
(:meth:`ReplicaFiles._apply_local`), and writes server content into files
(:meth:`ReplicaFiles._put_local`). A note found gone or emptied waits for the
deletion guard (``remote/guard.py``, :meth:`ReplicaFiles.deletion_loop`) before it is
queued, or held. :class:`~recalld.daemon.remote.filesync.FileSync`
builds the exchange with the server on it.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial

import trio

from recalld.daemon.config import RemoteConfig
from recalld.daemon.memory.dayindex import refresh_days
from recalld.daemon.remote import db
from recalld.daemon.remote.calls import in_thread
from recalld.daemon.remote.forms import renamed, spellings
from recalld.daemon.remote.guard import SETTLE_MAX_S, SETTLE_S, DeletionGuard
from recalld.daemon.remote.localfs import (
    ANY,
    Confinement,
    EditedMeanwhile,
    LocalFile,
    content_hash,
)
from recalld.daemon.remote.outbox import Change, Outbox
from recalld.daemon.remote.state import STATE_LOG, Base, ReplicaState, replica_dir
from recalld.daemon.safepath import masked, masked_about
from recalld.daemon.workspaces import Workspace

log = logging.getLogger(__name__)

_EMPTY = content_hash(b"")
#: The stat of a note whose file the replica has not seen since its last change: no file
#: has it, so the next rescan reads the file, or finds it gone.
_UNSEEN = (-1, -1)


class ReplicaFiles:
    """The local files of a shared workspace's replica (see the module docstring)."""

    def __init__(self, ws: Workspace, cfg: RemoteConfig) -> None:
        self._ws = ws
        self._cfg = cfg
        s = ws.settings
        meta = replica_dir(ws.root, s.metadata_dir)
        #: The replicated folders, relative to the workspace.
        self.folders = tuple("/".join(r) for r in
                             Confinement(ws.root, (s.daily_dir, s.digest_dir)).roots)
        self._fs = Confinement(ws.root, self.folders, daily_dir=s.daily_dir)
        self._outbox = Outbox(meta / "outbox.log")
        self.state = ReplicaState(meta / STATE_LOG)
        self._lock = trio.Lock()
        self._last_local: dict[str, str | None] = {}
        self._known: dict[str, tuple[int, int]] = {}
        self._wake_uploader = trio.Event()
        #: Called after each local change queued (the replica, waiting long to reconnect
        #: with nothing to send, tries the server after its short wait).
        self.on_queued: Callable[[], None] = lambda: None
        #: Local notes that could not be read at their last change or rescan, and why
        #: (said once in the log, not at each rescan).
        self._unreadable: dict[str, str] = {}
        self.guard = DeletionGuard(ws.root, (s.metadata_dir, s.daily_dir, s.digest_dir))
        self._guard_wake = trio.Event()
        #: Set (and replaced) each time the guard has judged what waited.
        self._judged = trio.Event()
        #: The version of the change feed the last catch-up read up to; ``_pulled`` is
        #: set (and replaced) after each.
        self.read_upto = 0
        self._pulled = trio.Event()
        #: Set (and replaced) when another host stored vectors or gave claims back.
        self.vectors_stored = trio.Event()
        #: Notes the feed wrote or removed here since the last catch-up ended, whose
        #: day indexes are then made again (each host derives its own: ``dayindex.py``).
        self._arrived: set[str] = set()

    async def pulled_upto(self, version: int) -> int:
        """Record that a catch-up read the feed up to ``version`` (returned), once the
        day indexes of the notes it brought are made again."""
        if self._arrived:
            arrived, self._arrived = self._arrived, set()
            await refresh_days(self._ws, arrived)
        self.read_upto = version
        self._pulled.set()
        self._pulled = trio.Event()
        return version

    def heard(self, notes: list[str]) -> bool:
        """Take the notifications drained from the workspace's channel: wake those waiting
        for another host's vectors; whether the feed is to be read."""
        if db.VECTORS_STORED in notes:
            self.vectors_stored.set()
            self.vectors_stored = trio.Event()
        return any(n != db.VECTORS_STORED for n in notes)

    async def wait_pulled(self, version: int, timeout_s: float,
                          online: Callable[[], bool]) -> bool:
        """Wait until a catch-up has read the feed up to ``version`` (False: not within
        ``timeout_s``, or ``online()`` says the server cannot be reached now)."""
        with trio.move_on_after(timeout_s):
            while self.read_upto < version:
                if not online():
                    return False
                await self._pulled.wait()
            return True
        return False

    def open(self) -> None:
        self._outbox.open()
        self.state.open()
        if self.state.bind_folders(list(self.folders)):
            log.warning("shared workspace %s: its folders changed to %s; the whole change "
                        "feed is read again", self._cfg.name, ", ".join(self.folders))
        for path, base in self.state.bases.items():
            self._last_local[path] = base.hash
            if base.hash is not None:
                self._known[path] = base.stat or _UNSEEN
        for change in self._outbox.pending():
            # The file was changed after its base: the base's stat is not the file's
            # (a copy of the base's text put back with its times, as a restored backup
            # does, would look unchanged), so the next rescan reads it, or finds it gone
            # (removed while the daemon was stopped, or by a restore).
            self._last_local[change.path] = change.hash
            if change.hash is None:
                self._known.pop(change.path, None)
            else:
                self._known[change.path] = _UNSEEN
        queued = {c.path: c.hash for c in self._outbox.pending()}
        for path, other in self.state.respelt.items():
            if other in queued and path not in queued:
                # Took the note over while a change of the old spelling waited: its
                # file is as that change left it, not as the base (see _take_base).
                self._last_local[path] = queued[other]
                self._known[path] = _UNSEEN
        self.guard.restored(self.state.held)
        self.guard.adopt_folders()

    def close(self) -> None:
        self._outbox.close()
        self.state.close()

    @property
    def queued(self) -> int:
        """Changes in the outbox."""
        return len(self._outbox)

    @property
    def cursor(self) -> int:
        """The highest server version the feed has been applied up to."""
        return self.state.cursor

    # -- local changes ---------------------------------------------------------------

    async def _apply_local(self, paths: set[str]) -> None:
        wanted = sorted(p for p in paths if self._fs.accepts(p))
        if not wanted:
            return
        async with self._lock:
            # Read under the lock: a file the feed is writing right now must be seen
            # either before or after, never as a stale copy queued as a local edit.
            failed: dict[str, Exception] = {}
            files = await in_thread(self._fs.read_each, wanted, failed)
            for path in wanted:  # one that fails stays as the replica knew it until then
                why = masked_about(str(failed[path]), path) if path in failed else None
                if why is not None and self._unreadable.get(path) != why:
                    log.warning("shared workspace %s: cannot read %s now (%s); it is read "
                                "again at its next change or rescan", self._cfg.name,
                                masked(path), why)
                if why is None:
                    self._unreadable.pop(path, None)
                else:
                    self._unreadable[path] = why
            await self._observe(f for f in files if f is not None)

    async def _observe(self, files: Iterable[LocalFile], *, settled: bool = False) -> None:
        """Queue what differs from the last content known (caller holds the lock). A
        note gone or emptied waits for the deletion guard unless ``settled``."""
        changes: list[Change] = []
        back: list[str] = []
        same: list[tuple[str, str | None, tuple[int, int] | None]] = []  # stat to keep
        now = time.time()
        for f in files:
            if f.stat is None:
                self._known.pop(f.path, None)
            else:
                self._known[f.path] = f.stat
            last = self._last_local.get(f.path)
            if f.exists and f.path in self.guard.held:
                back.append(f.path)  # restored: the same content is no change at all
            if f.hash == last:
                self.guard.pending.pop(f.path, None)
                same.append((f.path, f.hash, f.stat))
                continue
            # Gone, or empty where it was not (a writer that creates or truncates, then
            # writes; a new note too): judged once the changes have settled.
            if (not settled and ((f.data is None and last is not None)
                                 or (f.data == b"" and last != _EMPTY))):
                if f.exists or f.path not in self.guard.held:  # held stays held
                    self.guard.pending.setdefault(f.path, now)
                    self._guard_wake.set()
                continue
            self.guard.pending.pop(f.path, None)
            if f.hash is not None and self.state.landing.get(f.path) == f.hash:
                # Written from the server before a crash cut the bookkeeping short: the
                # next catch-up records it; it is not a local edit.
                self._last_local[f.path] = f.hash
                continue
            base = self.state.bases.get(f.path)
            if (last is None and (base is None or base.hash is None)  # none here yet
                    and await self._take_base(f.path) == f.hash):
                # Renamed between forms, unchanged: no edit, nothing to send (sent, it
                # would conflict with an edit another host made meanwhile).
                self._last_local[f.path] = f.hash
                continue
            changes.append(Change(str(uuid.uuid4()), f.path, f.data, f.hash, now))
        if same:
            await in_thread(self.state.restamp, same)
        if back:
            await self._unhold(back)
        if not changes:
            return
        with trio.CancelScope(shield=True):
            await in_thread(self._outbox.add, changes)
        for c in changes:
            self._last_local[c.path] = c.hash
        self._wake_uploader.set()
        self.on_queued()

    async def _take_base(self, path: str) -> str | None:
        """A new file ``path`` whose note the replica knows spelt in another Unicode form
        (the whole path, or a folder's name or the file name alone), no longer on disk
        (renamed between forms), is based on that note's version (caller holds the lock);
        returns the hash of the note as the replica last knew it (a change of the old
        spelling still queued, else that version's): other content is an edit made
        after it (a backup restored over it too). Beside it, it is another file: its
        own change (a conflict).

        The old spelling is no note of its own from then on (unless a change of it still
        waits to go up: the guard judges it once it has): were the files put back as
        they were before the rename (a backup restored, a sync tool spelling the name
        back) before the guard found it gone, its outdated version would be taken for a
        twin's, and the new spelling's absence for a deletion of the note."""
        for other in spellings(path)[1:]:
            base = self.state.bases.get(other)
            if (base is not None and base.hash is not None and not base.redirect
                    and not await in_thread(os.path.lexists, self._ws.root / other)):
                took = [(path, replace(base, stat=None))]
                ended: list[tuple[str, str | None]] = []
                if not self._outbox.pending_for(other):
                    took.append((other, Base(0, None)))
                    ended.append((other, None))  # its own take-over, if any, is over
                with trio.CancelScope(shield=True):
                    await in_thread(partial(self.state.record, took,
                                            respelt=[*ended, (path, other)]))
                last = self._last_local.get(other)
                if ended:
                    self._last_local[other] = None
                # Unchanged is as the replica last knew the note: a change of the old
                # spelling still queued, else its base.
                return base.hash if last is None else last
        return None

    def _stored(self, path: str, version: int, hash_: str | None,
                stat: tuple[int, int] | None,
                ended: list[tuple[str, str | None]]) -> list[tuple[str, Base]]:
        """The bases to record once a change of ``path`` is stored as ``version``: its
        own, and that of another spelling of the name that took the note over at the
        version the change was based on (renamed between forms while the change waited):
        what was changed under the new spelling since follows this change, as it would
        under one name, rather than conflicting with it. Once the last change queued
        under ``path`` is stored, ``path``, found renamed meanwhile, is no note of its
        own any more (as when nothing waited): the take-over ends (added to ``ended``)."""
        old = self.state.bases.get(path)
        stored = [(path, Base(version, hash_, stat, old.redirect if old else None))]
        if old is None or old.hash is None or not old.version or hash_ is None:
            return stored  # a deletion: the note another spelling holds is no deletion
        for other in spellings(path)[1:]:
            took = self.state.bases.get(other)
            if took is not None and took.version == old.version and not took.redirect:
                stored.append((other, replace(took, version=version, hash=hash_)))
        if (len(stored) > 1 and self._last_local.get(path) is None
                and self._outbox.count_for(path) <= 1):
            stored[0] = (path, Base(0, None))
            ended += [(new, None) for new, was in self.state.respelt.items() if was == path]
        return stored

    def _takers(self, path: str) -> list[str]:
        """The spellings that took the note at ``path`` over (renamed between forms while
        a change of it waited)."""
        return [new for new, old in self.state.respelt.items() if old == path]

    def _marked(self, path: str, redirect: str | None) -> list[tuple[str, Base]]:
        """The bases of ``path`` and of the spellings that took it over, marked to take
        the server's version (``redirect``: a conflict's copy, else a deletion that
        lost): the note is one under either spelling."""
        marked = []
        for p in [path, *self._takers(path)]:
            base = self.state.bases.get(p) or Base(0, None)
            marked.append((p, replace(base, redirect=redirect) if redirect
                           else replace(base, settle=True)))
        return marked

    def _handed_over(self, path: str, base: Base | None,
                     ended: list[tuple[str, str | None]]) -> tuple[list[str], Base | None]:
        """Once the last change queued under ``path`` is answered: the paths that must
        now take the server's version (``base`` marks a conflict or a lost deletion),
        and the base ``path`` is to have instead. A spelling that took the note over
        takes the server's version in its place (not ``path``, no longer on disk), and
        ``path`` is no note of its own any more: the take-over ends (added to ``ended``)."""
        if base is None or not (base.redirect or base.settle):
            return [], None
        takers = self._takers(path)
        if not takers:
            return [path], None
        ended += [(new, None) for new in takers]
        self._last_local[path] = None
        return [new for new in takers if not self._outbox.pending_for(new)], Base(0, None)

    def _waiting(self, path: str) -> bool:
        """Whether local changes of the note at ``path`` wait to go up: of ``path``, or of
        the spelling ``path`` took the note over from (renamed between forms while they
        waited), which move ``path``'s base on once stored (:meth:`_stored`)."""
        return any(self._outbox.pending_for(p)
                   for p in (path, self.state.respelt.get(path)) if p is not None)

    def _twin(self, path: str, other: str) -> bool:
        """``other`` (``path`` in another Unicode form) is a note of its own: the server
        holds the name in both forms (shared before one row per name), each synced here
        at its own version, so ``path`` gone is a deletion, no rename into ``other``.
        ``other`` that took this note over (renamed into, since edited) is none."""
        if self.state.respelt.get(other) == path:
            return False
        mine, theirs = self.state.bases.get(path), self.state.bases.get(other)
        return (theirs is not None and theirs.hash is not None
                and (mine is None or theirs.version != mine.version))

    async def _unhold(self, paths: list[str]) -> None:
        """End the hold of ``paths`` (restored, released; caller holds the lock)."""
        with trio.CancelScope(shield=True):
            await in_thread(self.state.hold, [(p, None) for p in paths])
        self.guard.unhold(paths)
        if not self.guard.held:
            await in_thread(self.guard.adopt_folders)
            log.info("shared workspace %s: no deletion is held back any more", self._cfg.name)

    async def deletion_loop(self) -> None:
        """Judge the notes found gone or emptied once the changes have settled (see
        ``remote/guard.py``), until cancelled; cancelled while waiting, those waiting are
        found again by the next start's reconcile."""
        while True:
            await self._guard_wake.wait()
            deadline = trio.current_time() + SETTLE_MAX_S
            while True:  # quiet for SETTLE_S, or SETTLE_MAX_S in all
                self._guard_wake = trio.Event()
                with trio.move_on_after(min(SETTLE_S, deadline - trio.current_time())):
                    await self._guard_wake.wait()
                if not self._guard_wake.is_set() or trio.current_time() >= deadline:
                    break
            async with self._lock:
                await self._judge()
                if not self.guard.held:  # a folder removed and made again lost nothing
                    await in_thread(self.guard.adopt_folders)
            self._judged.set()
            self._judged = trio.Event()

    def _root_lost(self, rel: str) -> None:
        """The watcher saw a replicated folder removed: judged after the settle window."""
        self.guard.lost.add(rel)
        self._guard_wake.set()

    async def wait_judged(self) -> None:
        """Return once no note found gone or emptied waits for the guard."""
        while self.guard.pending:
            await self._judged.wait()

    async def _judge(self) -> None:
        """Queue or hold what waited for the guard (caller holds the lock)."""
        paths = sorted(self.guard.pending)
        self.guard.pending.clear()
        if not paths:
            return
        failed: dict[str, Exception] = {}  # unreadable now: read at the next change
        files = [f for f in await in_thread(self._fs.read_each, paths, failed)
                 if f is not None]
        await self._observe([f for f in files if f.exists], settled=True)
        gone = [f for f in files if not f.exists and f.path not in self.guard.held
                and self._last_local.get(f.path) is not None]
        moved = {p: o for p, o in (await in_thread(
            renamed, self._ws.root, [f.path for f in gone])).items() if not self._twin(p, o)}
        if moved:
            # Renamed between Unicode forms: the same note, which the new spelling carries,
            # also one the watcher has not reported yet (it takes the note over now).
            for path, now in moved.items():
                if self._last_local.get(now) is None:
                    self._last_local[now] = await self._take_base(now)
                self._last_local[path] = None
            # A change still queued under the old spelling goes up on the version it
            # was made on (as in _take_base): that spelling's base stays until then.
            over = [p for p in moved if not self._outbox.pending_for(p)]
            ended = [(new, None) for new, old in self.state.respelt.items() if old in over]
            with trio.CancelScope(shield=True):
                await in_thread(partial(self.state.record, [(p, Base(0, None)) for p in over],
                                        respelt=ended))
            gone = [f for f in gone if f.path not in moved]
        if not gone:
            return
        known = sum(1 for h in self._last_local.values() if h is not None)
        why = (await in_thread(self.guard.folders_changed)
               or self.guard.mass(len(gone), known))
        if why is None:
            await self._observe(gone, settled=True)
            return
        with trio.CancelScope(shield=True):
            await in_thread(self.state.hold, [(f.path, why) for f in gone])
        self.guard.hold([f.path for f in gone], why)
        log.warning("shared workspace %s: %d note deletion(s) held back, not sent to the "
                    "other hosts: %s. Restore the files, or run `recalld remote release "
                    "%s --restore` to write them back from the server, or `recalld remote "
                    "release %s --upload` to delete them on every host",
                    self._cfg.name, len(gone), why, self._ws.agent_id, self._ws.agent_id)

    async def restore_held(self, rows: dict[str, db.Row | None]) -> int:
        """Write held notes back: each one's last queued content, else its server row
        (``rows``; None: not on the server); how many were held. Cut short, it records
        those written (a version unrecorded would make a later edit here conflict)."""
        async with self._lock:
            paths = [p for p in rows if p in self.guard.held]
            updates: list[tuple[str, Base]] = []
            try:
                for path in paths:
                    queued = [c for c in self._outbox.pending() if c.path == path]
                    try:
                        if queued:  # an edit not yet uploaded: it goes up, the file shows it
                            if queued[-1].data is not None:
                                await self._put_local(path, queued[-1].data, None)
                        else:
                            updates.append((path, await self._install(path, rows[path], None)))
                    except EditedMeanwhile as exc:  # put back meanwhile: that copy stays
                        await self._observe([exc.found], settled=True)
            finally:
                with trio.CancelScope(shield=True):
                    await in_thread(self.state.record, updates)
            await self._unhold(paths)
            return len(paths)

    async def upload_held(self) -> int:
        """Send the held deletions (of the notes still gone); how many were held."""
        async with self._lock:
            paths = sorted(self.guard.held)
            if not paths:
                return 0
            failed: dict[str, Exception] = {}
            files = await in_thread(self._fs.read_each, paths, failed)
            await self._unhold(paths)
            await self._observe([f for f in files if f is not None], settled=True)
            return len(paths)

    async def _put_local(self, path: str, data: bytes | None,
                         expect: str | object | None = ANY) -> tuple[int, int] | None:
        """Make the file at ``path`` hold ``data`` (None: absent); its new stat.
        ``expect``: the hash the caller read the file with (None: absent); a file found
        otherwise just before the write is left as it is: :class:`EditedMeanwhile`."""
        if data is None:
            await in_thread(partial(self._fs.put, [(path, None)], expect={path: expect}))
            self._known.pop(path, None)
            return None
        current = await in_thread(self._fs.read, path)
        if expect is not ANY and current.hash not in (expect, content_hash(data)):
            raise EditedMeanwhile(current)
        if current.data != data:
            new_hash = content_hash(data)
            if self.state.landing.get(path) != new_hash:
                await in_thread(self.state.land, [(path, new_hash)])
            stat = await in_thread(self._fs.write, path, data, current.hash)
        else:
            assert current.stat is not None
            stat = current.stat
        self._known[path] = stat
        return stat

    async def _install(self, path: str, row: db.Row | None,
                       expect: str | object | None = ANY) -> Base:
        data = None if row is None else row.data
        stat = await self._put_local(path, data, expect)
        self._last_local[path] = None if row is None else row.hash
        return Base(0 if row is None else row.version, None if row is None else row.hash, stat)
