"""A reply larger than one daemon request (``max_request_bytes``, or the 32,000
characters of one ``memory.add_note``) reaches memory whole.

A real AgentScope agent with the memory middleware on a real daemon; its chat model is
the fake provider on 127.0.0.1. What the daemon holds is read from its pending-turns log.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

import agentscope
from agentscope._utils import _common
from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider
from test_agentscope import NOTE, _chat_requests, _non_system, _open, _reply, scripted

from recalld.ipc.agentscope import RecalldMem0Middleware, RecalldMemoryMiddleware, session_key
from recalld.ipc.client import Client
from recalld.ipc.request_parts import search_query, turn_parts

PENDING = "mem_metadata/sessions/pending.jsonl"


def _said(root: Path, session: str, role: str) -> str:
    """The text of the ``role`` messages the daemon holds for ``session``, in order,
    one line each."""
    out = []
    for line in (root / PENDING).read_bytes().splitlines():
        record = orjson.loads(line.split(b" ", 1)[1])
        if record.get("session_id") == session_key(session):
            out += [m["content"] for m in record.get("messages") or []
                    if m.get("role") == role]
    return "\n".join(out)


def test_a_message_larger_than_a_request_is_written_back_whole(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    fake.chat_default = scripted()
    # A pasted log of about 2 MB of UTF-8: CJK, emoji, quotes and newlines to escape.
    pasted = "".join(f'第{i}行: 服务器 "kestrel-{i}" 🚲 出错\n' for i in range(40_000)).strip()

    async def main() -> str:
        mw = RecalldMemoryMiddleware(socket_path=daemon.socket_path, agent_id="coder")
        try:
            agent, answer = await _reply(fake, mw, "coder", pasted)
            assert answer == "plain answer"
            return str(agent.state.session_id)
        finally:
            await mw.close()

    session = asyncio.run(main())
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("coder")["path"])
    assert _said(root, session, "user") == pasted
    assert _said(root, session, "assistant") == "plain answer"


def test_turn_parts_fit_the_limit_and_keep_every_character() -> None:
    limit = 64 * 1024
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "\x00\"\\" * 30_000},  # 6 bytes of JSON each, or 2
        {"role": "assistant", "content": "short"},
        {"role": "user", "content": [{"type": "text", "text": "日本語" * 40_000},
                                     {"type": "data", "name": "receipt.png",
                                      "source": {"media_type": "image/png"}}]},
        *({"role": "user", "content": "x"} for _ in range(1500)),
    ]
    parts = turn_parts(messages, limit)
    assert all(len(orjson.dumps(p)) <= limit - 1024 for p in parts)
    assert all(len(p) <= 1000 for p in parts)
    flat = [m for p in parts for m in p]
    assert _text(flat) == _text(messages)
    assert [m["role"] for m in flat].count("assistant") == 1
    assert sum(m["content"] == "x" for m in flat) == 1500
    assert [b["name"] for m in flat if isinstance(m["content"], list)
            for b in m["content"] if b["type"] == "data"] == ["receipt.png"]


def _text(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"] if isinstance(m["content"], str)
                   else "".join(b.get("text", "") for b in m["content"]) for m in messages)


def test_a_mem0_exchange_larger_than_a_request_is_stored_whole(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    fake.chat_default = scripted()
    # About 100,000 characters: more than one memory.add_note takes (32,000).
    pasted = "\n".join(f"ligne {i}: l'hôte «héron-{i}» 🦩 ne répond plus" for i in range(2_000))

    async def main() -> None:
        mw = RecalldMem0Middleware(user_id="user-lea", agent_id="triage",
                                   socket_path=daemon.socket_path)
        try:
            _, answer = await _reply(fake, mw, "triage", pasted)
            assert answer == "plain answer"
        finally:
            await mw.close()

    asyncio.run(main())
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("user-lea")["path"])
    # The daemon starts another note of the day when one grows past its size.
    body = "".join(note.read_text(encoding="utf-8")
                   for note in (root / "memory").rglob("mem0-triage*.md"))
    assert all(f"ligne {i}: l'hôte «héron-{i}» 🦩 ne répond plus\n" in body
               for i in range(2_000 - 1))
    assert "Assistant: plain answer" in body


def test_facts_longer_than_one_note_takes_are_recorded_by_add_memory(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    facts = [f"The migration plan, step {n}: " + "move one shard, check it; " * 800
             for n in range(3)]  # about 20,000 characters each
    fake.chat_default = scripted(("add_memory", {"thinking": "the plan", "content": facts}))

    async def main() -> str:
        mw = RecalldMemoryMiddleware(socket_path=daemon.socket_path, agent_id="coder",
                                     mode="agent_control")
        try:
            _, answer = await _reply(fake, mw, "coder", "remember the migration plan")
            return answer
        finally:
            await mw.close()

    answer = asyncio.run(main())
    assert answer.startswith("final: Recorded 3 fact(s) in memory/"), answer
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("coder")["path"])
    body = "".join(note.read_text(encoding="utf-8")
                   for note in (root / "memory").rglob("agent-notes*.md"))
    assert all(f"- {fact.strip()}\n" in body for fact in facts)


# About 2.6 MB of JSON: a pasted build log of CJK, emoji, quotes and escapes.
LOG = "".join(f'步骤{i}: 构建 "wren-{i}" 🔧 失败\t退出码 {i % 7}\n' for i in range(45_000))
#: ``[daemon] max_request_bytes`` at its lowest: a message over it takes the path one over
#: the default 1 MiB takes, for a sixteenth of the bytes.
SMALL_LIMIT = 64 << 10


@pytest.mark.parametrize("question_first", [False, True])
def test_a_message_larger_than_a_request_gets_its_recall(
        daemon: DaemonHandle, fake: FakeProvider, question_first: bool) -> None:
    _open(daemon, "coder", {"memory/2026-07-01/backups.md": NOTE})
    fake.chat_default = scripted()
    question = "where do the nightly backups go?"
    text = f"{question}\n{LOG}" if question_first else f"{LOG}\n{question}"
    assert len(orjson.dumps(text)) > 2 << 20

    async def main() -> None:
        mw = RecalldMemoryMiddleware(socket_path=daemon.socket_path, agent_id="coder",
                                     mode="static_control")
        try:
            await _reply(fake, mw, "coder", text)
        finally:
            await mw.close()

    asyncio.run(main())
    req = _chat_requests(fake)[-1]  # the reply's (AgentScope tried to compress before)
    injected = _non_system(req).split("<recalled-memory>", 1)
    assert len(injected) == 2 and "quillfeather-7" in injected[1].split("</recalled-")[0]


def test_a_mem0_message_larger_than_a_request_gets_its_recall(
        daemon_factory: DaemonFactory, fake: FakeProvider,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The daemon takes requests of SMALL_LIMIT; the middleware's client reads that from the
    # daemon's configuration, as a client on the same account does.
    daemon = daemon_factory(f"[daemon]\nmax_request_bytes = {SMALL_LIMIT}\n")
    for key in ("XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "HOME"):
        monkeypatch.setenv(key, daemon.env[key])
    with Client(daemon.socket_path) as c:
        c.workspace_open("user-ines")
        c.add_note("user-ines", "Ines keeps her kayak at the boathouse on pier 9.",
                   session_id="mem0-guide", name="mem0-guide", author="guide")
    fake.chat_default = scripted()
    log = LOG[:LOG.index("步骤1300:")]  # over one request, no larger
    assert SMALL_LIMIT < len(orjson.dumps(log)) < 2 * SMALL_LIMIT

    async def main() -> None:
        mw = RecalldMem0Middleware(user_id="user-ines", agent_id="guide",
                                   mode="static_control", socket_path=daemon.socket_path)
        try:
            assert mw.client.request_limit == SMALL_LIMIT
            await _reply(fake, mw, "guide", f"where is my kayak kept?\n{log}")
        finally:
            await mw.close()

    asyncio.run(main())
    req = _chat_requests(fake)[-1]
    assert "## Relevant memories from past conversations" in _non_system(req)
    assert "boathouse on pier 9" in _non_system(req)


def test_a_search_query_fits_and_keeps_both_ends() -> None:
    limit = 64 * 1024
    for text in (LOG, "\x00" * 50_000 + "end", "é" * 70_000, "x" * 10):
        query = search_query(text, limit)
        assert len(orjson.dumps(query)) <= limit - 1024
        assert query == text or (text.startswith(query.split("\n")[0])
                                 and text.endswith(query.rsplit("\n")[-1]))
    assert search_query(LOG, limit).startswith("步骤0: ")
    assert search_query(LOG, limit).endswith('步骤44999: 构建 "wren-44999" 🔧 失败\t退出码 3\n')


def test_write_backs_of_replies_whose_long_ids_begin_alike_are_all_kept(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    """A host whose ids are long and begin alike (a tenant path before each uuid): each
    reply's write-back is its own request, not taken for the one before sent again."""
    fake.chat_default = scripted()
    tenant = "tenants/acme-logistics/regions/eu-central-1/deployments/" * 4
    default_factory = _common._id_factory

    async def main() -> str:
        mw = RecalldMemoryMiddleware(socket_path=daemon.socket_path, agent_id="dispatch")
        model = OpenAIChatModel(credential=OpenAICredential(
            api_key="k", base_url=fake.url + "/v1"), model="fake", stream=False,
            max_retries=0)
        agent = Agent(name="dispatch", system_prompt="You dispatch trucks.", model=model,
                      toolkit=Toolkit(tools=await mw.list_tools()), middlewares=[mw])
        try:
            for text in ("Truck 7 leaves Linz at 06:10.", "Truck 9 waits in Graz.",
                         "Truck 7 is back."):
                await agent.reply(UserMsg(name="user", content=text))
            return str(agent.state.session_id)
        finally:
            await model.client.close()
            await mw.close()

    agentscope.set_id_factory(lambda: tenant + uuid.uuid4().hex)
    try:
        session = asyncio.run(main())
    finally:
        agentscope.set_id_factory(default_factory)
    assert len(session) > 200
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("dispatch")["path"])
    assert _said(root, session, "user") == ("Truck 7 leaves Linz at 06:10.\n"
                                             "Truck 9 waits in Graz.\nTruck 7 is back.")
    assert _said(root, session, "assistant").count("plain answer") == 3
