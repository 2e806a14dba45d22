"""A one-turn conversation becomes a daily note through every client, closed or not.

Real daemon, real AgentScope agents (each retrieval mode), the MCP SDK's stdio client
against the real bridge, and one scripted OpenAI-compatible chat server on 127.0.0.1
that plays both the agents' model and the daemon's auto_memory model.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")
pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from agentscope.agent import Agent, ContextConfig
from agentscope.credential import OpenAICredential
from agentscope.event import ConfirmResult, RequireUserConfirmEvent, UserConfirmResultEvent
from agentscope.message import Base64Source, DataBlock, TextBlock, UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import ToolBase, ToolChunk, Toolkit
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, chat_answer, tool_call
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from waits import wait_for, wait_value

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agentscope import (
    MODES,
    Mode,
    RecalldMem0Middleware,
    RecalldMemoryMiddleware,
)
from recalld.ipc.client import Client

MEMORY_PROMPT = "You keep the long-term memory"


def model_answer(body: Any) -> dict[str, Any]:
    """auto_memory gets a note of the user's words; an agent gets a plain answer."""
    messages = body["messages"]
    if MEMORY_PROMPT not in str(messages[0].get("content")):
        return chat_answer("plain answer")
    if any(m["role"] == "tool" for m in messages):
        return chat_answer("saved")
    said = [m[1] for line in str(messages[1]["content"]).splitlines()
            if (m := re.match(r"user(?: \([^)]*\))?: (.*)", line))]
    return chat_answer(None, [tool_call("daily_write", {
        "name": "conversation", "description": "what the user said",
        "content": "\n".join(f"- {s}" for s in said)})])


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        provider.chat_default = model_answer
        yield provider


def config(fake: FakeProvider, idle_s: float) -> str:
    return ("[workspace_defaults]\n"
            f"auto_memory_idle_s = {idle_s}\n"
            "[workspace_defaults.chat_model_config]\n"
            f'base_url = "{fake.url}/v1"\napi_key = "k"\nmodel_name = "fake"\n')


def wait_note(root: Path, text: str) -> Path:
    def note() -> Path | None:
        for path in (root / "memory").rglob("*.md"):
            if path.name != "index.md" and text in path.read_text(encoding="utf-8"):
                return path
        return None
    return wait_for(note, f"a note with {text!r} under {root}")


def workspace_root(daemon: DaemonHandle, agent: str) -> Path:
    with Client(daemon.socket_path) as c:
        return Path(c.workspace_open(agent)["path"])


async def one_turn(fake: FakeProvider, mw: RecalldMemoryMiddleware,
                   text: str | list[Any], speaker: str = "user") -> Agent:
    model = OpenAIChatModel(credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
                            model="fake", stream=False, max_retries=0)
    agent = Agent(name="helper", system_prompt="You are a helpful assistant.", model=model,
                  toolkit=Toolkit(tools=await mw.list_tools()), middlewares=[mw])
    try:
        await agent.reply(UserMsg(name=speaker, content=text))
    finally:
        await model.client.close()
    return agent


def turn_then_close(daemon: Any, fake: FakeProvider, agent_id: str, mode: Mode,
                    said: Any) -> None:
    """One turn through a memory middleware of ``agent_id`` in ``mode``, then its close()."""
    async def main() -> None:
        mw = RecalldMemoryMiddleware(agent_id=agent_id, mode=mode,
                                     socket_path=daemon.socket_path)
        try:
            await one_turn(fake, mw, said)
        finally:
            await mw.close()

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES)
def test_agentscope_close_writes_the_note(daemon_factory: Any, fake: FakeProvider,
                                          mode: Mode) -> None:
    daemon = daemon_factory(config(fake, idle_s=600))
    fact = f"My favourite tree in {mode} is the rowan."

    turn_then_close(daemon, fake, "gardener", mode, fact)
    wait_note(workspace_root(daemon, "gardener"), fact)


