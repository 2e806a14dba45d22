"""Reading notes through the MCP bridge: resource URIs, a file larger than one read served
whole as a resource, and a range past the end of a file told rather than read as empty."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonHandle
from test_mcp import NOTE, _text, _write, bridge

from recalld.ipc.mcp_bridge import parse_uri, resource_uri


def test_resource_uris_round_trip() -> None:
    uri = resource_uri("coder", "memory/2026-07-02/a note.md")
    assert uri == "recalld://coder/memory/2026-07-02/a%20note.md"
    assert parse_uri(uri) == ("coder", "memory/2026-07-02/a note.md")
    for bad in ("file:///etc/passwd", "recalld://coder/", "recalld:///x.md"):
        with pytest.raises(ValueError):
            parse_uri(bad)


def test_a_file_larger_than_one_read_comes_whole_as_a_resource(daemon: DaemonHandle) -> None:
    from mcp.shared.exceptions import MCPError

    big = "".join(f"line {i} " + "é" * 100 + "\n" for i in range(8000))  # ~1.7 reads
    _write(daemon, "coder", "memory/2026-07-02/big.md", big)
    _write(daemon, "coder", "memory/2026-07-02/wide.md", "w" * 600_000 + "\nend\n")

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            got = await s.read_resource(resource_uri("coder", "memory/2026-07-02/big.md"))
            assert got.contents[0].text == big
            part = await s.call_tool("memory_read", {"path": "memory/2026-07-02/big.md"})
            assert part.structured_content["truncated"] is True
            end = part.structured_content["end_line"]
            assert _text(part).endswith(
                f"\n[truncated: lines 1-{end} of 8000; read on with start_line]")
            with pytest.raises(MCPError) as wide:  # a line longer than one read
                await s.read_resource(resource_uri("coder", "memory/2026-07-02/wide.md"))
            assert wide.value.code == -32602 and "memory_read" in wide.value.message

    asyncio.run(main())


def test_a_range_past_the_end_of_a_file_is_told_not_read_as_empty(
        daemon: DaemonHandle) -> None:
    _write(daemon, "coder", "memory/2026-07-02/printers.md", NOTE)
    _write(daemon, "coder", "memory/2026-07-02/empty.md", "")

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            past = await s.call_tool("memory_read", {
                "path": "memory/2026-07-02/printers.md", "start_line": 40, "end_line": 45})
            assert not past.is_error
            assert _text(past) == ("[no lines: start_line 40 is past the end of "
                                   "memory/2026-07-02/printers.md, which has 3 lines]")
            assert past.structured_content["total_lines"] == 3
            empty = await s.call_tool("memory_read", {"path": "memory/2026-07-02/empty.md"})
            assert "which has 0 lines" in _text(empty)
            last = await s.call_tool("memory_read", {
                "path": "memory/2026-07-02/printers.md", "start_line": 3})
            assert _text(last) == "The office printer is called marmalade-3 and needs a PIN.\n"
            # An empty agent names no workspace: refused, not read as the caller's own.
            nobody = await s.call_tool("memory_read", {
                "path": "memory/2026-07-02/printers.md", "agent": ""})
            assert nobody.is_error and "makes no workspace name" in _text(nobody), _text(nobody)

    asyncio.run(main())
