"""Frames at the edges of what JSON-RPC over UTF-8 allows, sent to a real daemon: bytes
that are not UTF-8, lone surrogates nested deep. The error says what is wrong and where,
the same frame gets the same answer whichever parser reads it, and the connection goes
on serving."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from recalld.ipc import errors

if TYPE_CHECKING:
    from conftest import DaemonHandle


# (what comes before, the bytes that are not UTF-8, what follows)
NOT_UTF8 = [
    # Latin-1 text, as an editor or a shell in another locale writes it.
    (b'{"jsonrpc":"2.0","method":"daemon.ping","params":{},"id":"caf', b"\xe9", b'"}'),
    # A multibyte sequence cut short after valid non-ASCII text, in a key.
    ('{"jsonrpc":"2.0","method":"daemon.ping","id":1,"ключ'.encode(), b"\xd0", b'":1}'),
    # An overlong encoding of "/" and an encoded surrogate: forms UTF-8 forbids.
    (b'{"jsonrpc":"2.0","method":"', b"\xc0\xaf", b'daemon.ping","id":2}'),
    (b'{"jsonrpc":"2.0","method":"daemon.ping","id":"', b"\xed\xa0\x80", b'"}'),
    # Outside any string.
    (b"", b"\xff", b'{"jsonrpc":"2.0","method":"daemon.ping","id":3}'),
]


@pytest.mark.parametrize(("before", "bad", "after"), NOT_UTF8)
def test_a_frame_that_is_not_utf8_is_answered_with_the_bytes_and_where(
        daemon: DaemonHandle, before: bytes, bad: bytes, after: bytes) -> None:
    # orjson's own message said "surrogates not allowed" at "char 0" whatever and wherever
    # the bytes were, leaving the sender to search its whole frame.
    with daemon.connect() as conn:
        conn.send_bytes(before + bad + after + b"\n")
        answer = conn.recv()
        assert answer["id"] is None and answer["error"]["code"] == errors.PARSE_ERROR, answer
        message = answer["error"]["message"]
        assert f"not valid UTF-8 (\\x{bad[0]:02x}" in message, message
        at = len(before.decode())  # in characters, as for the other parse errors
        assert message.endswith(f"line 1 column {at + 1} (char {at})"), message
        assert "surrogates not allowed" not in message, message
        assert conn.call("daemon.ping")["pong"] is True  # the connection still serves


@pytest.mark.parametrize("text", [r'"\ud800"', '"plain"'])
def test_nesting_is_limited_alike_with_or_without_a_lone_surrogate(
        daemon: DaemonHandle, text: str) -> None:
    # A frame holding a lone surrogate is read by a second parser, whose depth limit was
    # the interpreter's recursion limit: from about 980 levels down (1024 is the limit)
    # such a frame was answered as a parse error, with no id, instead of -32602.
    def frame(levels: int, id_: int) -> bytes:  # 3 levels around the nested arrays
        return (b'{"jsonrpc":"2.0","method":"memory.search","params":{"agent_id":"default",'
                b'"query":[' + text.encode() + b',' + b"[" * levels + b"]" * levels
                + b'],"x":1},"id":' + str(id_).encode() + b"}\n")

    with daemon.connect() as conn:
        for levels, id_ in ((1000, 1), (1021, 2)):
            conn.send_bytes(frame(levels, id_))
            answer = conn.recv()
            assert answer["id"] == id_, answer
            assert answer["error"]["code"] == errors.INVALID_PARAMS, answer
        conn.send_bytes(frame(1022, 3))
        answer = conn.recv()
        assert answer["id"] is None and answer["error"]["code"] == errors.PARSE_ERROR, answer
        assert "depth limit exceeded" in answer["error"]["message"], answer
        assert conn.call("daemon.ping")["pong"] is True
