"""RecalldMem0Middleware: a drop-in for AgentScope's ``Mem0Middleware``.

The middleware (its constructor keywords, modes and injection are Mem0's) and its tools
``search_memory`` and ``add_memory``; the user's workspace is opened with the agent's
models as for :class:`~recalld.ipc.agentscope_memory.RecalldMemoryMiddleware`.
Background writes (``await_write=False``) are asyncio tasks that :meth:`close` waits for.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

from agentscope.event import ReplyStartEvent
from agentscope.message import AssistantMsg, HintBlock, Msg
from agentscope.middleware import MiddlewareBase
from agentscope.tool import ToolBase, ToolChunk

from recalld.ipc._reopen import on_workspace
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import author_name, session_key, stand_in_name, workspace_name
from recalld.ipc.agentscope_messages import (
    MEMORY_MSG_NAME,
    Parked,
    _asker,
    _query_text,
    _said,
    still_waiting,
)
from recalld.ipc.agentscope_tools import _AllowedTool, _chunk, _facts
from recalld.ipc.agentscope_workspace import (
    _AWAY,
    _DAEMON_ERRORS,
    MAX_UNSENT,
    Mode,
    _check_mode,
    _open_workspace,
    model_overrides,
)
from recalld.ipc.answers import JsonObject, NoteAdded, NoteWritten
from recalld.ipc.errors import InvalidParams, refused_as_credential
from recalld.ipc.known_ids import KnownIds
from recalld.ipc.request_parts import in_note_parts, search_query
from recalld.ipc.tool_args import ArgumentError, count_argument
from recalld.ipc.types import visible, without_frontmatter

if TYPE_CHECKING:
    from agentscope.agent import Agent

# The adapter logs under its public module's name, wherever the code lives.
log = logging.getLogger("recalld.ipc.agentscope")
T = TypeVar("T")

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
      User ids and agent names are one name space: user ``alice`` and an agent named
      ``alice`` share one workspace (give users ids no agent has, ``user-alice``).
    - ``agent_id`` is the writing agent: every note this middleware writes records it as
      ``author`` in its frontmatter. With ``scope_search_by_agent`` (default true, as in
      Mem0) searches only return notes whose ``author`` is this ``agent_id`` (the
      ``author`` search filter); off, or without ``agent_id``, the user's whole workspace.
      An ``agent_id`` the daemon refuses to write as looking like a credential (an API
      key given by mistake), and one with no letter or digit (``~``, an emoji), which no
      author may be, is recorded as ``agent-<digest of it>`` instead, with one warning;
      searches scoped by agent find the notes written under either name.
    - ``static_control`` / ``both``: before a reply, the user's text is searched (``top_k``
      hits, at least ``threshold``: the daemon's score, BM25 or fused) and the memories
      are injected when the reply starts; after it, the exchange is stored as a note (Mem0
      stores it after extraction; the note is searchable at once): ``User: ...`` then
      ``Assistant: ...``, the user named when the request's messages name who spoke
      (``User (Alice): ...``, several people sharing one agent). ``await_write=False``
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
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(
                threshold, int | float) or not math.isfinite(threshold)):
            # Else each search failed naming the daemon's min_score, a name never set.
            raise ValueError(f"threshold must be a finite number or None, not {threshold!r}")
        unused = [name for name, value in (("client", client), ("mem0_config", mem0_config))
                  if value is not None]
        if unused:
            log.warning("RecalldMem0Middleware: %s not used; the recalld daemon's own "
                        "configuration serves this memory", ", ".join(unused))
        #: ``workspace.open``'s config: the agent's own models for the user's workspace.
        self.models = model_overrides(chat_model, embedding_model)
        self.user_id = user_id
        self.workspace = workspace_name(user_id)
        if agent_id is not None:
            workspace_name(agent_id)  # names its session: refused if it makes no name
        self.agent_id = agent_id
        #: The name its notes record: ``agent_id``, or its stand-in where it has no
        #: letter or digit (``author_name``), or once the daemon has refused it as
        #: looking like a credential.
        self.writer = agent_id if agent_id is None else author_name(agent_id)
        if self.writer != agent_id:
            log.warning("recalld: the agent_id %r of RecalldMem0Middleware for %s has no "
                        "letter or digit, which a note's author needs: its notes record "
                        "the author %r instead", agent_id, self.workspace, self.writer)
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
        self._ids = KnownIds(self.client)
        self._opened = False
        self._writes: set[asyncio.Task[None]] = set()
        #: Exchanges the daemon was away for, oldest first: sent with the next one.
        #: Each with its request id, so that one sent again is not stored twice.
        self._unsent: deque[tuple[str, str]] = deque()
        self._sending = asyncio.Lock()
        #: The request of a reply that ended waiting for the user (a tool call to
        #: confirm), by agent state: stored with the answer of the reply resuming it.
        self._parked: Parked[str] = Parked()

    async def _open(self, again: bool = False) -> None:
        if again or not self._opened:
            self.workspace = await self._ids.id_of(self.user_id, given_as_id=False)
            await _open_workspace(self.client, self.workspace, self.models, self.user_id)
            self._opened = True

    async def _on_workspace(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` on the user's workspace, opened again if another client closed it."""
        return await on_workspace(self._open, call)

    async def search_memories(self, query: str, limit: int | None = None) -> list[str]:
        """Memory texts for ``query`` (``[path:lines] text``), scoped as configured."""
        # Its stand-in too: notes an earlier run wrote under it, before this one wrote.
        authors = [self.agent_id, stand_in_name(self.agent_id)] if self.agent_id else []
        scoped = self.scope_search_by_agent and authors
        query = search_query(query, self.client.request_limit)  # a message of any size
        response = await self._on_workspace(lambda: self.client.search(
            self.workspace, query, max_results=limit or self.top_k, min_score=self.threshold,
            filters={"author": authors} if scoped else None))
        memories = []
        for hit in response:  # a memory is what the note says, not its frontmatter
            body, start = without_frontmatter(hit.text, hit.start_line)
            memories.append(f"[{visible(hit.path)}:{start}-{hit.end_line}] "
                            f"{' '.join(body.split())}")
        return memories

    async def add_memory_text(self, text: str, request_id: str | None = None) -> NoteWritten:
        """Store ``text`` as a note of the day, recording this agent as its author (with
        ``request_id``, a text sent again is not stored twice)."""
        try:
            return await self._add_note(text, request_id)
        except InvalidParams as exc:
            if (self.agent_id is None or self.writer != self.agent_id
                    or refused_as_credential(exc) not in ("author", "session_id")):
                raise
        # Refused for every write: its notes would never be stored. The id itself is
        # neither written nor logged.
        self.writer = stand_in_name(self.agent_id)
        log.warning("recalld: the agent_id of RecalldMem0Middleware for %s looks like a "
                    "credential (an API key?), which recalld never writes: its notes "
                    "record the author %r instead; give it another agent_id",
                    self.workspace, self.writer)
        return await self._add_note(text, request_id)

    async def _add_note(self, text: str, request_id: str | None) -> NoteWritten:
        """``text`` added to this writer's note, in as many requests as it takes (a text
        longer than the daemon takes at once is cut between its lines)."""
        return await in_note_parts(text, self.client.request_limit, self._add_note_part,
                                   request_id)

    async def _add_note_part(self, text: str, request_id: str | None) -> NoteAdded:
        writer = self.writer or "agent"
        return await self._on_workspace(lambda: self.client.add_note(
            # Its own session: writers whose names make one id ("Sales Bot", "Sales  Bot")
            # would append to one note, under the author who wrote last.
            self.workspace, text, session_id=session_key(f"mem0-{writer}"),
            name=f"{MEM0_NOTE_NAME}-{writer}", author=self.writer, request_id=request_id,
            dialog=False))  # the exchange is the note: no dialog log is written

    async def wait_writes(self) -> None:
        """Wait for background writes (``await_write=False``) to finish."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    async def close(self) -> None:
        """Finish background writes (and try once more the ones the daemon was away
        for), close the daemon connection if owned. Idempotent."""
        await self.wait_writes()
        await self._send_unsent()
        if self._unsent:
            log.warning("recalld: %d exchange(s) of %s not stored: the daemon stayed away",
                        len(self._unsent), self.workspace)
            self._unsent.clear()
        if self._owns_client:
            await self.client.aclose()

    def _memory_message(self, memories: Sequence[str]) -> Msg:
        bullets = "\n".join(f"- {m}" for m in memories)
        return AssistantMsg(name=MEMORY_MSG_NAME, content=[HintBlock(
            hint=f"{self.memory_section_header}\n{self.memory_section_intro}\n{bullets}")])

    async def _write(self, text: str) -> None:
        self._unsent.append((f"mem0-{uuid.uuid4().hex}", text))
        if len(self._unsent) > MAX_UNSENT:
            self._unsent.popleft()
            log.warning("recalld: dropped an unsent exchange of %s (more than %d waited "
                        "for the daemon)", self.workspace, MAX_UNSENT)
        await self._send_unsent()

    async def _send_unsent(self) -> None:
        """Store the waiting exchanges, oldest first, until the daemon is found away (the
        rest wait for the next exchange). One sent again after its answer was lost is not
        stored twice (the daemon knows its request id); an exchange that repeats an
        earlier one word for word is stored again."""
        async with self._sending:
            while self._unsent:
                request_id, text = self._unsent.popleft()
                try:
                    await self.add_memory_text(text, request_id)
                except _AWAY as exc:
                    self._unsent.appendleft((request_id, text))
                    log.warning("recalld add_note for %s failed (sent again with the next "
                                "exchange): %s", self.workspace, exc)
                    return
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
        parked = self._parked.pop(id(agent.state), None)
        # Stored with its media named, as the memory middleware's turns are (a photo
        # alone is a request too); a resumed reply answers the request it waited with.
        asked = _query_text(input_kwargs.get("inputs"), _said)
        # Whose request it is, when the users who spoke are named (parked with it).
        asked = f"{_asker(input_kwargs.get('inputs'))}: {asked}" if asked else parked
        memories: list[str] = []
        if query:
            try:
                memories = await self.search_memories(query)
            except _DAEMON_ERRORS as exc:
                log.warning("recalld search for %s failed: %s", self.workspace, exc)
        final: Msg | None = None
        injected = False
        waits = False
        try:
            async for item in next_handler(**input_kwargs):
                waits = still_waiting(item, waits)
                if not injected and memories and isinstance(item, ReplyStartEvent):
                    agent.state.context.append(self._memory_message(memories))
                    injected = True
                if isinstance(item, Msg) and item.role == "assistant":
                    final = item
                yield item
        finally:
            answer = _said(final) if final is not None else ""
            if asked and waits:  # its last message says it waits: not the answer
                self._parked.park(id(agent.state), asked)
            elif asked and answer:
                exchange = f"{asked}\nAssistant: {answer}"
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

    def __init__(self, middleware: RecalldMem0Middleware) -> None:
        super().__init__()
        self._mw = middleware


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
        try:  # an argument of the wrong shape is named, never quoted
            words = _facts(keywords, "keywords")
            most = count_argument("limit", limit)
        except ArgumentError as exc:
            return _chunk(f"Error retrieving memory: {exc}", error=True)
        if not words:
            return _chunk("(no keywords supplied — nothing to search)")
        try:
            per_keyword = await asyncio.gather(
                *(self._mw.search_memories(w, 5 if most is None else most) for w in words))
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
        try:
            facts = _facts(content)
        except ArgumentError as exc:
            return _chunk(f"Error recording memory: {exc}", error=True)
        if not facts:
            return _chunk("`content` is empty — nothing to record.", error=True)
        try:
            where = await self._mw.add_memory_text("\n".join(f"- {f}" for f in facts))
        except _DAEMON_ERRORS as exc:
            return _chunk(f"Error recording memory: {exc}", error=True)
        rationale = f" (rationale: {thinking})" if thinking else ""
        return _chunk(f"Successfully recorded to memory{rationale} → "
                      f"{', '.join(where['paths'])}")
