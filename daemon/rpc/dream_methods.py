"""RPC methods of dream runs: ``dream.undo {agent_id, run_id, force?}`` and
``dream.runs {agent_id, limit?}``."""

from __future__ import annotations

from typing import TypedDict

from recalld.daemon.memory import dreamruns
from recalld.daemon.rpc.dispatch import CallContext, JsonObject, Methods, Params
from recalld.ipc.answers import DreamRun, DreamUndone
from recalld.ipc.protocol import MAX_DREAM_RUNS

METHODS = Methods()


class DreamRuns(TypedDict):
    runs: list[DreamRun]


@METHODS.add("dream.undo", positional=("agent_id", "run_id"))
async def dream_undo(ctx: CallContext, params: JsonObject) -> DreamUndone:
    p = Params(params)
    agent_id = p.agent_id()
    run_id = p.text("run_id")
    force = p.boolean("force", False)
    p.done()
    async with ctx.writable(agent_id) as ws:
        return await dreamruns.undo(ws, run_id, force=force)


@METHODS.add("dream.runs", positional=("agent_id",))
async def dream_runs(ctx: CallContext, params: JsonObject) -> DreamRuns:
    p = Params(params)
    agent_id = p.agent_id()
    limit = p.integer("limit", 20, minimum=1)
    p.done()
    return {"runs": await dreamruns.runs(ctx.workspace(agent_id), min(limit, MAX_DREAM_RUNS))}
