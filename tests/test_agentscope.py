"""The AgentScope middleware against a real daemon and real AgentScope agents.

The agents' chat model is AgentScope's own OpenAI-compatible model class talking to the
scripted fake provider on 127.0.0.1: what reaches the "model" (system prompt, injected
memory, tool results) is checked on the wire, and what reaches the daemon through the
files and RPCs it keeps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import AssistantMsg, UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, chat_answer, tool_call

from recalld.ipc.agentscope import RecalldMemoryMiddleware, workspace_name
from recalld.ipc.client import Client

NOTE = """---
name: backups
description: where the nightly backups go
---
# Backups

The nightly backups of the laptop go to the NAS called quillfeather-7 over rsync.
"""

NODE = """---
name: Deploy checklist
description: When you are about to deploy the web app, read this first
---
1. run the migrations 2. flip the canary
"""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False)


def _chat_requests(fake: FakeProvider) -> list[dict[str, Any]]:
    return [r.json for r in fake.requests if r.path.endswith("/chat/completions")]


def _system(req: dict[str, Any]) -> str:
    return "".join(_text(m["content"]) for m in req["messages"] if m["role"] == "system")


def _non_system(req: dict[str, Any]) -> str:
    return "".join(_text(m.get("content")) for m in req["messages"] if m["role"] != "system")


def scripted(*calls: tuple[str, dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    """A model that makes ``calls`` one by one (one per request that does not carry a tool
    result yet), then answers with the text of the last tool result it saw."""
    queue = list(calls)

    def answer(body: Any) -> dict[str, Any]:
        last = body["messages"][-1]
        tool_results = [m for m in body["messages"] if m["role"] == "tool"]
        if queue and (not tool_results or last["role"] == "tool"):
            name, args = queue.pop(0)
            return chat_answer(None, [tool_call(name, args, f"call_{len(queue)}")])
        if tool_results:
            return chat_answer("final: " + _text(tool_results[-1]["content"]))
        return chat_answer("plain answer")

    return answer


def _open(daemon: DaemonHandle, agent: str, files: dict[str, str]) -> Path:
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open(agent)["path"])
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        c.index_sync(agent)
    return root


async def _reply(fake: FakeProvider, mw: RecalldMemoryMiddleware, name: str, text: str,
                 speaker: str = "user") -> tuple[Agent, str]:
    model = OpenAIChatModel(credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
                            model="fake", stream=False, max_retries=0)
    agent = Agent(name=name, system_prompt="You are a helpful assistant.", model=model,
                  toolkit=Toolkit(tools=await mw.list_tools()), middlewares=[mw])
    try:
        msg = await agent.reply(UserMsg(name=speaker, content=text))
    finally:
        await model.client.close()
    return agent, msg.get_text_content() or ""


def _pending(daemon: DaemonHandle, agent: str, session: str) -> int:
    with Client(daemon.socket_path) as c:
        return int(c.add_turns(agent, session, [])["pending_messages"])


def test_static_control_injects_hits_and_writes_back(daemon: DaemonHandle,
                                                     fake: FakeProvider) -> None:
    _open(daemon, "coder", {"memory/2026-07-01/backups.md": NOTE})
    fake.chat_default = scripted()

    async def main() -> tuple[Agent, str, list[Any]]:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="static_control",
                                     socket_path=daemon.socket_path)
        try:
            agent, text = await _reply(fake, mw, "assistant", "where do the nightly backups go?")
            return agent, text, await mw.list_tools()
        finally:
            await mw.close()

    agent, text, tools = asyncio.run(main())
    assert text == "plain answer" and tools == []
    (req,) = _chat_requests(fake)
    assert "quillfeather-7" in _non_system(req), "the hit is injected before reasoning"
    assert "<recalled-memory>" in _non_system(req)
    assert "memory_search" not in _system(req) and not req.get("tools")
    # The exchange went to memory.add_turns under the agent's own session id.
    assert _pending(daemon, "coder", agent.state.session_id) == 2


def test_agent_id_in_any_script_pins_the_workspace_its_agent_name_would(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    workspace = workspace_name("研究助手")
    _open(daemon, workspace, {"memory/2026-07-01/backups.md": NOTE})
    fake.chat_default = scripted()

    async def main() -> Agent:
        mw = RecalldMemoryMiddleware(agent_id="研究助手", mode="static_control",
                                     socket_path=daemon.socket_path)
        try:
            return (await _reply(fake, mw, "assistant", "where do the nightly backups go?"))[0]
        finally:
            await mw.close()

    agent = asyncio.run(main())
    (req,) = _chat_requests(fake)
    assert "quillfeather-7" in _non_system(req)
    assert _pending(daemon, workspace, agent.state.session_id) == 2


FERRY_NODE = """---
name: ferry-facts
description: what the lake ferries cost
type: reference
---
# Ferries

