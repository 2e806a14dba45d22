"""RPC methods of the index: ``memory.search``, ``index.sync``, and the reindex job.

Also the workspace-service factory that starts a :class:`WorkspaceIndex` for every
open workspace and attaches it as ``"index"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from recalld.daemon import sharing
from recalld.daemon.api import CallContext, DaemonState, Methods, Params
from recalld.daemon.config import DaemonConfig
from recalld.daemon.index.procpool import PreparePool
from recalld.daemon.index.search import MAX_RESULTS_CAP, parse_filters, search
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.jobs import JobContext
from recalld.daemon.workspaces import Workspace, WorkspaceService
from recalld.ipc.errors import UnknownWorkspace

METHODS = Methods()


def index_of(ws: Workspace) -> WorkspaceIndex:
    try:
        index: WorkspaceIndex = ws.get("index")
    except KeyError:
        raise UnknownWorkspace(f"workspace {ws.agent_id!r} has no index yet") from None
    return index


def _search_answers_now(state: DaemonState, params: dict[str, Any]) -> bool:
    """A short keyword-only search of one small workspace nobody is writing to does not
    wait: it runs on the connection's reader (a call task would cost ~20 us more)."""
    if params.get("sync") or params.get("agents") is not None:
        return False
    agent_id, query = params.get("agent_id"), params.get("query")
    if not isinstance(agent_id, str) or not isinstance(query, str):
        return False
    try:
        index = index_of(state.registry.get(agent_id))
    except UnknownWorkspace:
        return False
    vectors = index.vectors
    return (vectors is None or not vectors.embeds_queries()) and index.reads_now(query)


@METHODS.add("memory.search", positional=("agent_id", "query"),
             immediate_when=_search_answers_now)
async def memory_search(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    query = p.text("query")
    max_results = p.integer("max_results", 5, minimum=1)
    min_score = p.number("min_score", None)
    filters = parse_filters(p.mapping("filters", None))
    sync = p.boolean("sync", False)
    agents: list[str] | None = p.strings("agents", None)
    p.done()

    async def search_one(ws: Workspace) -> dict[str, Any]:
        index = index_of(ws)
        if sync:
            await index.sync()
        return await search(
            index, query, max_results=min(max_results, MAX_RESULTS_CAP), min_score=min_score,
            filters=filters, config=ws.settings.search, agent_id=ws.agent_id,
        )

    if agents is None:
        return await search_one(ctx.workspace(agent_id))
    # The caller (agent_id) searches the named workspaces, each only if its owner allows.
    return await sharing.search_workspaces(
        sharing.targets(ctx.state.registry, agent_id, agents), search_one,
        max_results=min(max_results, MAX_RESULTS_CAP),
    )


@METHODS.add("index.sync", positional=("agent_id",))
async def index_sync(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    p.done()
    index = index_of(ctx.workspace(agent_id))
    await index.sync()
    return {"synced": True, "files": len(index.state.files), "chunks": len(index.state.chunks)}


def reindex_job(get_workspace: Callable[[str], Workspace]) -> Callable[[JobContext], Any]:
    """The ``reindex`` job: rebuild one workspace's index with progress."""

    async def run(job: JobContext) -> dict[str, Any]:
        index = index_of(get_workspace(job.agent_id))
        return await index.rebuild(lambda done, total, msg: job.set_progress(done, total, msg))

    return run


def index_service(
    get_config: Callable[[], DaemonConfig],
    cpu: trio.CapacityLimiter,
    publish: Callable[[str, dict[str, Any]], None] | None = None,
    pool: PreparePool | None = None,
) -> WorkspaceService:
    """A workspace service that runs the index of each workspace."""

    async def run(
        workspace: Workspace, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None:
        index = WorkspaceIndex(workspace, get_config(), cpu=cpu, publish=publish, pool=pool)
        workspace.attach("index", index)
        workspace.add_status("index", index.status)
        await index.run(task_status=task_status)

    return run
