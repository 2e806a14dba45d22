"""AgentScope agents (and Mem0 writers) whose names make one agent id ("Sales Bot",
"Sales_Bot"), over a real daemon: the first to use the workspace keeps it; the other
replies without memory, neither reading nor writing the first one's, whether both share
one middleware or each has its own (as two processes would); writers keep their notes."""

from __future__ import annotations

import asyncio
import json
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, chat_answer, tool_call

from recalld.ipc.agentscope import RecalldMem0Middleware, RecalldMemoryMiddleware
from recalld.ipc.client import Client

SECRET = "The door code of the Basel office is 7731-kestrel."


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _model(body: Any) -> dict[str, Any]:
    """'Sales Bot' records the secret; any other agent searches for it; both then answer
    with the last tool result they saw."""
    system = "".join(_text(m["content"]) for m in body["messages"] if m["role"] == "system")
    results = [m for m in body["messages"] if m["role"] == "tool"]
    if results:
        return chat_answer("final: " + _text(results[-1]["content"]))
    if "I am Sales Bot." in system:
        return chat_answer(None, [tool_call("add_memory", {"thinking": "keep it",
                                                           "content": [SECRET]})])
    return chat_answer(None, [tool_call("memory_search", {"query": "door code Basel"})])


async def _reply(fake: FakeProvider, mw: RecalldMemoryMiddleware, name: str,
                 session: str) -> str:
    model = OpenAIChatModel(credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
                            model="fake", stream=False, max_retries=0)
    agent = Agent(name=name, system_prompt=f"I am {name}.", model=model,
                  toolkit=Toolkit(tools=await mw.list_tools()), middlewares=[mw])
    agent.state.session_id = session
    try:
        msg = await agent.reply(UserMsg(name="user", content="what is the Basel door code?"))
    finally:
        await model.client.close()
    return msg.get_text_content() or ""


def _seen_by_others(fake: FakeProvider) -> str:
    """Everything the model was shown while serving agents other than 'Sales Bot'."""
    out = []
    for r in fake.requests:
        body = r.json
        if "I am Sales Bot." not in json.dumps(body["messages"][0], ensure_ascii=False):
            out.append(json.dumps(body["messages"], ensure_ascii=False))
    return "\n".join(out)


@pytest.mark.parametrize("shared", [True, False], ids=["one middleware", "two middlewares"])
def test_agents_whose_names_make_one_id_do_not_share_memory(
        daemon: DaemonHandle, fake: FakeProvider, shared: bool) -> None:
    fake.chat_default = _model
    others = ("Sales_Bot", "Sales  Bot", "Sales #Bot")

    async def main() -> tuple[str, list[str]]:
        first = RecalldMemoryMiddleware(socket_path=daemon.socket_path)
        seconds: list[RecalldMemoryMiddleware] = []

        def middleware() -> RecalldMemoryMiddleware:
            if shared:
                return first
            seconds.append(RecalldMemoryMiddleware(socket_path=daemon.socket_path))
            return seconds[-1]

        make: Callable[[], RecalldMemoryMiddleware] = middleware
        try:
            recorded = await _reply(fake, first, "Sales Bot", "shop-1")
            answers = [await _reply(fake, make(), name, "shop-1") for name in others]
            # The first agent keeps its memory after the others were turned away.
            again = await _reply(fake, first, "Sales Bot", "shop-2")
            assert "7731-kestrel" not in again  # it records again, and is not refused
            assert "both have the agent id" not in again
        finally:
            await first.close()
            for mw in seconds:
                await mw.close()
        return recorded, answers

    recorded, answers = asyncio.run(main())
    assert recorded.startswith("final: Recorded 1 fact(s)"), recorded
    for name, answer in zip(others, answers, strict=True):
        assert "7731-kestrel" not in answer
        assert f"agent {name!r} and agent 'Sales Bot'" in answer, answer
    assert "7731-kestrel" not in _seen_by_others(fake)
    with Client(daemon.socket_path) as c:
        # Only the first agent's exchanges went to the workspace's conversation.
        assert c.add_turns("Sales_Bot", "shop-1", [])["pending_messages"] == 2
        assert "7731-kestrel" in c.search("Sales_Bot", "door code Basel")[0].text


def test_mem0_writers_whose_names_make_one_id_keep_their_own_notes(
        daemon: DaemonHandle) -> None:
    facts = {"Sales Bot": "The price floor for Vienna is 812 euros.",
             "Sales  Bot": "The shipping cutoff for Graz is 3pm sharp.",
             "Sales_Bot": "The Linz showroom opens at 10 on Saturdays.",
             "sales bot": "The Salzburg invoice run is on the 28th."}

    async def main() -> dict[str, list[str]]:
        writers = {name: RecalldMem0Middleware(user_id="erin", agent_id=name,
                                               socket_path=daemon.socket_path)
                   for name in facts}
        try:
            for name, fact in facts.items():
                await writers[name].add_memory_text(fact)
            return {name: await mw.search_memories("Vienna Graz Linz Salzburg")
                    for name, mw in writers.items()}
        finally:
            for mw in writers.values():
                await mw.close()

    seen = asyncio.run(main())
    for name, fact in facts.items():
        assert len(seen[name]) == 1 and seen[name][0].endswith(fact), (name, seen[name])


def test_an_agent_named_with_a_tab_and_decomposed_letters_keeps_its_memory(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    # "Zoë<TAB>Writer" (the daemon takes no tab in a name) records a fact; the same name
    # with "ë" decomposed (another process, another keyboard) is the same agent: it finds it.
    writer = "Zoë\tWriter"
    reader = unicodedata.normalize("NFD", writer)

    def model(body: Any) -> dict[str, Any]:
        system = "".join(_text(m["content"]) for m in body["messages"]
                         if m["role"] == "system")
        results = [m for m in body["messages"] if m["role"] == "tool"]
        if results:
            return chat_answer("final: " + _text(results[-1]["content"]))
        if "I am Zo\u00eb" in system:  # the writer (its "ë" composed)
            return chat_answer(None, [tool_call("add_memory", {"thinking": "keep it",
                                                               "content": [SECRET]})])
        return chat_answer(None, [tool_call("memory_search", {"query": "door code Basel"})])

    fake.chat_default = model

    async def main() -> tuple[str, str]:
        first = RecalldMemoryMiddleware(socket_path=daemon.socket_path)
        second = RecalldMemoryMiddleware(socket_path=daemon.socket_path)
        try:
            return (await _reply(fake, first, writer, "s-1"),
                    await _reply(fake, second, reader, "s-2"))
        finally:
            await first.close()
            await second.close()

    recorded, found = asyncio.run(main())
    assert recorded.startswith("final: Recorded 1 fact(s)"), recorded
    assert "7731-kestrel" in found, found
