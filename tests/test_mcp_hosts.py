"""The MCP bridge as agent hosts load it: AgentScope's own MCP client (``MCPClient``
with a stdio config, its tools in the agent's ``Toolkit``) and the chat model it talks
to, the scripted fake provider on 127.0.0.1. Hosts approve a tool call by what the tool
says it does: one that only reads runs without asking the user."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")
pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.mcp import MCPClient, StdioMCPConfig
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_agentscope import _open, scripted
from test_mcp import _text, bridge

NOTE = "# Nota\n\nEl gato de Carol se llama Ñandú y duerme en la biblioteca.\n"


def test_an_agentscope_agent_runs_the_reading_tools_without_asking(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    _open(daemon, "carol", {"memory/2026-07-01/gato.md": NOTE})
    fake.chat_default = scripted(("mcp__recalld__memory_search", {"query": "gato de Carol"}))

    async def main() -> str:
        client = MCPClient(name="recalld", is_stateful=True, mcp_config=StdioMCPConfig(
            command=sys.executable, env=daemon.env,
            args=["-m", "recalld.ipc.mcp", "--agent", "carol",
                  "--socket", str(daemon.socket_path)]))
        await client.connect()
        model = OpenAIChatModel(credential=OpenAICredential(api_key="k",
                                                            base_url=fake.url + "/v1"),
                                model="fake", stream=False, max_retries=0)
        try:
            agent = Agent(name="asistente", system_prompt="Eres útil.", model=model,
                          toolkit=Toolkit(mcps=[client]))
            msg = await agent.reply(UserMsg(name="carol", content="¿Cómo se llama mi gato?"))
            return msg.get_text_content() or ""
        finally:
            await model.client.close()
            await client.close()

    answer = asyncio.run(main())
    # The search ran and its result reached the model (not a stop for permission).
    assert answer.startswith("final: ") and "Ñandú" in answer, answer


def test_each_tool_says_whether_it_only_reads(daemon: DaemonHandle) -> None:
    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            tools = {t.name: t.annotations for t in (await s.list_tools()).tools}
            for name in ("memory_search", "memory_recall", "memory_read"):
                hints = tools[name]
                assert hints is not None and hints.read_only_hint is True, name
            for name in ("memory_add_turns", "memory_add_note"):
                hints = tools[name]
                assert hints is not None and hints.read_only_hint is False, name
                assert hints.destructive_hint is False, name  # adds, never removes
            assert all(h is not None and h.open_world_hint is False for h in tools.values())
            # A read-only tool's call still answers as before.
            found = await s.call_tool("memory_search", {"query": "nothing here yet"})
            assert not found.is_error, _text(found)

    asyncio.run(main())
