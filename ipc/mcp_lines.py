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
client's log, says so.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterable, AsyncIterator

import mcp.types as types
from anyio.streams.memory import MemoryObjectSendStream
from pydantic import ValidationError

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


def _refusal(message: object, why: str) -> list[Refusal]:
    if _is_response(message):
        return [(None, "a response of the wrong shape")]
    return [(_error(_request_id(message), types.INVALID_REQUEST, f"Invalid Request: {why}"),
             why)]


def check_line(line: str) -> tuple[str | None, list[Refusal]]:
    """The line to hand the SDK (None: none), and the answers to the rest of it."""
    refused: ValidationError | None = None
    try:
        read = _ADAPTER.validate_json(line, by_name=False)
    except ValidationError as exc:
        read, refused = None, exc
    # The SDK takes a request whose id is not a string or an integer for a notification
    # (it has a method and no id the SDK knows) and answers nothing.
    if read is not None and not (isinstance(read, types.JSONRPCNotification)
                                 and '"id"' in line):
        return line, []
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:
        return None, [(_error(None, types.PARSE_ERROR, f"Parse error: {exc}"), "not JSON")]
    if isinstance(message, list):
        answers: list[Refusal] = [
            (_error(_request_id(m), types.INVALID_REQUEST, f"Invalid Request: {_NO_BATCHES}"),
             "a batch") for m in message
            if _request_id(m) is not None and not _is_response(m)]
        return None, answers or [
            (_error(None, types.INVALID_REQUEST, f"Invalid Request: {_NO_BATCHES}"), "a batch")]
    with_id = isinstance(message, dict) and "id" in message
    if read is not None:
        return (None, _refusal(message, _problem(message, None))) if with_id else (line, [])
    try:
        whole = json.dumps(_whole_text(message), ensure_ascii=False)
        repaired = _ADAPTER.validate_json(whole, by_name=False)
    except RecursionError:
        return None, _refusal(message, "Invalid JSON: nested too deeply")
    except ValidationError as exc:
        return None, _refusal(message, _problem(message, exc))
    if with_id and isinstance(repaired, types.JSONRPCNotification):
        return None, _refusal(message, _problem(message, refused))
    return whole, []


class CheckedLines:
    """The client's lines as the SDK's stdio transport reads them (``async for``): those
    it reads, while the answers to the others go to ``answers``, closed at the end."""

    def __init__(self, lines: AsyncIterable[str],
                 answers: MemoryObjectSendStream[types.JSONRPCError]) -> None:
        self._lines = lines
        self._answers = answers

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async with self._answers:
            async for line in self._lines:
                if not line.strip():
                    continue
                forward, refusals = check_line(line)
                if refusals:
                    print(f"recalld mcp: refused a line ({refusals[0][1]}): "
                          f"{line[:200].rstrip()}", file=sys.stderr, flush=True)
                for answer, _ in refusals:
                    if answer is not None:
                        await self._answers.send(answer)
                if forward is not None:
                    yield forward
