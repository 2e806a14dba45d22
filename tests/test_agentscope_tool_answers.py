"""What the recalld tools of an AgentScope agent answer the model when the daemon refuses a
call or the model's arguments are empty or carry names the tool does not take (a real
daemon; the tools called as the agent's toolkit calls them: keywords only)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.tool import ToolBase, ToolChunk
from conftest import DaemonFactory

from recalld.ipc.agentscope import RecalldMemoryMiddleware


def _answer(chunk: object) -> tuple[str, bool]:
    """The text of a tool's answer, and whether it is marked as an error."""
    assert isinstance(chunk, ToolChunk), chunk
    text = "".join(getattr(block, "text", "") for block in chunk.content)
    return text, chunk.state.value == "error"


def test_each_tool_answers_a_refusal_or_an_empty_argument_as_text(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    daemon = daemon_factory(f'[workspaces.potter]\npath = "{root}"\n')

    async def main() -> dict[str, tuple[str, bool]]:
        mw = RecalldMemoryMiddleware(agent_id="potter", mode="agent_control",
                                     socket_path=daemon.socket_path)
        tools: dict[str, ToolBase] = {
            t.name: t for t in [*await mw.list_tools(), *mw.topic_tools()]}
        calls: dict[str, tuple[str, dict[str, Any]]] = {
            "no query": ("memory_search", {"query": "  "}),
            "no facts": ("add_memory", {"thinking": "why", "content": ["", " "]}),
            "bad type": ("memory_write", {"path": "kiln.md", "name": "Kiln",
                                          "description": "firing", "type": "diary",
                                          "body": "Cone 6."}),
            "no file": ("memory_edit", {"path": "glaze.md", "old": "a", "new": "b"}),
            # Names the tools do not take, among them those of their own parameters.
            "stray": ("memory_write", {"path": "kiln.md", "name": "Kiln",
                                       "description": "firing", "type": "project",
                                       "body": "Cone 6.", "workspace": "other",
                                       "state": None}),
            "edit": ("memory_edit", {"path": "kiln.md", "old": "Cone 6.", "new": "Cone 10.",
                                     "workspace": "other"}),
        }
        try:
            return {what: _answer(await tools[name].call(_agent_state=None, **args))
                    for what, (name, args) in calls.items()}
        finally:
            await mw.close()

    answers = asyncio.run(main())
    assert answers["no query"] == ("(no query given: nothing to search)", False)
    assert answers["no facts"] == ("`content` is empty: nothing to record", True)
    text, error = answers["bad type"]
    assert error and text.startswith("memory_write failed: ") and "'type'" in text, text
    text, error = answers["no file"]
    assert error and text.startswith("memory_edit failed: ") and "glaze.md" in text, text
    assert answers["stray"] == ("Created digest/kiln.md; listed in digest/MEMORY.md", False)
    assert answers["edit"] == ("Edited digest/kiln.md; listed in digest/MEMORY.md", False)
    assert "Cone 10." in (root / "digest" / "kiln.md").read_text(encoding="utf-8")
