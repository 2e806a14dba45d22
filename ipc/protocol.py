"""The JSON-RPC 2.0 core, sans I/O: bytes in, requests and responses out.

Framing is one JSON value per line (``\\n``). The same code serves the daemon
(:class:`ServerProtocol`) and the clients (:class:`ClientProtocol`); neither touches a
socket, so conformance is tested with tables and fuzzing alone.

Rules kept exactly as the specification says:
- a parse error answers with ``id: null``;
- an empty batch is one Invalid Request error, not an array;
- a batch of notifications only gets no answer at all;
- an invalid member of a batch gets its own error inside the answer array.
"""

# Annotations are evaluated, not postponed: a TypedDict compiles each string
# annotation into a ForwardRef at import, which every client process would pay.
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, TypeGuard

import orjson

from recalld.ipc import errors
from recalld.ipc.answers import JsonObject
from recalld.ipc.errors import ErrorObject

JSONRPC = "2.0"
DEFAULT_MAX_FRAME_BYTES = 1 << 20
#: The values ``[daemon] max_request_bytes`` may take (the daemon refuses others at its
#: start; a client keeps the default limit for them).
MAX_REQUEST_BYTES_RANGE = (64 << 10, 1 << 30)
DEFAULT_MAX_BATCH = 100
#: The most hits one ``memory.search`` hands back (the daemon's cap): a larger
#: ``max_results`` asks no more.
MAX_RESULTS = 100
#: The most records one ``memory.changes`` lists (auto_memory keeps 2,000 of its own).
MAX_LISTED_CHANGES = 500
#: The most runs one ``dream.runs`` lists.
MAX_DREAM_RUNS = 200
_CR = ord("\r")

Id = int | str | None


class ErrorResponse(TypedDict):
    jsonrpc: str
    error: ErrorObject
    id: Id


class ResultResponse(TypedDict):
    jsonrpc: str
    result: object  # what the handler returned: any JSON value
    id: Id


#: The answer to one call.
Answer = ResultResponse | ErrorResponse


class FrameTooLarge(Exception):
    """A line grew past the frame limit; the connection must answer once and close."""


class LineFramer:
    """Splits a byte stream into lines, holding at most ``max_frame_bytes`` of a partial line."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        # Bytes of the partial line already known to hold no newline: a line that
        # arrives in many small pieces is scanned once, not once per piece.
        self._scanned = 0

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete line (without the newline), blank lines dropped.

        Raises :class:`FrameTooLarge` once a line exceeds the limit. The limit is on the
        frame, not on the line's end: ``\r\n`` counts no more than ``\n``.
        """
        if not self._buffer and data.find(b"\n") == len(data) - 1 >= 0:
            # Exactly one whole line, the usual case: no copy through the buffer.
            if len(data) - 1 - data.endswith(b"\r\n") > self.max_frame_bytes:
                raise FrameTooLarge
            line = data[:-1].strip()
            return [line] if line else []
        self._buffer += data
        lines: list[bytes] = []
        start = 0
        search_from = self._scanned
        while True:
            end = self._buffer.find(b"\n", search_from)
            if end < 0:
                break
            if end - start - (end > start and self._buffer[end - 1] == _CR) \
                    > self.max_frame_bytes:
                raise FrameTooLarge
            line = bytes(self._buffer[start:end]).strip()
            if line:
                lines.append(line)
            start = search_from = end + 1
        del self._buffer[:start]
        self._scanned = len(self._buffer)
        if len(self._buffer) - self._buffer.endswith(b"\r") > self.max_frame_bytes:
            raise FrameTooLarge  # (a frame of the limit may wait for the \n of its \r\n)
        return lines


    def finish(self) -> bytes:
        """At the end of the stream: the partial line held (stripped; ``b""`` if none),
        forgotten. A writer may end its last line with the stream instead of a newline."""
        line = bytes(self._buffer).strip()
        self._buffer.clear()
        self._scanned = 0
        return line


@dataclass(frozen=True, slots=True)
class Request:
    """A call to run. ``id`` is absent for notifications (``is_notification``)."""

    method: str
    params: JsonObject | list[object]  # as decoded: handlers check what they read
    id: Id = None
    is_notification: bool = False


