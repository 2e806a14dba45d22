"""Long-term memory for AgentScope 2.x agents, backed by the recalld daemon.

Install with ``pip install 'recalld[agentscope]'``; a daemon must run (or pass
``autostart=True``). One middleware covers what AgentScope's three long-term memory
middlewares offer, without an index in the agent process::

    from agentscope.tool import Toolkit
    from recalld.ipc.agentscope import RecalldMemoryMiddleware

    memory = RecalldMemoryMiddleware(mode="both", top_k=5, index_in_prompt=True)
    agent = Agent(name="coder", system_prompt="...", model=model,
                  toolkit=Toolkit(tools=await memory.list_tools()), middlewares=[memory])
    ...
    await memory.close()

- ReMe-style retrieval modes: ``static_control`` searches the whole workspace when a
  reply starts and injects the hits before the first reasoning step; ``agent_control``
  gives the agent the ``memory_search`` and ``add_memory`` tools (from
  :meth:`list_tools`) and says so in the system prompt; ``both`` (default) does both.
- Write-back in every mode: each reply's new messages go to ``memory.add_turns`` under
  the agent's ``state.session_id``; the daemon's auto_memory job turns them into notes
  (every ``auto_memory_interval`` user turns, after ``auto_memory_idle_s`` without a
  turn, and when :meth:`~RecalldMemoryMiddleware.close` ends the conversations it saw).
- Context compaction: when the agent compacts its context and the workspace's
  ``summarize_when_compact`` is true (the default), the turns the compaction folds
  away go to auto_memory first (``on_compress_context``).
- Mem0-style ``add_memory(thinking, content)``: only ``content`` is stored, as a note
  of the day through ``memory.add_note``.
- Agentic-Memory-style index: with ``index_in_prompt=True`` the system prompt gets the
  names and one-line descriptions of the long-term nodes (``memory.index``).

Workspaces: ``agent_id`` pins one workspace for every agent using this instance;
without it each agent uses the workspace named after ``agent.name``. ``agents`` adds
other workspaces to every search (their owners must share them). All per-conversation
state is keyed by session id, so one instance may serve many agents at once. Daemon
failures are logged and never break a reply; the tools report them to the model.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentscope.message import AssistantMsg, HintBlock, Msg, TextBlock, ToolResultState
from agentscope.middleware import MiddlewareBase
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import ToolBase, ToolChunk

from recalld.ipc import errors
from recalld.ipc.asyncio_client import AsyncioClient
from recalld.ipc.types import SearchResponse

if TYPE_CHECKING:
    from agentscope.agent import Agent

log = logging.getLogger(__name__)

Mode = Literal["static_control", "agent_control", "both"]
MODES: tuple[Mode, ...] = ("static_control", "agent_control", "both")
#: Name of the context message that carries recalled memory (never written back).
MEMORY_MSG_NAME = "memory"
MAX_HIT_CHARS = 1200
#: Sessions whose workspace is remembered for the tools (oldest forgotten first).
MAX_SESSIONS = 10_000
_AGENT_ID_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_DAEMON_ERRORS = (errors.RecalldError, OSError, TimeoutError)

TOOL_INSTRUCTIONS = (
    "## Long-term memory\n\n"
    "You have a long-term memory shared across conversations. Call `memory_search` "
    "when the request may depend on something from an earlier session (a preference, a "
    "name, a decision, how something was done). Call `add_memory` to keep a durable fact "
    "the user states or asks you to remember; the conversation itself is recorded "
    "automatically."
)
INDEX_HEADER = "## Memory index (long-term notes: name — when to read it)"


def workspace_name(name: str) -> str:
    """A valid recalld agent id derived from an AgentScope agent name."""
    cleaned = _AGENT_ID_BAD.sub("_", name).strip(".")[:64]
    return cleaned or "default"


def format_hits(response: SearchResponse) -> list[str]:
    """One text per hit: where it comes from, then the text (cut to a bound)."""
    out = []
    for hit in response:
        text = hit.text if len(hit.text) <= MAX_HIT_CHARS else hit.text[:MAX_HIT_CHARS] + "…"
        owner = hit.extra.get("agent_id")
        where = f"{owner}:" if isinstance(owner, str) else ""
        out.append(f"[{where}{hit.path}:{hit.start_line}-{hit.end_line}]\n{text.strip()}")
    return out


def _msg_text(msg: Msg) -> str:
    text = msg.get_text_content()
    return text.strip() if text else ""


class RecalldMemoryMiddleware(MiddlewareBase):
    """AgentScope middleware giving agents recalld long-term memory (module docstring)."""

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
        client: AsyncioClient | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if top_k < 1:
            raise ValueError("top_k must be at least 1")
        self.agent_id = agent_id
        self.mode: Mode = mode
        self.top_k = top_k
        self.agents = list(agents) if agents is not None else None
        self.index_in_prompt = index_in_prompt
        self.index_max_entries = index_max_entries
        self.index_ttl_s = index_ttl_s
        self.write_back = write_back
        self._owns_client = client is None
        self.client = client or AsyncioClient(socket_path, timeout_s=timeout_s,
                                              autostart=autostart)
        #: Open workspaces and their settings (as ``workspace.open`` answered).
        self._opened: dict[str, dict[str, Any]] = {}
        #: Sessions with turns written back since their last flush, and their workspace.
        self._unflushed: OrderedDict[str, str] = OrderedDict()
        #: Ids of the context messages before the running reply of each session.
        self._reply_before: dict[str, set[str]] = {}
        # Keyed by session id: one instance may serve many agents and conversations.
        self._pending_hits: dict[str, list[str]] = {}
        self._session_workspace: OrderedDict[str, str] = OrderedDict()
        self._index_cache: dict[str, tuple[float, str]] = {}

    # ------------------------------------------------------------------ plumbing

    def workspace_of(self, agent: Agent) -> str:
        """The workspace an agent's memory lives in."""
        return self.agent_id or workspace_name(agent.name)

    async def _ensure_open(self, workspace: str) -> None:
        if workspace not in self._opened:
            info = await self.client.workspace_open(workspace)
            settings = info.get("settings") if isinstance(info, dict) else None
            self._opened[workspace] = dict(settings) if isinstance(settings, dict) else {}

    async def search(self, workspace: str, query: str, limit: int | None = None) -> list[str]:
        """Hits for ``query`` in the workspace (and ``agents``), formatted for a model."""
        await self._ensure_open(workspace)
        response = await self.client.search(workspace, query, max_results=limit or self.top_k,
                                            agents=self.agents)
        return format_hits(response)

    async def add(self, workspace: str, content: str, session_id: str | None) -> dict[str, Any]:
        """Store ``content`` as a note of the day; returns where it went."""
        await self._ensure_open(workspace)
        return await self.client.add_note(workspace, content, session_id=session_id)

    async def memory_index(self, workspace: str) -> str:
        """The rendered node index of the workspace, cached for ``index_ttl_s``."""
        now = time.monotonic()
        cached = self._index_cache.get(workspace)
        if cached is not None and now - cached[0] < self.index_ttl_s:
            return cached[1]
        await self._ensure_open(workspace)
        answer = await self.client.memory_index(workspace, max_entries=self.index_max_entries)
        rendered = str(answer.get("rendered") or "")
        self._index_cache[workspace] = (now, rendered)
        return rendered

    async def end_session(self, workspace: str, session: str) -> None:
        """Hand the session's pending turns to auto_memory now (failures are logged)."""
        self._unflushed.pop(session, None)
        try:
            await self._ensure_open(workspace)
            await self.client.end_session(workspace, session)
        except _DAEMON_ERRORS as exc:
            log.warning("recalld end_session for %s/%s failed: %s", workspace, session, exc)

    async def close(self) -> None:
        """End every conversation written back since its last flush (its turns go to
        auto_memory), then close the daemon connection if this instance opened it.
        Idempotent."""
        while self._unflushed:
            session, workspace = self._unflushed.popitem(last=False)
            await self.end_session(workspace, session)
        if self._owns_client:
            await self.client.aclose()

    @staticmethod
    def _session_of(agent: Agent) -> str | None:
        # Read live from the agent at hook time, never stored per instance: sharing works.
        session = getattr(getattr(agent, "state", None), "session_id", None)
        return session if isinstance(session, str) and session else None

    # --------------------------------------------------------------------- hooks

    async def on_reply(
        self,
        agent: Agent,
        input_kwargs: dict[str, Any],
        next_handler: Callable[..., AsyncGenerator[Any, None]],
    ) -> AsyncGenerator[Any, None]:
        workspace = self.workspace_of(agent)
        session = self._session_of(agent)
        if session is not None:
            self._session_workspace[session] = workspace
            self._session_workspace.move_to_end(session)
            while len(self._session_workspace) > MAX_SESSIONS:
                self._session_workspace.popitem(last=False)
        query = _query_text(input_kwargs.get("inputs"))
        if query and session is not None and self.mode != "agent_control":
            try:
                hits = await self.search(workspace, query)
            except _DAEMON_ERRORS as exc:
                log.warning("recalld search for %s failed: %s", workspace, exc)
                hits = []
            if hits:
                self._pending_hits[session] = hits
        before = {m.id for m in agent.state.context if isinstance(m, Msg)}
        if session is not None:
            self._reply_before[session] = before
        try:
            async for item in next_handler(**input_kwargs):
                yield item
        finally:
            if session is not None:
                self._pending_hits.pop(session, None)
                self._reply_before.pop(session, None)
            if self.write_back and query and session is not None:
                await self._write_back(agent, workspace, session, before)

    async def on_reasoning(
        self,
        agent: Agent,
        input_kwargs: dict[str, Any],
        next_handler: Callable[..., AsyncGenerator[Any, None]],
    ) -> AsyncGenerator[Any, None]:
        session = self._session_of(agent)
        hits = self._pending_hits.pop(session, None) if session is not None else None
        if hits:
            agent.state.context.append(memory_message(hits))
        async for event in next_handler(**input_kwargs):
            yield event

    async def on_compress_context(
        self,
        agent: Agent,
        input_kwargs: dict[str, Any],
        next_handler: Callable[..., Awaitable[None]],
    ) -> None:
        """Compaction folds old messages into a summary: with ``summarize_when_compact``
        the running reply's folded messages are written back and the session's pending
        turns go to auto_memory. (AgentScope calls this before every reasoning step; it
        acts only when messages really left the context.)"""
        context = [m for m in agent.state.context if isinstance(m, Msg)]
        await next_handler(**input_kwargs)
        session = self._session_of(agent)
        if session is None or not self.write_back:
            return
        workspace = self.workspace_of(agent)
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
        before = self._reply_before.get(session)
        current = [m for m in folded if before is not None and m.id not in before
                   and m.name != MEMORY_MSG_NAME]
        if before is not None:
            before.update(m.id for m in current)  # not written back twice at reply end
        messages = _turns(current)
        try:
            if messages:
                await self.client.add_turns(
                    workspace, session, messages, flush=True,
                    request_id=f"asc:{session}:{agent.state.reply_id}:{current[0].id}"[:200])
                self._unflushed.pop(session, None)
            else:
                await self.end_session(workspace, session)
        except _DAEMON_ERRORS as exc:
            log.warning("recalld flush before compaction of %s/%s failed: %s", workspace,
                        session, exc)

    async def on_system_prompt(self, agent: Agent, current_prompt: str) -> str:
        parts = [current_prompt]
        if self.mode != "static_control":
            parts.append(TOOL_INSTRUCTIONS)
        if self.index_in_prompt:
            workspace = self.workspace_of(agent)
            try:
                index = await self.memory_index(workspace)
            except _DAEMON_ERRORS as exc:
                log.warning("recalld memory index for %s failed: %s", workspace, exc)
                index = ""
            parts.append(f"{INDEX_HEADER}\n{index or '(no long-term notes yet)'}")
        return "\n\n".join(parts)

    async def list_tools(self) -> list[ToolBase]:
        """``memory_search`` and ``add_memory`` unless the mode is ``static_control``."""
        if self.mode == "static_control":
            return []
        return [MemorySearchTool(self), AddMemoryTool(self)]

    async def _write_back(self, agent: Agent, workspace: str, session: str,
                          before: set[str]) -> None:
        new = [m for m in agent.state.context
               if isinstance(m, Msg) and m.id not in before and m.name != MEMORY_MSG_NAME]
        messages = _turns(new)
        if not any(m["role"] == "assistant" for m in messages):
            return  # no real exchange (interrupted, or only tool calls)
        try:
            await self._ensure_open(workspace)
            # The reply id makes a retried write-back add nothing twice.
            await self.client.add_turns(workspace, session, messages,
                                        request_id=f"as:{session}:{agent.state.reply_id}"[:200])
            self._unflushed[session] = workspace
            self._unflushed.move_to_end(session)
            while len(self._unflushed) > MAX_SESSIONS:
                self._unflushed.popitem(last=False)  # its idle flush still comes
        except _DAEMON_ERRORS as exc:
            log.warning("recalld add_turns for %s/%s failed: %s", workspace, session, exc)

    def workspace_for_session(self, session: str | None) -> str | None:
        """The workspace of the agent replying in ``session`` (for tools)."""
        if self.agent_id is not None:
            return self.agent_id
        return self._session_workspace.get(session) if session is not None else None


