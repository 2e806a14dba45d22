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
  reply starts and injects the daemon's recall block (the hits, then the notes they link
  to, labelled with path and lines) before the first reasoning step; ``agent_control``
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

- The agent's own models: ``chat_model`` (AgentScope's ``OpenAIChatModel`` or
  ``DashScopeChatModel``) and ``embedding_model`` (``OpenAIEmbeddingModel`` or
  ``DashScopeEmbeddingModel``), or a mapping of the daemon's field names, are handed to
  the daemon when the middleware opens a workspace (``chat_model_config`` and
  ``embedding_model_config`` overrides), so that workspace's jobs (auto_memory, dreams)
  and vectors use them and the daemon needs no model configured. The key is sent over
  the per-user socket only, never logged, and masked in ``workspace.list``; the daemon
  records the overrides with the workspace so a restart keeps serving it. A workspace
  already open keeps the models it was opened with (close it to change them).
- Selection (``select=True``): before a reply the chat model picks the relevant topic
  files (``memory.select``); when it picks none or no chat model is configured, the
  recall block (the search) is injected as usual.

Workspaces: ``agent_id`` pins one workspace for every agent using this instance;
without it each agent uses the workspace named after ``agent.name`` (a name in a
non-Latin script gets a digest of itself: :func:`workspace_name`). ``agents`` adds
other workspaces to every search (their owners must share them). All per-conversation
state is keyed by session id, so one instance may serve many agents at once. Daemon
failures are logged and never break a reply; the tools report them to the model.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import unicodedata
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, TypedDict

from agentscope.event import ReplyStartEvent
from agentscope.message import AssistantMsg, HintBlock, Msg, TextBlock, ToolResultState
from agentscope.middleware import MiddlewareBase
from agentscope.permission import PermissionBehavior, PermissionContext, PermissionDecision
from agentscope.tool import ToolBase, ToolChunk

from recalld.ipc import errors
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.answers import JsonObject, NoteAdded
from recalld.ipc.types import SearchResponse, render_linked

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
    """A valid recalld agent id derived from an AgentScope agent name.

    An ASCII name keeps its letters, digits and ``_.-`` (others become ``_``). A name in
    another script would lose most of its characters and collide with every other one
    ("研究助手" and "写作助手" both became ``_``), so it becomes its ASCII letters (accents
    folded, ``agent`` if none) and a digest of the whole name: distinct names, distinct
    workspaces, the same one every time."""
    if name.isascii():
        return _AGENT_ID_BAD.sub("_", name).strip(".")[:64] or "default"
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    base = _AGENT_ID_BAD.sub("_", folded).strip("._-")[:55] or "agent"
    return f"{base}-{hashlib.blake2s(name.encode(), digest_size=4).hexdigest()}"


def format_hits(response: SearchResponse) -> list[str]:
    """One text per hit: where it comes from, then the text (cut to a bound)."""
    out = []
    for hit in response:
        text = hit.text if len(hit.text) <= MAX_HIT_CHARS else hit.text[:MAX_HIT_CHARS] + "…"
        owner = hit.extra.get("agent_id")
        where = f"{owner}:" if isinstance(owner, str) else ""
        out.append(f"[{where}{hit.path}:{hit.start_line}-{hit.end_line}]\n{text.strip()}")
    return out


class ChatModelOverride(TypedDict, total=False):
    """The daemon's ``chat_model_config`` fields a middleware hands over."""

    backend: str
    base_url: str
    api_key: str
    model_name: str


class EmbeddingModelOverride(TypedDict, total=False):
    """The daemon's ``embedding_model_config`` fields a middleware hands over."""

    backend: str
    base_url: str
    api_key: str
    model_name: str
    dimensions: int
    use_dimensions: bool


class ModelOverrides(TypedDict, total=False):
    """``workspace.open``'s ``config`` carrying the agent's models."""

    chat_model_config: ChatModelOverride
    embedding_model_config: EmbeddingModelOverride


