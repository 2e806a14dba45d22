"""Searches of one shared workspace in its server, for the replica (``remote/replica.py``).

With ``search_mode = "server"`` the replica has searches run in PostgreSQL
(``remote/search.py``) on a connection of their own, opened by the first search, and its
session makes sure every file has its chunks there (``remote/chunks.py``) before the
server answers; until then, and whenever the server cannot answer, the local index does
(:class:`SearchUnavailable`). The HNSW index of a vector space is built once, in the
background, after its first search. The counts and the last error here are what the
replica's status shows under ``search``.

Database calls run in worker threads; the replica closes the search connection when it
stops.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import partial

import psycopg
import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.config import RemoteConfig
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.reads import Candidates
from recalld.daemon.providers.errors import mask_given
from recalld.daemon.remote import db
from recalld.daemon.remote.calls import in_thread, on_conn
from recalld.daemon.remote.writes import WriteRefusal
from recalld.daemon.workspaces import Workspace

log = logging.getLogger(__name__)


class SearchUnavailable(Exception):
    """The server cannot run this search now; the local index answers it."""


class ServerSearcher:
    """The replica's searches in the server (see the module docstring)."""

    def __init__(self, ws: Workspace, cfg: RemoteConfig, *, host: str,
                 secrets: Sequence[str], writer_lock: trio.Lock, max_chars: int,
                 writes: WriteRefusal, cpu: trio.CapacityLimiter | None = None) -> None:
        self._ws = ws
        self._cfg = cfg
        self.host = host
        self._secrets = secrets
        # Held around each call on the replica's writer connection (the chunk backfill's).
        self._writer_lock = writer_lock
        self._max_chars = max_chars
        self._cpu = cpu or trio.CapacityLimiter(1)  # the daemon's: making chunk rows
        #: Notes too slow to chunk (``chunkplan.rows_of``), passed by for the session.
        self.unchunked: set[str] = set()
        # Whether the server refuses this host's writes (shared with the uploader).
        self._writes = writes
        # Searching in the server (search_mode "server"): a connection of its own, opened
        # on the first search, so searches never queue behind a burst of uploads.
        self._reader: db.Conn | None = None
        self._reader_lock = trio.Lock()
        # Until when searches go to the local index without asking (the server left the
        # last search unanswered: see db.SEARCH_PAUSE_S; :meth:`new_session` ends it).
        self._paused_until = -math.inf
        self.server_searches = 0
        self.search_fallbacks = 0
        self.chunks_backfilled = 0
        # Every file of the workspace has its chunks in the server (checked once per
        # session): until then the local index answers.
        self.chunks_ready = False
        # HNSW indexes of vector spaces searched in the server: built or being built.
        self._vector_indexes: set[tuple[str, int]] = set()
        self.last_error: str | None = None

    async def close(self) -> None:
        """Close the search connection, if one is open (the caller shields this)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await in_thread(reader.close)

    def new_session(self) -> None:
        """The replica is online again: the server's chunks are checked afresh before it
        answers, and a pause after an unanswered search ends (the server answers again)."""
        self.chunks_ready = False
        self.unchunked.clear()
        self._paused_until = -math.inf

    async def chunk_backfill(self, conn: db.Conn, workspace_id: int) -> None:
        """Have the workspace's uploads write their chunks from now on, and chunk the
        files written before, a page at a time between uploads; returns once every file has
        its chunks (``chunks_ready``). Where that takes writes the server refuses
        (read-only, disk full, permission: ``writes.py``), the session goes on without
        it (the local index answers searches; status says why) and it is tried again
        when the server takes this host's writes, or after the refusal's backoff.
        Cancellation waits for the call in flight."""
        refused: str | None = None
        while True:
            try:
                await self._chunk_all(conn, workspace_id)
            except psycopg.Error as exc:
                delay = self._writes.refused(exc, self._cfg.name)
                if delay is None:
                    raise
                self.last_error = (f"the server refuses this host's writes "
                                   f"({self._writes.kind}): chunks of the files written "
                                   f"before wait for it to take them; the local index "
                                   f"answers meanwhile")
                await self._writes.wait_taken(delay)
                refused = self.last_error
                continue
            if refused is not None and self.last_error == refused:
                self.last_error = None  # status no longer says it as if it still held
            return

    async def _chunk_all(self, conn: db.Conn, workspace_id: int) -> None:
        from recalld.daemon.remote import chunks

        async with self._writer_lock:
            wrote = await on_conn(conn, chunks.start_chunking, workspace_id,
                                  self._max_chars)
        while True:
            done = await self._chunk_page(conn, workspace_id)
            wrote = wrote or bool(done)
            if not done:
                if wrote and self._writes.cleared():
                    log.info("shared workspace %s: the server takes this host's writes "
                             "again", self._cfg.name)
                self.chunks_ready = True
                return
            self.chunks_backfilled += done

    async def _chunk_page(self, conn: db.Conn, workspace_id: int) -> int:
        """Chunk a page of the files whose chunks are missing or stale, each note's rows
        made outside the transaction that stores them (``chunkplan.rows_of``); how many
        files were looked at (0: none left). A note too slow to chunk is passed by for
        the session, named in ``last_error``."""
        from recalld.daemon.remote import chunkplan, chunks

        async with self._writer_lock:
            max_chars, todo = await on_conn(conn, chunks.backfill_todo, workspace_id,
                                            sorted(self.unchunked))
        for path, version in todo:
            async with self._writer_lock:
                current, data = await on_conn(conn, chunks.file_at, workspace_id, path,
                                              version)
            if not current:
                continue  # changed meanwhile: its upload wrote the chunks
            rows = None if data is None else await chunkplan.rows_of(path, data,
                                                                      max_chars, self._cpu)
            if data is not None and rows is None:
                self.unchunked.add(path)
                self.last_error = chunkplan.too_slow(path)
                log.warning("shared workspace %s: %s; server searches go without it",
                            self._cfg.name, self.last_error)
                continue
            async with self._writer_lock:
                await on_conn(conn, chunks.backfill_file, workspace_id, path, version, rows,
                              max_chars)
        return len(todo)

    async def candidates(self, workspace_id: int, query: str, limit: int, filters: Filters,
                         query_vector: tuple[str, F32] | None, *,
                         keep: int | None = None) -> Candidates:
        """One search's candidates from the server, once every file has its chunks there;
        SearchUnavailable when the server cannot answer now."""
        from recalld.daemon.remote import search as server

        if not self.chunks_ready:
            raise SearchUnavailable(f"the server is still chunking shared workspace "
                                    f"{self._cfg.name} ({self.chunks_backfilled} files so far)")
        if trio.current_time() < self._paused_until:
            raise SearchUnavailable(f"the server left a search unanswered lately "
                                    f"({self.last_error}); searching locally for a while")
        s = self._ws.settings
        run = partial(server.candidates, workspace_id=workspace_id, query=query, limit=limit,
                      filters=filters, query_vector=query_vector, daily_dir=s.daily_dir,
                      digest_dir=s.digest_dir, keep=keep)
        async with self._reader_lock:
            # A connection kept from before may have died with a server restart: one
            # more try on a new one before the local index answers.
            began = trio.current_time()
            for fresh in (self._reader is None, True):
                try:
                    if self._reader is None:
                        self._reader = await in_thread(partial(
                            db.connect, self._cfg,
                            application_name=f"recalld {self.host} search"))
                    found = await on_conn(self._reader, run, timeout_s=db.SEARCH_TIMEOUT_S)
                except Exception as exc:
                    reader, self._reader = self._reader, None
                    if reader is not None:
                        with trio.CancelScope(shield=True):
                            await in_thread(reader.close)
                    if not isinstance(exc, db.UNAVAILABLE):
                        log.error("shared workspace %s: search in the server failed",
                                  self._cfg.name, exc_info=exc)
                    self.last_error = one_line(exc, self._secrets)
                    if fresh or not isinstance(exc, psycopg.OperationalError):
                        if trio.current_time() - began >= db.SEARCH_TIMEOUT_S:
                            # Not answered in time (nor connected): a hung server.
                            self._paused_until = trio.current_time() + db.SEARCH_PAUSE_S
                        raise SearchUnavailable(self.last_error) from exc
                    continue
                self.server_searches += 1
                return found
        raise AssertionError("unreachable")

    def claim_vector_index(self, space: str, dims: int) -> bool:
        """Whether the HNSW index of ``space`` is still to be built (it now counts as being
        built)."""
        if (space, dims) in self._vector_indexes:
            return False
        self._vector_indexes.add((space, dims))
        return True

    async def build_vector_index(self, space: str, dims: int) -> None:
        """Build the HNSW index of ``space`` on a connection of its own; a failure is kept
        for status and gives the claim back (:meth:`claim_vector_index`), so the next
        search of the space tries again. Cancellation waits for the call in flight."""
        from recalld.daemon.remote import search as server

        try:
            conn = await in_thread(partial(db.connect, self._cfg,
                                           application_name=f"recalld {self.host} index"))
            try:
                # No deadline: building takes as long as the vectors need (the server's
                # statement_timeout is off for it); cancelling cuts it short.
                await on_conn(conn, server.build_vector_index, space, dims,
                              timeout_s=math.inf)
            finally:
                with trio.CancelScope(shield=True):
                    await in_thread(conn.close)
        except Exception as exc:
            # Searches go on with exact scans; the next search of the space tries again.
            self._vector_indexes.discard((space, dims))
            if not isinstance(exc, db.UNAVAILABLE):
                log.error("shared workspace %s: building the vector index failed",
                          self._cfg.name, exc_info=exc)
            self.last_error = one_line(exc, self._secrets)


def one_line(exc: BaseException, secrets: Sequence[str]) -> str:
    """``exc`` as a one-line text for status and logs, with ``secrets`` masked."""
    return mask_given(" ".join(str(exc).split()) or type(exc).__name__, secrets)
