"""One shared workspace's replica: local files up to PostgreSQL, remote changes down.

Owns the workspace's files on the replica's side (``remote/filesync.py``: the outbox and
replica state in ``<metadata_dir>/remote/``, a :class:`~recalld.daemon.watcher.Watcher`
of its Markdown folders, uploads and the change feed written locally) and, while the
server is reachable, two connections: the *writer* uploads the outbox in order, the
*listener* receives the workspace's NOTIFY channel and reads the change feed. Connection
count: two per shared workspace, none while offline; with ``search_mode = "server"`` a
third, opened by the first search, runs searches in the server (``remote/searcher.py``,
``remote/search.py``) and the session makes sure every file has its chunks there
(``remote/chunks.py``).

Offline: any database error closes both connections; the replica keeps accepting local
changes into the outbox, status shows ``offline`` with the outbox length, and connecting
is retried with full-jitter backoff (:class:`~recalld.daemon.providers.retry.RetryPolicy`).
Database calls run in worker threads, each given up after ``db.CALL_TIMEOUT_S`` (a server
that stops answering counts as offline); cancellation (closing the workspace, stopping
the daemon) shuts the connection of a call in flight down under it, so nothing waits on
a server that does not answer (``filesync.on_conn``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TypeVar, TypeVarTuple

import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.config import RemoteConfig
from recalld.daemon.dsn import mask_dsn
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.reads import Candidates
from recalld.daemon.providers.retry import RetryPolicy
from recalld.daemon.remote import db, filesync, handover, locks
from recalld.daemon.remote.calls import in_thread, on_conn
from recalld.daemon.remote.catalog import JobCatalog
from recalld.daemon.remote.filesync import FileSync
from recalld.daemon.remote.passfile import secrets
from recalld.daemon.remote.replicastatus import ReplicaStatus
from recalld.daemon.remote.schema import SchemaTooNew
from recalld.daemon.remote.searcher import SearchUnavailable, ServerSearcher, one_line
from recalld.daemon.remote.wentback import server_went_back
from recalld.daemon.remote.writes import refusal_kind
from recalld.daemon.safepath import masked
from recalld.daemon.sharedplace import default_host
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import AlreadyRunning, ProviderUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# How long an embedding waits for the first connection attempt after a start, and at
# most for vectors another host is computing (woken when it stores them, or gives them up).
FIRST_CONNECT_WAIT_S = 15.0
CLAIM_WAIT_S = 10.0
RECONNECT = RetryPolicy(backoff_base_s=0.5, backoff_max_s=10.0)
# After this long without a session and with nothing waiting to go up, the waits between attempts
# grow to IDLE_RECONNECT's cap (an idle daemon should not wake every few seconds for days); a local
# change, a server search or a job that needs the server cuts the wait back to RECONNECT's.
LONG_OUTAGE_S = 300.0
IDLE_RECONNECT = RetryPolicy(backoff_base_s=0.5, backoff_max_s=60.0)


class Replica:
    """The replica service of one shared workspace (see the module docstring)."""

    def __init__(self, ws: Workspace, cfg: RemoteConfig,
                 *, reconcile_interval_s: float = 300.0, chunk_max_chars: int =
                 DEFAULT_MAX_CHARS, cpu: trio.CapacityLimiter | None = None) -> None:
        self._cfg = cfg
        self.host = cfg.host or default_host()
        # The writer connection, shared by the uploader and the embedding exchange.
        self._writer: db.Conn | None = None
        self._writer_lock = trio.Lock()
        self._files = FileSync(ws, cfg, host=self.host, writer_lock=self._writer_lock,
                               reconcile_interval_s=reconcile_interval_s, cpu=cpu)
        self._reconcile_interval_s = reconcile_interval_s
        self._rng = random.Random()  # noqa: S311 (backoff jitter)
        self._workspace_id: int | None = None
        self._conn_state = "connecting"
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        # The kind of refusal of ours logged since the last session (said once: its text
        # changes with the other daemon's session, or with offline spells between).
        self._refusal_logged: str | None = None
        self._online_since: float | None = None
        self._secrets = secrets(cfg)
        self._first_attempt = trio.Event()
        # Since when no session has been up (None while one is), and what cuts a long
        # wait for the next attempt short.
        self._down_since: float | None = None
        self._server_wanted = trio.Event()
        self.shared_vectors = 0
        self.provider_vectors = 0
        self.vectors_unshared: str | None = None  # embeddings.unshared, at each session
        self._searcher = ServerSearcher(ws, cfg, host=self.host, secrets=self._secrets,
                                        writer_lock=self._writer_lock, max_chars=chunk_max_chars,
                                        writes=self._files.writes, cpu=cpu)
        self._nursery: trio.Nursery | None = None
        self._files.on_queued = self._want_server

    # -- lifecycle -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve until cancelled: local writing never waits for the server."""
        await in_thread(self._files.open)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._files.watcher.run)
                nursery.start_soon(self._files.deletion_loop)
                nursery.start_soon(self._connection_loop)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self._searcher.close()
                await self._files.shut()

    # -- status ----------------------------------------------------------------------

    def status(self) -> ReplicaStatus:
        blocked = self._files.blocked
        refused = self._files.refusals.reasons
        online = self._conn_state == "online"
        # Files this host cannot write, changes the server refuses: faults of one file.
        faults = list(blocked.values()) + list(refused.values()) if online else []
        writes = self._files.writes
        refusing = writes.kind if self._conn_state in ("online", "refusing") else None
        if refusing is not None:
            faults = [f"the server refuses this host's writes ({refusing}): "
                      f"{writes.reason}", *faults]
        return {
            "state": "refusing" if refusing else "failing" if faults else self._conn_state,
            "refusing": refusing,
            "server": mask_dsn(self._cfg.dsn),
            "name": self._cfg.name,
            "host": self.host,
            "outbox": self._files.queued,
            "behind": self._files.behind,
            "cursor": self._files.cursor,
            "uploaded": self._files.uploaded,
            "pulled": self._files.pulled,
            "conflicts": self._files.conflicts,
            "online_since": self._online_since,
            "last_upload": self._files.last_upload,
            "last_pull": self._files.last_pull,
            "last_error": faults[0] if faults else self._last_error,
            # When the error shown came: a refusal of every write since it began.
            "last_error_at": writes.since if refusing else self._last_error_at,
            # Named as search names them: masked where a name looks like a credential.
            "blocked": {masked(path): why for path, why in blocked.items()},
            "refused": {masked(path): why for path, why in refused.items()},
            "held": self._files.guard.status(),
            "outside": self._files.outside,
            "unshared": self._files.watcher.status()["misnamed"],
            "watcher": self._files.watcher.state,
            "vectors": {"shared": self.shared_vectors, "embedded_here": self.provider_vectors,
                        "not_shared": self.vectors_unshared},
            "search_mode": self._cfg.search_mode,
            "search": {"server_searches": self._searcher.server_searches,
                       "local_fallbacks": self._searcher.search_fallbacks,
                       "chunks_ready": self._searcher.chunks_ready,
                       "chunks_backfilled": self._searcher.chunks_backfilled,
                       "last_error": self._searcher.last_error},
        }

    # -- the connection --------------------------------------------------------------

    async def _connection_loop(self) -> None:
        attempt = 0
        while True:
            began = trio.current_time()
            ours = misconfigured = refusing = denied = False
            try:
                await self._session()
            except* db.BadDsn as group:
                self._record_error(group.exceptions[0], server=False)
                misconfigured = True
            except* (SchemaTooNew, locks.HostTaken, locks.WorkspaceIdTooLarge) as group:
                # The server answers; this recalld cannot use its tables ("upgrade") or
                # its workspace's id, or another daemon is there under this host's name.
                ours = True
                if self._refusal_logged != type(group.exceptions[0]).__name__:
                    self._refusal_logged = type(group.exceptions[0]).__name__
                    log.error("shared workspace %s: %s", self._cfg.name, group.exceptions[0])
                self._record_error(group.exceptions[0], server=False)
            except* db.UNAVAILABLE as group:
                # A server that answers but refuses this host's writes is not offline.
                refusing = self._files.writes.refused(group, self._cfg.name) is not None
                denied = isinstance(group.exceptions[0], db.LoginRefused)  # nor its login
                self._record_error(group.exceptions[0], server=not refusing)
            except* Exception as group:
                # A fault of ours (a full disk under the outbox, a file that cannot be
                # written, a bug) must not take the workspace down with it: record it
                # and try again after a while. Status says "failing", not "offline":
                # the server is not the cause.
                ours = True
                log.error("shared workspace %s: replication failed", self._cfg.name,
                          exc_info=group)
                self._record_error(group.exceptions[0], server=False)
            self._first_attempt.set()
            self._online_since = None
            if misconfigured:
                # Retrying cannot help: the settings stay until the workspace is
                # opened again.
                self._conn_state = "misconfigured"
                log.error("shared workspace %s: %s", self._cfg.name, self._last_error)
                await trio.sleep_forever()
            self._conn_state = ("failing" if ours else "refusing" if refusing
                                else "denied" if denied else "offline")
            now = trio.current_time()
            if now - began > 60:
                attempt = 0
            if self._down_since is None:
                self._down_since = now
            idle = (now - self._down_since >= LONG_OUTAGE_S and not self._files.queued)
            short = RECONNECT.backoff_s(attempt, self._rng)
            longer = IDLE_RECONNECT.backoff_s(attempt, self._rng) if idle else short
            attempt = min(attempt + 1, 16)
            self._server_wanted = trio.Event()
            # Never sooner than the short waits (a search a second must not become an
            # attempt a second); when idle, longer unless something needs the server.
            await trio.sleep(short)
            with trio.move_on_after(max(0.0, longer - short)):
                await self._server_wanted.wait()

    def _want_server(self) -> None:
        """Something needs the server now: a long wait for the next attempt ends."""
        self._server_wanted.set()

    def _record_error(self, exc: BaseException, *, server: bool = True) -> None:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        text = one_line(exc, self._secrets)
        if text != self._last_error and server:
            log.warning("shared workspace %s (%s): %s: %s", self._cfg.name, mask_dsn(
                self._cfg.dsn), "the server refused the login" if isinstance(
                    exc, db.LoginRefused) else "server unavailable", text)
        self._last_error = text
        self._last_error_at = time.time()

    async def _session(self) -> None:
        writer: db.Conn | None = None
        listener: db.Conn | None = None
        try:
            writer = await in_thread(db.connect, self._cfg)
            workspace_id, ident = await on_conn(writer, db.open_workspace, self._cfg.name)
            await on_conn(writer, locks.claim_host, workspace_id, self._cfg.name, self.host)
            if await server_went_back(self._files.state, writer, workspace_id, ident):
                # Its versions go on from a point the hosts read past: what they wrote
                # since would never reach each other. A new identity makes every host
                # start over (files the server lacks go up, the rest comes down).
                log.warning("shared workspace %s: the server is behind what this replica "
                            "saw of it (restored from a backup, or a failover to a server "
                            "that lagged); every host starts over with it",
                            self._cfg.name)
                ident = await on_conn(writer, db.renew_identity, self._cfg.name,
                                      workspace_id, ident)
            self._workspace_id = workspace_id
            from recalld.daemon.remote import embeddings
            self.vectors_unshared = await on_conn(writer, embeddings.unshared)
            await self._files.adopt(ident)
            await self._files.forget_removed(writer, workspace_id)
            listener = await in_thread(db.connect, self._cfg)
            listen_refused = await self._listen(listener, workspace_id)
            self._writer = writer
            self._searcher.new_session()
            self._conn_state = "online"
            self._online_since = time.time()
            self._down_since = None
            # What kept it offline (or failing) is over: the log keeps it, status no longer
            # shows it beside "online" as if it still held.
            self._last_error = self._last_error_at = self._refusal_logged = None
            self._files.writes.cleared()  # the next write refused says so again
            if listen_refused is not None:
                self._files.writes.refused(listen_refused, self._cfg.name)
            self._first_attempt.set()
            log.info("shared workspace %s: online (%s), %d change(s) queued",
                     self._cfg.name, mask_dsn(self._cfg.dsn), self._files.queued)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._files.upload_loop, writer, workspace_id)
                # Notified, the feed is read at the reconcile interval only in case a
                # notification was missed (a server without the removal trigger).
                every = filesync.CATCH_UP_EVERY_S
                if listen_refused is None:
                    every = max(every, self._reconcile_interval_s)
                nursery.start_soon(partial(self._files.pull_loop, listener, workspace_id,
                                           every_s=every))
                if self._cfg.search_mode == "server":
                    nursery.start_soon(self._searcher.chunk_backfill, writer, workspace_id)
        finally:
            self._writer = None
            with trio.CancelScope(shield=True):
                for conn in (listener, writer):
                    if conn is not None:
                        await in_thread(conn.close)

    async def _listen(self, listener: db.Conn, workspace_id: int) -> Exception | None:
        """LISTEN on the workspace's channel; the refusal of a server that takes no
        writes (a hot standby refuses LISTEN too: no NOTIFY reaches it) is returned,
        not raised: the feed is then read every ``CATCH_UP_EVERY_S`` instead, until a
        session on a server that listens."""
        try:
            await on_conn(listener, db.listen, workspace_id)
        except Exception as exc:
            if refusal_kind(exc) is None:
                raise
            return exc
        return None

    @asynccontextmanager
    async def job_lock(self, kind: str) -> AsyncIterator[JobCatalog]:
        """Run ``kind`` (auto_dream, auto_resource) on one host of the shared workspace at
        a time: a session-level advisory lock on a connection of its own, held for the
        block, which gets the job's catalog shared by every host and runs on the last
        run's changes (``handover.py``). AlreadyRunning when another host holds it,
        ProviderUnavailable while the server cannot be reached or refuses this host's
        writes (the catalog could not be stored for the others: it waits, as writes do)."""
        if (self._workspace_id is None or self._conn_state != "online"
                or self._files.writes.kind is not None):
            self._want_server()
            raise self._job_waits(kind)
        workspace_id = self._workspace_id
        try:
            conn = await in_thread(partial(db.connect, self._cfg,
                                           application_name=f"recalld {self.host} {kind}"))
        except db.UNAVAILABLE as exc:
            self._record_error(exc)
            raise ProviderUnavailable(
                f"shared workspace {self._cfg.name}: server unavailable for {kind}") from None
        try:
            holder = await on_conn(conn, locks.try_job_lock, workspace_id, kind)
            if holder is not None:
                where = holder.removeprefix("recalld ").split(" ")[0] or "another host"
                raise AlreadyRunning(
                    f"{kind} of shared workspace {self._cfg.name} is running on {where}")
            try:  # a server turned read-only since the last write says so now
                await on_conn(conn, db.try_write, workspace_id)
            except Exception as exc:
                if self._files.writes.refused(exc, self._cfg.name) is None:
                    raise
                raise self._job_waits(kind) from None
            self._files.writes_taken()
            async with handover.turn(self._files, conn, workspace_id, self._cfg.name, kind,
                                     lambda: self._conn_state == "online"):
                yield JobCatalog(conn, workspace_id, self._cfg.name, self._files.writes)
        finally:
            with trio.CancelScope(shield=True):
                await in_thread(conn.close)  # closing the session releases the lock

    def _job_waits(self, kind: str) -> ProviderUnavailable:
        """Why job ``kind`` cannot run now (see :meth:`job_lock`)."""
        writes = self._files.writes
        state = self._conn_state if writes.kind is None else "refusing"
        error = self._last_error if writes.kind is None else f"{writes.kind}: {writes.reason}"
        waits = {"misconfigured": "its dsn in the config file is fixed",
                 "refusing": "the server takes this host's writes",
                 "denied": "the server takes this host's login",
                 "failing": "this host can replicate again"}
        return ProviderUnavailable(
            f"shared workspace {self._cfg.name} is {state}"
            f"{f' ({error})' if error else ''}: {kind} runs on one host at a time and "
            f"waits until {waits.get(state, 'the server can be reached')}")

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
        # A server without the table is asked nothing: each text is embedded here.
        pending = [] if self.vectors_unshared else list(by_hash)
        try:
            while pending:
                stored = self._files.vectors_stored  # taken before asking: none is missed
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
                if pending:  # another host is embedding them
                    with trio.move_on_after(CLAIM_WAIT_S):
                        await stored.wait()
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
                return await on_conn(writer, fn, workspace_id, *args)
        except Exception as exc:
            if not isinstance(exc, db.UNAVAILABLE):
                log.error("shared workspace %s: %s failed", self._cfg.name,
                          getattr(fn, "__name__", fn), exc_info=exc)
            self._record_error(exc)
            raise _Unreachable from exc

    async def release_held(self, action: str) -> int:
        """End the hold of the deletions the guard held back: ``"upload"`` sends them,
        ``"restore"`` writes the notes back (their last queued content, else the
        server's; ProviderUnavailable while the server cannot be reached). Returns how
        many were held."""
        if action == "upload":
            return await self._files.upload_held()
        rows: dict[str, db.Row | None] = {}
        try:
            for path in sorted(self._files.guard.held):
                rows[path] = await self._on_writer(db.fetch, path)
        except _Unreachable:
            raise ProviderUnavailable(
                f"shared workspace {self._cfg.name}: the server cannot be reached now to "
                f"restore the notes whose deletion is held ({self._conn_state})") from None
        return await self._files.restore_held(rows)

    # -- searching in the server -------------------------------------------------------

    async def wait_uploaded(self, timeout_s: float) -> bool:
        """Wait until every local change made before the call is on the server (False:
        not within ``timeout_s``, or the server cannot be reached now)."""
        return await self._files.wait_uploaded(timeout_s,
                                               lambda: self._conn_state == "online")

    async def search_candidates(self, query: str, limit: int, filters: Filters,
                                query_vector: tuple[str, F32] | None, *,
                                link_limit: int = 0, keep: int | None = None) -> Candidates:
        """One search's candidates from the server (``remote/search.py``); SearchUnavailable
        when the server cannot answer now (the caller searches locally instead).
        ``link_limit`` is accepted for the local signature: links stay local."""
        del link_limit
        workspace_id = self._workspace_id
        if workspace_id is None or self._conn_state != "online":
            self._want_server()
            raise SearchUnavailable(f"shared workspace {self._cfg.name} is "
                                    f"{self._conn_state}")
        found = await self._searcher.candidates(workspace_id, query, limit, filters,
                                                query_vector, keep=keep)
        if query_vector is not None:
            self._want_vector_index(query_vector[0], len(query_vector[1]))
        return found

    def _want_vector_index(self, space: str, dims: int) -> None:
        """Have the server's HNSW index of ``space`` built, once, in the background
        (searches scan the vectors exactly until it exists)."""
        if self._nursery is None or not self._searcher.claim_vector_index(space, dims):
            return
        self._nursery.start_soon(self._searcher.build_vector_index, space, dims)

    def searched_locally(self) -> None:
        self._searcher.search_fallbacks += 1


class _Unreachable(Exception):
    """The shared workspace's server cannot serve this call now."""

