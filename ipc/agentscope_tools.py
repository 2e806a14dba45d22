"""The tools :class:`~recalld.ipc.agentscope_memory.RecalldMemoryMiddleware` gives an
agent outside ``static_control`` (``memory_search`` and ``add_memory``), its Agentic
Memory tools (``memory_write``, ``memory_edit``), and what every recalld tool shares:
always allowed, answers as text chunks. The daemon's failures are reported to the
model, never raised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from agentscope.message import TextBlock, ToolResultState
from agentscope.permission import PermissionBehavior, PermissionContext, PermissionDecision
from agentscope.tool import ToolBase, ToolChunk

from recalld.ipc import errors
from recalld.ipc.agentscope_workspace import _DAEMON_ERRORS
from recalld.ipc.answers import JsonObject
from recalld.ipc.protocol import MAX_RESULTS
from recalld.ipc.request_parts import in_note_parts
from recalld.ipc.shown import names_nothing
from recalld.ipc.tool_args import (
    ArgumentError,
    count_argument,
    text_argument,
    texts_argument,
)

if TYPE_CHECKING:
    from recalld.ipc.agentscope_memory import RecalldMemoryMiddleware


def _facts(content: Sequence[str] | str, name: str = "content") -> list[str]:
    """A tool argument given as one string or a list (``content``, ``keywords``) as its
    stripped strings that show something (ArgumentError, not quoting it, for another
    shape): a blank one, or one of only invisible characters, is no fact."""
    return [c.strip() for c in texts_argument(name, content) if not names_nothing(c)]


def _chunk(text: str, *, error: bool = False) -> ToolChunk:
    if error:
        return ToolChunk(content=[TextBlock(type="text", text=text)],
                         state=ToolResultState.ERROR)
    return ToolChunk(content=[TextBlock(type="text", text=text)])


class _AllowedTool(ToolBase):
    """Memory tools are part of the agent's own capabilities: always allowed. Each
    instance gets its own copy of the class's ``schema`` as its ``input_schema``."""

    is_external_tool = False
    is_mcp = False
    mcp_name = None

    schema: ClassVar[JsonObject] = {}

    def __init__(self) -> None:
        super().__init__()
        self.input_schema = dict(self.schema)

    async def check_permissions(self, tool_input: JsonObject,
                                context: PermissionContext) -> PermissionDecision:
        return PermissionDecision(behavior=PermissionBehavior.ALLOW,
                                  message="recalld long-term memory tool")


class _MemoryTool(_AllowedTool):
    """A tool of :class:`RecalldMemoryMiddleware`: :meth:`call` finds the calling agent's
    workspace and hands the arguments to :meth:`_answer`; a failure of the daemon is
    the answer ``"<failed>: <the error>"``."""

    # The agent state tells which conversation (and so which workspace) calls.
    is_state_injected = True

    failed: ClassVar[str] = "memory tool failed"

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__()
        self._mw = middleware

    async def call(self, _agent_state: object = None, **arguments: Any) -> ToolChunk:
        workspace = await self._workspace(_agent_state)
        if not isinstance(workspace, str):
            return workspace
        try:
            return await self._answer(workspace, _agent_state, **arguments)
        except (ArgumentError, *_DAEMON_ERRORS) as exc:
            # An argument of the wrong shape is named, never quoted (the daemon's own
            # errors come masked).
            return _chunk(f"{self.failed}: {exc}", error=True)

    async def _answer(self, workspace: str, state: object, /, **arguments: Any) -> ToolChunk:
        raise NotImplementedError

    async def _workspace(self, state: object) -> str | ToolChunk:
        """The calling agent's workspace, or the tool's answer why it has none."""
        try:
            workspace = await self._mw.workspace_for_state(state)
        except errors.InvalidParams as refused:
            return _chunk(f"memory is not available to this agent: {refused.message}",
                          error=True)
        if workspace is None:
            return _chunk("memory is not available outside a reply", error=True)
        return workspace


