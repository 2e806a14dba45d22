"""The lines ``recalld mcp`` reads from its MCP client, checked before the SDK sees them.

The SDK's stdio transport drops, without a word, every line it cannot read as one
JSON-RPC message: a request of the wrong shape (``params`` not an object, no
``jsonrpc``), a batch (MCP has none), text that is not JSON, and a string holding half
of a surrogate pair (``"\\ud83d"``, which a JavaScript host makes by cutting a text
between the two halves of an emoji). A request among them never got an answer, and its
client waited for it for ever.

:class:`CheckedLines` stands between stdin and the SDK. A line the SDK reads goes
through unchanged. Half a surrogate pair becomes U+FFFD, as a byte that is not UTF-8
already does, and the request is served. Every other line is answered here: Invalid
Request naming what is wrong, with the request's id (each request of a batch its own),
or with a null id when none can be read (Parse error for text that is not JSON). A
response of the wrong shape gets no answer (JSON-RPC answers none); stderr, the MCP
client's log, says so, with the line's length and what is wrong with it, never its text
(a conversation handed to a tool holds what the user typed, keys included).

The lines come from :func:`bounded_lines`, which keeps at most :data:`MAX_LINE_BYTES` of
one: a longer line (the SDK read it whole, however long) is read through, answered
Invalid Request with its id when its start shows it, and passed by.

At the end of stdin the SDK cancels the requests it still serves (answering "Connection
closed", or nothing for one it had not started), so a script that writes its requests and
closes its end would lose their answers. :class:`CheckedLines` therefore ends its lines
only once every request it handed on has been answered (:class:`InFlight`, told of each
answer by :class:`AnsweringStream`), or after :data:`EOF_GRACE_S`.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

import anyio
import mcp.types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.shared._stream_protocols import WriteStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

#: The longest line read from the client (a whole conversation for ``memory_add_turns``
#: fits; the bridge sends it on in parts): a longer one is answered and passed by, so the
#: bridge's memory does not grow with what a client writes.
MAX_LINE_BYTES = 16 << 20
#: Bytes read from stdin at once.
READ_BYTES = 64 << 10
#: The start of a line too long to read, kept to find its id in.
HEAD_BYTES = 4096
#: How long the end of stdin waits for the answers to the requests read before it (one
#: daemon call takes at most the client's 30 s; a tool may make a few).
EOF_GRACE_S = 60.0
# Where a top-level id's value begins (told from one among the arguments by coming
# before "params").
_ID = re.compile(r'"id"\s*:\s*')
#: A bad line's answer: the message to send back, or None (answer nothing), and why.
Refusal = tuple[types.JSONRPCError | None, str]
_ADAPTER = types.jsonrpc_message_adapter
_NO_BATCHES = "MCP has no batches: send each message on a line of its own"


def _error(request_id: int | str | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=request_id,
                              error=types.ErrorData(code=code, message=message))


def _request_id(message: object) -> int | str | None:
    """The id a reader can answer ``message`` with (MCP ids are strings or integers)."""
    if not isinstance(message, dict):
        return None
    given = message.get("id")
    return given if type(given) is int or isinstance(given, str) else None


def _is_response(message: object) -> bool:
    return (isinstance(message, dict) and "method" not in message
            and ("result" in message or "error" in message))


def _whole_text(value: object) -> object:
    """``value`` with each half of a surrogate pair in its strings (and keys) replaced
    by U+FFFD; whole pairs are kept."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_whole_text(v) for v in value]
    if isinstance(value, dict):
        return {_whole_text(k): _whole_text(v) for k, v in value.items()}
    return value


def _problem(message: object, refused: ValidationError | None) -> str:
    """What is wrong with ``message``, in the words of the JSON-RPC envelope."""
    if not isinstance(message, dict):
        return "a message is a JSON object"
    if message.get("jsonrpc") != "2.0":
        return '"jsonrpc" must be "2.0"'
    if "method" in message and not isinstance(message["method"], str):
        return '"method" must be a string'
    if "id" in message and _request_id(message) is None:
        return '"id" must be a string or an integer'
    if message.get("params") is not None and not isinstance(message["params"], dict):
        return '"params" must be an object'
    if "method" not in message:
        return 'a request has a "method"'
    if refused is None:
        return "not a JSON-RPC message"
    first = refused.errors()[0]
    return str(first["msg"]) if first["type"] == "json_invalid" else "not a JSON-RPC message"


