"""A search of other agents' workspaces (``agents``) through the MCP bridge or the
AgentScope middleware says which of them were not searched (not open) and why: a model
told nothing would take their silence for having nothing. Real daemon, the bridge a real
subprocess."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")
pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from conftest import DaemonFactory, DaemonHandle
from test_links_daemon import write
from test_mcp import _text, bridge

from recalld.ipc.agentscope import RecalldMemoryMiddleware


def _team(daemon_factory: DaemonFactory, tmp_path: Path) -> DaemonHandle:
    config = ""
    for agent in ("quill", "ledger"):
        root = tmp_path / agent
        config += f'[workspaces.{agent}]\npath = "{root}"\nshared_with = ["quill"]\n'
        write(root, f"memory/2026-10-03/{agent}.md", f"# Kiln\nthe kiln log of {agent}\n")
    d = daemon_factory(config)
    for agent in ("quill", "ledger"):
        d.call("index.sync", {"agent_id": agent})
    assert d.call("workspace.close", {"agent_id": "ledger"})["closed"]
    return d


def test_the_mcp_search_names_the_agents_not_searched(daemon_factory: DaemonFactory,
                                                      tmp_path: Path) -> None:
    d = _team(daemon_factory, tmp_path)

    async def main() -> list[tuple[str, object]]:
        async with bridge(d, "quill") as s:
            out = []
            for query in ("kiln log", "a word nowhere: xylograph"):
                got = await s.call_tool("memory_search", {"query": query,
                                                          "agents": ["ledger", "quill"]})
                assert not got.is_error, _text(got)
                out.append((_text(got), (got.structured_content or {}).get("skipped")))
            return out

    (found, found_skipped), (empty, empty_skipped) = asyncio.run(main())
    assert "kiln log of quill" in found and "Not searched" in found
    assert "- ledger: workspace 'ledger' is not open" in found, found
    assert "(no results)" in empty and "- ledger:" in empty, empty
    assert found_skipped == empty_skipped == {"ledger": "workspace 'ledger' is not open"}


def test_the_agentscope_search_names_the_agents_not_searched(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = _team(daemon_factory, tmp_path)

    async def main() -> tuple[list[str], list[str]]:
        mw = RecalldMemoryMiddleware(socket_path=d.socket_path, agent_id="quill",
                                     agents=["ledger"])
        try:
            return (await mw.search("quill", "kiln log"),
                    await mw.search("quill", "xylograph"))
        finally:
            await mw.close()

    found, empty = asyncio.run(main())
    assert "kiln log of quill" in found[0]
    assert found[-1] == "## Not searched\n\n- ledger: workspace 'ledger' is not open"
    assert empty == ["(nothing found in the workspaces searched)", found[-1]]