class MemorySearchTool(_MemoryTool):
    """``memory_search(query, limit)`` over the agent's whole workspace."""

    name = "memory_search"
    description = "Search long-term memory (notes from past conversations) for a query."
    is_concurrency_safe = True
    is_read_only = True
    failed = "memory search failed"

    def __init__(self, middleware: RecalldMemoryMiddleware) -> None:
        super().__init__(middleware)
        # The default limit is the middleware's.
        self.input_schema = {
            "type": "object",
            "properties": {
                "query": {"type": "string",
                          "description": "What to look for: a name, a preference, a "
                                         "decision, an error message..."},
                "limit": {"type": "integer", "description": "Maximum number of results.",
                          "minimum": 1, "maximum": MAX_RESULTS, "default": middleware.top_k},
            },
            "required": ["query"],
        }

    async def _answer(self, workspace: str, state: object, /, query: str = "",
                      limit: int | None = None, **_: object) -> ToolChunk:
        query = text_argument("query", query)
        if not query.strip():
            return _chunk("(no query given: nothing to search)")
        hits = await self._mw.search(workspace, query, count_argument("limit", limit))
        return _chunk("\n\n".join(hits) if hits else "(no relevant memories found)")


class AddMemoryTool(_MemoryTool):
    """Mem0-style ``add_memory(thinking, content)``: only ``content`` is stored."""

    name = "add_memory"
    description = ("Record durable facts worth remembering in later conversations. Only "
                   "`content` is stored; `thinking` stays in this conversation.")
    is_concurrency_safe = False
    is_read_only = False
    failed = "recording memory failed"
    schema: ClassVar[JsonObject] = {
        "type": "object",
        "properties": {
            "thinking": {"type": "string",
                         "description": "Why this is worth remembering (not stored)."},
            "content": {"type": "array", "items": {"type": "string"},
                        "description": "Facts to remember, one complete sentence each."},
        },
        "required": ["thinking", "content"],
    }

    async def _answer(self, workspace: str, state: object, /, thinking: str = "",
                      content: Sequence[str] | str = (), **_: object) -> ToolChunk:
        facts = _facts(content)
        if not facts:
            return _chunk("`content` is empty: nothing to record", error=True)
        given = getattr(state, "session_id", None)
        session = given if isinstance(given, str) else None
        # Facts longer than one note takes at once go in parts.
        where = await in_note_parts(
            "\n".join(f"- {f}" for f in facts), self._mw.client.request_limit,
            lambda part, part_id: self._mw.add(workspace, part, session, part_id))
        rationale = f" (rationale: {thinking})" if thinking else ""
        return _chunk(f"Recorded {len(facts)} fact(s) in {', '.join(where['paths'])}"
                      f"{rationale}")


class MemoryWriteTool(_MemoryTool):
    """``memory_write(path, name, description, type, body)``: create or replace a topic
    file (``memory.topic_write``)."""

    name = "memory_write"
    description = ("Create or replace one of your long-term memory topic files (Markdown in "
                   "the digest folder). MEMORY.md, the index of them, is kept for you.")
    is_concurrency_safe = False
    is_read_only = False
    failed = "memory_write failed"
    schema: ClassVar[JsonObject] = {
        "type": "object",
        "properties": {
            "path": {"type": "string",
                     "description": "File name in the digest folder, e.g. user_role.md"},
            "name": {"type": "string", "description": "Short title."},
            "description": {"type": "string",
                            "description": "One line: when this file is worth reading."},
            "type": {"type": "string", "enum": ["user", "feedback", "project", "reference"]},
            "body": {"type": "string", "description": "The content (Markdown)."},
        },
        "required": ["path", "name", "description", "type", "body"],
    }

    async def _answer(self, workspace: str, state: object, /, path: str = "", name: str = "",
                      description: str = "", type: str = "", body: str = "",
                      **_: object) -> ToolChunk:
        done = await self._mw.topic_write(workspace, path, name, description, type, body)
        return _chunk(f"{'Created' if done.get('created') else 'Wrote'} {done.get('path')}; "
                      f"listed in {done.get('memory_md')}")


class MemoryEditTool(_MemoryTool):
    """``memory_edit(path, old, new)``: replace one exact passage of a topic file."""

    name = "memory_edit"
    description = ("Edit one of your memory topic files: replace the one occurrence of "
                   "`old` with `new` (the frontmatter must stay valid).")
    is_concurrency_safe = False
    is_read_only = False
    failed = "memory_edit failed"
    schema: ClassVar[JsonObject] = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "The topic file."},
            "old": {"type": "string", "description": "Exact text to replace (once)."},
            "new": {"type": "string", "description": "Replacement text."},
        },
        "required": ["path", "old", "new"],
    }

    async def _answer(self, workspace: str, state: object, /, path: str = "", old: str = "",
                      new: str = "", **_: object) -> ToolChunk:
        done = await self._mw.topic_edit(workspace, path, old, new)
        return _chunk(f"Edited {done.get('path')}; listed in {done.get('memory_md')}")