@dataclass(slots=True)
class Incoming:
    """What one line asked for: calls to run, and errors already decided."""

    calls: list[Request] = field(default_factory=list)
    # Pre-built error responses for members that were invalid, in arrival order.
    errors: list[ErrorResponse] = field(default_factory=list)
    is_batch: bool = False
    # Set when the line itself must be answered with a single error (parse error,
    # empty batch, batch too large); calls and errors are then empty.
    fatal: ErrorResponse | None = None


def error_response(id_: Id, code: int, message: str, data: object = None) -> ErrorResponse:
    return {"jsonrpc": JSONRPC, "error": errors.error_object(code, message, data), "id": id_}


def result_response(id_: Id, result: object) -> ResultResponse:
    return {"jsonrpc": JSONRPC, "result": result, "id": id_}


def encode(message: object) -> bytes:
    """One frame: compact JSON and a newline."""
    return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)


def _encode_request(message: Mapping[str, object]) -> bytes:
    """``encode`` for a call; params JSON cannot carry are InvalidParams, raised here,
    and a method name it cannot carry InvalidRequest (as the daemon answers either).
    The errors quote the method with its lone surrogates escaped, so that printing or
    logging them does not fail in turn."""
    try:
        data = encode(message)
    except TypeError as exc:
        method = _printable(message["method"])
        if method != message["method"]:
            raise errors.InvalidRequest(
                f"{method}: the method cannot be sent; its name must be valid UTF-8 text "
                "(a lone surrogate, \\ud800-\\udfff without its pair, is not)") from None
        # Most often text holding lone surrogates: bytes that were not UTF-8, as Python
        # decodes a command line or a UTF-8 locale's standard input; or a number past the
        # 64 bits JSON integers are read into (``-n 99999999999999999999``).
        rule = ("numbers must lie within -2**63 to 2**64-1" if "Integer" in str(exc)
                else "text must be valid UTF-8" if "surrogate" in str(exc) else "")
        raise errors.InvalidParams(
            f"{method}: the params cannot be sent ({exc})"
            + (f"; {rule}" if rule else "")) from None
    # orjson writes NaN and infinities as null, which a method takes as a param not
    # given (``min_score=inf`` would drop nothing): refused instead. Looked for only
    # when the frame holds a null at all.
    if b"null" in data and _non_finite(message.get("params")):
        raise errors.InvalidParams(f"{message['method']}: the params cannot be sent; "
                                   "numbers must be finite (JSON has no NaN or infinity)")
    return data


def _printable(text: object) -> object:
    """``text`` with each lone surrogate written as its escape (``\\ud800``); what is
    not text, as it is."""
    if not isinstance(text, str):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _non_finite(value: object) -> bool:
    """Does ``value`` hold a float that is NaN or infinite, at any depth?"""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    return False


def _valid_id(value: object) -> TypeGuard[Id]:
    # Booleans are ints in Python but not valid ids; floats are discouraged by the spec
    # and refused here so answers always echo an exact id.
    return value is None or isinstance(value, str) or (
        isinstance(value, int) and not isinstance(value, bool)
    )


def _member(obj: object) -> Request | ErrorResponse:
    """Validate one request object; return it, or the error response to send."""
    if not isinstance(obj, dict):
        return error_response(None, errors.INVALID_REQUEST, "invalid request: not an object")
    has_id = "id" in obj
    raw_id = obj.get("id")
    id_ = raw_id if _valid_id(raw_id) else None
    if obj.get("jsonrpc") != JSONRPC:
        return error_response(id_, errors.INVALID_REQUEST, 'invalid request: jsonrpc must be "2.0"')
    if has_id and not _valid_id(raw_id):
        return error_response(None, errors.INVALID_REQUEST, "invalid request: id must be a "
                              "string, an integer of at most 64 bits, or null")
    method = obj.get("method")
    if not isinstance(method, str):
        return error_response(
            id_, errors.INVALID_REQUEST, "invalid request: method must be a string"
        )
    params = obj.get("params", {})
    if not isinstance(params, dict | list):
        return error_response(
            id_, errors.INVALID_REQUEST, "invalid request: params must be an object or array"
        )
    return Request(method=method, params=params, id=id_, is_notification=not has_id)


_LONE_SURROGATE = ("a \\u escape names a lone surrogate (\\ud800-\\udfff without its pair), "
                   "which UTF-8 cannot carry")