def _credential(model: object, what: str) -> tuple[str, str]:
    """The API key and base URL of an AgentScope model's credential ("" for the
    provider's default URL)."""
    credential = getattr(model, "credential", None)
    secret = getattr(credential, "api_key", None)
    get = getattr(secret, "get_secret_value", None)
    key = get() if callable(get) else secret
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what}: the model's credential has no API key")
    base_url = getattr(credential, "base_url", None)
    return key, base_url if isinstance(base_url, str) else ""


def chat_model_override(model: object) -> ChatModelOverride:
    """The daemon's ``chat_model_config`` for an AgentScope chat model speaking OpenAI's
    wire format (``OpenAIChatModel``; ``DashScopeChatModel``, whose credential names
    DashScope's OpenAI-compatible endpoint), or a mapping of those fields as given."""
    if isinstance(model, Mapping):
        return ChatModelOverride(**{k: v for k, v in model.items()})  # type: ignore[typeddict-item]
    from agentscope.model import DashScopeChatModel, OpenAIChatModel

    if not isinstance(model, (OpenAIChatModel, DashScopeChatModel)):
        raise ValueError(
            f"chat_model: {type(model).__name__} does not speak OpenAI's wire format; pass "
            "OpenAIChatModel, DashScopeChatModel or a mapping of chat_model_config fields")
    key, base_url = _credential(model, "chat_model")
    return ChatModelOverride(backend="openai", base_url=base_url, api_key=key,
                             model_name=str(model.model))


def embedding_model_override(model: object) -> EmbeddingModelOverride:
    """The daemon's ``embedding_model_config`` for ``OpenAIEmbeddingModel`` or
    ``DashScopeEmbeddingModel`` (text or multimodal), or a mapping of those fields."""
    if isinstance(model, Mapping):
        return EmbeddingModelOverride(**{k: v for k, v in model.items()})  # type: ignore[typeddict-item]
    from agentscope.embedding import DashScopeEmbeddingModel, OpenAIEmbeddingModel

    if not isinstance(model, (OpenAIEmbeddingModel, DashScopeEmbeddingModel)):
        raise ValueError(
            f"embedding_model: {type(model).__name__} is not supported; pass "
            "OpenAIEmbeddingModel, DashScopeEmbeddingModel or a mapping of "
            "embedding_model_config fields")
    key, base_url = _credential(model, "embedding_model")
    if isinstance(model, OpenAIEmbeddingModel):
        override = EmbeddingModelOverride(backend="openai", base_url=base_url, api_key=key,
                                          model_name=str(model.model),
                                          use_dimensions=bool(model.pass_dimensions))
    elif isinstance(model, DashScopeEmbeddingModel):
        backend = "dashscope_multimodal" if model.supports_multimodal else "dashscope"
        override = EmbeddingModelOverride(backend=backend, base_url=base_url, api_key=key,
                                          model_name=str(model.model))
    if isinstance(model.dimensions, int):
        override["dimensions"] = model.dimensions
    return override


def model_overrides(chat_model: object = None, embedding_model: object = None
                    ) -> ModelOverrides:
    """``workspace.open``'s ``config`` for the agent's own models (empty: none given)."""
    config = ModelOverrides()
    if chat_model is not None:
        config["chat_model_config"] = chat_model_override(chat_model)
    if embedding_model is not None:
        config["embedding_model_config"] = embedding_model_override(embedding_model)
    return config


def _warn_if_other_models(workspace: str, wanted: ModelOverrides,
                          settings: Mapping[str, object]) -> None:
    """A workspace already open keeps its models: say so when they are not the agent's."""
    names = {"chat_model_config": wanted.get("chat_model_config", {}).get("model_name"),
             "embedding_model_config": wanted.get("embedding_model_config", {}).get(
                 "model_name")}
    for key, want in names.items():
        have = settings.get(key)
        if want and isinstance(have, Mapping) and have.get("model_name") != want:
            log.warning("recalld workspace %s was already open with another %s (%s); it "
                        "keeps that one until it is closed", workspace, key,
                        have.get("model_name") or "none")


async def _open_workspace(client: AsyncClient, workspace: str,
                          models: ModelOverrides) -> JsonObject:
    """Open ``workspace`` with the agent's models; its settings as the daemon answered."""
    info = await client.workspace_open(workspace, config=models or None)
    settings = info.get("settings")
    opened = dict(settings) if isinstance(settings, Mapping) else {}
    _warn_if_other_models(workspace, models, opened)
    return opened


