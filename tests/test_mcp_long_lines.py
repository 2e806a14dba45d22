"""The MCP bridge holds at most ``MAX_LINE_BYTES`` of one line its client writes: a longer
line is read through without being kept, answered with an error (the request's id when
its start shows it) and the bridge reads on. A query that fits a line but not one request
to the daemon is searched by its start and end."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

from conftest import DaemonHandle
from test_mcp_lines import Raw, _call

from recalld.ipc.mcp_lines import MAX_LINE_BYTES, LongLine, bounded_lines


def test_a_line_longer_than_the_bound_is_answered_and_the_bridge_goes_on(
        daemon: DaemonHandle) -> None:
    raw = Raw(daemon)
    # A note the bridge would write in parts, on a line past the bound.
    fact = "- The glassblower's furnace runs at 1,100 °C « chaud » 🔥\n"
    content = fact * (MAX_LINE_BYTES // len(fact.encode()) + 1000)
    raw.send(_call("long", "memory_add_note", {"content": content}), ["long"])
    # The id after the arguments: the arguments' own "id" is not taken for it.
    line = json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": {
        "name": "memory_search", "arguments": {"query": "x" * MAX_LINE_BYTES, "id": 5}},
        "id": "late"}).encode() + b"\r\n"
    raw.send(line, [None])
    raw.send(_call("after", "memory_add_note", {"content": fact}), ["after"])
    raw.send(_call("found", "memory_search", {"query": "glassblower furnace"}), ["found"])
    assert raw.close() == []

    by_id = {m["id"]: m for m in raw.got if m.get("id") is not None}
    error = by_id["long"]["error"]
    assert error["code"] == -32600 and f"longer than the {MAX_LINE_BYTES}" in error["message"]
    (null,) = [m["error"] for m in raw.got if "id" in m and m["id"] is None]
    assert null["code"] == -32600 and "bytes is longer" in null["message"]
    assert not by_id["after"]["result"]["isError"], by_id["after"]
    # Only the note written after it: nothing of the long line reached the daemon.
    assert by_id["found"]["result"]["content"][0]["text"].count("glassblower") == 1
    log = (daemon.home / "mcp-lines.log").read_text(encoding="utf-8")
    assert "refused a line of" in log and "Traceback" not in log, log


async def _lines(chunks: Sequence[bytes], max_bytes: int) -> list[str | LongLine]:
    left = list(chunks)

    async def read(n: int) -> bytes:
        assert n > 0
        return left.pop(0) if left else b""

    return [line async for line in bounded_lines(read, max_bytes)]


@pytest.mark.parametrize(("chunks", "expected"), [
    # Lines across reads, several in one, the last without its newline.
    ([b'{"a":', b'1}\n{"b"', b':2}\n{"c":3}\n{"d"', b":4}"],
     ['{"a":1}\n', '{"b":2}\n', '{"c":3}\n', '{"d":4}']),
    # A byte that is not UTF-8, and a CRLF.
    ([b"\xff\xfe{}\r\n"], ["\ufffd\ufffd{}\r\n"]),
    # Exactly the bound is kept; one byte more is a long line, read through, and the
    # line after it in the same read is kept.
    ([b"0123456789\n", b"01234567890", b"12\nok\n"],
     ["0123456789\n", LongLine(b"01234567890", 13), "ok\n"]),
    # A long line whose newline comes in the read that takes it past the bound.
    ([b"abc", b"defghijkl\nok"], [LongLine(b"abcdefghijkl\n", 12), "ok"]),
    # A long line over many reads, the newline at the start of one.
    ([b'{"id":9', b"x" * 30, b"y" * 7, b"\nnext\n"],
     [LongLine(b'{"id":9' + b"x" * 30, 44), "next\n"]),
    # A long line at the end, without newline.
    ([b"z" * 25], [LongLine(b"z" * 25, 25)]),
])
async def test_bounded_lines(chunks: list[bytes], expected: list[str | LongLine]) -> None:
    assert await _lines(chunks, 10) == expected


@pytest.mark.parametrize(("head", "expected"), [
    (b'{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"id":3', 17),
    (b'{"jsonrpc":"2.0","id":"a \\"b\\"","method":"x"', 'a "b"'),
    (b'{"jsonrpc":"2.0","method":"x","params":{"id":3', None),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"x"', None),
])
def test_a_long_line_is_answered_with_its_id(head: bytes, expected: int | str | None) -> None:
    answer = LongLine(head, MAX_LINE_BYTES + 1).answer()
    assert answer is not None and answer.id == expected and answer.error.code == -32600


def test_a_long_response_is_not_answered() -> None:
    assert LongLine(b'{"jsonrpc":"2.0","id":4,"result":{"x":"', MAX_LINE_BYTES + 1
                    ).answer() is None


def test_a_query_larger_than_one_request_is_searched_by_its_start_and_end(
        daemon: DaemonHandle) -> None:
    # A host pastes a long log as the query: the tools answered with the daemon's
    # "request of N bytes exceeds the limit ... ([daemon] max_request_bytes)".
    raw = Raw(daemon)
    raw.send(_call("note", "memory_add_note",
                   {"content": "The heron-relay service restarts at dawn."}), ["note"])
    # Past the daemon's default bound of one request (1 MiB), within one MCP line.
    query = "heron-relay " + "Zeile ohne Bedeutung « » 🪶\n" * 40_000 + "restarts"
    raw.send(_call("search", "memory_search", {"query": query}), ["search"])
    raw.send(_call("recall", "memory_recall", {"query": query}), ["recall"])
    raw.send(json.dumps({"jsonrpc": "2.0", "id": "prompt", "method": "prompts/get",
                         "params": {"name": "recall", "arguments": {"query": query}}},
                        ).encode() + b"\n", ["prompt"])
    assert raw.close() == []

    by_id = {m["id"]: m for m in raw.got if m.get("id") is not None}
    for tool in ("search", "recall"):
        result = by_id[tool]["result"]
        assert not result["isError"] and "heron-relay" in result["content"][0]["text"], result
    said = by_id["prompt"]["result"]["messages"][0]["content"]["text"]
    assert "heron-relay service restarts" in said, by_id["prompt"]
