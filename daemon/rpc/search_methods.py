"""RPC methods of the index: ``memory.search`` and ``index.sync``."""

from __future__ import annotations

from recalld.daemon import sharing
from recalld.daemon.index.search import MAX_RESULTS_CAP, SearchAnswer, parse_filters, search
from recalld.daemon.remote.hook import server_search
from recalld.daemon.rpc.dispatch import CallContext, DaemonState, JsonObject, Methods, Params
from recalld.daemon.workspaces import Workspace
from recalld.ipc.answers import Synced

METHODS = Methods()


def _search_answers_now(state: DaemonState, params: JsonObject) -> bool:
    """A short keyword-only search of one small workspace nobody is writing to does not
    wait: it runs on the connection's reader, without starting a call task."""
    if params.get("sync") or params.get("agents") is not None:
        return False
    agent_id, query = params.get("agent_id"), params.get("query")
    if not isinstance(agent_id, str) or not isinstance(query, str):
        return False
    # The call itself looks whether a link took the folder's place.
    ws = state.registry.serving(agent_id)
    if ws is None:
        return False
    remote = ws.settings.remote
    if remote is not None and remote.search_mode == "server":
        return False  # a round trip to the server: never on the connection's reader
    index = ws.services.index
    vectors = index.vectors
    return (vectors is None or not vectors.embeds_queries()) and index.reads_now(query)


@METHODS.add("memory.search", positional=("agent_id", "query"),
             immediate_when=_search_answers_now, early=True)
async def memory_search(ctx: CallContext, params: JsonObject) -> SearchAnswer:
    p = Params(params)
    agent_id = p.agent_id()
    query = p.text("query")
    max_results = p.integer("max_results", 5, minimum=1)
    min_score = p.number("min_score", None)
    raw_filters = p.mapping("filters", None)
    parse_filters(raw_filters)  # refused before any workspace is searched
    sync = p.boolean("sync", False)
    agents = p.selection("agents", "agent_id's own workspace")
    p.done()

    async def search_one(ws: Workspace) -> SearchAnswer:
        index = ws.services.index
        server = server_search(ws)
        if sync:
            await (index.sync() if server is None else server.sync())
        answer = await search(
            index, query, max_results=min(max_results, MAX_RESULTS_CAP), min_score=min_score,
            # A path_prefix may name a folder of ws by its absolute path, as
            # workspace.list shows the workspace: it is taken relative to ws.
            filters=parse_filters(raw_filters, root=str(ws.root)),
            config=ws.settings.search, agent_id=ws.agent_id,
            source=None if server is None else server.candidates,
        )
        if server is not None:
            answer["search_mode"] = server.served
            if server.served == "local" and server.error is not None:
                answer["server_error"] = server.error
        return answer

    if agents is None:
        return await search_one(await ctx.searchable(agent_id))
    # The caller (agent_id) searches the named workspaces, each only if its owner allows;
    # while the daemon starts, once every workspace is open.
    await ctx.services.start.wait_started()
    found, away = sharing.targets(ctx.state.registry, agent_id, agents)
    answer = await sharing.search_workspaces(found, search_one,
                                             max_results=min(max_results, MAX_RESULTS_CAP))
    if away:
        answer["skipped"] = away
    return answer


@METHODS.add("index.sync", positional=("agent_id",))
async def index_sync(ctx: CallContext, params: JsonObject) -> Synced:
    p = Params(params)
    agent_id = p.agent_id()
    p.done()
    index = ctx.workspace(agent_id).services.index
    await index.sync()
    return {"synced": True, "files": len(index.state.files), "chunks": len(index.state.chunks)}