def _check_mode(mode: str, top_k: int) -> None:
    """Refuse the constructor arguments both middlewares take, when out of range."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if top_k < 1:
        raise ValueError("top_k must be at least 1")


def _msg_text(msg: Msg) -> str:
    text = msg.get_text_content()
    return text.strip() if text else ""


class RecalldMemoryMiddleware(MiddlewareBase):
    """AgentScope middleware giving agents recalld long-term memory (module docstring)."""

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
        #: ``workspace.open``'s config: the agent's own models for its workspaces' jobs.
        self.models = model_overrides(chat_model, embedding_model)
        self.select = select
        self.agent_id = agent_id
        self.mode: Mode = mode
        self.top_k = top_k
        self.agents = list(agents) if agents is not None else None
        self.index_in_prompt = index_in_prompt
        self.index_max_entries = index_max_entries
        self.index_ttl_s = index_ttl_s
        self.write_back = write_back
        self._owns_client = client is None
        self.client = client or AsyncClient(socket_path, timeout_s=timeout_s,
                                              autostart=autostart)
        #: Open workspaces and their settings (as ``workspace.open`` answered).
        self._opened: dict[str, JsonObject] = {}
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
            self._opened[workspace] = await _open_workspace(self.client, workspace, self.models)

    async def search(self, workspace: str, query: str, limit: int | None = None) -> list[str]:
        """Hits for ``query`` in the workspace (and ``agents``), formatted for a model."""
        await self._ensure_open(workspace)
        response = await self.client.search(workspace, query, max_results=limit or self.top_k,
                                            agents=self.agents)
        linked = render_linked(response, MAX_HIT_CHARS)
        return format_hits(response) + ([linked] if linked else [])

    async def recall_block(self, workspace: str, query: str) -> list[str]:
        """What is injected before a reply: the daemon's recall block (``memory.recall``:
        hits, then the notes they link to, within ``recall_budget_chars``). With ``agents``
        the hits of every named workspace are injected instead (the block covers one)."""
        if self.agents is not None:
            return await self.search(workspace, query)
        await self._ensure_open(workspace)
        if self.select:
            selected = await self.selected_files(workspace, query)
            if selected:
                return selected
        answer = await self.client.recall(workspace, query, max_results=self.top_k,
                                          budget_chars=self.recall_budget_chars)
        rendered = str(answer.get("rendered") or "")
        return [rendered] if rendered else []

    async def selected_files(self, workspace: str, query: str) -> list[str]:
        """The topic files the chat model picks for ``query`` (``memory.select``), each
        labelled with its path and lines, within ``recall_budget_chars``; empty when the
        daemon fell back to the search (the recall block then serves)."""
        answer = await self.client.select(workspace, query, limit=self.top_k)
        files = answer.get("files") if answer.get("method") == "model" else None
        out: list[str] = []
        left = self.recall_budget_chars
        for entry in files or []:
            path = str(entry.get("path", ""))
            read = await self.client.read(workspace, path)
            text = str(read.get("text") or "").strip()
            label = f"[{path}:1-{read.get('end_line', 1)}]"
            room = left - len(label) - 1
            if room <= 0:
                break
            body = text if len(text) <= room else text[:max(room - 1, 0)] + "…"
            out.append(f"{label}\n{body}")
            left -= len(label) + 1 + len(body)
        return out

    async def add(self, workspace: str, content: str, session_id: str | None) -> NoteAdded:
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
        input_kwargs: dict[str, object],
        next_handler: Callable[..., AsyncGenerator[object, None]],
    ) -> AsyncGenerator[object, None]:
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
                hits = await self.recall_block(workspace, query)
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
        input_kwargs: dict[str, object],
        next_handler: Callable[..., AsyncGenerator[object, None]],
    ) -> AsyncGenerator[object, None]:
        session = self._session_of(agent)
        hits = self._pending_hits.pop(session, None) if session is not None else None
        if hits:
            agent.state.context.append(memory_message(hits))
        async for event in next_handler(**input_kwargs):
            yield event

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

    def topic_tools(self) -> list[ToolBase]:
        """Agentic Memory's ``memory_write`` and ``memory_edit`` for the agent's own topic
        files in the digest folder (the daemon keeps ``MEMORY.md`` listing them); add them
        to the toolkit beside :meth:`list_tools`."""
        return [MemoryWriteTool(self), MemoryEditTool(self)]

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


def _turns(msgs: Sequence[Msg]) -> list[dict[str, str]]:
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


def _query_text(inputs: object) -> str | None:
    """The user's text in the reply inputs (None for resumption events)."""
    msgs = inputs if isinstance(inputs, list) else [inputs]
    texts = [_msg_text(m) for m in msgs if isinstance(m, Msg) and m.role == "user"]
    joined = "\n".join(t for t in texts if t)
    return joined or None


