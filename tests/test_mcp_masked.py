"""What an agent reads through the MCP bridge goes on to its chat model: a key typed into
a note by hand is read masked there (tool and resource), as search serves it, while the
owner's own ``memory.read`` gives the file as it is unless it asks for ``masked``."""

from __future__ import annotations

import asyncio
import secrets
import string

from conftest import DaemonHandle
from test_mcp import _text, _write, bridge

from recalld.ipc.client import Client
from recalld.ipc.mcp_bridge import resource_uri

REL = "memory/2026-07-04/deploy.md"


def _token(prefix: str, n: int) -> str:
    alphabet = string.ascii_letters + string.digits
    return prefix + "".join(secrets.choice(alphabet) for _ in range(n))


def test_an_agent_reads_a_hand_typed_key_masked(daemon: DaemonHandle) -> None:
    gitlab = _token("glpat-", 20)
    slack = _token("xoxb-", 40)
    note = (f"# Deploy\n\nThe runner logs in with {gitlab} every night.\n"
            f"bot token: {slack}\nThe staging box is called heron-7.\n")
    _write(daemon, "ops", REL, note)
    with Client(str(daemon.socket_path)) as c:
        c.workspace_open("ops")
        c.search("ops", "heron", sync=True)
        assert c.read("ops", REL)["text"] == note  # the owner's file as it is
        masked = c.read("ops", REL, masked=True)
        assert masked["total_lines"] == note.count("\n")
        assert gitlab not in masked["text"] and slack not in masked["text"]
        assert "[REDACTED]" in masked["text"] and "heron-7" in masked["text"]

    async def main() -> None:
        async with bridge(daemon, "ops") as s:
            read = await s.call_tool("memory_read", {"path": REL})
            shown = _text(read)
            assert not read.is_error and "heron-7" in shown, shown
            assert gitlab not in shown and slack not in shown, shown
            assert gitlab not in str(read.structured_content), read.structured_content
            body = (await s.read_resource(resource_uri("ops", REL))).contents[0].text
            assert "heron-7" in body and gitlab not in body and slack not in body, body

    asyncio.run(main())


def test_a_note_named_by_a_credential_is_named_masked_and_read_by_that_name(
        daemon: DaemonHandle) -> None:
    """A masked read (the bridge's tool, its resources) named a note whose name is a
    token by that token when asked for by its real name, in ``path`` and in the bridge's
    text; it names it as search and ``memory.list`` do. Every name so given reads the
    note back, also one the index has not reached (just written, or outside the indexed
    folders), and the resources listed for such notes read."""
    day = "memory/2026-08-09"
    token, fresh_token, other_token = _token("ghp_", 36), _token("glpat-", 20), _token(
        "ghp_", 36)
    rel, fresh, other = (f"{day}/{token}.md", f"{day}/sso-{fresh_token}.md",
                         f"scratch/{other_token}.md")
    notes = {rel: "# Hook\n\nThe deploy hook of the tern cluster.\n",
             fresh: "# SSO\n\nThe login of the auk proxy.\n",
             other: "# Scratch\n\nThe petrel notes.\n"}
    root = _write(daemon, "ops", rel, notes[rel])
    for path in (fresh, other):  # after the index's sync: it need not have them
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(notes[path], encoding="utf-8")
    tokens = (token, fresh_token, other_token)
    with Client(str(daemon.socket_path)) as c:
        assert c.read("ops", rel)["path"] == rel  # the owner's own read: as it is
        for path, text in notes.items():
            got = c.read("ops", path, masked=True)
            assert got["text"] == text and not any(t in str(got) for t in tokens), got
            assert "[REDACTED]" in got["path"]
            again = c.read("ops", got["path"])  # the name given back reads it
            assert again["text"] == text and again["path"] == got["path"], again

    async def main() -> None:
        async with bridge(daemon, "ops") as s:
            read = await s.call_tool("memory_read", {"path": rel, "start_line": 40})
            said = f"{_text(read)} {read.structured_content}"
            assert f"past the end of {day}/[REDACTED].md" in said and token not in said
            listed = (await s.list_resources()).resources
            uris = [str(r.uri) for r in listed if day in str(r.uri)]
            assert len(uris) == 2 and not any(t in str(listed) for t in tokens), uris
            bodies = {(await s.read_resource(uri)).contents[0].text for uri in uris}
            assert bodies == {notes[rel], notes[fresh]}, bodies

    asyncio.run(main())