def test_agentscope_a_reply_with_no_text_keeps_what_the_user_said(daemon_factory: Any,
                                                                   fake: FakeProvider) -> None:
    # The model answered with a tool call, then with no text: the reply wrote nothing
    # back, and the next reply starts after the user's message, which never reached
    # memory.
    daemon = daemon_factory(config(fake, idle_s=600))
    fact = "My passport expires in March 2031, renew it in Vilnius."

    def searcher(body: Any) -> dict[str, Any]:
        if MEMORY_PROMPT in str(body["messages"][0].get("content")):
            return model_answer(body)
        if any(m["role"] == "tool" for m in body["messages"]):
            return chat_answer("")
        return chat_answer(None, [tool_call("memory_search", {"query": "passport"})])

    fake.chat_default = searcher

    turn_then_close(daemon, fake, "traveller", "agent_control", fact)
    root = workspace_root(daemon, "traveller")
    wait_note(root, fact)

    def said() -> list[str]:  # the dialog log is written after the note
        return [json.loads(line)["content"] for path in (root / "mem_session").glob(
            "dialog/*.jsonl") for line in path.read_text(encoding="utf-8").splitlines()]
    wait_value(said, lambda got: got == [fact], "the user's message alone in the dialog")


def test_agentscope_images_and_files_are_named_in_the_dialog(daemon_factory: Any,
                                                            fake: FakeProvider) -> None:
    # The middleware wrote back only a message's text: a photo sent with a caption lost
    # what it showed, and a recording sent alone was no turn at all (neither it nor the
    # answer to it was kept), where every other client's media become a placeholder.
    daemon = daemon_factory(config(fake, idle_s=600))
    photo = DataBlock(name="receipt.png",
                      source=Base64Source(data="iVBORw0KGgo=", media_type="image/png"))
    memo = DataBlock(name="memo.wav", source=Base64Source(data="UklGRg==",
                                                          media_type="audio/wav"))

    turn_then_close(daemon, fake, "archivist", "static_control",
                    [photo, TextBlock(text="Keep it for the warranty.")])
    turn_then_close(daemon, fake, "archivist", "agent_control", [memo])
    root = workspace_root(daemon, "archivist")
    wait_note(root, "[audio omitted: memo.wav]")

    def said() -> list[str]:
        return sorted(json.loads(line)["content"] for path in (root / "mem_session").glob(
            "dialog/*.jsonl") for line in path.read_text(encoding="utf-8").splitlines())
    wait_value(said, lambda got: len(got) == 4, "both exchanges in the dialog log")
    assert said() == sorted(["[image omitted: receipt.png]\nKeep it for the warranty.",
                             "[audio omitted: memo.wav]", "plain answer", "plain answer"])
    assert "iVBORw0KGgo" not in "".join(said()) and "UklGRg" not in "".join(said())


@pytest.mark.parametrize("mode", MODES)
def test_agentscope_without_close_is_written_when_idle(daemon_factory: Any,
                                                       fake: FakeProvider, mode: Mode) -> None:
    daemon = daemon_factory(config(fake, idle_s=1))
    fact = f"My bicycle in {mode} is green."

    async def main() -> None:
        client = AsyncClient(daemon.socket_path)
        mw = RecalldMemoryMiddleware(agent_id="cyclist", mode=mode, client=client)
        try:
            await one_turn(fake, mw, fact)  # and the middleware is never closed
        finally:
            await client.aclose()

    asyncio.run(main())
    wait_note(workspace_root(daemon, "cyclist"), fact)


def test_agentscope_compaction_writes_folded_turns_first(daemon_factory: Any,
                                                          fake: FakeProvider) -> None:
    daemon = daemon_factory(config(fake, idle_s=600))
    fact = "My first pet was a tortoise called Atlas."

    async def main() -> None:
        client = AsyncClient(daemon.socket_path)
        mw = RecalldMemoryMiddleware(agent_id="keeper", mode="static_control", client=client)
        try:
            agent = await one_turn(fake, mw, fact)
            # Compact everything: the context's turns are folded into a summary.
            agent.model.context_size = 10
            await agent.compress_context(
                context_config=ContextConfig(trigger_ratio=0.1, reserve_ratio=0.1))
            assert all(fact not in (m.get_text_content() or "") for m in agent.state.context)
        finally:
            await client.aclose()

    asyncio.run(main())
    wait_note(workspace_root(daemon, "keeper"), fact)


async def mcp_turn(daemon: DaemonHandle, agent: str, fact: str, *,
                   wait_inside: Path | None = None, speaker: str | None = None) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "recalld.ipc.mcp", "--agent", agent, "--socket", str(daemon.socket_path)],
        env=daemon.env)
    with open(daemon.home / f"mcp-{agent}.log", "w", encoding="utf-8") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("memory_add_turns", {
                "session_id": "chat-1",
                "messages": [{"role": "user", "content": fact,
                              **({"name": speaker} if speaker else {})},
                             {"role": "assistant", "content": "noted"}]})
            assert not result.is_error
            if wait_inside is not None:  # the stream stays open: only the idle flush
                await asyncio.to_thread(wait_note, wait_inside, fact)