The lake ferry leaves Bürkliplatz hourly from April to October; the GA covers it.
"""


def test_injection_carries_the_linked_node_body(daemon: DaemonHandle,
                                                fake: FakeProvider) -> None:
    _open(daemon, "coder", {
        "digest/wiki/ferry.md": FERRY_NODE,
        "memory/2026-07-25/lake.md": "# Saturday\n\nWe rode the quokkaboat, see "
                                     "[[digest/wiki/ferry]].\n"})
    fake.chat_default = scripted()

    async def main() -> None:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="static_control",
                                     socket_path=daemon.socket_path)
        try:
            await _reply(fake, mw, "assistant", "what was the quokkaboat trip about?")
        finally:
            await mw.close()

    asyncio.run(main())
    (req,) = _chat_requests(fake)
    injected = _non_system(req).split("<recalled-memory>", 1)[1]
    assert "[memory/2026-07-25/lake.md:" in injected
    linked = injected.split("## Linked context", 1)[1]
    assert "leaves Bürkliplatz hourly" in linked
    assert "(linked from memory/2026-07-25/lake.md)" in linked
    assert "name: ferry-facts" not in injected and "type: reference" not in injected

    # The memory_search tool gives the linked context as well.
    fake.requests.clear()
    fake.chat_default = scripted(("memory_search", {"query": "quokkaboat"}))

    async def tool_turn() -> str:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="agent_control",
                                     socket_path=daemon.socket_path)
        try:
            return (await _reply(fake, mw, "assistant", "the boat trip?"))[1]
        finally:
            await mw.close()

    text = asyncio.run(tool_turn())
    assert "leaves Bürkliplatz hourly" in text.split("## Linked context", 1)[1]
    assert "name: ferry-facts" not in text


def test_agent_control_tools_search_and_add_memory(daemon: DaemonHandle,
                                                   fake: FakeProvider) -> None:
    root = _open(daemon, "coder", {"memory/2026-07-01/backups.md": NOTE})
    fake.chat_default = scripted(("memory_search", {"query": "nightly backups NAS", "limit": 3}))

    async def search_turn() -> tuple[str, list[str]]:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="agent_control",
                                     socket_path=daemon.socket_path)
        try:
            _, text = await _reply(fake, mw, "assistant", "remind me about backups")
            return text, [t.name for t in await mw.list_tools()]
        finally:
            await mw.close()

    text, names = asyncio.run(search_turn())
    assert names == ["memory_search", "add_memory"]
    assert text.startswith("final: ") and "quillfeather-7" in text
    first = _chat_requests(fake)[0]
    assert "memory_search" in _system(first), "usage hint in the system prompt"
    assert "quillfeather-7" not in _non_system(first), "no automatic injection"
    assert {t["function"]["name"] for t in first["tools"]} >= {"memory_search", "add_memory"}

    fake.requests.clear()
    fake.chat_default = scripted(("add_memory", {
        "thinking": "SECRET-RATIONALE the user stated a lasting preference",
        "content": ["The user indents Python with tabs.", "The user's editor is helix."]}))

    async def add_turn() -> str:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="agent_control",
                                     socket_path=daemon.socket_path)
        try:
            return (await _reply(fake, mw, "assistant", "remember: I use tabs and helix"))[1]
        finally:
            await mw.close()

    text = asyncio.run(add_turn())
    assert "Recorded 2 fact(s)" in text
    notes = [p for p in (root / "memory").rglob("agent-notes*.md")]
    assert len(notes) == 1
    body = notes[0].read_text(encoding="utf-8")
    assert "indents Python with tabs" in body and "helix" in body
    assert "SECRET-RATIONALE" not in body, "only content is stored, never thinking"
    with Client(daemon.socket_path) as c:
        hits = c.search("coder", "helix editor")
    assert hits and hits[0].path == notes[0].relative_to(root).as_posix()


def test_both_with_index_in_system_prompt(daemon: DaemonHandle, fake: FakeProvider) -> None:
    _open(daemon, "ops", {"memory/2026-07-01/backups.md": NOTE,
                          "digest/procedure/deploy.md": NODE})
    fake.chat_default = scripted()

    async def main() -> None:
        mw = RecalldMemoryMiddleware(agent_id="ops", index_in_prompt=True,
                                     socket_path=daemon.socket_path)
        try:
            assert [t.name for t in await mw.list_tools()] == ["memory_search", "add_memory"]
            await _reply(fake, mw, "assistant", "the nightly backups, where?")
        finally:
            await mw.close()

    asyncio.run(main())
    (req,) = _chat_requests(fake)
    system = _system(req)
    assert "[Deploy checklist](digest/procedure/deploy.md)" in system
    assert "When you are about to deploy the web app" in system
    assert "memory_search" in system
    assert "quillfeather-7" in _non_system(req)


def test_one_instance_shared_by_agents_keeps_them_apart(daemon: DaemonHandle,
                                                        fake: FakeProvider) -> None:
    _open(daemon, "alice",
          {"memory/2026-07-01/a.md": "# Cat\nAlice's cat is named Pumpernickel.\n"})
    _open(daemon, "bob", {"memory/2026-07-01/b.md": "# Cat\nBob's cat is named Ziggurat.\n"})
    fake.chat_default = scripted()

    async def main() -> list[tuple[Agent, str]]:
        mw = RecalldMemoryMiddleware(mode="static_control", socket_path=daemon.socket_path)
        try:
            return list(await asyncio.gather(
                _reply(fake, mw, "alice", "what is my cat named?"),
                _reply(fake, mw, "bob", "what is my cat named?"),
            ))
        finally:
            await mw.close()
            await mw.close()  # idempotent

    (alice, _), (bob, _) = asyncio.run(main())
    by_agent = {}
    for req in _chat_requests(fake):
        seen = _non_system(req)
        by_agent["alice" if "Pumpernickel" in seen else "bob" if "Ziggurat" in seen else "?"] = seen
    assert set(by_agent) == {"alice", "bob"}
    assert "Ziggurat" not in by_agent["alice"] and "Pumpernickel" not in by_agent["bob"]
    assert _pending(daemon, "alice", alice.state.session_id) == 2
    assert _pending(daemon, "bob", bob.state.session_id) == 2
    assert _pending(daemon, "alice", bob.state.session_id) == 0


def test_agents_add_shared_workspaces_to_each_agents_own(daemon: DaemonHandle,
                                                        fake: FakeProvider) -> None:
    _open(daemon, "alice", {"memory/2026-07-01/a.md": "# Boat\nAlice's boat is the Kelpie.\n"})
    _open(daemon, "bob", {"memory/2026-07-01/b.md": "# Boat\nBob's boat is the Selkie.\n"})
    with Client(daemon.socket_path) as c:
        c.workspace_open("team", config={"shared_with": ["*"]})
    _open(daemon, "team", {"memory/2026-07-01/t.md": "# Boat\nThe team boat is the Nixie.\n"})
    fake.chat_default = scripted(("memory_search", {"query": "boat"}))

    async def main() -> None:
        # One instance, two agents: each searches its own workspace and the shared one.
        mw = RecalldMemoryMiddleware(mode="both", agents=["team"],
                                     socket_path=daemon.socket_path)
        try:
            await _reply(fake, mw, "alice", "which boat?")
            await _reply(fake, mw, "bob", "which boat?")
        finally:
            await mw.close()

    asyncio.run(main())
    alice, alice_tool, bob = _chat_requests(fake)
    assert "Kelpie" in _non_system(alice) and "Nixie" in _non_system(alice)
    assert "Selkie" not in _non_system(alice)
    tool_result = alice_tool["messages"][-1]  # memory_search's answer to alice
    assert tool_result["role"] == "tool"
    assert "Kelpie" in _text(tool_result["content"]) and "Nixie" in _text(tool_result["content"])
    assert "Selkie" in _non_system(bob) and "Nixie" in _non_system(bob)
    assert "Kelpie" not in _non_system(bob)


def test_a_write_back_the_daemon_missed_is_sent_with_the_next(
        daemon_factory: DaemonFactory, fake: FakeProvider) -> None:
    first = daemon_factory()
    fake.chat_default = scripted()
    sock = first.socket_path

    async def main() -> tuple[str, list[str]]:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="static_control",
                                     socket_path=sock)
        model = OpenAIChatModel(
            credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
            model="fake", stream=False, max_retries=0)
        agent = Agent(name="coder", system_prompt="You are a helpful assistant.", model=model,
                      toolkit=Toolkit(tools=[]), middlewares=[mw])
        answers = []
        try:
            answers.append(await agent.reply(UserMsg(name="user", content="one")))
            assert first.stop() == 0  # the daemon restarts (an upgrade, say)
            answers.append(await agent.reply(UserMsg(name="user", content="two")))
            daemon_factory(RECALLD_DATA_DIR=str(first.data_dir), RECALLD_SOCKET=str(sock))
            answers.append(await agent.reply(UserMsg(name="user", content="three")))
        finally:
            await model.client.close()
            await mw.close()
        return agent.state.session_id, [a.get_text_content() or "" for a in answers]

    session, answers = asyncio.run(main())
    assert answers == ["plain answer"] * 3
    with Client(sock) as c:
        added = c.add_turns("coder", session, [])
    assert added["user_turns_total"] == 3, added


def test_daemon_down_never_breaks_a_reply(tmp_path: Path, fake: FakeProvider) -> None:
    fake.chat_default = scripted()

    async def main() -> str:
        mw = RecalldMemoryMiddleware(agent_id="coder", socket_path=tmp_path / "none.sock")
        try:
            return (await _reply(fake, mw, "assistant", "hello there"))[1]
        finally:
            await mw.close()

    assert asyncio.run(main()) == "plain answer"


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="mode"):
        RecalldMemoryMiddleware(mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_k"):
        RecalldMemoryMiddleware(top_k=0)
    assert workspace_name("Research Bot #2") == "Research_Bot_2"
    assert workspace_name("研究助手") != workspace_name("写作助手")


def test_an_agent_named_memory_has_its_answers_written_back(daemon: DaemonHandle,
                                                            fake: FakeProvider) -> None:
    # The recalled block was told from the agent's messages by its name alone: an agent
    # named "memory" had none of its answers kept, only the user's messages.
    root = _open(daemon, "memory", {"memory/2026-07-01/backups.md": NOTE})
    fake.chat_default = scripted()

    async def main() -> bytes:
        mw = RecalldMemoryMiddleware(mode="static_control", socket_path=daemon.socket_path)
        try:
            await _reply(fake, mw, "memory", "where do the nightly backups go?")
            # Taken by the daemon when the reply ends (before close() hands it on).
            return (root / "mem_metadata/sessions/pending.jsonl").read_bytes()
        finally:
            await mw.close()

    pending = asyncio.run(main())
    assert "quillfeather-7" in _non_system(_chat_requests(fake)[0])  # the block was there
    assert _held(pending) == [("user", "where do the nightly backups go?"),
                              ("assistant", "plain answer")]


def _held(pending: bytes) -> list[tuple[str, str]]:
    """Role and text of each message in a workspace's pending.jsonl, in order."""
    return [(m["role"], m["content"]) for line in pending.splitlines()
            for m in json.loads(line.split(b" ", 1)[1]).get("messages") or []]