def _turns(msgs: Sequence[Msg]) -> list[dict[str, Any]]:
    """The user and assistant texts of ``msgs`` as chat messages."""
    return [{"role": m.role, "content": _msg_text(m)} for m in msgs
            if m.role in ("user", "assistant") and _msg_text(m)]


def memory_message(hits: Sequence[str]) -> Msg:
    """The context message carrying recalled hits. The tag lets the daemon drop the block
    if the message is ever written back."""
    body = "\n\n".join(hits)
    hint = ("## Relevant memories\nNotes from long-term memory that may be relevant; use "
            f"them only if pertinent.\n<recalled-memory>\n{body}\n</recalled-memory>")
    return AssistantMsg(name=MEMORY_MSG_NAME, content=[HintBlock(hint=hint)])


def _query_text(inputs: Any) -> str | None:
    """The user's text in the reply inputs (None for resumption events)."""
    msgs = inputs if isinstance(inputs, list) else [inputs]
    texts = [_msg_text(m) for m in msgs if isinstance(m, Msg) and m.role == "user"]
    joined = "\n".join(t for t in texts if t)
    return joined or None


# ------------------------------------------------------------------------------- tools


def _chunk(text: str, *, error: bool = False) -> ToolChunk:
    if error:
        return ToolChunk(content=[TextBlock(type="text", text=text)],
                         state=ToolResultState.ERROR)
    return ToolChunk(content=[TextBlock(type="text", text=text)])


