"""Frames whose bytes are not what JSON-RPC over UTF-8 asks for, sent to a real daemon:
the error says what is wrong and where, and the connection goes on serving."""

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
