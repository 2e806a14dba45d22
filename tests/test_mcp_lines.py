"""The MCP bridge's stdio, line by line: what a client may write on it, and what it gets.

The bridge is a real ``python -m recalld.ipc.mcp`` subprocess on a real daemon, spoken to
in raw bytes (the SDK's own client writes only well-formed messages): each line is
written, then the answers it must get are read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonHandle

from recalld.ipc.client import Client

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}}


def _call(request_id: int | str, name: str, arguments: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}}).encode() + b"\n"


class Raw:
    """A bridge on ``daemon`` spoken to in raw lines; its stderr goes to mcp-lines.log."""

    def __init__(self, daemon: DaemonHandle) -> None:
        with open(daemon.home / "mcp-lines.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "recalld.ipc.mcp", "--agent", "coder",
                 "--socket", str(daemon.socket_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=daemon.env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        #: Every message the bridge wrote, in order.
        self.got: list[dict[str, Any]] = []
        self.send(json.dumps(INIT).encode() + b"\n", [0])
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n', [])

    def send(self, line: bytes, answered: list[int | str | None]) -> None:
        """Write ``line``, then read until each id of ``answered`` has its answer (a
        null id once for each ``None``); a bridge that answers nothing is stopped by
        the test's time cap."""
        self.stdin.write(line)
        self.stdin.flush()
        waiting = list(answered)
        while waiting:
            message = json.loads(self.stdout.readline())
            self.got.append(message)
            if message.get("id") in waiting:
                waiting.remove(message.get("id"))

    def close(self) -> list[dict[str, Any]]:
        """Close stdin; what the bridge wrote besides the answers waited for."""
        self.stdin.close()
        rest = [json.loads(line) for line in self.stdout.read().splitlines()]
        self.stdout.close()
        assert self.proc.wait(timeout=60) == 0
        return rest


def test_every_request_the_sdk_cannot_read_is_answered_and_the_bridge_goes_on(
        daemon: DaemonHandle) -> None:
    raw = Raw(daemon)
    nothing: list[int | str | None] = []
    raw.send(b"this is not json\n", [None])
    raw.send(b"\xff\xfe{not utf-8 either}\n", [None])
    raw.send(b"\n", nothing)
    raw.send(b'{"jsonrpc":"2.0","id":"shape","method":"tools/call","params":"x"}\n',
             ["shape"])
    raw.send(b'{"id":"version","method":"tools/list"}\n', ["version"])
    raw.send(b'{"jsonrpc":"2.0","id":"method","method":["tools/list"]}\n', ["method"])
    # MCP has no batches: each request in one gets its own answer.
    raw.send(b'[{"jsonrpc":"2.0","id":7,"method":"tools/list"},'
             b'{"jsonrpc":"2.0","id":8,"method":"ping"},'
             b'{"jsonrpc":"2.0","method":"notifications/progress"}]\n', [7, 8])
    # An id that is neither a string nor an integer: the SDK took these for
    # notifications; they are answered with a null id.
    for bad_id in (b'{"n":1}', b"2.5", b"false"):
        raw.send(b'{"jsonrpc":"2.0","id":%s,"method":"tools/list"}\n' % bad_id, [None])
    # Nested deeper than the SDK reads JSON.
    raw.send(_call("deep", "memory_search", {"query": json.loads("[" * 250 + "]" * 250)}),
             ["deep"])
    # Half of a surrogate pair, as a JavaScript host cuts an emoji: read as U+FFFD.
    raw.send(_call("half", "memory_search", {"query": "tandem CUT"}).replace(
        b"CUT", b"\\ud83d"), ["half"])
    raw.send(_call("note", "memory_add_note", {"content": "Our tandem is called Kestrel CUT"},
                   ).replace(b"CUT", b"\\ud83d, the \\ud83d\\udeb2 one"), ["note"])
    # An answer to nothing (a response of the wrong shape) is not answered.
    raw.send(b'{"jsonrpc":"2.0","id":"resp","result":"ok"}\n', nothing)
    raw.send(_call("after", "memory_search", {"query": "Kestrel tandem"}), ["after"])
    assert raw.close() == []

    by_id = {m["id"]: m for m in raw.got if m.get("id") is not None}
    for request_id in ("shape", "version", "method", 7, 8, "deep"):
        assert by_id[request_id]["error"]["code"] == -32600, by_id[request_id]
    assert "params" in by_id["shape"]["error"]["message"]
    assert '"jsonrpc" must be "2.0"' in by_id["version"]["error"]["message"]
    assert "batches" in by_id[7]["error"]["message"]
    assert "recursion" in by_id["deep"]["error"]["message"]
    for request_id in ("half", "note", "after"):
        assert not by_id[request_id]["result"]["isError"], by_id[request_id]
    nulls = [m["error"] for m in raw.got if "id" in m and m["id"] is None]
    assert [e["code"] for e in nulls] == [-32700, -32700, -32600, -32600, -32600], nulls
    assert all('"id" must be' in e["message"] for e in nulls[2:]), nulls
    assert "resp" not in by_id

    stored = "Our tandem is called Kestrel \ufffd, the \U0001f6b2 one"
    assert stored in by_id["after"]["result"]["content"][0]["text"]
    with Client(daemon.socket_path) as c:  # the daemon's own search finds the same
        assert any(stored in hit.text for hit in c.search("coder", "Kestrel tandem"))
    log = (daemon.home / "mcp-lines.log").read_text(encoding="utf-8")
    assert "recalld mcp: refused a line of 16 characters (not JSON)" in log
    assert "this is not json" not in log, log  # what a line says is not logged
    assert "Traceback" not in log, log


