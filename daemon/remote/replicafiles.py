"""The replica's side of one shared workspace's files: what is on disk, what the replica
knows of it, and the outbox that local changes are queued in.

:class:`ReplicaFiles` owns the outbox and replica state (``<metadata_dir>/remote/``),
the lock under which files are read, written and compared with them, and, per path, the
last content the replica knows (the server's, or the last queued change) and the stat it
last saw. It reads what the watcher reports and queues what differs
(:meth:`ReplicaFiles._apply_local`), and writes server content into files
(:meth:`ReplicaFiles._put_local`). :class:`~recalld.daemon.remote.filesync.FileSync`
builds the exchange with the server on it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable

import trio

from recalld.daemon.config import RemoteConfig
from recalld.daemon.remote import db
from recalld.daemon.remote.calls import in_thread
from recalld.daemon.remote.localfs import Confinement, LocalFile, content_hash
from recalld.daemon.remote.outbox import Change, Outbox
from recalld.daemon.remote.state import Base, ReplicaState
from recalld.daemon.workspaces import Workspace

log = logging.getLogger(__name__)


class ReplicaFiles:
    """The local files of a shared workspace's replica (see the module docstring)."""

    def __init__(self, ws: Workspace, cfg: RemoteConfig) -> None:
        self._ws = ws
        self._cfg = cfg
        s = ws.settings
        meta = ws.root / s.metadata_dir / "remote"
        self._fs = Confinement(ws.root, (s.daily_dir, s.digest_dir))
        self._outbox = Outbox(meta / "outbox.log")
        self.state = ReplicaState(meta / "state.log")
        self._lock = trio.Lock()
        self._last_local: dict[str, str | None] = {}
        self._known: dict[str, tuple[int, int]] = {}
        self._wake_uploader = trio.Event()
        #: Local notes that could not be read at their last change or rescan, and why
        #: (said once in the log, not at each rescan).
        self._unreadable: dict[str, str] = {}

    def open(self) -> None:
        self._outbox.open()
        self.state.open()
        for path, base in self.state.bases.items():
            self._last_local[path] = base.hash
            if base.hash is not None and base.stat is not None:
                self._known[path] = base.stat
        for change in self._outbox.pending():
            self._last_local[change.path] = change.hash

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
                why = str(failed[path]) if path in failed else None
                if why is not None and self._unreadable.get(path) != why:
                    log.warning("shared workspace %s: cannot read %s now (%s); it is read "
                                "again at its next change or rescan", self._cfg.name, path, why)
                if why is None:
                    self._unreadable.pop(path, None)
                else:
                    self._unreadable[path] = why
            await self._observe(f for f in files if f is not None)

    async def _observe(self, files: Iterable[LocalFile]) -> None:
        """Queue what differs from the last content known (caller holds the lock)."""
        changes: list[Change] = []
        now = time.time()
        for f in files:
            if f.stat is None:
                self._known.pop(f.path, None)
            else:
                self._known[f.path] = f.stat
            if f.hash == self._last_local.get(f.path):
                continue
            if f.hash is not None and self.state.landing.get(f.path) == f.hash:
                # Written from the server before a crash cut the bookkeeping short: the
                # next catch-up records it; it is not a local edit.
                self._last_local[f.path] = f.hash
                continue
            changes.append(Change(str(uuid.uuid4()), f.path, f.data, f.hash, now))
        if not changes:
            return
        with trio.CancelScope(shield=True):
            await in_thread(self._outbox.add, changes)
        for c in changes:
            self._last_local[c.path] = c.hash
        self._wake_uploader.set()

    async def _put_local(self, path: str, data: bytes | None) -> tuple[int, int] | None:
        """Make the file at ``path`` hold ``data`` (None: absent); its new stat."""
        if data is None:
            await in_thread(self._fs.remove, path)
            self._known.pop(path, None)
            return None
        current = await in_thread(self._fs.read, path)
        if current.data != data:
            new_hash = content_hash(data)
            if self.state.landing.get(path) != new_hash:
                await in_thread(self.state.land, [(path, new_hash)])
            stat = await in_thread(self._fs.write, path, data)
        else:
            assert current.stat is not None
            stat = current.stat
        self._known[path] = stat
        return stat

    async def _install(self, path: str, row: db.Row | None) -> Base:
        data = None if row is None else row.data
        stat = await self._put_local(path, data)
        self._last_local[path] = None if row is None else row.hash
        return Base(0 if row is None else row.version, None if row is None else row.hash, stat)