class _MemoryTool(ToolBase):
    """Memory tools are part of the agent's own capabilities: always allowed."""

    is_external_tool = False
    # The agent state tells which conversation (and so which workspace) calls.
    is_state_injected = True
    is_mcp = False
    mcp_name = None

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__()
        self._mw = middleware

    async def check_permissions(self, tool_input: dict[str, Any],
                                context: Any) -> PermissionDecision:
        return PermissionDecision(behavior=PermissionBehavior.ALLOW,
                                  message="recalld long-term memory tool")

    def _workspace(self, state: Any) -> str | None:
        session = getattr(state, "session_id", None)
        return self._mw.workspace_for_session(session if isinstance(session, str) else None)


class MemorySearchTool(_MemoryTool):
    """``memory_search(query, limit)`` over the agent's whole workspace."""

    name = "memory_search"
    description = "Search long-term memory (notes from past conversations) for a query."
    is_concurrency_safe = True
    is_read_only = True

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__(middleware)
        self.input_schema = {
            "type": "object",
            "properties": {
                "query": {"type": "string",
                          "description": "What to look for: a name, a preference, a "
                                         "decision, an error message..."},
                "limit": {"type": "integer", "description": "Maximum number of results.",
                          "default": middleware.top_k},
            },
            "required": ["query"],
        }

    async def call(self, query: str = "", limit: int | None = None,
                   _agent_state: Any = None, **_: Any) -> ToolChunk:
        workspace = self._workspace(_agent_state)
        if workspace is None:
            return _chunk("memory is not available outside a reply", error=True)
        if not query.strip():
            return _chunk("(no query given: nothing to search)")
        try:
            hits = await self._mw.search(workspace, query, limit)
        except _DAEMON_ERRORS as exc:
            return _chunk(f"memory search failed: {exc}", error=True)
        return _chunk("\n\n".join(hits) if hits else "(no relevant memories found)")


