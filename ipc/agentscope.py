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
- Write-back in every mode: each reply's new messages (for a ``reply()`` given no
  input, those the agent took in with ``observe()`` since it last spoke, and its
  answer) go to ``memory.add_turns`` under the agent's ``state.session_id`` (an id
  the daemon does not take, ``user 42/chat`` or ``会话-1``, as :func:`session_key` of
  it); the daemon's auto_memory job turns them
  into notes (every ``auto_memory_interval`` user turns, after ``auto_memory_idle_s``
  without a turn, and when :meth:`~RecalldMemoryMiddleware.close` ends the
  conversations it saw). A write-back the daemon did not take (it was restarting) is
  sent again, in order, with the next one or at ``close()``.
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
  already open keeps the models it was opened with (close it to change them). A
  workspace another client closes is opened again by the middleware's next call (the
  MCP bridge does the same).
- Selection (``select=True``): before a reply the chat model picks the relevant topic
  files (``memory.select``); when it picks none or no chat model is configured, the
  recall block (the search) is injected as usual.

Workspaces: ``agent_id`` pins one workspace for every agent using this instance;
without it each agent uses the workspace named after ``agent.name`` (a name in a
non-Latin script gets a digest of itself: :func:`workspace_name`). ``agents`` adds
other workspaces to every search (their owners must share them). A running reply's
state is kept per agent and each conversation's per workspace, so one instance may
serve many agents at once, in one conversation too. Daemon
failures are logged and never break a reply; the tools report them to the model.

This module is the adapter's public entry point; the code lives in sibling modules:
:mod:`~recalld.ipc.agentscope_memory` (:class:`RecalldMemoryMiddleware`),
:mod:`~recalld.ipc.agentscope_tools` (its tools: ``memory_search``, ``add_memory``,
``memory_write``, ``memory_edit``, and what
every tool shares), :mod:`~recalld.ipc.agentscope_mem0` (:class:`RecalldMem0Middleware`
and its tools), :mod:`~recalld.ipc.agentscope_workspace` (workspace names, modes, the
agent's models) and :mod:`~recalld.ipc.agentscope_messages` (what goes in and out of an
agent's context). Importing any of them but ``agentscope_workspace`` needs AgentScope;
nothing else in :mod:`recalld.ipc` imports them.
"""

from __future__ import annotations

from recalld.ipc.agent_ids import session_key, workspace_name
from recalld.ipc.agentscope_mem0 import (
    MEM0_NOTE_NAME,
    MEM0_SECTION_HEADER,
    MEM0_SECTION_INTRO,
    MEM0_TOOL_INSTRUCTIONS,
    Mem0AddMemoryTool,
    Mem0SearchMemoryTool,
    RecalldMem0Middleware,
)
from recalld.ipc.agentscope_memory import RecalldMemoryMiddleware
from recalld.ipc.agentscope_messages import (
    INDEX_HEADER,
    MAX_HIT_CHARS,
    MEMORY_MSG_NAME,
    TOOL_INSTRUCTIONS,
    format_hits,
    memory_message,
)
from recalld.ipc.agentscope_tools import (
    AddMemoryTool,
    MemoryEditTool,
    MemorySearchTool,
    MemoryWriteTool,
)
from recalld.ipc.agentscope_workspace import (
    MODES,
    ChatModelOverride,
    EmbeddingModelOverride,
    Mode,
    ModelOverrides,
    chat_model_override,
    embedding_model_override,
    model_overrides,
)
from recalld.ipc.agentscope_writeback import MAX_SESSIONS

__all__ = [
    "INDEX_HEADER",
    "MAX_HIT_CHARS",
    "MAX_SESSIONS",
    "MEM0_NOTE_NAME",
    "MEM0_SECTION_HEADER",
    "MEM0_SECTION_INTRO",
    "MEM0_TOOL_INSTRUCTIONS",
    "MEMORY_MSG_NAME",
    "MODES",
    "TOOL_INSTRUCTIONS",
    "AddMemoryTool",
    "ChatModelOverride",
    "EmbeddingModelOverride",
    "Mem0AddMemoryTool",
    "Mem0SearchMemoryTool",
    "MemoryEditTool",
    "MemorySearchTool",
    "MemoryWriteTool",
    "Mode",
    "ModelOverrides",
    "RecalldMem0Middleware",
    "RecalldMemoryMiddleware",
    "chat_model_override",
    "embedding_model_override",
    "format_hits",
    "memory_message",
    "model_overrides",
    "session_key",
    "workspace_name",
]
