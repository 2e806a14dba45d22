"""How the MCP bridge reads tool arguments that pass their input schema in another
spelling than the daemon's: an integer written as a float (``3.0``, which JSON Schema
takes for an integer and a client's JSON library may write)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonHandle
from test_mcp import NOTE, _text, _write, bridge


def test_integer_arguments_written_as_floats_are_read_as_integers(
        daemon: DaemonHandle) -> None:
    _write(daemon, "coder", "memory/2026-07-02/printers.md", NOTE)

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            read = await s.call_tool("memory_read", {
                "path": "memory/2026-07-02/printers.md", "start_line": 3.0, "end_line": 3.0})
            assert not read.is_error, _text(read)
            assert _text(read) == "The office printer is called marmalade-3 and needs a PIN.\n"
            found = await s.call_tool("memory_search", {"query": "office printer",
                                                        "limit": 1.0})
            assert not found.is_error, _text(found)
            assert [h["path"] for h in found.structured_content["results"]] == [
                "memory/2026-07-02/printers.md"]
            # A float that is no whole number is still refused, before the daemon.
            half = await s.call_tool("memory_read", {
                "path": "memory/2026-07-02/printers.md", "start_line": 2.5})
            assert half.is_error and "start_line: must be an integer" in _text(half)

    asyncio.run(main())
