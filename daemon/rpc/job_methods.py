"""RPC methods of the job manager: ``jobs.submit``, ``jobs.get``, ``jobs.list``,
``jobs.cancel``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from recalld.daemon.jobs import JobManager
from recalld.daemon.rpc.dispatch import CallContext, Methods
from recalld.ipc.errors import InvalidParams

DEFAULT_AGENT = "default"
METHODS = Methods()


def _params(params: Any) -> Mapping[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise InvalidParams("params must be an object")
    return params


def _string(params: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = params.get(name, default)
    if not isinstance(value, str) or not value:
        raise InvalidParams(f"{name} must be a non-empty string")
    return value


async def rpc_submit(manager: JobManager, params: Any) -> dict[str, Any]:
    """``jobs.submit {agent_id, kind, params?}`` → ``{job_id}``."""
    p = _params(params)
    job_params = p.get("params")
    if job_params is not None and not isinstance(job_params, Mapping):
        raise InvalidParams("params.params must be an object")
    job_id = await manager.submit(_string(p, "agent_id", DEFAULT_AGENT), _string(p, "kind"),
                                  job_params)
    return {"job_id": job_id}


async def rpc_get(manager: JobManager, params: Any) -> dict[str, Any]:
    """``jobs.get {agent_id, job_id}`` → the job record."""
    p = _params(params)
    return manager.get(_string(p, "agent_id", DEFAULT_AGENT), _string(p, "job_id"))


async def rpc_list(manager: JobManager, params: Any) -> dict[str, Any]:
    """``jobs.list {agent_id?}`` → ``{jobs: [...]}``, oldest first."""
    p = _params(params)
    agent = None if p.get("agent_id") is None else _string(p, "agent_id")
    return {"jobs": manager.list(agent)}


async def rpc_cancel(manager: JobManager, params: Any) -> dict[str, Any]:
    """``jobs.cancel {agent_id, job_id}`` → the job record after cancelling."""
    p = _params(params)
    return await manager.cancel(_string(p, "agent_id", DEFAULT_AGENT), _string(p, "job_id"))


def _on_manager(
    fn: Callable[[JobManager, Any], Awaitable[dict[str, Any]]],
) -> Callable[[CallContext, dict[str, Any]], Awaitable[dict[str, Any]]]:
    async def handle(ctx: CallContext, params: dict[str, Any]) -> dict[str, Any]:
        return await fn(ctx.services.jobs, params)

    return handle


for _name, _fn in (("jobs.submit", rpc_submit), ("jobs.get", rpc_get),
                   ("jobs.list", rpc_list), ("jobs.cancel", rpc_cancel)):
    METHODS.register(_name, _on_manager(_fn))
