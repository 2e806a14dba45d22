"""RPC methods of the job manager: ``jobs.submit``, ``jobs.get``, ``jobs.list``,
``jobs.cancel``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TypedDict, TypeVar

from recalld.daemon.jobs import JobManager, JobRecord
from recalld.daemon.rpc.dispatch import CallContext, JsonObject, Methods
from recalld.ipc.errors import InvalidParams

DEFAULT_AGENT = "default"
METHODS = Methods()
R = TypeVar("R")


class JobSubmitted(TypedDict):
    job_id: str


class JobList(TypedDict):
    jobs: list[JobRecord]


def _params(params: object) -> Mapping[str, object]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise InvalidParams("params must be an object")
    return params


def _string(params: Mapping[str, object], name: str, default: str | None = None) -> str:
    value = params.get(name, default)
    if not isinstance(value, str) or not value:
        raise InvalidParams(f"{name} must be a non-empty string")
    return value


async def rpc_submit(manager: JobManager, params: object) -> JobSubmitted:
    """``jobs.submit {agent_id, kind, params?}`` → ``{job_id}``."""
    p = _params(params)
    job_params = p.get("params")
    if job_params is not None and not isinstance(job_params, Mapping):
        raise InvalidParams("params.params must be an object")
    job_id = await manager.submit(_string(p, "agent_id", DEFAULT_AGENT), _string(p, "kind"),
                                  job_params)
    return {"job_id": job_id}


async def rpc_get(manager: JobManager, params: object) -> JobRecord:
    """``jobs.get {agent_id, job_id}`` → the job record."""
    p = _params(params)
    return manager.get(_string(p, "agent_id", DEFAULT_AGENT), _string(p, "job_id"))


async def rpc_list(manager: JobManager, params: object) -> JobList:
    """``jobs.list {agent_id?}`` → ``{jobs: [...]}``, oldest first."""
    p = _params(params)
    agent = None if p.get("agent_id") is None else _string(p, "agent_id")
    return {"jobs": manager.list(agent)}


async def rpc_cancel(manager: JobManager, params: object) -> JobRecord:
    """``jobs.cancel {agent_id, job_id}`` → the job record after cancelling."""
    p = _params(params)
    return await manager.cancel(_string(p, "agent_id", DEFAULT_AGENT), _string(p, "job_id"))


def _on_manager(
    fn: Callable[[JobManager, object], Awaitable[R]],
) -> Callable[[CallContext, JsonObject], Awaitable[R]]:
    async def handle(ctx: CallContext, params: JsonObject) -> R:
        return await fn(ctx.services.jobs, params)

    return handle


METHODS.register("jobs.submit", _on_manager(rpc_submit))
METHODS.register("jobs.get", _on_manager(rpc_get))
METHODS.register("jobs.list", _on_manager(rpc_list))
METHODS.register("jobs.cancel", _on_manager(rpc_cancel))
