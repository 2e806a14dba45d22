"""What the MCP bridge says of a client's request it refuses (an unknown tool or prompt,
arguments of the wrong shape, a URI that is no recalld resource, a line that is no
JSON-RPC message) never quotes what the client sent: a key pasted into the wrong place
came back unmasked, in the answer and in the bridge's log (the daemon, which masks what
it quotes, never saw it). The answers still say what was expected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonHandle
from test_mcp_lines import Raw, _call

TOKEN = "ghp_" + "Wd3Kq8Zr1Mv6Tx4Nb9Lc2Hs7Jp5Yf0Ga8Ue"
SEEN = TOKEN[6:18]  # any piece of it, whatever form it is shown in


def _request(request_id: str, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                       "params": params}).encode() + b"\n"


def test_refusals_of_the_bridge_never_quote_what_the_client_sent(
        daemon: DaemonHandle) -> None:
    raw = Raw(daemon)
    tools = {
        "tool": (TOKEN, {"query": "x"}),
        "agents": ("memory_search", {"query": "x", "agents": TOKEN}),
        "query": ("memory_search", {"query": {"text": TOKEN}}),
        "limit": ("memory_recall", {"query": "x", "limit": TOKEN}),
        "flag": ("memory_recall", {"query": "x", "include_index": TOKEN}),
        "role": ("memory_add_turns", {"session_id": "s", "messages": [{"role": TOKEN}]}),
        "shape": ("memory_add_turns", {"session_id": "s", "messages": [{"content": TOKEN}]}),
        "item": ("memory_add_turns", {"session_id": "s", "messages": [TOKEN]}),
        "long id": ("memory_add_turns", {"session_id": "s", "request_id": TOKEN * 6,
                                         "messages": [{"role": "user", "content": "hi"}]}),
        "line": ("memory_read", {"path": "MEMORY.md", "start_line": TOKEN}),
    }
    for request_id, (name, arguments) in tools.items():
        raw.send(_call(request_id, name, arguments), [request_id])
    asked = {
        "prompt": ("prompts/get", {"name": TOKEN, "arguments": {"query": "x"}}),
        "budget": ("prompts/get", {"name": "recall",
                                   "arguments": {"query": "x", "budget_chars": TOKEN}}),
        "uri": ("resources/read", {"uri": f"https://{TOKEN}@example.com/x.md"}),
        "no path": ("resources/read", {"uri": f"recalld://{TOKEN}"}),
    }
    for request_id, (method, params) in asked.items():
        raw.send(_request(request_id, method, params), [request_id])
    # Lines the bridge refuses before the SDK reads them: logged, and answered.
    raw.send(b'{"jsonrpc":"2.0","id":"params","method":"tools/call","params":"%s"}\n'
             % TOKEN.encode(), ["params"])
    raw.send(b"my key is %s\n" % TOKEN.encode(), [None])
    assert raw.close() == []

    by_id = {m["id"]: m for m in raw.got if m.get("id") is not None}
    for request_id in tools:
        result = by_id[request_id]["result"]
        assert result["isError"], (request_id, result)
        assert SEEN not in json.dumps(result), (request_id, result)
    said = {i: by_id[i]["result"]["content"][0]["text"] for i in tools}
    assert said["tool"].startswith("unknown tool: the tools are memory_add_note, "), said
    assert said["agents"] == ("bad arguments for memory_search: agents: must be an array, "
                              f"not a string of {len(TOKEN)} characters"), said
    assert said["role"].startswith("bad arguments for memory_add_turns: messages/0/role: "
                                   "must be one of assistant, "), said
    assert 'a "type" other than "message"' in said["shape"], said
    assert "request_id: must be at most 200 characters long" in said["long id"], said
    for request_id in (*asked, "params"):
        error = by_id[request_id]["error"]
        assert error["code"] in (-32602, -32600), (request_id, error)
        assert SEEN not in json.dumps(error), (request_id, error)
    assert "the prompt is recall" in by_id["prompt"]["error"]["message"]
    assert "budget_chars must be a whole number" in by_id["budget"]["error"]["message"]
    assert "recalld://<agent>/<path>" in by_id["uri"]["error"]["message"]
    (unread,) = [m for m in raw.got if m.get("id", "") is None]
    assert SEEN not in json.dumps(unread), unread
    log = (daemon.home / "mcp-lines.log").read_text(encoding="utf-8")
    assert "refused a line of" in log and "(not JSON)" in log, log
    assert SEEN not in log and "Traceback" not in log, log


def test_a_path_the_daemon_quotes_in_a_refusal_shows_its_control_characters_escaped(
        daemon: DaemonHandle) -> None:
    """A path named by the client and quoted back in the daemon's refusal (no such file,
    not a file, a folder) keeps its control characters as escapes, as a search hit's
    header shows them: a line break, a terminal's escape sequence or a right-to-left
    override in it cannot split the answer into lines, drive the terminal of a host that
    prints tool errors, or turn the text around."""
    from recalld.ipc.client import Client

    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("coder")["path"])
    (root / "memory" / "dir\x1b[2J").mkdir(parents=True)
    raw = Raw(daemon)
    paths = {"clear": "memory/\x1b[2J\x1b[31mnote.md", "lines": "memory/a\nforged: b.md",
             "rtl": "memory/\u202edm.txt", "folder": "memory/dir\x1b[2J",
             "ends": "memory/\x07x/"}
    for request_id, path in paths.items():
        raw.send(_call(request_id, "memory_read", {"path": path}), [request_id])
    raw.send(_request("uri", "resources/read",
                      {"uri": "recalld://coder/memory/%1B%5B2Jx%0Ay.md"}), ["uri"])
    assert raw.close() == []
    by_id = {m["id"]: m for m in raw.got if m.get("id") is not None}
    said = {i: by_id[i]["result"]["content"][0]["text"] for i in paths}
    said["uri"] = by_id["uri"]["error"]["message"]
    for request_id, text in said.items():
        assert text.isprintable(), (request_id, text)
    assert "memory/\\x1b[2J\\x1b[31mnote.md" in said["clear"], said
    assert "memory/a\\nforged: b.md" in said["lines"] and "\\u202e" in said["rtl"], said
    assert "not a regular file: memory/dir\\x1b[2J" in said["folder"], said
    assert "\\x07x/" in said["ends"] and "\\x1b[2Jx\\ny.md" in said["uri"], said
