"""RecalldMemoryMiddleware: recalld long-term memory for AgentScope agents.

What it offers is told by :mod:`recalld.ipc.agentscope`. It holds the per-session state
(pending hits, the context before a running reply, sessions to flush), runs the hooks
(recall before a reply, write-back after it, a flush before compaction, the system
prompt) and owns the daemon connection unless one was given. Its tools
(``memory_search``, ``add_memory`` and the Agentic Memory ``memory_write`` and
``memory_edit``) are in :mod:`recalld.ipc.agentscope_tools`; the write-back after a reply,
the flush before compaction and the queue of write-backs the daemon did not take are in
:mod:`recalld.ipc.agentscope_writeback`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agentscope.message import Msg
from agentscope.middleware import MiddlewareBase
from agentscope.tool import ToolBase

from recalld.ipc import errors
from recalld.ipc._reopen import on_workspace
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import owner_name, same_id_refusal, session_key
from recalld.ipc.agentscope_messages import (
    INDEX_HEADER,
    TOOL_INSTRUCTIONS,
    Parked,
    _query_text,
    _said,
    heard,
    hit_texts,
    memory_message,
    session_of,
    still_waiting,
)
from recalld.ipc.agentscope_tools import (
    AddMemoryTool,
    MemoryEditTool,
    MemorySearchTool,
    MemoryWriteTool,
)
from recalld.ipc.agentscope_workspace import (
    _DAEMON_ERRORS,
    Mode,
    _check_count,
    _check_mode,
    _open_workspace,
    model_overrides,
    selected_files,
)
from recalld.ipc.agentscope_writeback import MAX_SESSIONS, WriteBacks
from recalld.ipc.answers import JsonObject, NoteAdded, TopicWritten
from recalld.ipc.known_ids import KnownIds, provisional_id
from recalld.ipc.request_parts import search_query

if TYPE_CHECKING:
    from agentscope.agent import Agent

# The adapter logs under its public module's name, wherever the code lives.
log = logging.getLogger("recalld.ipc.agentscope")
T = TypeVar("T")


class RecalldMemoryMiddleware(WriteBacks, MiddlewareBase):
    """AgentScope middleware giving agents recalld long-term memory (see
    :mod:`recalld.ipc.agentscope`)."""

    #: Size cap of the block injected before a reply (``memory.recall``'s budget_chars).
    recall_budget_chars: int = 4000

    def __init__(
        self,
        *,
        agent_id: str | None = None,
        mode: Mode = "both",
        top_k: int = 5,
        agents: Sequence[str] | None = None,
        index_in_prompt: bool = False,
        index_max_entries: int = 50,
        index_ttl_s: float = 30.0,
        write_back: bool = True,
        socket_path: str | Path | None = None,
        autostart: bool = False,
        timeout_s: float = 30.0,
        client: AsyncClient | None = None,
        chat_model: object = None,
        embedding_model: object = None,
        select: bool = False,
    ) -> None:
        _check_mode(mode, top_k)
        _check_count(index_max_entries, "index_max_entries")
        if (isinstance(index_ttl_s, bool) or not isinstance(index_ttl_s, int | float)
                or not index_ttl_s >= 0):
            raise ValueError(f"index_ttl_s must be a number of seconds, 0 or more, not "
                             f"{index_ttl_s!r}")
        #: ``workspace.open``'s config: the agent's own models for its workspaces' jobs.
        self.models = model_overrides(chat_model, embedding_model)
        self.select = select
        # Named in any script, as agents are; the daemon's id of it is known at first use.
        # An empty one is refused, not taken as None: its tools then wrote to workspace
        # "" while its replies used each agent's own.
        try:
            self.agent_id = provisional_id(agent_id) if agent_id is not None else None
        except ValueError as exc:
            raise ValueError(f"agent_id: {exc}") from None
        self._pinned = agent_id
        #: The name each workspace's id was made of (given to the daemon with each open):
        #: the first agent of this middleware to use it; another whose name makes the same
        #: id is refused (:meth:`workspace_of`), as the daemon refuses one of another process.
        self._names: dict[str, str] = {}
        self.mode: Mode = mode
        self.top_k = top_k
        self._agent_names = list(agents) if agents is not None else None
        self.agents = [provisional_id(a) for a in agents] if agents is not None else None
        self.index_in_prompt = index_in_prompt
        self.index_max_entries = index_max_entries
        self.index_ttl_s = index_ttl_s
        self.write_back = write_back
        self._owns_client = client is None
        self.client = client or AsyncClient(socket_path, timeout_s=timeout_s,
                                              autostart=autostart)
        #: Which id each name has, as the daemon knows it.
        self._ids = KnownIds(self.client)
        self._resolved = False
        #: Open workspaces and their settings (as ``workspace.open`` answered).
        self._opened: dict[str, JsonObject] = {}
        #: (workspace, session) with turns written back since the session's last flush:
        #: agents in other workspaces may take part in the same conversation.
        self._unflushed: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: Write-backs the daemon did not take, by request id: sent again, oldest first,
        #: before the next one and at :meth:`close` (the id keeps a resend from adding
        #: anything twice).
        self._unsent: OrderedDict[str, tuple[str, str, list[JsonObject]]] = OrderedDict()
        self._sending = asyncio.Lock()
        # A running reply's state is keyed by its agent's state object (its id): agents
        # of several workspaces may reply in one conversation at once.
        #: Ids of the context messages before each running reply.
        self._reply_before: dict[int, set[str]] = {}
        #: The recall block waiting for each running reply's first reasoning step.
        self._pending_hits: dict[int, list[str]] = {}
        #: The workspace of each running reply (for its tools), or why it has none.
        self._reply_workspace: dict[int, str | errors.InvalidParams] = {}
        #: Context ids before a reply that ended waiting for the user: its turns are
        #: written back by the reply that resumes it.
        self._parked: Parked[set[str]] = Parked()
        self._session_workspace: OrderedDict[str, str] = OrderedDict()
        self._index_cache: dict[str, tuple[float, str]] = {}

    # ------------------------------------------------------------------ plumbing

    async def _resolve(self) -> None:
        """``agent_id`` and ``agents`` as the daemon knows them (once)."""
        if self._resolved:
            return
        if self._pinned is not None:
            self.agent_id = await self._ids.id_of(self._pinned)
            self._names.setdefault(self.agent_id, self._pinned)
        if self._agent_names is not None:
            self.agents = [await self._ids.id_of(a) for a in self._agent_names]
        self._resolved = True

    async def workspace_of(self, agent: Agent) -> str:
        """The workspace an agent's memory lives in. InvalidParams if it is another agent's
        of this middleware, whose name makes the same id ("Sales Bot", "Sales_Bot")."""
        await self._resolve()
        if self.agent_id:
            return self.agent_id
        workspace = await self._ids.id_of(agent.name, given_as_id=False)
        owner = self._names.setdefault(workspace, agent.name)
        if owner_name(owner) != owner_name(agent.name):
            raise errors.InvalidParams(same_id_refusal(workspace, agent.name, owner))
        return workspace

    async def _ensure_open(self, workspace: str, again: bool = False) -> None:
        if again or workspace not in self._opened:
            self._opened[workspace] = await _open_workspace(
                self.client, workspace, self.models, self._names.get(workspace))

    async def _on(self, workspace: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` on ``workspace``, opened again if another client closed it."""
        return await on_workspace(lambda again: self._ensure_open(workspace, again), call)

    async def search(self, workspace: str, query: str, limit: int | None = None) -> list[str]:
        """Hits for ``query`` in the workspace (and ``agents``), formatted for a model."""
        await self._resolve()
        query = search_query(query, self.client.request_limit)  # a message of any size
        response = await self._on(workspace, lambda: self.client.search(
            workspace, query, max_results=limit or self.top_k,
            agents=self.searched(workspace)))
        return hit_texts(response, query)

    def searched(self, workspace: str) -> list[str] | None:
        """The workspaces a search of ``workspace`` covers: its own, then ``agents``
        (which add to it, never replace it); None without ``agents``."""
        if self.agents is None:
            return None
        return list(dict.fromkeys([workspace, *self.agents]))

    async def recall_block(self, workspace: str, query: str) -> list[str]:
        """What is injected before a reply: the daemon's recall block (``memory.recall``:
        hits, then the notes they link to, within ``recall_budget_chars``). With ``agents``
        the hits of its own and every named workspace are injected instead (the block
        covers one)."""
        query = search_query(query, self.client.request_limit)  # a message of any size
        if self.agents is not None:
            return await self.search(workspace, query)
        if self.select:
            selected = await self._on(workspace, lambda: self.selected_files(workspace, query))
            if selected:
                return selected
        answer = await self._on(workspace, lambda: self.client.recall(
            workspace, query, max_results=self.top_k, budget_chars=self.recall_budget_chars))
        rendered = str(answer.get("rendered") or "")
        return [rendered] if rendered else []

    async def selected_files(self, workspace: str, query: str) -> list[str]:
        """The topic files the chat model picks for ``query`` (:func:`selected_files`)."""
        return await selected_files(self.client, workspace, query, self.top_k,
                                    self.recall_budget_chars)

    async def add(self, workspace: str, content: str, session_id: str | None,
                  request_id: str | None = None) -> NoteAdded:
        """Store ``content`` as a note of the day; returns where it went."""
        session = session_key(session_id) if session_id is not None else None
        return await self._on(workspace, lambda: self.client.add_note(
            workspace, content, session_id=session, request_id=request_id))

    async def topic_write(self, workspace: str, path: str, name: str, description: str,
                          type: str, body: str) -> TopicWritten:
        """Create or replace a topic file (``memory.topic_write``); the prompt's index
        lists it from the next request on."""
        done = await self._on(workspace, lambda: self.client.topic_write(
            workspace, path, name, description, type, body))
        self._index_cache.pop(workspace, None)
        return done

    async def topic_edit(self, workspace: str, path: str, old: str, new: str,
                         ) -> TopicWritten:
        """Replace the one ``old`` passage of a topic file (``memory.topic_edit``)."""
        done = await self._on(workspace, lambda: self.client.topic_edit(
            workspace, path, old, new))
        self._index_cache.pop(workspace, None)
        return done

    async def memory_index(self, workspace: str) -> str:
        """The rendered node index of the workspace, cached for ``index_ttl_s``."""
        now = time.monotonic()
        cached = self._index_cache.get(workspace)
        if cached is not None and now - cached[0] < self.index_ttl_s:
            return cached[1]
        answer = await self._on(workspace, lambda: self.client.memory_index(
            workspace, max_entries=self.index_max_entries))
        rendered = str(answer.get("rendered") or "")
        self._index_cache[workspace] = (now, rendered)
        return rendered

    async def end_session(self, workspace: str, session: str) -> None:
        """Hand the session's pending turns to auto_memory now (failures are logged)."""
        self._unflushed.pop((workspace, session), None)
        try:
            await self._on(workspace,
                           lambda: self.client.end_session(workspace, session_key(session)))
        except _DAEMON_ERRORS as exc:
            log.warning("recalld end_session for %s/%s failed: %s", workspace, session, exc)

    async def close(self) -> None:
        """Send the write-backs the daemon did not take yet, end every conversation
        written back since its last flush (its turns go to auto_memory), then close the
        daemon connection if this instance opened it. Idempotent."""
        await self._send_unsent()
        if self._unsent:
            log.warning("recalld: %d write-back(s) not sent: the daemon did not answer",
                        len(self._unsent))
            self._unsent.clear()
        while self._unflushed:
            (workspace, session), _ = self._unflushed.popitem(last=False)
            await self.end_session(workspace, session)
        if self._owns_client:
            await self.client.aclose()

    # --------------------------------------------------------------------- hooks

    async def on_reply(
        self,
        agent: Agent,
        input_kwargs: dict[str, object],
        next_handler: Callable[..., AsyncGenerator[object, None]],
    ) -> AsyncGenerator[object, None]:
        session = session_of(agent)
        key = id(agent.state)
        try:
            workspace = await self.workspace_of(agent)
        except errors.InvalidParams as refused:
            # Another agent's memory: this reply goes on without any, its tools say why.
            log.warning("recalld: no memory for this reply: %s", refused.message)
            self._reply_workspace[key] = refused
            try:
                async for item in next_handler(**input_kwargs):
                    yield item
            finally:
                self._reply_workspace.pop(key, None)
            return
        if session is not None:
            self._reply_workspace[key] = workspace
            self._session_workspace[session] = workspace
            self._session_workspace.move_to_end(session)
            while len(self._session_workspace) > MAX_SESSIONS:
                self._session_workspace.popitem(last=False)
        # A photo alone is a request too (its media named); a resumption has none.
        asked = _query_text(input_kwargs.get("inputs"), _said)
        parked = self._parked.pop(key, None) if asked is None else None
        # A reply given no input answers what the agent heard (observe) since it spoke.
        news = heard(agent) if asked is None and parked is None else []
        query = _query_text(input_kwargs.get("inputs")) or _query_text(news)
        if query and session is not None and self.mode != "agent_control":
            try:
                hits = await self.recall_block(workspace, query)
            except _DAEMON_ERRORS as exc:
                log.warning("recalld search for %s failed: %s", workspace, exc)
                hits = []
            if hits:
                self._pending_hits[key] = hits
        before = parked if parked is not None else {
            m.id for m in agent.state.context if isinstance(m, Msg)} - {m.id for m in news}
        if session is not None:
            self._reply_before[key] = before
        waits = False
        try:
            async for item in next_handler(**input_kwargs):
                waits = still_waiting(item, waits)
                yield item
        finally:
            if session is not None:
                self._pending_hits.pop(key, None)
                self._reply_before.pop(key, None)
                self._reply_workspace.pop(key, None)
            if self.write_back and (asked or parked is not None or news) and session:
                if waits:  # no answer yet: the reply resuming it writes the turns back
                    self._parked.park(key, before)
                else:
                    await self._write_back(agent, workspace, session, before)

    async def on_reasoning(
        self,
        agent: Agent,
        input_kwargs: dict[str, object],
        next_handler: Callable[..., AsyncGenerator[object, None]],
    ) -> AsyncGenerator[object, None]:
        hits = self._pending_hits.pop(id(agent.state), None)
        if hits:
            agent.state.context.append(memory_message(hits))
        async for event in next_handler(**input_kwargs):
            yield event

    async def on_system_prompt(self, agent: Agent, current_prompt: str) -> str:
        parts = [current_prompt]
        if self.mode != "static_control":
            parts.append(TOOL_INSTRUCTIONS)
        if self.index_in_prompt:
            try:
                workspace = await self.workspace_of(agent)
                index = await self.memory_index(workspace)
            except _DAEMON_ERRORS as exc:
                log.warning("recalld memory index for %s failed: %s", agent.name, exc)
                index = ""
            parts.append(f"{INDEX_HEADER}\n{index or '(no long-term notes yet)'}")
        return "\n\n".join(parts)

    async def list_tools(self) -> list[ToolBase]:
        """``memory_search`` and ``add_memory`` unless the mode is ``static_control``."""
        if self.mode == "static_control":
            return []
        return [MemorySearchTool(self), AddMemoryTool(self)]

    def topic_tools(self) -> list[ToolBase]:
        """Agentic Memory's ``memory_write`` and ``memory_edit`` for the agent's own topic
        files in the digest folder (the daemon keeps ``MEMORY.md`` listing them); add them
        to the toolkit beside :meth:`list_tools`."""
        return [MemoryWriteTool(self), MemoryEditTool(self)]

    def workspace_for_session(self, session: str | None) -> str | None:
        """The workspace of the agent that replied last in ``session``."""
        if self.agent_id is not None:
            return self.agent_id
        return self._session_workspace.get(session) if session is not None else None

    async def workspace_for_state(self, state: object) -> str | None:
        """The workspace of the agent whose state is ``state`` (for its tools): the one
        of its running reply, else of the last reply in its session. InvalidParams if
        its running reply has none (:meth:`workspace_of`)."""
        await self._resolve()
        if self.agent_id is not None:
            return self.agent_id
        workspace = self._reply_workspace.get(id(state))
        if isinstance(workspace, errors.InvalidParams):
            raise workspace
        if workspace is not None:
            return workspace
        session = getattr(state, "session_id", None)
        return self.workspace_for_session(session if isinstance(session, str) else None)
