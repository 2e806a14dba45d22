"""The one place the daemon reaches shared workspaces: a per-workspace service.

:func:`remote_service` returns a workspace service that does nothing for a local
workspace (it reports started and returns) and runs the replica
(:mod:`recalld.daemon.remote.replica`, which imports the PostgreSQL driver) for a
workspace whose settings name a ``remote``. The import happens there, so a daemon with
only local workspaces never loads psycopg.
"""

from __future__ import annotations

from typing import Any

import trio

from recalld.daemon.workspaces import Workspace, WorkspaceService


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
