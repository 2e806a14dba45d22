"""The one place the daemon reaches shared workspaces: the workspace's ``remote`` service.

:class:`RemoteService` is a field of every workspace's service record. For a local
workspace its ``run`` reports started and returns; for a workspace whose settings name a
``remote`` it runs the replica (:mod:`recalld.daemon.remote.replica`, which imports the
PostgreSQL driver). The import happens there, so a daemon with only local workspaces
never loads psycopg.

Helpers let feature code use the replica without knowing it:
:func:`one_host_at_a_time` wraps the jobs that must run on one host of a shared
workspace at a time, :func:`embed_passages` is where the vector backfill asks for
embeddings, once per text for all hosts, and :func:`server_search` is where a search of
a workspace whose ``search_mode`` is ``"server"`` gets its candidates from PostgreSQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

import trio

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.reads import Candidates
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.workspaces import Workspace

if TYPE_CHECKING:
    from recalld.daemon.remote.replica import Replica


# How long a shared workspace's first embeddings wait for its replica to be running.
REPLICA_START_WAIT_S = 10.0


class RemoteService:
    """The replica of a shared workspace, or nothing for a local one."""

    def __init__(self, ws: Workspace, *, chunk_max_chars: int = DEFAULT_MAX_CHARS,
                 cpu: trio.CapacityLimiter | None = None) -> None:
        self._ws = ws
        self._max_chars = chunk_max_chars
        self._cpu = cpu  # the daemon's CPU limiter (the uploads' chunk rows)
        self.replica: Replica | None = None
        self._started = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run the replica until cancelled (a local workspace: return at once)."""
        cfg = self._ws.settings.remote
        if cfg is None:
            self._started.set()
            task_status.started()
            return
        from recalld.daemon.remote.replica import Replica

        replica = Replica(self._ws, cfg, chunk_max_chars=self._max_chars, cpu=self._cpu)
        self.replica = replica
        self._ws.add_status("remote", replica.status)
        self._started.set()
        await replica.run(task_status=task_status)

    async def wait_replica(self, timeout_s: float) -> Replica | None:
        """The running replica (None for a local workspace, or if it did not start in
        time)."""
        with trio.move_on_after(timeout_s):
            await self._started.wait()
        return self.replica


def _service(workspace: Workspace) -> RemoteService:
    remote: RemoteService = workspace.services.remote
    return remote


class SharedCatalog(Protocol):
    """A job's catalog kept for every host of a shared workspace (see
    :class:`recalld.daemon.remote.catalog.JobCatalog`)."""

    async def load(self, job: str) -> dict[str, JsonObject]: ...

    async def store(self, job: str, catalog: Mapping[str, JsonObject],
                    known: dict[str, JsonObject]) -> None: ...

    async def put_back(self, job: str,
                       changes: Mapping[str, Mapping[str, object]]) -> None: ...


@asynccontextmanager
async def one_host_at_a_time(workspace: Workspace, kind: str
                             ) -> AsyncIterator[SharedCatalog | None]:
    """Around a job whose work must be done once for a shared workspace (auto_dream,
    auto_resource): nothing for a local workspace (None); for a shared one, the replica's
    advisory lock (AlreadyRunning when another host runs it) and the job's catalog shared
    by the hosts."""
    replica = None
    if workspace.settings.remote is not None:
        replica = await _service(workspace).wait_replica(REPLICA_START_WAIT_S)
    if replica is None:
        yield None
        return
    async with replica.job_lock(kind) as shared:
        yield shared


async def embed_passages(workspace: Workspace, space: str, hashes: Sequence[str],
                         texts: Sequence[str],
                         embed: Callable[[list[str]], Awaitable[F32]]) -> list[F32]:
    """Vectors of ``texts`` (``hashes`` their text hashes) in vector space ``space``.

    A local workspace asks its provider (``embed``); a shared one asks the server first,
    so each text is embedded by one host for all of them (see
    :mod:`recalld.daemon.remote.embeddings`).
    """
    replica = None
    if workspace.settings.remote is not None:
        # The replica starts after the vector service.
        replica = await _service(workspace).wait_replica(REPLICA_START_WAIT_S)
    if replica is None:
        return list(await embed(list(texts)))
    return await replica.shared_embed(space, hashes, texts, embed)


# How long a search with ``sync`` waits for this host's earlier changes to reach the
# server before it answers from the local index instead.
SEARCH_SYNC_WAIT_S = 30.0


class ServerSearch:
    """The candidates of one search of a ``search_mode = "server"`` workspace: from
    PostgreSQL while the replica is online, else from the local index (the host keeps
    its replica indexed). ``served`` says which answered, ``error`` why not the server."""

    def __init__(self, workspace: Workspace, replica: Replica) -> None:
        self._ws = workspace
        self._replica = replica
        self.served = "server"
        self.error: str | None = None

    async def sync(self) -> None:
        """Before a search with ``sync``: local changes made before it are on the server
        (and, for the fallback, in the local index)."""
        await self._ws.services.index.sync()
        if not await self._replica.wait_uploaded(SEARCH_SYNC_WAIT_S):
            self.error = "local changes not yet on the server"

    async def candidates(self, query: str, limit: int, filters: Filters,
                         query_vector: tuple[str, F32] | None, *, link_limit: int = 0,
                         keep: int | None = None) -> Candidates:
        from recalld.daemon.remote.searcher import SearchUnavailable

        if query_vector is not None and self._replica.vectors_unshared is not None:
            # No vectors there to search: the host's own index answers, asking nothing.
            self.error = f"{self._replica.vectors_unshared}; searches with vectors run here"
        if self.error is None:
            try:
                return await self._replica.search_candidates(
                    query, limit, filters, query_vector, link_limit=link_limit, keep=keep)
            except SearchUnavailable as exc:
                self.error = str(exc)
        self.served = "local"
        self._replica.searched_locally()
        return await self._ws.services.index.candidates(
            query, limit, filters, query_vector, link_limit=link_limit, keep=keep)


def server_search(workspace: Workspace) -> ServerSearch | None:
    """A :class:`ServerSearch` for a workspace that searches in the server, else None
    (local mode, or the replica has not started)."""
    cfg = workspace.settings.remote
    if cfg is None or cfg.search_mode != "server":
        return None
    replica = _service(workspace).replica
    return None if replica is None else ServerSearch(workspace, replica)