# ------------------------------------------------------------------------------- tools


def _facts(content: Sequence[str] | str) -> list[str]:
    """A tool argument given as one string or a list (``content``, ``keywords``) as its
    non-empty stripped strings."""
    items = [content] if isinstance(content, str) else list(content)
    return [str(c).strip() for c in items if str(c).strip()]


def _chunk(text: str, *, error: bool = False) -> ToolChunk:
    if error:
        return ToolChunk(content=[TextBlock(type="text", text=text)],
                         state=ToolResultState.ERROR)
    return ToolChunk(content=[TextBlock(type="text", text=text)])


class _AllowedTool(ToolBase):
    """Memory tools are part of the agent's own capabilities: always allowed."""

    is_external_tool = False
    is_mcp = False
    mcp_name = None

    async def check_permissions(self, tool_input: JsonObject,
                                context: PermissionContext) -> PermissionDecision:
        return PermissionDecision(behavior=PermissionBehavior.ALLOW,
                                  message="recalld long-term memory tool")


class _MemoryTool(_AllowedTool):
    """A tool of :class:`RecalldMemoryMiddleware`."""

    # The agent state tells which conversation (and so which workspace) calls.
    is_state_injected = True

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__()
        self._mw = middleware

    def _workspace(self, state: object) -> str | None:
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
                   _agent_state: object = None, **_: object) -> ToolChunk:
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
                   _agent_state: object = None, **_: object) -> ToolChunk:
        workspace = self._workspace(_agent_state)
        if workspace is None:
            return _chunk("memory is not available outside a reply", error=True)
        facts = _facts(content)
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


class MemoryWriteTool(_MemoryTool):
    """``memory_write(path, name, description, type, body)``: create or replace a topic
    file (``memory.topic_write``)."""

    name = "memory_write"
    description = ("Create or replace one of your long-term memory topic files (Markdown in "
                   "the digest folder). MEMORY.md, the index of them, is kept for you.")
    is_concurrency_safe = False
    is_read_only = False

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__(middleware)
        self.input_schema = {
            "type": "object",
            "properties": {
                "path": {"type": "string",
                         "description": "File name in the digest folder, e.g. user_role.md"},
                "name": {"type": "string", "description": "Short title."},
                "description": {"type": "string",
                                "description": "One line: when this file is worth reading."},
                "type": {"type": "string", "enum": ["user", "feedback", "project",
                                                   "reference"]},
                "body": {"type": "string", "description": "The content (Markdown)."},
            },
            "required": ["path", "name", "description", "type", "body"],
        }

    async def call(self, path: str = "", name: str = "", description: str = "",
                   type: str = "", body: str = "", _agent_state: object = None,
                   **_: object) -> ToolChunk:
        workspace = self._workspace(_agent_state)
        if workspace is None:
            return _chunk("memory is not available outside a reply", error=True)
        try:
            await self._mw._ensure_open(workspace)
            done = await self._mw.client.topic_write(workspace, path, name, description,
                                                     type, body)
        except _DAEMON_ERRORS as exc:
            return _chunk(f"memory_write failed: {exc}", error=True)
        return _chunk(f"{'Created' if done.get('created') else 'Wrote'} {done.get('path')}; "
                      f"listed in {done.get('memory_md')}")


