"""The write-back half of :class:`~recalld.ipc.agentscope_memory.RecalldMemoryMiddleware`
(a mixin: the middleware sets every attribute below and gives the methods stubbed here).

Owns the path of a conversation's turns to the daemon: the flush before compaction
(``on_compress_context``), the write-back after a reply, and the queue of write-backs the
daemon did not take (sent again, oldest first, before the next one and at ``close``). It
starts no task.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from agentscope.message import Msg

from recalld.ipc import errors
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import session_key
from recalld.ipc.agentscope_messages import chat_turns, recalled, session_of
from recalld.ipc.agentscope_workspace import _AWAY, _DAEMON_ERRORS, MAX_UNSENT
from recalld.ipc.answers import JsonObject
from recalld.ipc.request_parts import add_turns_in_parts, fitting_request_id

if TYPE_CHECKING:
    from agentscope.agent import Agent

__all__ = ["MAX_SESSIONS", "WriteBacks"]

# The adapter logs under its public module's name, wherever the code lives.
log = logging.getLogger("recalld.ipc.agentscope")
T = TypeVar("T")

#: Sessions whose workspace is remembered for the tools (oldest forgotten first).
MAX_SESSIONS = 10_000


class WriteBacks:
    """The write-back half of :class:`~recalld.ipc.agentscope_memory.RecalldMemoryMiddleware`
    (a mixin: the middleware sets every attribute below)."""

    client: AsyncClient
    write_back: bool
    _opened: dict[str, JsonObject]
    _unflushed: OrderedDict[tuple[str, str], None]
    _unsent: OrderedDict[str, tuple[str, str, list[JsonObject]]]
    _sending: asyncio.Lock
    _reply_before: dict[int, set[str]]

    async def workspace_of(self, agent: Agent) -> str:
        raise NotImplementedError

    async def _ensure_open(self, workspace: str, again: bool = False) -> None:
        raise NotImplementedError

    async def _on(self, workspace: str, call: Callable[[], Awaitable[T]]) -> T:
        raise NotImplementedError

    async def end_session(self, workspace: str, session: str) -> None:
        raise NotImplementedError

    async def on_compress_context(
        self,
        agent: Agent,
        input_kwargs: dict[str, object],
        next_handler: Callable[..., Awaitable[None]],
    ) -> None:
        """Compaction folds old messages into a summary: with ``summarize_when_compact``
        the running reply's folded messages are written back and the session's pending
        turns go to auto_memory. (AgentScope calls this before every reasoning step; it
        acts only when messages really left the context.)"""
        context = [m for m in agent.state.context if isinstance(m, Msg)]
        await next_handler(**input_kwargs)
        session = session_of(agent)
        if session is None or not self.write_back:
            return
        try:
            workspace = await self.workspace_of(agent)
        except errors.InvalidParams:
            return  # said when its reply started
        kept = {m.id for m in agent.state.context if isinstance(m, Msg)}
        folded = [m for m in context if m.id not in kept]
        if not folded:
            return
        try:
            await self._ensure_open(workspace)
        except _DAEMON_ERRORS as exc:
            log.warning("recalld workspace.open for %s failed: %s", workspace, exc)
            return
        if not self._opened.get(workspace, {}).get("summarize_when_compact", True):
            return
        before = self._reply_before.get(id(agent.state))
        current = [m for m in folded if before is not None and m.id not in before
                   and not recalled(m)]
        if before is not None:
            before.update(m.id for m in current)  # not written back twice at reply end
        messages = chat_turns(current)
        key = session_key(session)
        request_id = fitting_request_id(
            f"asc:{key}:{agent.state.reply_id}:{current[0].id}") if messages else ""
        try:
            if messages:
                await self._on(workspace, lambda: add_turns_in_parts(
                    self.client, workspace, key, messages, request_id, flush=True))
                self._unflushed.pop((workspace, session), None)
            else:
                await self.end_session(workspace, session)
        except _AWAY as exc:
            if messages:  # they left the context: kept to go with the next write-back
                self._keep_unsent(request_id, (workspace, session, messages))
            log.warning("recalld flush before compaction of %s/%s failed (its turns are "
                        "sent again with the next write-back): %s", workspace, session, exc)
        except _DAEMON_ERRORS as exc:
            log.warning("recalld flush before compaction of %s/%s failed: %s", workspace,
                        session, exc)
    async def _write_back(self, agent: Agent, workspace: str, session: str,
                          before: set[str]) -> None:
        new = [m for m in agent.state.context
               if isinstance(m, Msg) and m.id not in before and not recalled(m)]
        messages = chat_turns(new)
        if not messages:  # a user's message goes without an answer too (tools, no text):
            return  # the next reply starts after it
        # The reply id makes a write-back sent again add nothing twice.
        request_id = fitting_request_id(f"as:{session_key(session)}:{agent.state.reply_id}")
        self._keep_unsent(request_id, (workspace, session, messages))
        await self._send_unsent()

    def _keep_unsent(self, request_id: str, item: tuple[str, str, list[JsonObject]]) -> None:
        self._unsent[request_id] = item
        while len(self._unsent) > MAX_UNSENT:
            _, (lost_ws, lost_session, _) = self._unsent.popitem(last=False)
            log.warning("recalld: dropped an unsent write-back of %s/%s (more than %d "
                        "waited for the daemon)", lost_ws, lost_session, MAX_UNSENT)

    async def _send_unsent(self) -> None:
        """Send the waiting write-backs, oldest first, until the daemon is found away
        (the rest wait for the next write-back); one the daemon refuses is dropped."""
        async with self._sending:
            while self._unsent:
                request_id, (workspace, session, messages) = next(iter(self._unsent.items()))
                try:
                    await self._send_turns(workspace, session, messages, request_id)
                except _AWAY as exc:
                    log.warning("recalld add_turns for %s/%s failed (sent again with the "
                                "next write-back): %s", workspace, session, exc)
                    return
                except _DAEMON_ERRORS as exc:
                    log.warning("recalld add_turns for %s/%s failed: %s", workspace,
                                session, exc)
                self._unsent.pop(request_id, None)

    async def _send_turns(self, workspace: str, session: str, messages: list[JsonObject],
                          request_id: str) -> None:
        await self._on(workspace, lambda: add_turns_in_parts(
            self.client, workspace, session_key(session), messages, request_id))
        self._unflushed[workspace, session] = None
        self._unflushed.move_to_end((workspace, session))
        while len(self._unflushed) > MAX_SESSIONS:
            self._unflushed.popitem(last=False)  # its idle flush still comes