def _unreadable(head: str, why: str) -> Refusal:
    """The answer to a message that cannot be read whole, of which ``head`` is the start:
    Invalid Request with its id if the start shows it (before its ``params``), else a
    null id; none for a response."""
    if '"method"' not in head and ('"result"' in head or '"error"' in head):
        return None, "a response that cannot be read"
    found, params = _ID.search(head), head.find('"params"')
    request_id = None
    if found is not None and (params < 0 or found.start() < params):
        try:
            read, _ = json.JSONDecoder().raw_decode(head, found.end())
        except (ValueError, RecursionError):
            read = None
        request_id = read if type(read) is int or isinstance(read, str) else None
    return _error(request_id, types.INVALID_REQUEST, f"Invalid Request: {why}"), why


def _refusal(message: object, why: str) -> list[Refusal]:
    if _is_response(message):
        return [(None, "a response of the wrong shape")]
    return [(_error(_request_id(message), types.INVALID_REQUEST, f"Invalid Request: {why}"),
             why)]


def check_line(line: str) -> tuple[str | None, list[Refusal]]:
    """The line to hand the SDK (None: none), and the answers to the rest of it."""
    forward, _, refusals = _checked_line(line)
    return forward, refusals


def _checked_line(line: str) -> tuple[str | None, types.JSONRPCMessage | None, list[Refusal]]:
    """:func:`check_line`, with the message the SDK reads in the line handed on."""
    refused: ValidationError | None = None
    try:
        read = _ADAPTER.validate_json(line, by_name=False)
    except ValidationError as exc:
        read, refused = None, exc
    # The SDK takes a request whose id is not a string or an integer for a notification
    # (it has a method and no id the SDK knows) and answers nothing.
    if read is not None and not (isinstance(read, types.JSONRPCNotification)
                                 and '"id"' in line):
        return line, read, []
    try:
        message = json.loads(line)
    except RecursionError:  # JSON nested deeper than Python reads: answered by its id
        return None, None, [_unreadable(line, "Invalid JSON: nested too deeply")]
    except ValueError as exc:
        return None, None, [(_error(None, types.PARSE_ERROR, f"Parse error: {exc}"),
                             "not JSON")]
    if isinstance(message, list):
        answers: list[Refusal] = [
            (_error(_request_id(m), types.INVALID_REQUEST, f"Invalid Request: {_NO_BATCHES}"),
             "a batch") for m in message
            if _request_id(m) is not None and not _is_response(m)]
        return None, None, answers or [
            (_error(None, types.INVALID_REQUEST, f"Invalid Request: {_NO_BATCHES}"), "a batch")]
    with_id = isinstance(message, dict) and "id" in message
    if read is not None:
        return ((None, None, _refusal(message, _problem(message, None))) if with_id
                else (line, read, []))
    try:
        whole = json.dumps(_whole_text(message), ensure_ascii=False)
        repaired = _ADAPTER.validate_json(whole, by_name=False)
    except RecursionError:
        return None, None, _refusal(message, "Invalid JSON: nested too deeply")
    except ValidationError as exc:
        return None, None, _refusal(message, _problem(message, exc))
    if with_id and isinstance(repaired, types.JSONRPCNotification):
        return None, None, _refusal(message, _problem(message, refused))
    return whole, repaired, []


@dataclass(frozen=True)
class LongLine:
    """A line longer than ``MAX_LINE_BYTES``: its start and how long it was."""

    head: bytes
    size: int

    def answer(self) -> types.JSONRPCError | None:
        """The error for the request whose start this is, with its id if the start shows
        it (before its ``params``), else a null id; None for a response."""
        return _unreadable(self.head.decode("utf-8", "replace"),
                           f"a line of {self.size} bytes is longer than the "
                           f"{MAX_LINE_BYTES} one message may take: send less at once")[0]