def test_a_reply_to_what_the_agent_observed_recalls_and_writes_it_back(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    # An agent that took its input in with observe() (a group chat) and was then asked to
    # reply() with nothing new got no recall, and neither what it heard nor its answer
    # was kept.
    root = _open(daemon, "coder", {"memory/2026-07-01/backups.md": NOTE})
    fake.chat_default = scripted()

    async def main() -> bytes:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="static_control",
                                     socket_path=daemon.socket_path)
        model = OpenAIChatModel(
            credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
            model="fake", stream=False, max_retries=0)
        agent = Agent(name="coder", system_prompt="You are a helpful assistant.", model=model,
                      toolkit=Toolkit(tools=[]), middlewares=[mw])
        try:
            await agent.observe([UserMsg(name="Ana", content="Where do the nightly backups go?"),
                                 AssistantMsg(name="ops", content="I moved them in May.")])
            await agent.reply()
            return (root / "mem_metadata/sessions/pending.jsonl").read_bytes()
        finally:
            await model.client.close()
            await mw.close()

    pending = asyncio.run(main())
    assert "quillfeather-7" in _non_system(_chat_requests(fake)[0])
    assert _held(pending) == [("user", "Where do the nightly backups go?"),
                              ("assistant", "I moved them in May."),
                              ("assistant", "plain answer")]
