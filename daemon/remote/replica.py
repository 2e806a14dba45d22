"""One shared workspace's replica: local files up to PostgreSQL, remote changes down.

Owns the workspace's outbox and replica state (``<metadata_dir>/remote/``), a
:class:`~recalld.daemon.watcher.Watcher` of its Markdown folders (the same mechanism as
the index: inotify plus reconcile scans) and, while the server is reachable, two
connections: the *writer* uploads the outbox in order, the *listener* receives the
workspace's NOTIFY channel and reads the change feed. Connection count: two per shared
workspace, none while offline; with ``search_mode = "server"`` a third, opened by the
first search, runs searches in the server (``remote/search.py``) and the session makes
sure every file has its chunks there (``remote/chunks.py``).

Local → remote: the watcher reports paths; each is read and hashed under the replica
lock and compared with the last content the replica knows for it (the server's, or the
last queued change). A difference becomes a :class:`~recalld.daemon.remote.outbox.Change`
appended durably to the outbox; the uploader sends changes in order, each based on the
version the replica last agreed on for that path, and records the answer
(:mod:`recalld.daemon.remote.db`). A conflict keeps the other host's version at the path:
this host's version is written beside it as ``*.sync-conflict-<date>-<host>.md`` (already
stored on the server as such), later local edits of that path go to the copy until the
winning version has been written locally, and an inbox item says what happened.

Remote → local: after every (re)connect, on each notification and every
``CATCH_UP_EVERY_S``, the feed is read from the last applied version on. A newer row is
written into the directory atomically (confined to the watched folders) unless the path
has local changes not yet uploaded (those upload first, and conflict); the watcher then
finds the file identical to what the replica knows, so nothing goes back up, and the index
picks it up through its own watcher.

Offline: any database error closes both connections; the replica keeps accepting local
changes into the outbox, status shows ``offline`` with the outbox length, and connecting
is retried with full-jitter backoff (:class:`~recalld.daemon.providers.retry.RetryPolicy`).
Database calls run in worker threads; cancellation (closing the workspace) waits for the
call in flight, which the server and socket timeouts of :func:`db.connect` bound.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import TypedDict, TypeVar, TypeVarTuple

import psycopg
import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.config import RemoteConfig, mask_dsn
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.reads import Candidates
from recalld.daemon.providers.retry import RetryPolicy
from recalld.daemon.remote import db
from recalld.daemon.remote.localfs import Confinement, LocalFile, content_hash
from recalld.daemon.remote.outbox import Change, Outbox
from recalld.daemon.remote.schema import SchemaTooNew
from recalld.daemon.remote.state import Base, ReplicaState
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import AlreadyRunning, ProviderUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

CATCH_UP_EVERY_S = 30.0
# How long an embedding waits for the first connection attempt after a start, and how
# often it looks for vectors another host is computing.
FIRST_CONNECT_WAIT_S = 15.0
CLAIM_POLL_S = 0.2
RECONNECT = RetryPolicy(backoff_base_s=0.5, backoff_max_s=10.0)
_UNAVAILABLE = (psycopg.Error, OSError, SchemaTooNew)


async def _thread(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    return await trio.to_thread.run_sync(fn, *args)


class VectorCounts(TypedDict):
    shared: int  # vectors another host had embedded
    embedded_here: int


class ServerSearchStatus(TypedDict):
    server_searches: int
    local_fallbacks: int
    chunks_ready: bool
    chunks_backfilled: int
    last_error: str | None


class ReplicaStatus(TypedDict):
    """A shared workspace's replica, as the workspace's status shows it."""

    state: str  # connecting, online, offline
    server: str  # the DSN, password masked
    name: str
    host: str
    outbox: int
    cursor: int
    uploaded: int
    pulled: int
    conflicts: int
    online_since: float | None
    last_upload: float | None
    last_pull: float | None
    last_error: str | None
    last_error_at: float | None
    watcher: str
    vectors: VectorCounts
    search_mode: str
    search: ServerSearchStatus


class Replica:
    """The replica service of one shared workspace (see the module docstring)."""

    def __init__(self, ws: Workspace, cfg: RemoteConfig,
                 *, reconcile_interval_s: float = 300.0,
                 chunk_max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self._ws = ws
        self._cfg = cfg
        self._max_chars = chunk_max_chars
        self.host = cfg.host or socket.gethostname().split(".")[0] or "host"
        s = ws.settings
        meta = ws.root / s.metadata_dir / "remote"
        self._fs = Confinement(ws.root, (s.daily_dir, s.digest_dir))
        self._outbox = Outbox(meta / "outbox.log")
        self._state = ReplicaState(meta / "state.log")
        self._lock = trio.Lock()
        self._last_local: dict[str, str | None] = {}
        self._known: dict[str, tuple[int, int]] = {}
        self._wake_uploader = trio.Event()
        self._watcher = Watcher(
            ws.root, [s.daily_dir, s.digest_dir], apply=self._apply_local,
            known=lambda: self._known,
            config=WatcherConfig(reconcile_interval_s=reconcile_interval_s,
                                 reconcile_before_ready=False))
        self._rng = random.Random()  # noqa: S311 (backoff jitter)
        self._workspace_id: int | None = None
        self._conn_state = "connecting"
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._online_since: float | None = None
        self._last_upload: float | None = None
        self._last_pull: float | None = None
        self._uploaded = 0
        self._pulled = 0
        self._conflicts = 0
        self._secrets = _secrets(cfg)
        # The writer connection, shared by the uploader and the embedding exchange.
        self._writer: db.Conn | None = None
        self._writer_lock = trio.Lock()
        self._first_attempt = trio.Event()
        self.shared_vectors = 0
        self.provider_vectors = 0
        # Searching in the server (search_mode "server"): a connection of its own, opened
        # on the first search, so searches never queue behind a burst of uploads.
        self._reader: db.Conn | None = None
        self._reader_lock = trio.Lock()
        self._uploaded_event = trio.Event()
        self.server_searches = 0
        self.search_fallbacks = 0
        self.chunks_backfilled = 0
        # Every file of the workspace has its chunks in the server (checked once per
        # session): until then the local index answers.
        self._chunks_ready = False
        # HNSW indexes of vector spaces searched in the server: built or being built.
        self._vector_indexes: set[tuple[str, int]] = set()
        self._nursery: trio.Nursery | None = None
        self._last_search_error: str | None = None

    # -- lifecycle -------------------------------------------------------------------

    def _open(self) -> None:
        self._outbox.open()
        self._state.open()
        for path, base in self._state.bases.items():
            self._last_local[path] = base.hash
            if base.hash is not None and base.stat is not None:
                self._known[path] = base.stat
        for change in self._outbox.pending():
            self._last_local[change.path] = change.hash

    def _close(self) -> None:
        self._outbox.close()
        self._state.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve until cancelled: local writing never waits for the server."""
        await _thread(self._open)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._watcher.run)
                nursery.start_soon(self._connection_loop)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                reader, self._reader = self._reader, None
                if reader is not None:
                    await _thread(reader.close)
                await _thread(self._close)

    # -- status ----------------------------------------------------------------------

    def status(self) -> ReplicaStatus:
        return {
            "state": self._conn_state,
            "server": mask_dsn(self._cfg.dsn),
            "name": self._cfg.name,
            "host": self.host,
            "outbox": len(self._outbox),
            "cursor": self._state.cursor,
            "uploaded": self._uploaded,
            "pulled": self._pulled,
            "conflicts": self._conflicts,
            "online_since": self._online_since,
            "last_upload": self._last_upload,
            "last_pull": self._last_pull,
            "last_error": self._last_error,
            "last_error_at": self._last_error_at,
            "watcher": self._watcher.state,
            "vectors": {"shared": self.shared_vectors, "embedded_here": self.provider_vectors},
            "search_mode": self._cfg.search_mode,
            "search": {"server_searches": self.server_searches,
                       "local_fallbacks": self.search_fallbacks,
                       "chunks_ready": self._chunks_ready,
                       "chunks_backfilled": self.chunks_backfilled,
                       "last_error": self._last_search_error},
        }

    # -- local changes ---------------------------------------------------------------

    async def _apply_local(self, paths: set[str]) -> None:
        wanted = sorted(p for p in paths if self._fs.accepts(p))
        if not wanted:
            return
        async with self._lock:
            # Read under the lock: a file the feed is writing right now must be seen
            # either before or after, never as a stale copy queued as a local edit.
            files = await _thread(lambda: [self._fs.read(p) for p in wanted])
            await self._observe(files)

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
            if f.hash is not None and self._state.landing.get(f.path) == f.hash:
                # Written from the server before a crash cut the bookkeeping short: the
                # next catch-up records it; it is not a local edit.
                self._last_local[f.path] = f.hash
                continue
            changes.append(Change(str(uuid.uuid4()), f.path, f.data, f.hash, now))
        if not changes:
            return
        with trio.CancelScope(shield=True):
            await _thread(self._outbox.add, changes)
        for c in changes:
            self._last_local[c.path] = c.hash
        self._wake_uploader.set()

    # -- the connection --------------------------------------------------------------

    async def _connection_loop(self) -> None:
        attempt = 0
        while True:
            began = trio.current_time()
            try:
                await self._session()
            except* _UNAVAILABLE as group:
                self._record_error(group.exceptions[0])
            except* Exception as group:
                # A fault of ours (a full disk under the outbox, a bug) must not take the
                # workspace down with it: record it and try again after a while.
                log.error("shared workspace %s: replication failed", self._cfg.name,
                          exc_info=group)
                self._record_error(group.exceptions[0])
            self._first_attempt.set()
            self._conn_state = "offline"
            self._online_since = None
            if trio.current_time() - began > 60:
                attempt = 0
            delay = RECONNECT.backoff_s(attempt, self._rng)
            attempt = min(attempt + 1, 16)
            await trio.sleep(delay)

    def _record_error(self, exc: BaseException) -> None:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        text = " ".join(str(exc).split()) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        if text != self._last_error:
            log.warning("shared workspace %s (%s): server unavailable: %s",
                        self._cfg.name, mask_dsn(self._cfg.dsn), text)
        self._last_error = text
        self._last_error_at = time.time()

    async def _session(self) -> None:
        writer: db.Conn | None = None
        listener: db.Conn | None = None
        try:
            writer = await _thread(db.connect, self._cfg)
            workspace_id, ident = await _thread(db.open_workspace, writer, self._cfg.name)
            self._workspace_id = workspace_id
            await self._adopt(ident)
            listener = await _thread(db.connect, self._cfg)
            poked = _Flag()
            listener.add_notify_handler(lambda _n: poked.set())
            await _thread(db.listen, listener, workspace_id)
            self._writer = writer
            self._chunks_ready = False
            self._conn_state = "online"
            self._online_since = time.time()
            self._first_attempt.set()
            log.info("shared workspace %s: online (%s), %d change(s) queued",
                     self._cfg.name, mask_dsn(self._cfg.dsn), len(self._outbox))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._upload_loop, writer)
                nursery.start_soon(self._pull_loop, listener, poked)
                if self._cfg.search_mode == "server":
                    nursery.start_soon(self._chunk_backfill, writer)
        finally:
            self._writer = None
            with trio.CancelScope(shield=True):
                for conn in (listener, writer):
                    if conn is not None:
                        await _thread(conn.close)

    async def _adopt(self, ident: str) -> None:
        """Start over when the state belongs to another shared workspace than the server's."""
        async with self._lock:
            reset = await _thread(self._state.adopt, ident)
            if not reset:
                return
            log.warning("shared workspace %s: the server's workspace is not the one this "
                        "replica synced with; every local file goes up again (identical "
                        "content is no change, different content a conflict copy)",
                        self._cfg.name)
            self._last_local = {c.path: c.hash for c in self._outbox.pending()}
            self._known.clear()
        await self._watcher.reconcile("shared workspace changed")

    # -- uploading -------------------------------------------------------------------

    def _target(self, path: str) -> tuple[str, int]:
        base = self._state.bases.get(path)
        if base is not None and base.redirect:
            copy = self._state.bases.get(base.redirect)
            return base.redirect, copy.version if copy else 0
        return path, base.version if base else 0

    async def _upload_loop(self, conn: db.Conn) -> None:
        assert self._workspace_id is not None
        # Paths whose settling a disconnect or a crash interrupted.
        for path, base in list(self._state.bases.items()):
            if (base.redirect or base.settle) and not self._outbox.pending_for(path):
                async with self._writer_lock:
                    row = await _thread(db.fetch, conn, self._workspace_id, path)
                async with self._lock:
                    await self._settle(path, row)
        while True:
            wake = self._wake_uploader
            change = self._outbox.head()
            if change is None:
                await wake.wait()
                self._wake_uploader = trio.Event()
                continue
            async with self._lock:
                target, base_version = self._target(change.path)
            async with self._writer_lock:
                answer = await _thread(db.upload, conn, self._workspace_id, self.host, change,
                                       target, base_version, self._max_chars)
            async with self._lock:
                settle = await self._record_answer(change, target, answer)
            self._uploaded += 1
            self._last_upload = time.time()
            self._uploaded_event.set()
            self._uploaded_event = trio.Event()
            if settle:
                async with self._writer_lock:
                    row = await _thread(db.fetch, conn, self._workspace_id, change.path)
                async with self._lock:
                    await self._settle(change.path, row)

    async def _record_answer(self, change: Change, target: str, answer: db.Answer) -> bool:
        """Apply the server's answer locally, then mark the change done. Returns whether
        the path must now take the server's version (caller holds the lock)."""
        bases = self._state.bases
        updates: list[tuple[str, Base]] = []
        if answer.outcome in ("applied", "same"):
            stat = self._known.get(target)
            if target != change.path:
                # Redirected to this host's conflict copy: the copy on disk follows.
                stat = await self._put_local(target, change.data)
                self._last_local[target] = change.hash
            old = bases.get(target)
            updates.append((target, Base(answer.version, change.hash, stat,
                                         old.redirect if old else None)))
        elif answer.outcome == "conflict":
            copy = answer.stored_path
            stat = await self._put_local(copy, change.data)
            self._last_local[copy] = change.hash
            updates.append((copy, Base(answer.version, change.hash, stat)))
            old = bases.get(change.path) or Base(0, None)
            updates.append((change.path, replace(old, redirect=copy)))
            self._conflicts += 1
            await self._report_conflict(change.path, copy, answer.replayed)
        elif answer.outcome == "kept":
            old = bases.get(change.path) or Base(0, None)
            updates.append((change.path, replace(old, settle=True)))
        with trio.CancelScope(shield=True):
            await _thread(self._state.record, updates)
            await _thread(self._outbox.done, change.id)
        if self._outbox.pending_for(change.path):
            return False
        base = bases.get(change.path)
        return bool(base is not None and (base.redirect or base.settle))

    async def _settle(self, path: str, row: db.Row | None) -> None:
        """Give ``path`` the server's version once every local edit of it went up."""
        if self._outbox.pending_for(path):
            return
        local = await _thread(self._fs.read, path)
        if local.hash != self._last_local.get(path):
            await self._observe([local])  # edited again meanwhile: that goes up first
            return
        base = await self._install(path, row)
        await _thread(self._state.record, [(path, base)])

    async def _put_local(self, path: str, data: bytes | None) -> tuple[int, int] | None:
        """Make the file at ``path`` hold ``data`` (None: absent); its new stat."""
        if data is None:
            await _thread(self._fs.remove, path)
            self._known.pop(path, None)
            return None
        current = await _thread(self._fs.read, path)
        if current.data != data:
            new_hash = content_hash(data)
            if self._state.landing.get(path) != new_hash:
                await _thread(self._state.land, [(path, new_hash)])
            stat = await _thread(self._fs.write, path, data)
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

    async def _report_conflict(self, path: str, copy: str, replayed: bool) -> None:
        log.warning("shared workspace %s: %s was changed on another host first; this "
                    "host's version is kept as %s", self._cfg.name, path, copy)
        try:
            inbox = self._ws.services.inbox
            if replayed and any(i.get("details", {}).get("conflict_copy") == copy
                                for i in inbox.list(include_acked=True)):
                return  # reported before a crash interrupted the bookkeeping
            await inbox.push(
                "sync_conflict",
                f"{path} was changed on another host first; your version is kept as {copy}",
                [path, copy], details={"path": path, "conflict_copy": copy,
                                       "shared_workspace": self._cfg.name})
        except Exception:  # the copy is on disk either way; the inbox is a courtesy
            log.exception("inbox item for the conflict on %s not recorded", path)

    # -- pulling ---------------------------------------------------------------------

    async def _pull_loop(self, conn: db.Conn, poked: _Flag) -> None:
        fd = conn.fileno()
        while True:
            poked.clear()
            await self._catch_up(conn)
            if await _thread(db.drain_notifies, conn) or poked.is_set():
                continue
            with trio.move_on_after(CATCH_UP_EVERY_S):
                await trio.lowlevel.wait_readable(fd)

    async def _catch_up(self, conn: db.Conn) -> None:
        assert self._workspace_id is not None
        while True:
            rows = await _thread(db.feed, conn, self._workspace_id, self._state.cursor)
            if not rows:
                return
            async with self._lock:
                landing = [(r.path, r.hash) for r in rows if r.hash is not None
                           and self._fs.accepts(r.path)]
                with trio.CancelScope(shield=True):
                    await _thread(self._state.land, landing)
                updates: list[tuple[str, Base]] = []
                for row in rows:
                    base = await self._apply_remote(row)
                    if base is not None:
                        updates.append((row.path, base))
                with trio.CancelScope(shield=True):
                    await _thread(partial(self._state.record, updates, rows[-1].version))
            self._pulled += len(updates)
            self._last_pull = time.time()

    async def _apply_remote(self, row: db.Row) -> Base | None:
        """Write one newer server row locally, or leave it to the uploader (lock held)."""
        if not self._fs.accepts(row.path):
            log.warning("shared workspace %s: ignoring a file outside the replicated "
                        "folders: %r", self._cfg.name, row.path)
            return None
        base = self._state.bases.get(row.path)
        if base is not None and (row.version <= base.version or base.redirect
                                 or base.settle):
            return None  # already known, or the uploader settles the path
        if self._outbox.pending_for(row.path):
            return None  # uploads first; a conflict then settles the path
        local = await _thread(self._fs.read, row.path)
        if local.hash == row.hash:
            # Already so on disk (written before a crash, or the same edit made here).
            if local.stat is not None:
                self._known[row.path] = local.stat
            self._last_local[row.path] = row.hash
            return Base(row.version, row.hash, local.stat)
        if local.hash != self._last_local.get(row.path):
            await self._observe([local])  # a local edit not reported yet goes up first
            return None
        return await self._install(row.path, row)


    @asynccontextmanager
    async def job_lock(self, kind: str) -> AsyncIterator[None]:
        """Run ``kind`` (auto_dream, auto_resource) on one host of the shared workspace at
        a time: a session-level advisory lock on a connection of its own, held for the
        block. Raises AlreadyRunning when another host holds it, ProviderUnavailable
        while the server cannot be reached."""
        if self._workspace_id is None or self._conn_state != "online":
            raise ProviderUnavailable(
                f"shared workspace {self._cfg.name} is offline: {kind} runs on one host at "
                "a time and waits until the server can be reached")
        workspace_id = self._workspace_id
        try:
            conn = await _thread(partial(db.connect, self._cfg,
                                         application_name=f"recalld {self.host} {kind}"))
        except _UNAVAILABLE as exc:
            self._record_error(exc)
            raise ProviderUnavailable(
                f"shared workspace {self._cfg.name}: server unavailable for {kind}") from None
        try:
            holder = await _thread(db.try_job_lock, conn, workspace_id, kind)
            if holder is not None:
                where = holder.removeprefix("recalld ").split(" ")[0] or "another host"
                raise AlreadyRunning(
                    f"{kind} of shared workspace {self._cfg.name} is running on {where}")
            yield
        finally:
            with trio.CancelScope(shield=True):
                await _thread(conn.close)  # closing the session releases the lock


    async def shared_embed(self, space: str, hashes: Sequence[str], texts: Sequence[str],
                           embed: Callable[[list[str]], Awaitable[F32]],
                           ) -> list[F32]:
        """Vectors of ``texts`` (keyed by ``hashes``) in vector space ``space``, each asked of
        the provider (``embed``) by one host of the shared workspace only.

        Offline, or when the server fails meanwhile, the rest is embedded here: vectors
        never wait for the server for long. Raises what ``embed`` raises (its claims are
        given back first).
        """
        from recalld.daemon.remote import embeddings as shared

        with trio.move_on_after(FIRST_CONNECT_WAIT_S):
            await self._first_attempt.wait()
        by_hash = dict(zip(hashes, texts, strict=True))
        out: dict[str, F32] = {}
        pending = list(by_hash)
        try:
            while pending:
                found, mine = await self._on_writer(shared.get_or_claim, space, pending,
                                                    self.host)
                out.update(found)
                self.shared_vectors += len(found)
                if mine:
                    try:
                        rows = await embed([by_hash[h] for h in mine])
                    except BaseException:
                        with (trio.CancelScope(shield=True), trio.move_on_after(10),
                              contextlib.suppress(_Unreachable)):
                            await self._on_writer(shared.release, space, mine, self.host)
                        raise
                    self.provider_vectors += len(mine)
                    out.update(zip(mine, rows, strict=True))
                    await self._on_writer(shared.store, space,
                                          list(zip(mine, rows, strict=True)))
                pending = [h for h in pending if h not in out]
                if pending:
                    await trio.sleep(CLAIM_POLL_S)  # another host is embedding them
        except _Unreachable:
            pass  # embedded here instead
        rest = [h for h in by_hash if h not in out]
        if rest:
            rows = await embed([by_hash[h] for h in rest])
            self.provider_vectors += len(rest)
            out.update(zip(rest, rows, strict=True))
        return [out[h] for h in hashes]


    async def _on_writer(self, fn: Callable[[db.Conn, int, *Ts], T], *args: *Ts) -> T:
        """``fn(writer, workspace_id, *args)`` in a worker thread; _Unreachable when the
        replica is not online or the call fails (the error is recorded)."""
        writer, workspace_id = self._writer, self._workspace_id
        if writer is None or workspace_id is None:
            raise _Unreachable
        try:
            async with self._writer_lock:
                return await _thread(fn, writer, workspace_id, *args)
        except Exception as exc:
            if not isinstance(exc, _UNAVAILABLE):
                log.error("shared workspace %s: %s failed", self._cfg.name,
                          getattr(fn, "__name__", fn), exc_info=exc)
            self._record_error(exc)
            raise _Unreachable from exc


    # -- searching in the server -------------------------------------------------------

    async def _chunk_backfill(self, conn: db.Conn) -> None:
        """Have the workspace's uploads write their chunks from now on, and chunk the
        files written before, a page at a time between uploads."""
        from recalld.daemon.remote import chunks

        assert self._workspace_id is not None
        async with self._writer_lock:
            await _thread(chunks.start_chunking, conn, self._workspace_id)
        while True:
            async with self._writer_lock:
                done = await _thread(partial(chunks.backfill, conn, self._workspace_id,
                                             max_chars=self._max_chars))
            if not done:
                self._chunks_ready = True
                return
            self.chunks_backfilled += done

    async def wait_uploaded(self, timeout_s: float) -> bool:
        """Wait until every local change made before the call is on the server (False:
        not within ``timeout_s``, or the server cannot be reached now)."""
        with trio.move_on_after(timeout_s):
            await self._watcher.sync()
            async with self._lock:
                waiting = {c.id for c in self._outbox.pending()}
            while waiting:
                if self._conn_state != "online":
                    return False
                event = self._uploaded_event
                waiting &= {c.id for c in self._outbox.pending()}
                if waiting:
                    await event.wait()
            return True
        return False

    async def search_candidates(self, query: str, limit: int, filters: Filters,
                                query_vector: tuple[str, F32] | None, *,
                                link_limit: int = 0, keep: int | None = None) -> Candidates:
        """One search's candidates from the server (``remote/search.py``); SearchUnavailable
        when the server cannot answer now (the caller searches locally instead).
        ``link_limit`` is accepted for the local signature: links stay local."""
        from recalld.daemon.remote import search as server

        del link_limit
        workspace_id = self._workspace_id
        if workspace_id is None or self._conn_state != "online":
            raise SearchUnavailable(f"shared workspace {self._cfg.name} is "
                                    f"{self._conn_state}")
        if not self._chunks_ready:
            raise SearchUnavailable(f"the server is still chunking shared workspace "
                                    f"{self._cfg.name} ({self.chunks_backfilled} files so far)")
        s = self._ws.settings
        run = partial(server.candidates, workspace_id=workspace_id, query=query, limit=limit,
                      filters=filters, query_vector=query_vector, daily_dir=s.daily_dir,
                      digest_dir=s.digest_dir, keep=keep)
        async with self._reader_lock:
            # A connection kept from before may have died with a server restart: one
            # more try on a new one before the local index answers.
            for fresh in (self._reader is None, True):
                try:
                    if self._reader is None:
                        self._reader = await _thread(partial(
                            db.connect, self._cfg,
                            application_name=f"recalld {self.host} search"))
                    found = await _thread(partial(run, self._reader))
                except Exception as exc:
                    reader, self._reader = self._reader, None
                    if reader is not None:
                        with trio.CancelScope(shield=True):
                            await _thread(reader.close)
                    if not isinstance(exc, _UNAVAILABLE):
                        log.error("shared workspace %s: search in the server failed",
                                  self._cfg.name, exc_info=exc)
                    self._last_search_error = _one_line(exc, self._secrets)
                    if fresh or not isinstance(exc, psycopg.OperationalError):
                        raise SearchUnavailable(self._last_search_error) from exc
                    continue
                self.server_searches += 1
                if query_vector is not None:
                    self._want_vector_index(query_vector[0], len(query_vector[1]))
                return found
        raise AssertionError("unreachable")

    def _want_vector_index(self, space: str, dims: int) -> None:
        """Have the server's HNSW index of ``space`` built, once, in the background
        (searches scan the vectors exactly until it exists)."""
        if (space, dims) in self._vector_indexes or self._nursery is None:
            return
        self._vector_indexes.add((space, dims))
        self._nursery.start_soon(self._build_vector_index, space, dims)

    async def _build_vector_index(self, space: str, dims: int) -> None:
        from recalld.daemon.remote import search as server

        try:
            conn = await _thread(partial(db.connect, self._cfg,
                                         application_name=f"recalld {self.host} index"))
            try:
                await _thread(server.build_vector_index, conn, space, dims)
            finally:
                with trio.CancelScope(shield=True):
                    await _thread(conn.close)
        except Exception as exc:
            # Searches go on with exact scans; the next search of the space tries again.
            self._vector_indexes.discard((space, dims))
            if not isinstance(exc, _UNAVAILABLE):
                log.error("shared workspace %s: building the vector index failed",
                          self._cfg.name, exc_info=exc)
            self._last_search_error = _one_line(exc, self._secrets)

    def searched_locally(self) -> None:
        self.search_fallbacks += 1


class SearchUnavailable(Exception):
    """The server cannot run this search now; the local index answers it."""


def _one_line(exc: BaseException, secrets: Sequence[str]) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


class _Unreachable(Exception):
    """The shared workspace's server cannot serve this call now."""


class _Flag:
    """Set from the driver's notification callback (any thread), read on trio."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


def _secrets(cfg: RemoteConfig) -> list[str]:
    """Passwords that must never appear in a logged or reported error."""
    out: list[str] = []
    try:
        password = psycopg.conninfo.conninfo_to_dict(cfg.dsn).get("password")
    except psycopg.Error:
        password = None
    if password:
        out.append(str(password))
    return out
