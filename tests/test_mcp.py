"""The MCP bridge, driven by the official SDK's own stdio client against a real daemon.

Each bridge is a real subprocess (``python -m recalld.ipc.mcp`` or ``recalld mcp``)
launched by ``mcp.client.stdio.stdio_client``; several run at once on one daemon. Reading
notes through it is in ``test_mcp_resources.py``, the workspace it serves in
``test_mcp_agents.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonFactory, DaemonHandle
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from waits import wait_log

from recalld.ipc.client import Client
from recalld.ipc.errors import NOT_ALLOWED
from recalld.ipc.mcp_bridge import resource_uri

NOTE = "# Printers\n\nThe office printer is called marmalade-3 and needs a PIN.\n"


@asynccontextmanager
async def bridge(daemon: DaemonHandle, agent: str, *, cli: bool = False,
                 ) -> AsyncIterator[ClientSession]:
    module = ["-m", "recalld.ipc", "mcp"] if cli else ["-m", "recalld.ipc.mcp"]
    params = StdioServerParameters(
        command=sys.executable,
        args=[*module, "--agent", agent, "--socket", str(daemon.socket_path)],
        env=daemon.env)
    with open(daemon.home / f"mcp-{agent}.log", "w", encoding="utf-8") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


def _write(daemon: DaemonHandle, agent: str, rel: str, text: str) -> Path:
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open(agent)["path"])
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
        c.index_sync(agent)
    return root


def _text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def test_round_trip_through_the_sdk_client(daemon: DaemonHandle) -> None:
    _write(daemon, "coder", "memory/2026-07-02/printers.md", NOTE)

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            tools = {t.name for t in (await s.list_tools()).tools}
            assert tools == {"memory_search", "memory_recall", "memory_read",
                             "memory_add_turns", "memory_add_note"}

            found = await s.call_tool("memory_search", {"query": "office printer", "limit": 3})
            assert not found.is_error
            assert "memory/2026-07-02/printers.md:" in _text(found)
            hits = found.structured_content["results"]
            assert hits[0]["path"] == "memory/2026-07-02/printers.md"

            read = await s.call_tool("memory_read", {"path": "memory/2026-07-02/printers.md",
                                                     "start_line": 3, "end_line": 3})
            assert _text(read) == "The office printer is called marmalade-3 and needs a PIN.\n"

            turns = await s.call_tool("memory_add_turns", {
                "session_id": "mcp-1",
                "messages": [{"role": "user", "content": "my shell is fish"},
                             {"role": "assistant", "content": "noted"}]})
            assert json.loads(_text(turns))["pending_messages"] == 2
            # A host retrying the call with the same request_id adds nothing twice.
            once = {"session_id": "mcp-2", "request_id": "turns-7",
                    "messages": [{"role": "user", "content": "my editor is helix"}]}
            first = await s.call_tool("memory_add_turns", once)
            retried = await s.call_tool("memory_add_turns", once)
            assert json.loads(_text(first))["pending_messages"] == 1
            assert json.loads(_text(retried)) == json.loads(_text(first))
            # Messages as hosts hold them: content blocks, a developer prompt, a tool
            # call and its answer, a Responses API item; the user's and the assistant's
            # words are kept.
            shaped = await s.call_tool("memory_add_turns", {"session_id": "mcp-3", "messages": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": [{"type": "text", "text": "J'utilise zsh."},
                                             {"type": "image", "source": {"type": "url"}}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "zsh 5.9"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Noté."}]}]})
            assert not shaped.is_error, _text(shaped)
            assert (shaped.structured_content["added_messages"],
                    shaped.structured_content["pending_turns"]) == (2, 1)

            note = await s.call_tool("memory_add_note", {"content": "The VPN is wireguard."})
            assert not note.is_error and "recorded in memory/" in _text(note)
            again = await s.call_tool("memory_search", {"query": "wireguard"})
            assert "The VPN is wireguard." in _text(again)

            resources = (await s.list_resources()).resources
            uris = {str(r.uri) for r in resources}
            assert resource_uri("coder", "memory/2026-07-02/printers.md") in uris
            body = await s.read_resource(resource_uri("coder", "memory/2026-07-02/printers.md"))
            assert body.contents[0].text == NOTE

            bad = await s.call_tool("memory_read", {"path": "../../etc/passwd"})
            assert bad.is_error and "code" in _text(bad)
            junk = await s.call_tool("memory_search", {"query": "printer", "limit": "lots"})
            assert junk.is_error

    asyncio.run(main())


SHARED = """
[workspaces.bob]
shared_with = ["alice"]
"""


def test_many_bridges_share_one_daemon_and_sharing_rules_hold(
        daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(SHARED)
    _write(daemon, "bob", "memory/2026-07-02/bob.md", "# Garden\nBob plants tomatoes in May.\n")
    _write(daemon, "carol", "memory/2026-07-02/c.md", "# Garden\nCarol grows basil.\n")
    _write(daemon, "alice", "memory/2026-07-02/a.md", "# Garden\nAlice has no garden.\n")

    async def as_alice() -> None:
        async with bridge(daemon, "alice", cli=True) as s:
            both = await s.call_tool("memory_search", {"query": "garden",
                                                       "agents": ["alice", "bob"]})
            owners = {h["agent_id"] for h in both.structured_content["results"]}
            assert owners == {"alice", "bob"}
            read = await s.call_tool("memory_read", {"agent": "bob",
                                                     "path": "memory/2026-07-02/bob.md"})
            assert "tomatoes" in _text(read)
            refused = await s.call_tool("memory_search", {"query": "garden",
                                                          "agents": ["carol"]})
            assert refused.is_error and f"(code {NOT_ALLOWED})" in _text(refused)

    async def as_carol() -> None:
        async with bridge(daemon, "carol") as s:
            own = await s.call_tool("memory_search", {"query": "basil"})
            assert "Carol grows basil." in _text(own)
            refused = await s.call_tool("memory_read", {"agent": "bob",
                                                        "path": "memory/2026-07-02/bob.md"})
            assert refused.is_error and "may not read" in _text(refused)
            assert "tomatoes" not in _text(refused)

    async def main() -> None:
        await asyncio.gather(as_alice(), as_carol())

    asyncio.run(main())
    status = daemon.call("daemon.status")
    assert status["pid"] == daemon.pid  # one daemon served both bridges


def test_without_a_daemon_it_warns_and_every_request_is_a_valid_error(
        daemon_factory: DaemonFactory) -> None:
    from mcp.shared.exceptions import MCPError

    env = daemon_factory.environment()
    home = Path(env["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    sock = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    log = home / "mcp-down.log"

    async def main() -> None:
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "recalld.ipc", "mcp", "--agent", "coder"],
                                       env=env)
        with open(log, "w", encoding="utf-8") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as s:
                await s.initialize()
                assert [t.name for t in (await s.list_tools()).tools]
                with pytest.raises(MCPError) as listed:
                    await s.list_resources()
                assert listed.value.code == -32603
                assert f"daemon not running at {sock}" in listed.value.message
                with pytest.raises(MCPError) as read:
                    await s.read_resource(resource_uri("coder", "memory/x.md"))
                assert read.value.code == -32603
                with pytest.raises(MCPError) as bad_uri:
                    await s.read_resource("recalld:///x.md")
                assert bad_uri.value.code == -32602
                called = await s.call_tool("memory_search", {"query": "printer"})
                assert called.is_error and "daemon not running" in _text(called)
                # The check at start runs beside the requests: said before the end.
                wait_log(log, f"recalld mcp: warning: daemon not running at {sock}",
                         "the bridge's warning")

    asyncio.run(main())
    assert "Traceback" not in log.read_text(encoding="utf-8")


FERRY_NODE = """---
name: ferry-facts
description: what the lake ferries cost
type: reference
---
# Ferries

