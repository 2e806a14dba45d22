"""Which workspace an MCP bridge serves: an agent named in another script (the one its
AgentScope middleware has), one closed by another client, a name that makes none."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonFactory, DaemonHandle
from test_mcp import NOTE, _text, _write, bridge

from recalld.ipc.agent_ids import session_key, workspace_id
from recalld.ipc.client import Client
from recalld.ipc.mcp_bridge import resource_uri


def test_an_agent_named_in_another_script_has_the_workspace_its_middleware_has(
        daemon_factory: DaemonFactory) -> None:
    # A host configured with `--agent 研究助手` means that agent, not an invalid id: the
    # bridge serves the workspace the AgentScope middleware and the QwenPaw import give
    # the name, and maps the agents its tools name the same way.
    research, writing = workspace_id("研究助手"), workspace_id("写作助手")
    daemon = daemon_factory(f'[workspaces."{writing}"]\nshared_with = ["{research}"]\n')
    _write(daemon, research, "memory/2026-07-02/r.md", "# Sources\nThe survey cites Knuth.\n")
    _write(daemon, writing, "memory/2026-07-02/w.md", "# Style\nThe draft uses British spelling.\n")

    async def main() -> None:
        async with bridge(daemon, "研究助手") as s:
            own = await s.call_tool("memory_search", {"query": "survey Knuth"})
            assert not own.is_error and "The survey cites Knuth." in _text(own)
            note = await s.call_tool("memory_add_note", {"content": "Deadline is Friday.",
                                                         "session_id": "研究 1"})
            assert not note.is_error, _text(note)
            # A host's conversation id the daemon would refuse is mapped, not refused.
            turns = await s.call_tool("memory_add_turns", {
                "session_id": "会话 1/a", "messages": [{"role": "user", "content": "hi"}]})
            assert not turns.is_error, _text(turns)
            assert turns.structured_content["session_id"] == session_key("会话 1/a")
            shared = await s.call_tool("memory_search", {"query": "spelling",
                                                         "agents": ["写作助手"]})
            assert {h["agent_id"] for h in shared.structured_content["results"]} == {writing}
            read = await s.call_tool("memory_read", {"agent": "写作助手",
                                                     "path": "memory/2026-07-02/w.md"})
            assert "British spelling" in _text(read)
            uris = {str(r.uri) for r in (await s.list_resources()).resources}
            assert resource_uri(research, "memory/2026-07-02/r.md") in uris

    asyncio.run(main())
    assert "Deadline is Friday." in daemon.call(
        "memory.search", {"agent_id": research, "query": "deadline Friday"})["results"][0]["text"]


def test_a_workspace_closed_by_another_client_is_opened_again(daemon: DaemonHandle) -> None:
    _write(daemon, "coder", "memory/2026-07-02/printers.md", NOTE)

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            assert not (await s.call_tool("memory_search", {"query": "printer"})).is_error
            for ask in ("memory_search", "memory_recall", "resources", "prompt"):
                with Client(daemon.socket_path) as c:
                    assert c.call("workspace.close", {"agent_id": "coder"})["closed"]
                if ask == "resources":
                    uris = {str(r.uri) for r in (await s.list_resources()).resources}
                    assert resource_uri("coder", "memory/2026-07-02/printers.md") in uris
                elif ask == "prompt":
                    got = await s.get_prompt("recall", {"query": "office printer"})
                    assert "marmalade-3" in got.messages[0].content.text
                else:
                    found = await s.call_tool(ask, {"query": "office printer"})
                    assert not found.is_error, _text(found)
                    assert "marmalade-3" in _text(found)

    asyncio.run(main())


def test_an_agent_name_that_makes_no_workspace_is_a_usage_error(
        daemon_factory: DaemonFactory) -> None:
    import subprocess

    env = daemon_factory.environment()
    # Every name of dots through the bridge's module, one through the CLI's dispatch (each
    # run imports the MCP SDK: ~1 s).
    runs = [(["-m", "recalld.ipc.mcp"], name) for name in ("..", ".", ".....")]
    for module, name in [*runs, (["-m", "recalld.ipc", "mcp"], "..")]:
        done = subprocess.run([sys.executable, *module, f"--agent={name}"], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 2, (module, name, done.stderr)
        assert done.stdout == ""
        assert (f"argument --agent: the agent name {name!r} makes no workspace name"
                in done.stderr), done.stderr
        assert "Traceback" not in done.stderr
