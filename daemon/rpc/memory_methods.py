"""RPC methods of memory capture: ``memory.add_turns``, ``memory.changes``, ``inbox.list``,
``inbox.ack``."""

from __future__ import annotations

import heapq
import itertools
import logging
from typing import TypedDict

import trio

from recalld.daemon.memory import capture_log, changelog
from recalld.daemon.memory.turns import (
    check_messages,
    check_request_id,
    check_session_id,
    continued,
)
from recalld.daemon.rpc.dispatch import CallContext, JsonObject, Methods, Params
from recalld.daemon.rpc.echo import echoed
from recalld.daemon.store.errors import StorageError
from recalld.ipc.answers import InboxAcked, TurnsAdded
from recalld.ipc.errors import InvalidParams
from recalld.ipc.protocol import MAX_LISTED_CHANGES

METHODS = Methods()
log = logging.getLogger(__name__)


class Changes(TypedDict):
    agent_id: str
    changes: list[JsonObject]


CHANGE_KINDS = ("auto_memory", "auto_dream")


class InboxItems(TypedDict):
    agent_id: str
    items: list[JsonObject]


@METHODS.add("memory.add_turns")
async def add_turns(ctx: CallContext, params: JsonObject) -> TurnsAdded | JsonObject:
    """Store a session's new turns; submit auto_memory every N user turns or on flush."""
    raw_messages = params.get("messages", [])
    p = Params({k: v for k, v in params.items() if k != "messages"})
    agent_id = p.agent_id()
    session_id = check_session_id(p.text("session_id"))
    flush = p.boolean("flush", False)
    request_id = check_request_id(p.text("request_id", None))
    p.done()
    if request_id is not None:
        # A retry is a retry of the same session's call: the same id given with another
        # session is another request (no session id has a '/').
        request_id = f"{session_id}/{request_id}"
    messages = check_messages(raw_messages if raw_messages is not None else [])
    # Saved after a restore's snapshot and before its files, turns would be in neither.
    async with ctx.writable(agent_id) as ws:
        store = ws.services.sessions
        async with store.lock:
            prior = store.answer_for(request_id)
            if prior is not None:
                # Killed between saving the turns and queueing the job they were due
                # (every ``auto_memory_interval`` user turns): the retry queues it, else
                # they would wait for the next turns. Its answer stays the first one.
                owed = store.info(session_id)
                interval = ws.settings.auto_memory_interval
                if (interval and owed.since_submit >= interval and owed.pending_turns
                        and not (messages and continued(messages[-1]))
                        and not ws.services.capture.covered(owed)):
                    await ws.services.capture.submit(session_id, owed.upto,
                                                     trigger="interval")
                return prior
            before = store.info(session_id)
            added = await store.add(session_id, messages, request_id, answer=None)

            def answer(job_id: str | None) -> TurnsAdded:
                out: TurnsAdded = {
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
            # Never with a message half said (its pieces go on in the next request): its
            # rest would go to the next run, and the dialog log would hold it in two lines.
            periodic = (interval is not None and interval > 0
                        and added.since_submit >= interval
                        and not (messages and continued(messages[-1])))
            has_pending = added.pending_messages > 0 or added.pending_turns > 0
            capture = ws.services.capture
            if added.pending_messages > before.pending_messages or (
                    added.pending_turns > before.pending_turns):
                capture.touched(session_id)
            job_id: str | None = None
            if (periodic or flush) and has_pending:
                if not periodic and capture.covered(added):
                    job_id = added.last_job_id  # a queued or running job covers it all
                    capture.watch(session_id)
                else:
                    try:
                        job_id = await capture.submit(session_id, added.upto, request_id,
                                                      lambda jid: dict(answer(jid)),
                                                      trigger="interval" if periodic else "flush")
                        return answer(job_id)
                    except StorageError as exc:
                        # The turns are saved: an error now would have the caller add them
                        # again. They stay pending for the next turns' or the idle flush.
                        log.warning("%s: turns of session %s saved, but no auto_memory job "
                                    "could be queued: %s", agent_id, session_id, exc)
            result = answer(job_id)
            try:
                await store.remember(request_id, result)
            except StorageError as exc:  # the turns record holds an answer for a retry
                log.warning("%s: the answer to %s was not saved: %s", agent_id, request_id, exc)
            return result


@METHODS.add("memory.changes", positional=("agent_id",))
async def memory_changes(ctx: CallContext, params: JsonObject) -> Changes:
    """The change log records of the memory jobs (auto_memory, auto_dream), newest first."""
    p = Params(params)
    agent_id = p.agent_id()
    kind = p.text("kind", None)
    limit = min(p.integer("limit", 20, minimum=1), MAX_LISTED_CHANGES)
    p.done()
    if kind is not None and kind not in CHANGE_KINDS:
        raise InvalidParams(f"kind must be one of {', '.join(CHANGE_KINDS)}")
    ws = ctx.workspace(agent_id)
    meta = ws.settings.metadata_dir

    def collect() -> list[JsonObject]:
        memory: list[JsonObject] = []
        dreams: list[JsonObject] = []
        if kind in (None, "auto_memory"):
            memory = [dict(run) for run in capture_log.list_runs(ws.root, meta, limit)]
        if kind in (None, "auto_dream"):
            dreams = [{"kind": "auto_dream", **run,
                       "log": f"{meta}/dream/runs/{run['run_id']}.md"}
                      for run in changelog.list_runs(changelog.runs_dir(ws.root, meta), limit)]
        # Each kind's list keeps its order (dream runs by their place, which a wall clock
        # set back does not change); the two are interleaved by start.
        out = heapq.merge(memory, dreams, reverse=True,
                          key=lambda r: (str(r.get("started")), str(r["run_id"])))
        return list(itertools.islice(out, limit))

    return {"agent_id": agent_id, "changes": await trio.to_thread.run_sync(collect)}


@METHODS.add("inbox.list", positional=("agent_id",))
async def inbox_list(ctx: CallContext, params: JsonObject) -> InboxItems:
    p = Params(params)
    agent_id = p.agent_id()
    since = p.text("since", None)
    include_acked = p.boolean("include_acked", False)
    p.done()
    inbox = ctx.workspace(agent_id).services.inbox
    return {"agent_id": agent_id, "items": inbox.list(since, include_acked)}


@METHODS.add("inbox.ack")
async def inbox_ack(ctx: CallContext, params: JsonObject) -> InboxAcked:
    p = Params(params)
    agent_id = p.agent_id()
    ids = p.strings("ids")
    p.done()
    async with ctx.writable(agent_id) as ws:
        acked = await ws.services.inbox.ack(ids)
    # Ids it does not know are the caller's text alone: sent back as they are shown.
    return {"agent_id": agent_id, "acked": acked["acked"],
            "unknown": [echoed(i) for i in acked["unknown"]]}
