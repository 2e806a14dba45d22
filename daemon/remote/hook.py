"""The one place the daemon reaches shared workspaces: a per-workspace service.

:func:`remote_service` returns a workspace service that does nothing for a local
workspace (it reports started and returns) and runs the replica
(:mod:`recalld.daemon.remote.replica`, which imports the PostgreSQL driver) for a
workspace whose settings name a ``remote``. The import happens there, so a daemon with
only local workspaces never loads psycopg. :func:`one_host_at_a_time` wraps the jobs
that must run on one host of a shared workspace at a time; :func:`embed_passages` is
where the vector backfill asks for embeddings, once per text for all hosts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from recalld.daemon.workspaces import Workspace, WorkspaceService

# How long a shared workspace's first embeddings wait for its replica to be running.
REPLICA_START_WAIT_S = 10.0


def remote_service() -> WorkspaceService:
    async def run(
        workspace: Workspace, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if workspace.settings.remote is None:
            task_status.started()
            return
        from recalld.daemon.remote.replica import run_replica

        await run_replica(workspace, task_status=task_status)

    return run


@asynccontextmanager
async def one_host_at_a_time(workspace: Workspace, kind: str) -> AsyncIterator[None]:
    """Around a job whose work must be done once for a shared workspace (auto_dream,
    auto_resource): nothing for a local workspace; for a shared one, the replica's
    advisory lock (AlreadyRunning when another host runs it)."""
    if workspace.settings.remote is None:
        yield
        return
    replica = workspace.get("remote")
    async with replica.job_lock(kind):
        yield


async def embed_passages(workspace: Workspace, space: str, hashes: Sequence[str],
                         texts: Sequence[str],
                         embed: Callable[[list[str]], Awaitable[Any]]) -> list[Any]:
    """Vectors of ``texts`` (``hashes`` their text hashes) in vector space ``space``.

    A local workspace asks its provider (``embed``); a shared one asks the server first,
    so each text is embedded by one host for all of them (see
    :mod:`recalld.daemon.remote.embeddings`).
    """
    if workspace.settings.remote is None:
        return list(await embed(list(texts)))
    replica: Any = None
    with trio.move_on_after(REPLICA_START_WAIT_S):
        while replica is None:
            try:
                replica = workspace.get("remote")
            except KeyError:
                await trio.sleep(0.05)  # the replica starts after the vector service
    if replica is None:
        return list(await embed(list(texts)))
    result: list[Any] = await replica.shared_embed(space, hashes, texts, embed)
    return result