class MemoryEditTool(_MemoryTool):
    """``memory_edit(path, old, new)``: replace one exact passage of a topic file."""

    name = "memory_edit"
    description = ("Edit one of your memory topic files: replace the one occurrence of "
                   "`old` with `new` (the frontmatter must stay valid).")
    is_concurrency_safe = False
    is_read_only = False

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__(middleware)
        self.input_schema = {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The topic file."},
                "old": {"type": "string", "description": "Exact text to replace (once)."},
                "new": {"type": "string", "description": "Replacement text."},
            },
            "required": ["path", "old", "new"],
        }

    async def call(self, path: str = "", old: str = "", new: str = "",
                   _agent_state: object = None, **_: object) -> ToolChunk:
        workspace = self._workspace(_agent_state)
        if workspace is None:
            return _chunk("memory is not available outside a reply", error=True)
        try:
            await self._mw._ensure_open(workspace)
            done = await self._mw.client.topic_edit(workspace, path, old, new)
        except _DAEMON_ERRORS as exc:
            return _chunk(f"memory_edit failed: {exc}", error=True)
        return _chunk(f"Edited {done.get('path')}; listed in {done.get('memory_md')}")


# ------------------------------------------------------------------- Mem0 compatibility

MEM0_SECTION_HEADER = "## Relevant memories from past conversations"
MEM0_SECTION_INTRO = ("The following memories about the user may be relevant. "
                      "Use them only if they are pertinent to the current request.")
MEM0_TOOL_INSTRUCTIONS = (
    "## Long-term memory\n\n"
    "You have `search_memory` and `add_memory` tools available. Use them whenever the "
    "conversation depends on (search) or contributes (add) a durable fact about the user "
    "— see each tool's own description for the exact input shape and usage guidance."
)
#: Name of the notes the Mem0-compatible middleware writes (one per writing agent a day).
MEM0_NOTE_NAME = "mem0"


