"""How the MCP bridge reads tool arguments that pass their input schema in another
spelling than the daemon's: an integer written as a float (``3.0``, which JSON Schema
takes for an integer and a client's JSON library may write), and arguments that pass it
yet say nothing (a note of zero-width characters only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonHandle
from test_mcp import NOTE, _text, _write, bridge

from recalld.ipc.client import Client


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


@pytest.mark.parametrize("content", ["\u200b", "\u200b\u200c\u200d", "\ufeff \u2060\n",
                                     "\u00ad\u200e\u3000"])
def test_a_note_of_invisible_characters_only_is_refused_as_empty(
        daemon: DaemonHandle, content: str) -> None:
    """A note of only zero-width or other invisible characters (a word joiner, a byte
    order mark, a soft hyphen, a direction mark, spaces) says nothing: the bridge hands
    back the daemon's refusal as a tool error and no note is written; a note with words
    and one of them is written."""

    def notes() -> list[Path]:
        with Client(daemon.socket_path) as c:
            root = Path(c.workspace_open("coder")["path"])
        return [p for p in (root / "memory").rglob("*") if p.is_file()]

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            note = await s.call_tool("memory_add_note", {"content": content})
            assert note.is_error, _text(note)
            assert "empty" in _text(note), _text(note)
            assert notes() == []
            kept = await s.call_tool("memory_add_note",
                                     {"content": f"The kettle{content}is red."})
            assert not kept.is_error, _text(kept)
            assert len(notes()) == 1

    asyncio.run(main())


def test_a_note_continued_in_further_notes_names_every_one(daemon: DaemonHandle) -> None:
    """A text larger than the largest write of one note (1 MiB) goes on in the next note
    of its name: the tool's answer names every note it went into, not only the last,
    where an agent reading it back would find the text without its start."""
    lines = [f"- séance {n}: le thé de Ωmega-{n} est prêt à 17 h" for n in range(30_000)]
    text = "\n".join(lines)
    assert len(text.encode("utf-8")) > 1 << 20  # the case itself

    async def main() -> None:
        async with bridge(daemon, "coder") as s:
            note = await s.call_tool("memory_add_note", {"content": text})
            assert not note.is_error, _text(note)
            named = note.structured_content["paths"]
            assert len(named) >= 2, named
            for path in named:
                assert path in _text(note)
            with Client(daemon.socket_path) as c:
                root = Path(c.workspace_open("coder")["path"])
            written = sorted(str(p.relative_to(root)) for p in (root / "memory").rglob("*.md"))
            assert sorted(named) == written
            body = "".join((root / p).read_text(encoding="utf-8") for p in named)
            assert lines[0] in body and lines[-1] in body

    asyncio.run(main())