def test_mcp_end_of_stdio_writes_the_note(daemon_factory: Any, fake: FakeProvider) -> None:
    daemon = daemon_factory(config(fake, idle_s=600))
    fact = "The office plant is a monstera."
    asyncio.run(mcp_turn(daemon, "botanist", fact))
    wait_note(workspace_root(daemon, "botanist"), fact)


def test_mcp_open_stream_is_written_when_idle(daemon_factory: Any, fake: FakeProvider) -> None:
    daemon = daemon_factory(config(fake, idle_s=1))
    fact = "The car is parked on level three."
    root = workspace_root(daemon, "driver")
    asyncio.run(mcp_turn(daemon, "driver", fact, wait_inside=root))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_mcp_stopped_by_a_signal_writes_the_note_and_exits(daemon_factory: Any,
                                                          fake: FakeProvider,
                                                          sig: signal.Signals) -> None:
    # An MCP host stops its server with SIGTERM (after closing stdin, or instead of it),
    # a person at a terminal with Ctrl-C. SIGTERM killed the bridge before it ended its
    # sessions (the turns waited for the idle flush); after Ctrl-C it ended them, then
    # hung reading stdin until it closed, and died with a traceback.
    from test_mcp_lines import Raw, _call

    daemon = daemon_factory(config(fake, idle_s=600))
    fact = f"The {sig.name} fox sleeps under the porch."
    raw = Raw(daemon)
    raw.send(_call(1, "memory_add_turns", {"session_id": "porch", "messages": [
        {"role": "user", "content": fact}, {"role": "assistant", "content": "noted"}]}), [1])
    raw.proc.send_signal(sig)  # stdin stays open
    try:
        assert raw.proc.wait(timeout=60) == 0
    finally:
        raw.stdin.close()
        raw.stdout.close()
    said = (daemon.home / "mcp-lines.log").read_text(encoding="utf-8")
    assert "Traceback" not in said, said
    wait_note(workspace_root(daemon, "coder"), fact)


def test_agents_named_in_any_script_keep_their_own_memory(daemon_factory: Any,
                                                           fake: FakeProvider) -> None:
    """One middleware instance (no agent_id) serves agents named in Chinese, German and
    emoji: each gets a workspace of its own, the same one every time, and its one-turn
    conversation becomes a note there after close()."""
    from recalld.ipc.agentscope import workspace_name

    daemon = daemon_factory(config(fake, idle_s=600))
    facts = {"研究助手": "我最喜欢的城市是杭州。", "写作助手": "我的小说写的是一座灯塔。",
             "Bürohund": "Der Bürohund heißt Keks.", "🤖": "Robots like 🔋 batteries."}
    ids = {name: workspace_name(name) for name in facts}
    assert len(set(ids.values())) == len(facts), ids  # no two names share a workspace
    assert ids == {name: workspace_name(name) for name in facts}  # stable

    async def main() -> None:
        mw = RecalldMemoryMiddleware(mode="static_control", socket_path=daemon.socket_path)
        try:
            for name, fact in facts.items():
                model = OpenAIChatModel(
                    credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
                    model="fake", stream=False, max_retries=0)
                agent = Agent(name=name, system_prompt="You are a helpful assistant.",
                              model=model, toolkit=Toolkit(tools=await mw.list_tools()),
                              middlewares=[mw])
                try:
                    await agent.reply(UserMsg(name="user", content=fact))
                finally:
                    await model.client.close()
        finally:
            await mw.close()

    asyncio.run(main())
    for name, fact in facts.items():
        root = workspace_root(daemon, ids[name])
        note = wait_note(root, fact)
        others = [f for n, f in facts.items() if n != name]
        assert not any(f in note.read_text(encoding="utf-8") for f in others), (name, note)