class RecalldMem0Middleware(MiddlewareBase):
    """A drop-in for AgentScope's ``Mem0Middleware`` backed by the recalld daemon.

    Same constructor keywords, modes, tools and injection; swapping is one line::

        memory = RecalldMem0Middleware(user_id="alice", agent_id="coder", mode="both")

    - ``user_id`` names whose memory it is: the recalld workspace of that name
      (:func:`workspace_name` of it), so every agent of one user shares one workspace.
    - ``agent_id`` is the writing agent: every note this middleware writes records it as
      ``author`` in its frontmatter. With ``scope_search_by_agent`` (default true, as in
      Mem0) searches only return notes whose ``author`` is this ``agent_id`` (the
      ``author`` search filter); off, or without ``agent_id``, the user's whole workspace.
    - ``static_control`` / ``both``: before a reply, the user's text is searched (``top_k``
      hits, at least ``threshold``: the daemon's score, BM25 or fused) and the memories
      are injected when the reply starts; after it, the exchange is stored as a note (Mem0
      stores it after extraction; the note is searchable at once). ``await_write=False``
      stores it in the background.
    - ``agent_control`` / ``both``: tools ``search_memory(keywords, limit)`` (each keyword
      searched, results merged and de-duplicated) and ``add_memory(thinking, content)``
      (only ``content`` is stored).
    - ``chat_model`` and ``embedding_model`` are handed to the daemon for the user's
      workspace (as for :class:`RecalldMemoryMiddleware`): its auto_memory and dream jobs
      and its vectors use them. ``client`` and ``mem0_config`` are accepted for the
      one-line swap and not used.
    """

    def __init__(
        self,
        *,
        user_id: str,
        client: object = None,
        chat_model: object = None,
        embedding_model: object = None,
        mem0_config: object = None,
        mode: Mode = "both",
        agent_id: str | None = None,
        top_k: int = 5,
        threshold: float | None = None,
        scope_search_by_agent: bool = True,
        await_write: bool = True,
        memory_section_header: str = MEM0_SECTION_HEADER,
        memory_section_intro: str = MEM0_SECTION_INTRO,
        tool_instructions: str = MEM0_TOOL_INSTRUCTIONS,
        socket_path: str | Path | None = None,
        autostart: bool = False,
        timeout_s: float = 30.0,
        daemon_client: AsyncClient | None = None,
    ) -> None:
        if not isinstance(user_id, str) or not user_id.strip():
            raise ValueError("RecalldMem0Middleware requires a non-empty `user_id`.")
        _check_mode(mode, top_k)
        unused = [name for name, value in (("client", client), ("mem0_config", mem0_config))
                  if value is not None]
        if unused:
            log.warning("RecalldMem0Middleware: %s not used; the recalld daemon's own "
                        "configuration serves this memory", ", ".join(unused))
        #: ``workspace.open``'s config: the agent's own models for the user's workspace.
        self.models = model_overrides(chat_model, embedding_model)
        self.user_id = user_id
        self.workspace = workspace_name(user_id)
        self.agent_id = agent_id
        self.mode: Mode = mode
        self.top_k = top_k
        self.threshold = threshold
        self.scope_search_by_agent = scope_search_by_agent
        self.await_write = await_write
        self.memory_section_header = memory_section_header
        self.memory_section_intro = memory_section_intro
        self.tool_instructions = tool_instructions
        self._owns_client = daemon_client is None
        self.client = daemon_client or AsyncClient(socket_path, timeout_s=timeout_s,
                                                     autostart=autostart)
        self._opened = False
        self._writes: set[asyncio.Task[None]] = set()

    async def _open(self) -> None:
        if not self._opened:
            await _open_workspace(self.client, self.workspace, self.models)
            self._opened = True

    async def search_memories(self, query: str, limit: int | None = None) -> list[str]:
        """Memory texts for ``query`` (``[path:lines] text``), scoped as configured."""
        await self._open()
        scoped = self.scope_search_by_agent and self.agent_id
        response = await self.client.search(
            self.workspace, query, max_results=limit or self.top_k, min_score=self.threshold,
            filters={"author": self.agent_id} if scoped else None)
        return [f"[{hit.path}:{hit.start_line}-{hit.end_line}] {' '.join(hit.text.split())}"
                for hit in response]

    async def add_memory_text(self, text: str) -> NoteAdded:
        """Store ``text`` as a note of the day, recording this agent as its author."""
        await self._open()
        writer = self.agent_id or "agent"
        return await self.client.add_note(
            self.workspace, text, session_id=f"mem0-{workspace_name(writer)}"[:128],
            name=f"{MEM0_NOTE_NAME}-{writer}", author=self.agent_id)

    async def wait_writes(self) -> None:
        """Wait for background writes (``await_write=False``) to finish."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    async def close(self) -> None:
        """Finish background writes, close the daemon connection if owned. Idempotent."""
        await self.wait_writes()
        if self._owns_client:
            await self.client.aclose()

    def _memory_message(self, memories: Sequence[str]) -> Msg:
        bullets = "\n".join(f"- {m}" for m in memories)
        return AssistantMsg(name=MEMORY_MSG_NAME, content=[HintBlock(
            hint=f"{self.memory_section_header}\n{self.memory_section_intro}\n{bullets}")])

    async def _write(self, text: str) -> None:
        try:
            await self.add_memory_text(text)
        except _DAEMON_ERRORS as exc:
            log.warning("recalld add_note for %s failed: %s", self.workspace, exc)

    async def on_reply(
        self,
        agent: Agent,
        input_kwargs: dict[str, object],
        next_handler: Callable[..., AsyncGenerator[object, None]],
    ) -> AsyncGenerator[object, None]:
        if self.mode == "agent_control":
            async for item in next_handler(**input_kwargs):
                yield item
            return
        query = _query_text(input_kwargs.get("inputs"))
        memories: list[str] = []
        if query:
            try:
                memories = await self.search_memories(query)
            except _DAEMON_ERRORS as exc:
                log.warning("recalld search for %s failed: %s", self.workspace, exc)
        final: Msg | None = None
        injected = False
        try:
            async for item in next_handler(**input_kwargs):
                if not injected and memories and isinstance(item, ReplyStartEvent):
                    agent.state.context.append(self._memory_message(memories))
                    injected = True
                if isinstance(item, Msg) and item.role == "assistant":
                    final = item
                yield item
        finally:
            answer = _msg_text(final) if final is not None else ""
            if query and answer:
                exchange = f"User: {query}\nAssistant: {answer}"
                if self.await_write:
                    await self._write(exchange)
                else:
                    task = asyncio.get_running_loop().create_task(self._write(exchange))
                    self._writes.add(task)
                    task.add_done_callback(self._writes.discard)

    async def on_system_prompt(self, agent: Agent, current_prompt: str) -> str:
        if self.mode == "static_control":
            return current_prompt
        return f"{current_prompt}\n\n{self.tool_instructions}"

    async def list_tools(self) -> list[ToolBase]:
        """``search_memory`` and ``add_memory`` unless the mode is ``static_control``."""
        if self.mode == "static_control":
            return []
        return [Mem0SearchMemoryTool(self), Mem0AddMemoryTool(self)]


class _Mem0Tool(_AllowedTool):
    """Mem0-compatible tools: the workspace is the middleware's user."""

    is_state_injected = False

    schema: ClassVar[JsonObject] = {}

    def __init__(self, middleware: RecalldMem0Middleware) -> None:
        super().__init__()
        self._mw = middleware
        self.input_schema = dict(self.schema)


