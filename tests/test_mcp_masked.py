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