def _read_int(text: str) -> int | float:
    # As orjson reads them: an integer past 64 bits is a float (and refused as an id),
    # and one past the range of a double does not parse.
    value = int(text)
    if -(1 << 63) <= value < (1 << 64):
        return value
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"number is infinity when parsed as double: {text[:40]}"
                         + ("..." if len(text) > 40 else "")) from None


def _read_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number is infinity when parsed as double: {text}")
    return value


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# orjson's nesting limit, kept for the frames json reads in its place.
MAX_JSON_DEPTH = 1024
_TOO_DEEP = f"depth limit exceeded: arrays and objects nest more than {MAX_JSON_DEPTH} deep"


def _with_lone_surrogates(line: bytes) -> object:
    """``line``, which orjson refused for a surrogate, read as JSON whose strings may
    hold lone surrogates (``"\\ud800"``: valid JSON that orjson refuses); the
    :class:`ValueError` saying why if it is not JSON at all (orjson stopped at the
    surrogate, before what is wrong: a NaN, a frame cut short), or that it is not UTF-8
    (orjson's own message for that names neither the bytes nor where they are)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _not_utf8(exc)
    limit = sys.getrecursionlimit()
    try:
        # json nests on the interpreter's stack: room for orjson's depth whatever the
        # caller's own depth (the default limit cut frames short at ~980 levels, their
        # lone surrogates then answered as a parse error).
        sys.setrecursionlimit(limit + MAX_JSON_DEPTH + 64)
        value: object = json.loads(text, parse_int=_read_int,
                                   parse_float=_read_float, parse_constant=_refuse_constant)
    except ValueError as exc:
        return exc
    except RecursionError:
        return ValueError(_TOO_DEEP)
    finally:
        sys.setrecursionlimit(limit)
    return ValueError(_TOO_DEEP) if _deeper_than(value, MAX_JSON_DEPTH) else value


def _deeper_than(value: object, most: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``most`` levels deep."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth == most:
                return True
            stack += ((child, depth + 1)
                      for child in (item.values() if isinstance(item, dict) else item))
    return False


def _not_utf8(exc: UnicodeDecodeError) -> ValueError:
    """What is wrong and where, as orjson says it of other errors: the first bytes that
    are not UTF-8, and the line, column and character they start at."""
    chars = len(exc.object[:exc.start].decode("utf-8"))  # valid up to there
    bad = "".join(f"\\x{byte:02x}" for byte in exc.object[exc.start:exc.end])
    return ValueError(f"bytes that are not valid UTF-8 ({bad}, {exc.reason}): "
                      f"line 1 column {chars + 1} (char {chars})")


def _lone_surrogate(value: object) -> bool:
    """Does ``value`` hold, at any depth (keys too), text with a lone surrogate?"""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    return False


def _member_text(obj: object) -> Request | ErrorResponse | None:
    """:func:`_member` for a value whose text may hold lone surrogates: a member holding
    one is refused with its id (no id if the id holds it); a notification, unanswered."""
    if isinstance(obj, dict) and _lone_surrogate(obj.get("id")):
        return error_response(None, errors.INVALID_REQUEST,
                              f"invalid request: id must be valid Unicode text: {_LONE_SURROGATE}")
    member = _member(obj)
    if not isinstance(member, Request):
        return member
    if _lone_surrogate(member.method):
        return error_response(member.id, errors.INVALID_REQUEST, "invalid request: method "
                              f"must be valid Unicode text: {_LONE_SURROGATE}")
    if _lone_surrogate(member.params):
        return None if member.is_notification else error_response(
            member.id, errors.INVALID_PARAMS,
            f"invalid params: text must be valid Unicode: {_LONE_SURROGATE}")
    return member


class ServerProtocol:
    """Turns request lines into :class:`Incoming` and assembles the answer line."""

    def __init__(self, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.max_batch = max_batch

    def receive_line(self, line: bytes) -> Incoming:
        member_of: Callable[[object], Request | ErrorResponse | None] = _member
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            # Valid JSON orjson refuses: answered with its id, as its member's error.
            obj = _with_lone_surrogates(line) if "surrogate" in str(exc) else exc
            if isinstance(obj, ValueError):  # (JSONDecodeError is one)
                # What is wrong and where: a byte order mark, bytes that are not UTF-8,
                # NaN, nesting over 1024 deep, a frame cut short...
                return Incoming(fatal=error_response(None, errors.PARSE_ERROR,
                                                     f"parse error: {obj}"))
            member_of = _member_text
        if isinstance(obj, list):
            if not obj:
                return Incoming(
                    fatal=error_response(
                        None, errors.INVALID_REQUEST, "invalid request: empty batch"
                    )
                )
            if len(obj) > self.max_batch:
                return Incoming(
                    fatal=error_response(
                        None,
                        errors.REQUEST_TOO_LARGE,
                        f"batch of {len(obj)} requests exceeds the limit of {self.max_batch}",
                    )
                )
            incoming = Incoming(is_batch=True)
            for item in obj:
                member = member_of(item)
                if isinstance(member, Request):
                    incoming.calls.append(member)
                elif member is not None:
                    incoming.errors.append(member)
            return incoming
        member = member_of(obj)
        if isinstance(member, Request):
            return Incoming(calls=[member])
        return Incoming(errors=[member] if member is not None else [])

    def refuse(self, line: bytes, code: int, message: str) -> bytes | None:
        """The line that answers ``line`` when none of its calls may run: each request
        gets the error ``code``, invalid ones the error :meth:`reply` gives them, and
        notifications nothing (``None`` when nothing is owed)."""
        incoming = self.receive_line(line)
        return self.reply(incoming, [
            None if call.is_notification else error_response(call.id, code, message)
            for call in incoming.calls])

    @staticmethod
    def reply(incoming: Incoming, answers: Sequence[Answer | None]) -> bytes | None:
        """The line to send back, given one answer per call (``None`` for notifications).

        Returns ``None`` when nothing must be sent (notifications only).
        """
        if incoming.fatal is not None:
            return encode(incoming.fatal)
        responses: list[Answer] = [a for a in answers if a is not None]
        responses += incoming.errors
        if not responses:
            return None
        if incoming.is_batch:
            return encode(responses)
        return encode(responses[0])


@dataclass(frozen=True, slots=True)
class Response:
    """An answer to one of our requests (client side)."""

    id: Id
    result: object = None  # any JSON value: the method's parser checks it
    error: Mapping[str, object] | None = None  # as received: read leniently


@dataclass(frozen=True, slots=True)
class Notification:
    """A server-to-client notification (client side), e.g. method ``event``."""

    method: str
    params: object  # as received: an event's parser checks it


class ClientProtocol:
    """Builds request frames with fresh ids and parses what the daemon sends back."""

    def __init__(self) -> None:
        self._ids: Iterator[int] = itertools.count(1)

    def request(self, method: str, params: Mapping[str, object] | Sequence[object] | None = None
                ) -> tuple[int, bytes]:
        id_ = next(self._ids)
        return id_, _encode_request(
            {"jsonrpc": JSONRPC, "method": method, "params": {} if params is None else params,
             "id": id_}
        )

    @staticmethod
    def notification(method: str, params: Mapping[str, object] | None = None) -> bytes:
        return _encode_request({"jsonrpc": JSONRPC, "method": method, "params": params or {}})

    @staticmethod
    def receive_line(line: bytes) -> list[Response | Notification]:
        """Parse one line from the daemon. Malformed lines raise :class:`errors.ParseError`."""
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise errors.ParseError(f"daemon sent invalid JSON: {exc}") from None
        items = obj if isinstance(obj, list) else [obj]
        out: list[Response | Notification] = []
        for item in items:
            if not isinstance(item, dict):
                raise errors.ParseError("daemon sent a non-object message")
            if "method" in item and "id" not in item:
                out.append(Notification(method=str(item["method"]), params=item.get("params")))
            elif "error" in item:
                err = item["error"] if isinstance(item["error"], dict) else {}
                out.append(Response(id=item.get("id"), error=err))
            else:
                out.append(Response(id=item.get("id"), result=item.get("result")))
        return out


def event_notification(topic: str, payload: Mapping[str, object]) -> bytes:
    """A server-to-client ``event`` notification frame."""
    return encode({"jsonrpc": JSONRPC, "method": "event", "params": {"topic": topic, **payload}})
