"""Newer rows of a shared workspace's change feed written into the replica's files.

:class:`FeedApply` extends :class:`~recalld.daemon.remote.replicafiles.ReplicaFiles`
with what a catch-up of :class:`~recalld.daemon.remote.filesync.FileSync` does to each
row under the replica lock: whether the row is this replica's to write (``_wanted``),
and writing the wanted ones (``_apply_remote``), leaving a file edited here since the
replica last saw it for its edit to go up first; and recording what was written
(``_record_pulled``, which also records a version the uploader wrote to settle a path).
It starts nothing and owns no task.
"""

from __future__ import annotations

from functools import partial

import trio

from recalld.daemon.remote import db
from recalld.daemon.remote.calls import in_thread
from recalld.daemon.remote.localfs import LocalFile
from recalld.daemon.remote.replicafiles import ReplicaFiles
from recalld.daemon.remote.state import Base


class FeedApply(ReplicaFiles):
    """The replica's files, to which the feed's rows are applied (see the module
    docstring)."""

    #: Whether a row outside this host's folders passed by (counted at the catch-up's end).
    _passed_outside: bool

    async def _record_pulled(self, bases: list[tuple[str, Base]],
                             cursor: int | None = None) -> None:
        """Persist the bases of notes the server's versions were written for. Shielded:
        a cancel (a disconnect, the workspace closed for a restore) that came while a
        version was written must not leave it on disk unrecorded, its note still marked
        to take it (a later edit, a restored backup, would then go to the conflict copy,
        or be based on the version before it)."""
        with trio.CancelScope(shield=True):
            await in_thread(partial(self.state.record, bases, cursor))
        self._arrived.update(path for path, _ in bases)

    def _wanted(self, row: db.Row) -> bool:
        """Whether the newer server row ``row`` is this replica's to write (lock held)."""
        if not self._fs.accepts(row.path):
            self._passed_outside = True  # counted at the end of the catch-up
            return False
        base = self.state.bases.get(row.path)
        if base is not None and (row.version <= base.version or base.redirect or base.settle):
            return False  # already known, or the uploader settles the path
        # A note with local changes waiting uploads first; a conflict then settles it.
        return not self._waiting(row.path)

    async def _apply_remote(self, rows: list[db.Row],
                            failed: dict[str, Exception]) -> list[tuple[str, Base]]:
        """Write newer server rows locally (lock held; their landings are recorded): the
        files read in one worker-thread call, the ones to change written in another.
        Returns the bases to record; a row whose file was edited here since the replica
        last saw it gets none: that edit goes up first (and conflicts); nor does one whose
        file cannot be read or written (in ``failed``)."""
        if not rows:
            return []
        local = await in_thread(self._fs.read_each, [r.path for r in rows], failed)
        # A file the watcher has not reported yet (renamed between forms just now, the
        # name as this disk spells it now) is read first: unchanged, it takes over the
        # note it was renamed from and then takes the row like any other file; otherwise
        # its content goes up first.
        unseen = [f for row, f in zip(rows, local, strict=True)
                  if f is not None and f.hash not in (None, row.hash)
                  and self._last_local.get(f.path) is None]
        if unseen:
            await self._observe(unseen)
        updates: list[tuple[str, Base]] = []
        edited: list[LocalFile] = []
        install: list[db.Row] = []
        expect: dict[str, str | None] = {}
        for row, f in zip(rows, local, strict=True):
            if f is None:
                continue  # unreadable: in failed
            if self._outbox.pending_for(row.path):
                continue  # read just now as a local edit: it goes up first
            if f.hash == row.hash:
                # Already so on disk (written before a crash, or the same edit made here).
                if f.stat is not None:
                    self._known[row.path] = f.stat
                self._last_local[row.path] = row.hash
                updates.append((row.path, Base(row.version, row.hash, f.stat)))
            elif f.hash != self._last_local.get(row.path):
                edited.append(f)  # a local edit not reported yet
            else:
                install.append(row)
                expect[row.path] = f.hash
        # A save between the read above and a file's rename is kept, and goes up.
        saved: list[LocalFile] = []
        stats = await in_thread(partial(self._fs.put, [(r.path, r.data) for r in install],
                                        failed, expect=expect, edited=saved))
        edited += saved
        gone = {f.path for f in saved}
        for row, stat in zip(install, stats, strict=True):
            if row.path in failed or row.path in gone:
                continue
            if stat is None:
                self._known.pop(row.path, None)
            else:
                self._known[row.path] = stat
            self._last_local[row.path] = row.hash
            updates.append((row.path, Base(row.version, row.hash, stat)))
        if edited:
            # Shielded (local file calls only): a cancel here would leave the rows just
            # written on disk with their bases never recorded (the caller records them
            # next, shielded), so a later edit here would be based on the versions before.
            with trio.CancelScope(shield=True):
                await self._observe(edited)
        return updates