def test_agentscope_turns_folded_while_the_daemon_is_away_are_sent_later(
        daemon_factory: Any, fake: FakeProvider) -> None:
    """A compaction folds the running reply's user message while the daemon restarts: the
    folded turns are kept and go with the next write-back, not lost."""
    first = daemon_factory(config(fake, idle_s=600))
    sock = first.socket_path
    fact = "My grandmother's violin was made in Cremona."
    second: list[DaemonHandle] = []

    async def main() -> None:
        client = AsyncClient(sock)
        mw = RecalldMemoryMiddleware(agent_id="luthier", mode="static_control", client=client)
        try:
            await one_turn(fake, mw, "hello")  # the workspace is open, the session known
            assert first.stop() == 0  # the daemon restarts (an upgrade, say)
            model = OpenAIChatModel(
                credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
                model="fake", stream=False, max_retries=0)
            model.context_size = 10
            agent = Agent(name="helper", system_prompt="You are a helpful assistant.",
                          model=model, toolkit=Toolkit(tools=[]), middlewares=[mw],
                          context_config=ContextConfig(trigger_ratio=0.1, reserve_ratio=0.05,
                                                       context_buffer_ratio=0.01))
            try:  # compacted before its first reasoning step: the fact is folded at once
                await agent.reply(UserMsg(name="user", content=fact))
                assert all(fact not in (m.get_text_content() or "")
                           for m in agent.state.context)
                second.append(daemon_factory(config(fake, idle_s=600),
                                             RECALLD_DATA_DIR=str(first.data_dir),
                                             RECALLD_SOCKET=str(sock)))
                model.context_size = 100_000
                await agent.reply(UserMsg(name="user", content="thanks"))
            finally:
                await model.client.close()
        finally:
            await mw.close()  # ends the session: its turns go to auto_memory
            await client.aclose()

    asyncio.run(main())
    wait_note(workspace_root(second[0], "luthier"), fact)


class Launch(ToolBase):
    """A tool the user must confirm before it runs."""

    name = "launch"
    description = "Launch the rocket."
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012
    is_concurrency_safe = False
    is_read_only = False
    is_external_tool = False
    is_mcp = False
    mcp_name = None

    async def check_permissions(self, tool_input: Any, context: Any) -> PermissionDecision:
        return PermissionDecision(behavior=PermissionBehavior.ASK, message="launch?")

    async def call(self, **_: Any) -> ToolChunk:
        return ToolChunk(content=[TextBlock(type="text", text="launched")])


@pytest.mark.parametrize("kind", ["memory", "mem0"])
def test_a_reply_that_waited_for_the_users_confirmation_is_remembered(
        daemon_factory: Any, fake: FakeProvider, kind: str) -> None:
    # The reply that asked to confirm a tool call ended without an answer, and the reply
    # resuming it had no user message: neither wrote anything back, the request and the
    # answer never reached memory.
    daemon = daemon_factory(config(fake, idle_s=600))

    def pilot(body: Any) -> dict[str, Any]:
        if MEMORY_PROMPT in str(body["messages"][0].get("content")):
            return model_answer(body)
        if any(m["role"] == "tool" for m in body["messages"]):
            return chat_answer("Kestrel left pad 39B at dawn.")
        return chat_answer(None, [tool_call("launch", {})])

    fake.chat_default = pilot

    async def main() -> None:
        mw: Any = (RecalldMemoryMiddleware(agent_id="pilot", mode="static_control",
                                           socket_path=daemon.socket_path) if kind == "memory"
                   else RecalldMem0Middleware(user_id="pilot", mode="static_control",
                                              socket_path=daemon.socket_path))
        model = OpenAIChatModel(credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
                                model="fake", stream=False, max_retries=0)
        agent = Agent(name="helper", system_prompt="You fly rockets.", model=model,
                      toolkit=Toolkit(tools=[Launch()]), middlewares=[mw])
        try:
            asks = [e async for e in agent.reply_stream(
                UserMsg(name="user", content="Launch the rocket Kestrel from pad 39B."))
                if isinstance(e, RequireUserConfirmEvent)]
            await agent.reply(UserConfirmResultEvent(reply_id=asks[0].reply_id, confirm_results=[
                ConfirmResult(confirmed=True, tool_call=asks[0].tool_calls[0])]))
        finally:
            await mw.close()
            await model.client.close()

    asyncio.run(main())
    root = workspace_root(daemon, "pilot")
    note = wait_note(root, "Launch the rocket Kestrel")
    # The answer: in the note Mem0's middleware stores, in the dialog of auto_memory's.
    said = (lambda: [note]) if kind == "mem0" else (
        lambda: list((root / "mem_session/dialog").glob("*.jsonl")))
    text = wait_value(lambda: "".join(p.read_text(encoding="utf-8") for p in said()),
                      lambda t: "Kestrel left pad 39B at dawn." in t,
                      "the answer given after the confirmation", deadline_s=30)
    assert "waiting for your permission" not in text, text