class AddMemoryTool(_MemoryTool):
    """Mem0-style ``add_memory(thinking, content)``: only ``content`` is stored."""

    name = "add_memory"
    description = ("Record durable facts worth remembering in later conversations. Only "
                   "`content` is stored; `thinking` stays in this conversation.")
    is_concurrency_safe = False
    is_read_only = False

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__(middleware)
        self.input_schema = {
            "type": "object",
            "properties": {
                "thinking": {"type": "string",
                             "description": "Why this is worth remembering (not stored)."},
                "content": {"type": "array", "items": {"type": "string"},
                            "description": "Facts to remember, one complete sentence each."},
            },
            "required": ["thinking", "content"],
        }

    async def call(self, thinking: str = "", content: Sequence[str] | str = (),
                   _agent_state: Any = None, **_: Any) -> ToolChunk:
        workspace = self._workspace(_agent_state)
        if workspace is None:
            return _chunk("memory is not available outside a reply", error=True)
        items = [content] if isinstance(content, str) else list(content)
        facts = [str(c).strip() for c in items if str(c).strip()]
        if not facts:
            return _chunk("`content` is empty: nothing to record", error=True)
        session = getattr(_agent_state, "session_id", None)
        try:
            where = await self._mw.add(workspace, "\n".join(f"- {f}" for f in facts),
                                       session if isinstance(session, str) else None)
        except _DAEMON_ERRORS as exc:
            return _chunk(f"recording memory failed: {exc}", error=True)
        rationale = f" (rationale: {thinking})" if thinking else ""
        return _chunk(f"Recorded {len(facts)} fact(s) in {where.get('path')}{rationale}")