The lake ferry leaves Bürkliplatz hourly from April to October; the GA covers it.
"""


def test_recall_tool_and_prompt_carry_the_linked_node_body(daemon: DaemonHandle) -> None:
    _write(daemon, "coder", "digest/wiki/ferry.md", FERRY_NODE)
    _write(daemon, "coder", "digest/interests.yaml",
           "topics:\n  - topic: lake ferries\n    weight: 0.4\n")
    _write(daemon, "coder", "memory/2026-07-25/lake.md",
           "# Saturday\n\nWe rode the quokkaboat, see [[digest/wiki/ferry]].\n")

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            found = await s.call_tool("memory_recall", {"query": "quokkaboat",
                                                        "include_index": True})
            assert not found.is_error
            text = _text(found)
            assert text.startswith("## Relevant memories\n\n[memory/2026-07-25/lake.md:")
            assert "leaves Bürkliplatz hourly" in text.split("## Linked context", 1)[1]
            assert "name: ferry-facts" not in text and "type: reference" not in text
            assert "[ferry-facts](digest/wiki/ferry.md)" in text.split("## Memory index")[1]
            assert found.structured_content["items"][1]["via"] == "memory/2026-07-25/lake.md"

            prompts = (await s.list_prompts()).prompts
            assert [p.name for p in prompts] == ["recall"]
            interests = await s.get_prompt("recall", {"query": "quokkaboat",
                                                      "include_interests": "true"})
            assert "## Interests\n- lake ferries (0.40)" in interests.messages[0].content.text
            on = await s.get_prompt("recall", {"query": "quokkaboat", "include_interests": " On "})
            assert "## Interests\n- lake ferries" in on.messages[0].content.text  # "on" is yes
            # A host handing its conversation back, the prompt's message in it, stores
            # what the user said, not the recalled memory as the user's words.
            handed = await s.call_tool("memory_add_turns", {"session_id": "p1", "messages": [
                {"role": "user", "content": interests.messages[0].content.text},
                {"role": "user", "content": "Which ferry today?"},
                {"role": "assistant", "content": "The 10:40 one."}]})
            assert (handed.structured_content["added_messages"],
                    handed.structured_content["pending_turns"]) == (2, 1), _text(handed)
            got = await s.get_prompt("recall", {"query": "quokkaboat", "budget_chars": "300"})
            (message,) = got.messages
            assert message.role == "user"
            assert "leaves Bürkliplatz hourly" in message.content.text
            assert "name: ferry-facts" not in message.content.text
            small = await s.get_prompt("recall", {"query": "quokkaboat", "budget_chars": "60"})
            block = small.messages[0].content.text.split("\n\n", 1)[1].removesuffix(
                "\n</recalled-memory>")
            assert len(block) <= 60
            # Hits that do not fit in a tiny budget are not "nothing found".
            tiny = await s.call_tool("memory_recall", {"query": "quokkaboat",
                                                       "budget_chars": 12})
            assert tiny.structured_content["truncated"] and not tiny.is_error
            assert "none fits in budget_chars=12" in _text(tiny), _text(tiny)
            nothing = await s.call_tool("memory_recall", {"query": "zeppelinfjord"})
            assert _text(nothing) == "(no relevant memories found)"

            # The search tool shows the linked context too.
            searched = _text(await s.call_tool("memory_search", {"query": "quokkaboat"}))
            assert "leaves Bürkliplatz hourly" in searched.split("## Linked context", 1)[1]
            assert "name: ferry-facts" not in searched

            bad = await s.call_tool("memory_recall", {"query": "  "})
            assert bad.is_error and "empty" in _text(bad)

    asyncio.run(main())


def test_arguments_of_the_wrong_shape_are_refused_before_the_daemon(
        daemon: DaemonHandle) -> None:
    from mcp.shared.exceptions import MCPError

    wrong = [
        ("memory_search", {"query": "printer", "agents": "bob"},
         "agents: must be an array, not a string"),
        ("memory_search", {}, "query is required"),
        ("memory_search", {"query": {"text": "printer"}}, "query: must be a string, not an object"),
        ("memory_search", {"query": "printer", "limit": 10**30}, "limit: must be at most 100"),
        ("memory_recall", {"query": "printer", "include_index": "false"}, "include_index:"),
        ("memory_read", {"path": ["memory/x.md"]}, "path: must be a string, not an array"),
        # Past 64 bits no request carries it: named here, not the wire's range error.
        ("memory_read", {"path": "memory/x.md", "start_line": 2**64},
         "start_line: must be at most"),
        ("memory_add_turns", {"session_id": "s1", "messages": "hello"},
         "messages: must be an array"),
        ("memory_add_turns", {"session_id": "s1", "flush": "false",
                              "messages": [{"role": "user", "content": "hi"}]}, "flush:"),
        ("memory_add_turns", {"session_id": "s1", "messages": [{"role": "robot",
                                                                "content": "hi"}]},
         "messages/0/role: must be one of assistant, "),
        ("memory_add_turns", {"session_id": "s1", "messages": [{"content": "hi"}]},
         "messages/0: fits none of the shapes"),
        ("memory_add_note", {"content": 5}, "content: must be a string, not an integer"),
    ]

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            for name, args, said in wrong:
                result = await s.call_tool(name, args)
                assert result.is_error, (name, args)
                assert _text(result).startswith(f"bad arguments for {name}: "), _text(result)
                assert said in _text(result), _text(result)
            unknown = await s.call_tool("memory_forget", {"query": "x"})
            assert unknown.is_error and _text(unknown).startswith("unknown tool: the tools are ")
            with pytest.raises(MCPError) as bad_prompt:
                await s.get_prompt("recall", {"query": "printer", "budget_chars": "lots"})
            assert bad_prompt.value.code == -32602
            assert "budget_chars must be a whole number" in bad_prompt.value.message
            # A flag in a word not known is refused, not taken for "false"; a number is
            # ASCII digits ("٣٠٠" is 300 to int(), as are "+300" and "3_00").
            for arg, value in (("include_index", "maybe"), ("include_interests", "tru"),
                               ("budget_chars", "٣٠٠"), ("budget_chars", "+300"),
                               ("budget_chars", "3_00")):
                with pytest.raises(MCPError) as refused:
                    await s.get_prompt("recall", {"query": "printer", arg: value})
                assert refused.value.code == -32602 and f"{arg} must be" in refused.value.message
            # Past its bounds (also past 64 bits, or thousands of digits long), in the
            # memory_recall tool's words, before the daemon is asked.
            for value in ("0", "200001", "9" * 23, "7" * 5000, "000" + "5" * 6):
                with pytest.raises(MCPError) as refused:
                    await s.get_prompt("recall", {"query": "printer", "budget_chars": value})
                assert refused.value.code == -32602
                assert refused.value.message == (
                    "recalld: budget_chars must be between 1 and 200000"), value

    asyncio.run(main())
    with Client(daemon.socket_path) as c:  # none of it reached the daemon
        assert [w["agent_id"] for w in c.workspace_list()] == ["default"]
    assert "Traceback" not in (daemon.home / "mcp-coder.log").read_text(encoding="utf-8")


def test_turns_beyond_one_request_go_in_parts_and_once(daemon: DaemonHandle) -> None:
    import orjson

    # A host hands over a long conversation at its end: more messages than one
    # memory.add_turns takes (1,000) and one message larger than a request (1 MiB).
    pasted = "\n".join(f"Zeile {i}: der Dienst »reiher-{i}« 🪶 antwortet nicht"
                       for i in range(25_000))
    messages = [{"role": "user" if n % 2 else "assistant", "content": f"turn {n}"}
                for n in range(1_500)] + [{"role": "user", "content": pasted}]
    args = {"session_id": "long chat/7", "messages": messages, "flush": False,
            "request_id": "handover-1"}

    async def main() -> tuple[Any, Any]:
        async with bridge(daemon, "coder") as s:
            first = await s.call_tool("memory_add_turns", args)
            again = await s.call_tool("memory_add_turns", args)
            return first, again

    first, again = asyncio.run(main())
    assert not first.is_error, _text(first)
    assert first.structured_content["added_messages"] > 1_501
    # A retry with the same request_id gets the first answer and adds nothing twice.
    assert again.structured_content == first.structured_content
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("coder")["path"])
    said = [m["content"] for line in (root / "mem_metadata/sessions/pending.jsonl")
            .read_bytes().splitlines()
            for m in orjson.loads(line.split(b" ", 1)[1]).get("messages") or []]
    assert said[:1_500] == [f"turn {n}" for n in range(1_500)]
    assert "\n".join(said[1_500:]) == pasted
