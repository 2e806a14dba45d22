"""RPC methods of memory capture (``memory.add_turns``, ``inbox.list``, ``inbox.ack``) and
:func:`install`, which plugs capture into a supervisor: the per-workspace session store
and inbox services, these methods, and the ``auto_memory`` job kind.
"""

from __future__ import annotations

from typing import Any

from recalld.daemon.api import CallContext, Methods, Params
from recalld.daemon.jobs import JobManager
from recalld.daemon.memory.auto_memory import auto_memory_job
from recalld.daemon.memory.inbox import inbox_of, inbox_service
from recalld.daemon.memory.sessions import (
    check_messages,
    check_session_id,
    sessions_service,
    store_of,
)
from recalld.daemon.supervisor import Supervisor
from recalld.ipc.errors import InvalidParams, NotFound

METHODS = Methods()
ACTIVE = ("queued", "running")


def _job_active(jobs: JobManager, agent_id: str, job_id: str | None) -> bool:
    if job_id is None:
        return False
    try:
        return jobs.get(agent_id, job_id)["state"] in ACTIVE
    except NotFound:
        return False


@METHODS.add("memory.add_turns")
async def add_turns(ctx: CallContext, params: dict[str, Any]) -> Any:
    """Store a session's new turns; submit auto_memory every N user turns or on flush."""
    raw_messages = params.get("messages", [])
    p = Params({k: v for k, v in params.items() if k != "messages"})
    agent_id = p.agent_id()
    session_id = check_session_id(p.text("session_id"))
    flush: bool = p.boolean("flush", False)
    request_id: str | None = p.text("request_id", None)
    p.done()
    if request_id is not None and not (0 < len(request_id) <= 200):
        raise InvalidParams("request_id must be 1-200 characters")
    messages = check_messages(raw_messages if raw_messages is not None else [])
    ws = ctx.workspace(agent_id)
    store = store_of(ws)
    jobs: JobManager = ctx.state.services["jobs"]
    async with store.lock:
        prior = store.answer_for(request_id)
        if prior is not None:
            return prior
        before = store.info(session_id)
        added = await store.add(session_id, messages, request_id, answer=None)

        def answer(job_id: str | None) -> dict[str, Any]:
            out: dict[str, Any] = {
                "session_id": session_id,
                "added_messages": max(0, added.pending_messages - before.pending_messages),
                "pending_turns": added.pending_turns,
                "pending_messages": added.pending_messages,
                "user_turns_total": added.user_turns_total,
            }
            if job_id is not None:
                out["job_id"] = job_id
            return out

        interval = ws.settings.auto_memory_interval
        periodic = interval is not None and interval > 0 and added.since_submit >= interval
        has_pending = added.pending_messages > 0 or added.pending_turns > 0
        job_id: str | None = None
        if (periodic or flush) and has_pending:
            if (not periodic and added.upto <= added.submitted
                    and _job_active(jobs, agent_id, added.last_job_id)):
                job_id = added.last_job_id  # a queued or running job covers it all
            else:
                job_id = await jobs.submit(agent_id, "auto_memory",
                                           {"session_id": session_id, "upto": added.upto})
                await store.mark_submitted(session_id, added.upto, job_id, request_id,
                                           answer(job_id))
                return answer(job_id)
        result = answer(job_id)
        await store.remember(request_id, result)
        return result


@METHODS.add("inbox.list", positional=("agent_id",))
async def inbox_list(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    since: str | None = p.text("since", None)
    include_acked: bool = p.boolean("include_acked", False)
    p.done()
    inbox = inbox_of(ctx.workspace(agent_id))
    return {"agent_id": agent_id, "items": inbox.list(since, include_acked)}


@METHODS.add("inbox.ack")
async def inbox_ack(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    ids: list[str] = p.strings("ids")
    p.done()
    inbox = inbox_of(ctx.workspace(agent_id))
    return {"agent_id": agent_id, **await inbox.ack(ids)}


def install(supervisor: Supervisor) -> None:
    """Add memory capture to a supervisor that is not running yet."""
    supervisor.registry.add_service("sessions", sessions_service(
        supervisor.state.services["cpu"]))
    supervisor.registry.add_service("inbox", inbox_service(supervisor.events.publish))
    supervisor.state.methods.include(METHODS)
    jobs: JobManager = supervisor.state.services["jobs"]
    jobs.register("auto_memory",
                  auto_memory_job(supervisor.registry.get, supervisor.state.services),
                  resumable=True)
