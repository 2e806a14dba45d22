"""RPC methods of the job manager: ``jobs.submit``, ``jobs.get``, ``jobs.list``,
``jobs.cancel``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TypedDict, TypeVar

from recalld.daemon import sharing
from recalld.daemon.config import DEFAULT_AGENT
from recalld.daemon.jobs import JobManager
from recalld.daemon.rpc.dispatch import CallContext, JsonObject, Methods, Params
from recalld.daemon.workspaces import check_agent_id
from recalld.ipc.answers import JobInfo, JobSubmitted
from recalld.ipc.errors import InvalidParams, NotAllowed, Overloaded

METHODS = Methods()
R = TypeVar("R")
#: Jobs a workspace may have queued or running when a client submits another.
MAX_ACTIVE_JOBS = 256


class JobList(TypedDict):
    jobs: list[JobInfo]


def _params(params: object) -> Params:
    if params is None:
        return Params({})
    if not isinstance(params, Mapping):
        raise InvalidParams("params must be an object")
    return Params(params)


def _agent(p: Params) -> str:
    """The workspace a job call names: required where a job is started, read or cancelled
    (left out, another agent's jobs were acted on: the default workspace's)."""
    return p.agent_id()


async def rpc_submit(manager: JobManager, params: object) -> JobSubmitted:
    """``jobs.submit {agent_id, kind, params?}`` → ``{job_id}``."""
    p = _params(params)
    agent, kind = _agent(p), p.text("kind")
    job_params = p.mapping("params", None)
    p.done()
    if not kind:
        raise InvalidParams("param 'kind' must be a non-empty string")
    if manager.active_count(agent) >= MAX_ACTIVE_JOBS:  # the daemon's own submits go on
        raise Overloaded(f"{MAX_ACTIVE_JOBS} jobs are already queued or running in workspace "
                         f"{agent!r}; wait for some to finish")
    job_id = await manager.submit(agent, kind, job_params)
    return {"job_id": job_id}


def _refuse(reader: str, owner: str) -> None:
    raise NotAllowed(f"agent {reader!r} may not see the jobs of {owner!r}")


async def rpc_get(manager: JobManager, params: object,
                  check_reader: Callable[[str, str], object] = _refuse) -> JobInfo:
    """``jobs.get {agent_id, job_id, as_agent?}`` → the job record; for ``as_agent``,
    another agent (``check_reader(as_agent, agent_id)`` raises unless the workspace is
    shared with it), as a reader sees it."""
    p = _params(params)
    agent, job_id = _agent(p), p.text("job_id")
    reader = check_agent_id(p.text("as_agent", agent))
    p.done()
    if reader == agent:
        return manager.get(agent, job_id)
    check_reader(reader, agent)
    return sharing.job_for_reader(manager.get(agent, job_id))


async def rpc_list(manager: JobManager, params: object,
                   may_see: Callable[[str, str], bool] = lambda caller, owner: False,
                   ) -> JobList:
    """``jobs.list {agent_id?}`` → ``{jobs: [...]}``, oldest first: the jobs of the agent's
    own workspace and of the others' that ``may_see(agent, owner)`` allows (shared with
    it), those as a reader sees them."""
    p = _params(params)
    agent = check_agent_id(p.text("agent_id", DEFAULT_AGENT))
    p.done()
    jobs = manager.list(agent) + [sharing.job_for_reader(j) for j in manager.list()
                                  if j["agent_id"] != agent and may_see(agent, j["agent_id"])]
    return {"jobs": sorted(jobs, key=lambda j: j["submitted_at"])}


async def rpc_cancel(manager: JobManager, params: object) -> JobInfo:
    """``jobs.cancel {agent_id, job_id}`` → the job record after cancelling."""
    p = _params(params)
    agent, job_id = _agent(p), p.text("job_id")
    p.done()
    return await manager.cancel(agent, job_id)


def _on_manager(
    fn: Callable[[JobManager, object], Awaitable[R]],
) -> Callable[[CallContext, JsonObject], Awaitable[R]]:
    async def handle(ctx: CallContext, params: JsonObject) -> R:
        return await fn(ctx.services.jobs, params)

    return handle


async def _submit(ctx: CallContext, params: JsonObject) -> JobSubmitted:
    # A workspace that failed to open runs no job: refused here, saying why, rather than
    # a job id nobody can list (the job would only fail).
    agent = params.get("agent_id") if isinstance(params, Mapping) else None
    if isinstance(agent, str):
        ws = ctx.state.registry.find(agent)
        if ws is not None and ws.state == "failed":
            ctx.state.registry.get(agent)  # raises UnknownWorkspace with its error
    return await rpc_submit(ctx.services.jobs, params)


METHODS.register("jobs.submit", _submit)
def _may_see(ctx: CallContext) -> Callable[[str, str], bool]:
    registry = ctx.state.registry
    return lambda caller, owner: sharing.may_see(registry, caller, owner)


async def _get(ctx: CallContext, params: JsonObject) -> JobInfo:
    registry = ctx.state.registry
    return await rpc_get(ctx.services.jobs, params,
                         lambda reader, owner: sharing.readable(registry, reader, owner))


async def _list(ctx: CallContext, params: JsonObject) -> JobList:
    return await rpc_list(ctx.services.jobs, params, _may_see(ctx))


METHODS.register("jobs.get", _get)
METHODS.register("jobs.list", _list)
METHODS.register("jobs.cancel", _on_manager(rpc_cancel))
