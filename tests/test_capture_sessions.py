"""Conversations with any session id, and many agents in one conversation, become notes.

Real daemon, real AgentScope agents sharing one middleware, and the scripted
OpenAI-compatible chat server of test_capture_clients (the agents' model and the
daemon's auto_memory model).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit
from fakes.provider_server import FakeProvider, chat_answer, tool_call
from test_capture_clients import (  # noqa: F401
    MEMORY_PROMPT,
    config,
    fake,
    model_answer,
    wait_note,
    workspace_root,
)

from recalld.ipc.agentscope import RecalldMemoryMiddleware, session_key
from recalld.ipc.client import Client


async def reply(fake: FakeProvider, mw: RecalldMemoryMiddleware,  # noqa: F811
                name: str, session: str, text: str) -> Agent:
    """One reply of agent ``name`` in conversation ``session``."""
    model = OpenAIChatModel(credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
                            model="fake", stream=False, max_retries=0)
    agent = Agent(name=name, system_prompt=f"You are {name}.", model=model,
                  toolkit=Toolkit(tools=await mw.list_tools()), middlewares=[mw])
    agent.state.session_id = session
    try:
        await agent.reply(UserMsg(name="user", content=text))
    finally:
        await model.client.close()
    return agent


def test_conversations_with_any_session_id_become_notes(
        daemon_factory: Any, fake: FakeProvider) -> None:  # noqa: F811
    """Session ids the daemon does not take (spaces, slashes, Chinese, 200 characters, a
    leading dot) were refused with only a warning: the conversation never became memory.
    Each is a note after close() now, under its own session, and add_memory works too."""
    daemon = daemon_factory(config(fake, idle_s=600))
    facts = {"user 42/chat": "The lighthouse keeper is called Ines.",
             "会话-1": "我的猫叫豆豆。",
             "x" * 200: "The spare key is under the blue pot.",
             "x" * 199 + "y": "The boat is moored at pier nine.",
             ".hidden": "The attic stores the winter tyres."}
    keys = {session: session_key(session) for session in facts}
    assert len(set(keys.values())) == len(facts), keys
    assert session_key("chat-1") == "chat-1"  # an id the daemon takes stays as it is

    async def main() -> None:
        mw = RecalldMemoryMiddleware(agent_id="keeper", mode="both",
                                     socket_path=daemon.socket_path)
        try:
            for session, fact in facts.items():
                await reply(fake, mw, "helper", session, fact)
            added = await mw.add("keeper", "- The ferry leaves at seven.", "notes #7")
            assert added["session_id"] == session_key("notes #7"), added
        finally:
            await mw.close()

    asyncio.run(main())
    root = workspace_root(daemon, "keeper")
    for session, fact in facts.items():
        note = wait_note(root, fact).read_text(encoding="utf-8")
        assert f"session_id: {keys[session]}" in note, note
        assert not any(f in note for f in facts.values() if f != fact), note
    wait_note(root, "The ferry leaves at seven.")


def test_close_ends_one_conversation_of_many_agents_in_each_workspace(
        daemon_factory: Any, fake: FakeProvider) -> None:  # noqa: F811
    """Agents of one middleware (each in its own workspace) taking part in the same
    conversation id: close() ends that conversation in every workspace (it ended only in
    the last agent's; the others waited for the idle flush)."""
    daemon = daemon_factory(config(fake, idle_s=600))
    facts = {"planner": "The launch is on a Tuesday.", "writer": "The essay needs a title.",
             "critic": "The draft is too long."}

    async def main() -> None:
        mw = RecalldMemoryMiddleware(mode="static_control", socket_path=daemon.socket_path)
        try:
            for name, fact in facts.items():
                await reply(fake, mw, name, "room-1", fact)
        finally:
            await mw.close()

    asyncio.run(main())
    for name, fact in facts.items():
        wait_note(workspace_root(daemon, name), fact)


def test_agents_replying_at_once_in_one_conversation_keep_their_memory_apart(
        daemon_factory: Any, fake: FakeProvider) -> None:  # noqa: F811
    """Agents of two workspaces replying at the same time in one conversation id, through
    one middleware: each reply gets its own workspace's recall block (one agent was given
    the other's memory, the other none) and each agent's add_memory goes to its own
    workspace."""
    daemon = daemon_factory(config(fake, idle_s=600))
    names = ("alpha", "beta")
    with Client(daemon.socket_path) as c:
        for name in names:
            c.workspace_open(name)
            c.add_note(name, f"The vault code of {name} is {name}-1234.")

    def answer(body: Any) -> dict[str, Any]:
        messages = body["messages"]
        system = str(messages[0].get("content"))
        if MEMORY_PROMPT in system:
            return model_answer(body)
        if any(m["role"] == "tool" for m in messages):
            return chat_answer("done")
        name = next(n for n in names if f"You are {n}." in system)
        return chat_answer(None, [tool_call("add_memory", {
            "thinking": "worth keeping", "content": [f"{name} prefers window seats."]})])

    fake.chat_default = answer

    async def main() -> None:
        mw = RecalldMemoryMiddleware(mode="both", index_in_prompt=True, index_ttl_s=0,
                                     socket_path=daemon.socket_path)
        try:
            await asyncio.gather(*(reply(fake, mw, name, "room-1", "what is the vault code?")
                                   for name in names for _ in range(3)))
        finally:
            await mw.close()

    asyncio.run(main())
    seen = {name: 0 for name in names}
    for request in fake.requests:
        text = request.body.decode()
        if "/chat/completions" not in request.path or MEMORY_PROMPT in text:
            continue
        name = next(n for n in names if f"You are {n}." in text)
        other = next(n for n in names if n != name)
        assert f"{other}-1234" not in text, (name, text)
        seen[name] += f"{name}-1234" in text
    assert seen == {name: 6 for name in names}, seen  # 3 replies x 2 model calls each
    for name in names:
        root = workspace_root(daemon, name)
        notes = "".join(p.read_text(encoding="utf-8") for p in (root / "memory").rglob("*.md"))
        assert f"{name} prefers window seats." in notes, (name, notes)
        assert all(f"{n} prefers" not in notes for n in names if n != name), (name, notes)
