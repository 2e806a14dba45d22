"""Conformance of the sans-IO JSON-RPC core (recalld.ipc.protocol): tables and fuzzing.

No sockets: bytes go in, the reply line comes out, and each reply is checked against the
JSON-RPC 2.0 rules (RELIABILITY.md 15 and 16).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.ipc import errors
from recalld.ipc.protocol import (
    ClientProtocol,
    FrameTooLarge,
    LineFramer,
    Notification,
    Request,
    Response,
    ServerProtocol,
    encode,
    error_response,
    event_notification,
    result_response,
)

# ------------------------------------------------------------------------- helpers


def answer_all(protocol: ServerProtocol, line: bytes) -> Any:
    """Run one line through the server core, answering every call with its method name.

    Returns the decoded reply, or None when the core says nothing must be sent.
    """
    incoming = protocol.receive_line(line)
    answers = [
        None if call.is_notification else result_response(call.id, {"method": call.method})
        for call in incoming.calls
    ]
    reply = protocol.reply(incoming, answers)
    if reply is None:
        return None
    assert reply.endswith(b"\n") and reply.count(b"\n") == 1, "one frame per reply"
    return orjson.loads(reply)


def assert_valid_response(obj: Any) -> None:
    """One JSON-RPC 2.0 response object, exactly as the specification shapes it."""
    assert isinstance(obj, dict), obj
    assert obj.get("jsonrpc") == "2.0", obj
    assert "id" in obj, obj
    id_ = obj["id"]
    assert id_ is None or isinstance(id_, str) or (
        isinstance(id_, int) and not isinstance(id_, bool)
    ), obj
    assert ("result" in obj) != ("error" in obj), obj
    assert set(obj) <= {"jsonrpc", "id", "result", "error"}, obj
    if "error" in obj:
        err = obj["error"]
        assert isinstance(err, dict) and isinstance(err.get("code"), int), obj
        assert not isinstance(err["code"], bool)
        assert isinstance(err.get("message"), str) and err["message"], obj
        assert set(err) <= {"code", "message", "data"}, obj


def assert_valid_reply(reply: Any) -> None:
    if isinstance(reply, list):
        assert reply, "a batch answer is never an empty array"
        for item in reply:
            assert_valid_response(item)
    else:
        assert_valid_response(reply)


def req(method: str = "m", id_: Any = 1, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id_}
    obj.update(extra)
    return obj


def note(method: str = "n", **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    obj.update(extra)
    return obj


def line(obj: Any) -> bytes:
    return orjson.dumps(obj)


# ----------------------------------------------------------------- single requests

SINGLE_CASES: list[tuple[str, bytes, Any, int | None]] = [
    # name, line, expected id, expected error code (None: a result)
    ("call with int id", line(req(id_=7)), 7, None),
    ("call with string id", line(req(id_="abc")), "abc", None),
    ("call with null id", line(req(id_=None)), None, None),
    ("call with array params", line(req(params=[1, 2])), 1, None),
    ("call with object params", line(req(params={"a": 1})), 1, None),
    ("call without params", line({"jsonrpc": "2.0", "method": "m", "id": 3}), 3, None),
    ("parse error", b'{"jsonrpc": "2.0", "method": "m", "id": 1', None, errors.PARSE_ERROR),
    ("parse error: garbage", b"\xff\xfe not json", None, errors.PARSE_ERROR),
    ("parse error: NaN", b"NaN", None, errors.PARSE_ERROR),
    ("parse error: too deep", b"[" * 2000, None, errors.PARSE_ERROR),
    ("not an object: number", b"1", None, errors.INVALID_REQUEST),
    ("not an object: string", b'"m"', None, errors.INVALID_REQUEST),
    ("not an object: null", b"null", None, errors.INVALID_REQUEST),
    ("missing jsonrpc", line({"method": "m", "id": 1}), 1, errors.INVALID_REQUEST),
    ("wrong jsonrpc", line({"jsonrpc": "1.0", "method": "m", "id": 1}), 1,
     errors.INVALID_REQUEST),
    ("jsonrpc as number", line({"jsonrpc": 2.0, "method": "m", "id": 1}), 1,
     errors.INVALID_REQUEST),
    ("method missing", line({"jsonrpc": "2.0", "id": 1}), 1, errors.INVALID_REQUEST),
    ("method not a string", line(req(method=1)), 1, errors.INVALID_REQUEST),  # type: ignore[arg-type]
    ("params a string", line(req(params="x")), 1, errors.INVALID_REQUEST),
    ("params null", line(req(params=None)), 1, errors.INVALID_REQUEST),
    ("params a number", line(req(params=3)), 1, errors.INVALID_REQUEST),
    ("id true", line(req(id_=True)), None, errors.INVALID_REQUEST),
    ("id false", line(req(id_=False)), None, errors.INVALID_REQUEST),
    ("id float", line(req(id_=1.5)), None, errors.INVALID_REQUEST),
    ("id integral float", line(req(id_=1.0)), None, errors.INVALID_REQUEST),
    ("id object", line(req(id_={"a": 1})), None, errors.INVALID_REQUEST),
    ("id array", line(req(id_=[1])), None, errors.INVALID_REQUEST),
    ("invalid notification (no method)", line({"jsonrpc": "2.0"}), None,
     errors.INVALID_REQUEST),
    # Valid JSON that orjson does not read: answered with the request's id, not -32700.
    ("lone surrogate in params", rb'{"jsonrpc":"2.0","method":"m","params":{"q":"a\ud800"},'
     rb'"id":4}', 4, errors.INVALID_PARAMS),
    ("lone low surrogate in a key", rb'{"jsonrpc":"2.0","method":"m","params":[{"\udc00":1}],'
     rb'"id":"k"}', "k", errors.INVALID_PARAMS),
    ("lone surrogate in method", rb'{"jsonrpc":"2.0","method":"m\udfff","id":5}', 5,
     errors.INVALID_REQUEST),
    ("lone surrogate in id", rb'{"jsonrpc":"2.0","method":"m","id":"\ud83d"}', None,
     errors.INVALID_REQUEST),
    ("lone surrogate and NaN", rb'{"jsonrpc":"2.0","method":"m","params":["\ud800",NaN],'
     rb'"id":6}', None, errors.PARSE_ERROR),
    ("lone surrogate, cut short", rb'{"jsonrpc":"2.0","method":"m","params":["\ud800"]', None,
     errors.PARSE_ERROR),
]


@pytest.mark.parametrize(("data", "said"), [
    (b"\xef\xbb\xbf" + line(req()), "byte order mark"),
    (b'{"jsonrpc":"2.0","method":"\xff","id":1}', "not valid UTF-8"),
    (b"[" * 2000 + b"]" * 2000, "depth limit exceeded"),
    (b'{"jsonrpc":"2.0","method":"m","params":{"n":1e400},"id":1}', "infinity"),
    (b'{"jsonrpc":"2.0","method":"m","id":1', "unexpected end of data: line 1 column 37"),
    (b'{"jsonrpc":"2.0","method":"m","id":123456789012345678901234567890}',
     "id must be a string, an integer of at most 64 bits, or null"),
    (line(req(id_=True)), "id must be a string, an integer of at most 64 bits, or null"),
    # A lone surrogate (valid JSON) before what is not JSON: the error names the latter.
    (rb'{"jsonrpc":"2.0","method":"m","params":["\ud800",NaN],"id":6}', "NaN is not JSON"),
    (rb'{"jsonrpc":"2.0","method":"m","params":["\ud800",1e999],"id":6}', "infinity"),
    # An integer past a double's range there raised OverflowError: no answer, the
    # connection dropped with the requests that followed.
    (rb'{"jsonrpc":"2.0","method":"m","params":["\ud800",' + b"9" * 400 + b'],"id":6}',
     "number is infinity when parsed as double: 9999"),
    (rb'{"jsonrpc":"2.0","method":"m","params":{"q":"\udfff"},"id":-' + b"1" * 310 + b"}",
     "number is infinity when parsed as double: -111"),
    (rb'{"jsonrpc":"2.0","method":"m","params":["\ud800"]', "Expecting ',' delimiter"),
    (rb'{"jsonrpc":"2.0","method":"m","params":["\ud800"],"id":6} x', "Extra data"),
])
def test_errors_say_what_is_wrong_with_the_frame(data: bytes, said: str) -> None:
    # A bare "parse error" or "bad id" left the sender guessing (valid JSON nested too
    # deep, an editor's byte order mark, an integer id too large to echo exactly).
    reply = answer_all(ServerProtocol(), data)
    assert isinstance(reply, dict) and reply["id"] is None
    assert said in reply["error"]["message"], reply


@pytest.mark.parametrize(("name", "data", "want_id", "want_code"), SINGLE_CASES,
                         ids=[c[0] for c in SINGLE_CASES])
def test_single(name: str, data: bytes, want_id: Any, want_code: int | None) -> None:
    reply = answer_all(ServerProtocol(), data)
    assert isinstance(reply, dict), f"{name}: a single request gets a single object"
    assert_valid_response(reply)
    assert reply["id"] == want_id
    if want_code is None:
        assert reply["result"] == {"method": "m"}
    else:
        assert reply["error"]["code"] == want_code


def test_lone_surrogates_in_a_batch_refuse_only_their_members() -> None:
    ok = rb'{"jsonrpc":"2.0","method":"m","params":{"q":"\ud83d\ude00"},"id":1}'
    bad = rb'{"jsonrpc":"2.0","method":"m","params":{"q":"\ud83d"},"id":2}'
    quiet = rb'{"jsonrpc":"2.0","method":"m","params":{"q":"\ud83d"}}'  # a notification
    big = rb'{"jsonrpc":"2.0","method":"m","id":123456789012345678901234567890}'
    incoming = ServerProtocol().receive_line(b"[" + b",".join([ok, bad, quiet, big]) + b"]")
    assert [(c.id, c.params) for c in incoming.calls] == [(1, {"q": "\U0001f600"})]
    assert [(e["id"], e["error"]["code"]) for e in incoming.errors] == [
        (2, errors.INVALID_PARAMS), (None, errors.INVALID_REQUEST)]
    assert "lone surrogate" in incoming.errors[0]["error"]["message"]
    assert ServerProtocol().receive_line(quiet).errors == []  # a notification: no answer


def test_request_fields_are_kept() -> None:
    incoming = ServerProtocol().receive_line(line(req("daemon.ping", 5, params={"x": [1]})))
    assert incoming.calls == [Request(method="daemon.ping", params={"x": [1]}, id=5)]
    assert not incoming.errors and incoming.fatal is None and not incoming.is_batch


def test_notification_gets_no_reply() -> None:
    protocol = ServerProtocol()
    incoming = protocol.receive_line(line(note("x", params={"a": 1})))
    assert incoming.calls == [Request("x", {"a": 1}, None, is_notification=True)]
    assert answer_all(protocol, line(note())) is None


def test_null_id_is_a_call_not_a_notification() -> None:
    incoming = ServerProtocol().receive_line(line(req(id_=None)))
    assert incoming.calls[0].is_notification is False


# -------------------------------------------------------------------------- batches


def test_empty_batch_is_one_error_not_an_array() -> None:
    reply = answer_all(ServerProtocol(), b"[]")
    assert isinstance(reply, dict)
    assert_valid_response(reply)
    assert reply["id"] is None and reply["error"]["code"] == errors.INVALID_REQUEST


def test_batch_of_notifications_gets_nothing() -> None:
    assert answer_all(ServerProtocol(), line([note("a"), note("b"), note("c")])) is None


def test_mixed_batch() -> None:
    batch = [req("a", 1), note("b"), {"foo": "boo"}, 1, req("c", "x"), req("d", True)]
    reply = answer_all(ServerProtocol(), line(batch))
    assert isinstance(reply, list)
    assert_valid_reply(reply)
    # Two results (a, c) and three errors (the object, the number, the bool id).
    results = {r["id"]: r["result"] for r in reply if "result" in r}
    assert results == {1: {"method": "a"}, "x": {"method": "c"}}
    codes = sorted(r["error"]["code"] for r in reply if "error" in r)
    assert codes == [errors.INVALID_REQUEST] * 3
    assert len(reply) == 5


def test_batch_of_invalid_members_gets_one_error_each() -> None:
    reply = answer_all(ServerProtocol(), b"[1,2,3]")
    assert isinstance(reply, list) and len(reply) == 3
    assert_valid_reply(reply)
    assert all(r["error"]["code"] == errors.INVALID_REQUEST and r["id"] is None for r in reply)


def test_batch_with_parse_error_inside_is_one_parse_error() -> None:
    reply = answer_all(ServerProtocol(), b'[{"jsonrpc": "2.0", "method": "sum", "id": "1"},'
                                         b'{"jsonrpc": "2.0", "method"]')
    assert isinstance(reply, dict) and reply["error"]["code"] == errors.PARSE_ERROR


@pytest.mark.parametrize(("size", "over"), [(1, False), (100, False), (101, True), (5000, True)])
def test_batch_limit(size: int, over: bool) -> None:
    protocol = ServerProtocol(max_batch=100)
    reply = answer_all(protocol, line([req(id_=i) for i in range(size)]))
    assert_valid_reply(reply)
    if over:
        assert isinstance(reply, dict)
        assert reply["error"]["code"] == errors.REQUEST_TOO_LARGE and reply["id"] is None
    else:
        assert isinstance(reply, list) and sorted(r["id"] for r in reply) == list(range(size))


def test_batch_limit_is_configurable() -> None:
    reply = answer_all(ServerProtocol(max_batch=2), line([req(id_=1), req(id_=2), req(id_=3)]))
    assert reply["error"]["code"] == errors.REQUEST_TOO_LARGE


# -------------------------------------------------------------------------- framing

FRAMING_CASES: list[tuple[str, list[bytes], list[bytes]]] = [
    ("one line", [b"abc\n"], [b"abc"]),
    ("two lines in one feed", [b"a\nb\n"], [b"a", b"b"]),
    ("partial then rest", [b"ab", b"c\n"], [b"abc"]),
    ("byte by byte", [bytes([c]) for c in b"xy\nz\n"], [b"xy", b"z"]),
    ("no newline yet", [b"abc"], []),
    ("blank lines dropped", [b"\n\n  \n\ta\n\n"], [b"a"]),
    ("crlf stripped", [b"a\r\n"], [b"a"]),
    ("surrounding whitespace stripped", [b"  {}  \n"], [b"{}"]),
]


@pytest.mark.parametrize(("name", "feeds", "want"), FRAMING_CASES,
                         ids=[c[0] for c in FRAMING_CASES])
def test_framing(name: str, feeds: list[bytes], want: list[bytes]) -> None:
    framer = LineFramer(max_frame_bytes=64)
    got: list[bytes] = []
    for chunk in feeds:
        got += framer.feed(chunk)
    assert got == want


def test_frame_limit_exact_size_is_accepted() -> None:
    framer = LineFramer(max_frame_bytes=10)
    assert framer.feed(b"x" * 10 + b"\n") == [b"x" * 10]
    assert framer.pending_bytes == 0


@pytest.mark.parametrize("chunks", [
    [b"x" * 10 + b"\r\n"], [b"x" * 10 + b"\r", b"\n"], [b"x" * 10, b"\r\n"],
    [b"y\n" + b"x" * 10 + b"\r\n"], [b"y\n" + b"x" * 10 + b"\r", b"\n"]])
def test_frame_limit_is_the_same_for_crlf(chunks: list[bytes]) -> None:
    # The limit is on the frame: one of exactly the limit ends with \r\n as with \n.
    framer = LineFramer(max_frame_bytes=10)
    got = [line for chunk in chunks for line in framer.feed(chunk)]
    assert got[-1] == b"x" * 10 and framer.pending_bytes == 0
    with pytest.raises(FrameTooLarge):
        LineFramer(max_frame_bytes=10).feed(b"x" * 11 + b"\r\n")
    with pytest.raises(FrameTooLarge):
        LineFramer(max_frame_bytes=10).feed(b"y\n" + b"x" * 11 + b"\r")


def test_frame_limit_complete_line_too_long() -> None:
    with pytest.raises(FrameTooLarge):
        LineFramer(max_frame_bytes=10).feed(b"x" * 11 + b"\n")


def test_frame_limit_partial_frames_across_feeds() -> None:
    # A line that never ends must be refused once it passes the limit, without waiting
    # for the newline and without holding more than the limit plus one chunk.
    framer = LineFramer(max_frame_bytes=10)
    assert framer.feed(b"x" * 6) == []
    assert framer.pending_bytes == 6
    with pytest.raises(FrameTooLarge):
        framer.feed(b"x" * 5)


def test_frame_limit_counts_only_the_current_line() -> None:
    framer = LineFramer(max_frame_bytes=10)
    for _ in range(50):
        assert framer.feed(b"y" * 9 + b"\n") == [b"y" * 9]
    assert framer.feed(b"z" * 10) == []
    assert framer.feed(b"\n") == [b"z" * 10]


def test_default_limits() -> None:
    assert LineFramer().max_frame_bytes == 1 << 20
    assert ServerProtocol().max_batch == 100


# ---------------------------------------------------------------------- client side


def test_client_request_ids_are_fresh_and_frames_valid() -> None:
    client = ClientProtocol()
    (id1, f1), (id2, f2) = client.request("a", {"x": 1}), client.request("b")
    assert id1 != id2
    assert f1.endswith(b"\n") and f2.endswith(b"\n")
    server = ServerProtocol()
    calls = server.receive_line(f1.strip()).calls + server.receive_line(f2.strip()).calls
    assert [(c.method, c.params, c.id) for c in calls] == [("a", {"x": 1}, id1), ("b", {}, id2)]


def test_client_notification_frame() -> None:
    frame = ClientProtocol.notification("events.ping", {"a": 1})
    incoming = ServerProtocol().receive_line(frame.strip())
    assert incoming.calls[0].is_notification and incoming.calls[0].params == {"a": 1}


CLIENT_CASES: list[tuple[str, bytes, list[Response | Notification]]] = [
    ("result", encode(result_response(3, {"ok": True})), [Response(3, {"ok": True})]),
    ("error", encode(error_response(4, -32001, "no such workspace")),
     [Response(4, None, {"code": -32001, "message": "no such workspace"})]),
    ("event", event_notification("jobs", {"job_id": "j1", "progress": 0.5}),
     [Notification("event", {"topic": "jobs", "job_id": "j1", "progress": 0.5})]),
    ("batch answer", encode([result_response(1, 1), result_response(2, 2)]),
     [Response(1, 1), Response(2, 2)]),
    ("error not an object", b'{"jsonrpc":"2.0","id":1,"error":"bad"}', [Response(1, None, {})]),
]


@pytest.mark.parametrize(("name", "data", "want"), CLIENT_CASES, ids=[c[0] for c in CLIENT_CASES])
def test_client_receive(name: str, data: bytes, want: list[Any]) -> None:
    assert ClientProtocol.receive_line(data.strip()) == want


@pytest.mark.parametrize("data", [b"{oops", b"[1]", b"3", b"\xff"])
def test_client_receive_malformed_raises_parse_error(data: bytes) -> None:
    with pytest.raises(errors.ParseError):
        ClientProtocol.receive_line(data)


def test_error_round_trip_is_typed() -> None:
    exc = errors.PathOutsideWorkspace("../etc/passwd leaves the workspace", {"path": "../x"})
    wire = orjson.loads(encode(error_response(9, exc.code, exc.message, exc.data)))
    (response,) = ClientProtocol.receive_line(orjson.dumps(wire))
    assert isinstance(response, Response) and response.error is not None
    back = errors.error_from_wire(response.error)
    assert type(back) is errors.PathOutsideWorkspace
    assert isinstance(back, errors.InvalidParams)
    assert back.code == errors.PATH_OUTSIDE_WORKSPACE and back.data == {"path": "../x"}


def test_unknown_error_code_stays_visible() -> None:
    back = errors.error_from_wire({"code": -32077, "message": "from the future"})
    assert type(back) is errors.RecalldError and back.code == -32077


# -------------------------------------------------------------------------- fuzzing

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=5),
    max_leaves=20,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]) | json_scalars,
        "method": st.text(max_size=10) | json_scalars,
        "params": json_values,
        "id": json_scalars | st.lists(json_scalars, max_size=2),
    },
)


def _serve_bytes(chunks: list[bytes], max_frame: int = 256) -> list[Any]:
    framer = LineFramer(max_frame_bytes=max_frame)
    protocol = ServerProtocol(max_batch=8)
    replies: list[Any] = []
    for chunk in chunks:
        try:
            lines = framer.feed(chunk)
        except FrameTooLarge:
            return replies  # the server answers once and closes
        for data in lines:
            reply = answer_all(protocol, data)
            if reply is not None:
                replies.append(reply)
    return replies


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_fuzz_arbitrary_bytes(chunks: list[bytes]) -> None:
    for reply in _serve_bytes(chunks):
        assert_valid_reply(reply)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_fuzz_arbitrary_json_values(value: Any) -> None:
    reply = answer_all(ServerProtocol(max_batch=8), orjson.dumps(value))
    if reply is not None:
        assert_valid_reply(reply)


@settings(max_examples=300, deadline=None)
@given(request_like | st.lists(request_like, max_size=10))
def test_fuzz_request_shaped_objects(value: Any) -> None:
    items = value if isinstance(value, list) else [value]
    reply = answer_all(ServerProtocol(max_batch=8), orjson.dumps(value))
    if reply is None:
        # Silence is right only for notifications: valid requests that carry no id.
        assert items and all(
            isinstance(i, dict) and "id" not in i and i.get("jsonrpc") == "2.0"
            and isinstance(i.get("method"), str) for i in items
        )
        return
    assert_valid_reply(reply)
    if isinstance(value, list) and value and len(value) <= 8:
        expected = sum(1 for i in items if not (
            i.get("jsonrpc") == "2.0" and isinstance(i.get("method"), str) and "id" not in i
            and isinstance(i.get("params", {}), dict | list)))
        assert isinstance(reply, list) and len(reply) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), max_size=20), st.integers(4, 64))
def test_fuzz_framer_matches_split(chunks: list[bytes], limit: int) -> None:
    # Whatever the chunking, the framer yields the stream's non-blank lines, or refuses
    # once one passes the limit.
    stream = b"".join(chunks)
    framer = LineFramer(max_frame_bytes=limit)
    got: list[bytes] = []
    try:
        for chunk in chunks:
            got += framer.feed(chunk)
    except FrameTooLarge:
        parts = stream.split(b"\n")
        assert any(len(p.removesuffix(b"\r")) > limit for p in parts)
        return
    complete = stream.split(b"\n")[:-1]
    assert got == [p.strip() for p in complete if p.strip()]
    last = stream.split(b"\n")[-1]
    assert framer.pending_bytes == len(last) <= limit + last.endswith(b"\r")