@pytest.mark.parametrize(("line", "forward", "answers"), [
    # Read by the SDK: handed on as it is, answered by nothing here.
    ('{"jsonrpc":"2.0","id":1,"method":"ping"}', "same", []),
    ('{"jsonrpc":"2.0","method":"notifications/x","params":{"note":"\\"id\\": 3"}}',
     "same", []),
    ('{"jsonrpc":"2.0","id":"r","result":{}}', "same", []),
    # Half a surrogate pair (in a key too) is read as U+FFFD; a whole pair is kept.
    ('{"jsonrpc":"2.0","id":2,"method":"m","params":{"\\udc00k":"a\\ud83d\\ude00\\ud83d"}}',
     '{"jsonrpc": "2.0", "id": 2, "method": "m", "params": {"\ufffdk": "a\U0001f600\ufffd"}}',
     []),
    # Answered here, with the request's id when it can be read.
    ("{", None, [(None, -32700)]),
    ('{"jsonrpc":"2.0","id":3,"method":"m","params":[1]}', None, [(3, -32600)]),
    ('{"jsonrpc":"1.0","id":"v","method":"m"}', None, [("v", -32600)]),
    ('{"jsonrpc":"2.0","id":null,"method":"m"}', None, [(None, -32600)]),
    ('{"jsonrpc":"2.0","method":"m","params":"x"}', None, [(None, -32600)]),
    ('[{"jsonrpc":"2.0","id":4,"method":"m"},{"jsonrpc":"2.0","id":5,"result":{}}]', None,
     [(4, -32600)]),
    ('[{"jsonrpc":"2.0","method":"m"}]', None, [(None, -32600)]),
    ('"ping"', None, [(None, -32600)]),
    # A response of the wrong shape: JSON-RPC answers no response.
    ('{"jsonrpc":"2.0","id":6,"result":"ok"}', None, [None]),
    # JSON nested deeper than Python reads: answered with the id its start shows (a
    # parse error's null id left the client waiting for its answer for ever).
    ('{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"x":'
     + "[" * 5000 + "]" * 5000 + "}}", None, [(9, -32600)]),
    ('{"jsonrpc":"2.0","method":"m","params":{"id":3,"x":' + "[" * 5000 + "]" * 5000 + "}}",
     None, [(None, -32600)]),
    ('{"jsonrpc":"2.0","id":10,"result":' + "[" * 5000 + "]" * 5000 + "}", None, [None]),
])
def test_check_line(line: str, forward: str | None,
                    answers: list[tuple[int | str | None, int] | None]) -> None:
    from recalld.ipc.mcp_lines import check_line

    got, refusals = check_line(line)
    assert got == (line if forward == "same" else forward)
    assert [None if answer is None else (answer.id, answer.error.code)
            for answer, _ in refusals] == answers