async def bounded_lines(read: Callable[[int], Awaitable[bytes]],
                        max_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[str | LongLine]:
    """The lines of what ``read(n)`` gives until it gives nothing (each decoded as UTF-8,
    a byte that is not read as U+FFFD, its newline kept), holding at most ``max_bytes``
    of one: a longer line is read through and given as a :class:`LongLine`."""
    buffer = bytearray()
    scanned = 0  # the bytes of the buffer known to hold no newline
    long: LongLine | None = None
    while chunk := await read(READ_BYTES):
        if long is not None:  # the rest of a long line is read through, not kept
            end = chunk.find(b"\n")
            long = LongLine(long.head, long.size + (len(chunk) if end < 0 else end))
            if end < 0:
                continue
            yield long
            long, chunk = None, chunk[end + 1:]
        buffer += chunk
        while (end := buffer.find(b"\n", scanned)) >= 0:
            line = bytes(buffer[:end + 1])
            del buffer[:end + 1]
            scanned = 0
            yield (line.decode("utf-8", "replace") if end <= max_bytes
                   else LongLine(line[:HEAD_BYTES], end))
        scanned = len(buffer)
        if len(buffer) > max_bytes:
            long = LongLine(bytes(buffer[:HEAD_BYTES]), len(buffer))
            buffer.clear()
            scanned = 0
    if long is not None:
        yield long
    elif buffer:
        yield buffer.decode("utf-8", "replace")


RequestId = int | str


class InFlight:
    """The requests handed to the SDK and not answered yet (an id sent twice counts twice)."""

    def __init__(self) -> None:
        self._ids: Counter[RequestId] = Counter()
        self._changed = anyio.Event()

    def __len__(self) -> int:
        return self._ids.total()

    def read(self, message: types.JSONRPCMessage) -> None:
        """Note ``message``, handed to the SDK: a request waits for its answer; one the
        client cancels gets none (MCP answers no cancelled request)."""
        if isinstance(message, types.JSONRPCRequest):
            self._ids[message.id] += 1
        elif (isinstance(message, types.JSONRPCNotification)
              and message.method == "notifications/cancelled"
              and isinstance(message.params, dict)):
            cancelled = message.params.get("requestId")
            if type(cancelled) is int or isinstance(cancelled, str):
                self.answered(cancelled)

    def answered(self, request_id: RequestId) -> None:
        if self._ids[request_id] > 1:
            self._ids[request_id] -= 1
        else:
            self._ids.pop(request_id, None)
        self._changed.set()

    async def wait_answered(self) -> None:
        """Return once every request noted has been answered (or cancelled)."""
        while self._ids:
            self._changed = anyio.Event()
            await self._changed.wait()


class AnsweringStream:
    """The SDK's write stream, telling ``in_flight`` of each answer it carries."""

    def __init__(self, stream: WriteStream[SessionMessage], in_flight: InFlight) -> None:
        self._stream = stream
        self._in_flight = in_flight

    async def send(self, item: SessionMessage, /) -> None:
        try:
            await self._stream.send(item)
        finally:  # an answer that could not be written is not waited for either
            message = item.message
            if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) \
                    and message.id is not None:
                self._in_flight.answered(message.id)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> AnsweringStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None, exc_tb: TracebackType | None) -> None:
        await self.aclose()


class CheckedLines:
    """The client's lines as the SDK's stdio transport reads them (``async for``): those
    it reads, while the answers to the others go to ``answers``, closed at the end. The
    lines end once the requests handed on (``in_flight``) are answered after the end of
    ``lines``, or ``grace_s`` after it."""

    def __init__(self, lines: AsyncIterable[str | LongLine],
                 answers: MemoryObjectSendStream[types.JSONRPCError],
                 in_flight: InFlight | None = None, grace_s: float = EOF_GRACE_S) -> None:
        self._lines = lines
        self._answers = answers
        self.in_flight = in_flight if in_flight is not None else InFlight()
        self._grace_s = grace_s

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async with self._answers:
            async for line in self._lines:
                if isinstance(line, LongLine):
                    answer = line.answer()
                    print(f"recalld mcp: refused a line of {line.size} bytes (longer than "
                          f"{MAX_LINE_BYTES})", file=sys.stderr, flush=True)
                    if answer is not None:
                        await self._answers.send(answer)
                    continue
                if not line.strip():
                    continue
                forward, message, refusals = _checked_line(line)
                if refusals:
                    print(f"recalld mcp: refused a line of {len(line.rstrip())} "
                          f"characters ({refusals[0][1]})", file=sys.stderr, flush=True)
                for answer, _ in refusals:
                    if answer is not None:
                        await self._answers.send(answer)
                if forward is not None:
                    if message is not None:
                        self.in_flight.read(message)
                    yield forward
            with anyio.move_on_after(self._grace_s):
                await self.in_flight.wait_answered()
            if self.in_flight:
                print(f"recalld mcp: stdin closed; {len(self.in_flight)} request(s) still "
                      f"unanswered after {self._grace_s:g} s are cancelled", file=sys.stderr,
                      flush=True)