class Mem0SearchMemoryTool(_Mem0Tool):
    """``search_memory(keywords, limit)``: each keyword searched, merged, de-duplicated."""

    name = "search_memory"
    description = ("Retrieve memories based on short, targeted search keywords. Each keyword "
                   "is issued as an independent query; results are merged and deduplicated.")
    is_concurrency_safe = True
    is_read_only = True
    schema: ClassVar[JsonObject] = {
        "type": "object",
        "properties": {
            "keywords": {"type": "array", "items": {"type": "string"},
                         "description": "Short, targeted search phrases such as a person's "
                                        "name, a specific date, a location, or a phrase "
                                        "describing what to retrieve from memory."},
            "limit": {"type": "integer",
                      "description": "Maximum number of memories to retrieve per keyword.",
                      "default": 5},
        },
        "required": ["keywords"],
    }

    async def call(self, keywords: Sequence[str] | str = (), limit: int = 5,
                   **_: object) -> ToolChunk:
        words = _facts(keywords)
        if not words:
            return _chunk("(no keywords supplied — nothing to search)")
        try:
            per_keyword = await asyncio.gather(
                *(self._mw.search_memories(w, max(1, int(limit))) for w in words))
        except _DAEMON_ERRORS as exc:
            return _chunk(f"Error retrieving memory: {exc}", error=True)
        merged = list(dict.fromkeys(m for found in per_keyword for m in found))
        if not merged:
            return _chunk("(no relevant memories found)")
        return _chunk("\n".join(f"- {m}" for m in merged))


class Mem0AddMemoryTool(_Mem0Tool):
    """``add_memory(thinking, content)``: only ``content`` is stored."""

    name = "add_memory"
    description = ("Record important, durable information that may be useful later. Only "
                   "the provided content is persisted; thinking is retained in the tool "
                   "result for auditability.")
    is_concurrency_safe = False
    is_read_only = False
    schema: ClassVar[JsonObject] = {
        "type": "object",
        "properties": {
            "thinking": {"type": "string",
                         "description": "Reasoning about why this information is worth "
                                        "remembering. This is not persisted."},
            "content": {"type": "array", "items": {"type": "string"},
                        "description": "Specific facts to remember. Each item should be a "
                                       "complete, standalone sentence."},
        },
        "required": ["thinking", "content"],
    }

    async def call(self, thinking: str = "", content: Sequence[str] | str = (),
                   **_: object) -> ToolChunk:
        facts = _facts(content)
        if not facts:
            return _chunk("`content` is empty — nothing to record.", error=True)
        try:
            where = await self._mw.add_memory_text("\n".join(f"- {f}" for f in facts))
        except _DAEMON_ERRORS as exc:
            return _chunk(f"Error recording memory: {exc}", error=True)
        rationale = f" (rationale: {thinking})" if thinking else ""
        return _chunk(f"Successfully recorded to memory{rationale} → {where.get('path')}")
