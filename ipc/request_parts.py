"""Requests cut to the daemon's limits, so that no write (nor the search of a long message)
is refused for its size.

A ``memory.add_turns`` request takes at most ``max_request_bytes`` of JSON (1 MiB by
default) and 1,000 messages; a ``memory.add_note`` at most 32,000 characters. A longer
conversation or note goes in consecutive requests that each fit, a message or text cut
between its lines, else its words or clauses (the daemon strips what it is given: a cut
there loses nothing). The AgentScope middlewares, the MCP bridge and ``recalld note`` send their
writes through here, and the middlewares the user's message they search for
(:func:`search_query`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import date
from typing import TYPE_CHECKING, Final

import orjson

from recalld.ipc.answers import (
    CONTINUED,
    SPEAKERS,
    JsonObject,
    NoteAdded,
    NoteWritten,
    TurnsAdded,
)
from recalld.ipc.media import MEDIA_BLOCKS, TEXT_BLOCKS, block_kind, media_stub
from recalld.ipc.shown import names_nothing

if TYPE_CHECKING:  # the command line splits notes too, and runs no event loop
    from recalld.ipc.aclient import AsyncClient

#: The daemon's bound on the messages of one ``memory.add_turns`` call.
MAX_TURN_MESSAGES = 1000
#: What a ``memory.add_turns`` request holds besides its messages (method, ids, flags).
REQUEST_ROOM_BYTES = 4096
#: The characters one ``memory.add_note`` takes (32,000), less some to spare.
MAX_NOTE_PART_CHARS = 30_000
#: The characters of a request id the daemon takes.
MAX_REQUEST_ID_CHARS = 200
#: The characters of the caller's id a part's id keeps (the daemon takes 200 in all).
PART_ID_PREFIX_CHARS = 150

def json_size(value: object) -> int:
    """The bytes of JSON ``value`` takes, also for text JSON cannot carry (lone surrogates,
    bytes that were not UTF-8): measured as if it could, so that the request, not the
    cutting, refuses it, as one ``InvalidParams`` saying why."""
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))
                   .encode("utf-8", "surrogatepass"))


def _sha256_hex(data: bytes) -> str:
    # Imported here: a command that sends no request id or note in parts does not pay
    # for hashlib's import (OpenSSL's library, some 3 ms of CPU).
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _id_digest(request_id: str, chars: int) -> str:
    return _sha256_hex(request_id.encode("utf-8", "surrogatepass"))[:chars]


def fitting_request_id(request_id: str) -> str:
    """``request_id`` as the daemon takes it (:data:`MAX_REQUEST_ID_CHARS`): itself if
    it fits, else its start and a digest of the whole, so that two long ids alike in
    their first 200 characters (a long session and reply id) stay two requests, and the
    same id is the same request every time."""
    if len(request_id) <= MAX_REQUEST_ID_CHARS:
        return request_id
    return f"{request_id[:MAX_REQUEST_ID_CHARS - 25]}~{_id_digest(request_id, 24)}"


def part_id(request_id: str | None, n: int) -> str | None:
    """The request id of part ``n`` (from 0) of a write the caller identified as
    ``request_id``: that id for the first part, for each later one an id made of it that
    names the part and a digest of the whole id. So a later part is not taken for a
    call the caller identified as ``X#1`` (its answer given again, the part lost), nor
    for the same part of another write whose id begins alike; the same write sent again
    has the same part ids, and adds nothing twice."""
    if request_id is None or n == 0:
        return request_id
    return f"{request_id[:PART_ID_PREFIX_CHARS]}#{n}~{_id_digest(request_id, 12)}"


#: Where a text is cut, best first: after a line; else after a space (a long paragraph);
#: else after a clause of text written without spaces (Chinese, Japanese). Only a text
#: with none of them (a long token) is cut anywhere.
CUT_AFTER: tuple[tuple[str, ...], ...] = (
    ("\n",), (" ", "\t", "\u3000"), ("。", "！", "？", "；", "，", "、", "．", "!", "?", ";", ","),
)


def _cut_place(text: str) -> int:
    """Where to cut ``text`` in two: after the separator (:data:`CUT_AFTER`) nearest to its
    middle, of the best kind it has; the middle where it has none."""
    half = len(text) // 2
    for separators in CUT_AFTER:
        before = max(text.rfind(sep, 0, half) for sep in separators) + 1
        after = min((at for sep in separators if (at := text.find(sep, half)) >= 0),
                    default=-1) + 1
        cut = before or after
        if 0 < cut < len(text):
            return cut
    return half


def text_parts(text: str, max_bytes: int, max_chars: int | None = None) -> list[str]:
    """``text`` in consecutive pieces of at most ``max_bytes`` of JSON (and ``max_chars``
    characters) each, cut after a line where there is one, else between words or clauses
    (:func:`_cut_place`): the daemon strips what it is given and keeps the pieces apart
    (lines, paragraphs), so a cut there loses nothing, where one inside a word split it
    in two."""
    if len(text) < 2 or (json_size(text) <= max_bytes
                         and (max_chars is None or len(text) <= max_chars)):
        return [text]
    cut = _cut_place(text)
    return (text_parts(text[:cut], max_bytes, max_chars)
            + text_parts(text[cut:], max_bytes, max_chars))


def _fitting(text: str, max_bytes: int, *, tail: bool = False) -> str:
    """The longest start (or end, ``tail``) of ``text`` that takes at most ``max_bytes`` of
    JSON, cut after (before) a line where one lies in its second half."""
    low, high = 0, len(text)
    while low < high:  # the longest length that fits, by bisection
        mid = (low + high + 1) // 2
        piece = text[len(text) - mid:] if tail else text[:mid]
        if json_size(piece) <= max_bytes:
            low = mid
        else:
            high = mid - 1
    piece = text[len(text) - low:] if tail else text[:low]
    line = piece.find("\n") + 1 if tail else piece.rfind("\n")
    if tail and 0 < line <= len(piece) // 2:
        return piece[line:]
    return piece[:line] if not tail and line >= len(piece) // 2 else piece


def search_query(text: str, limit_bytes: int) -> str:
    """``text`` (a user's message) as a search query one request of ``limit_bytes`` takes:
    whole if it fits, else its start and its end (where a request around a pasted text
    usually is), cut between lines, each half of what fits."""
    budget = max(limit_bytes - REQUEST_ROOM_BYTES, 1024)
    if json_size(text) <= budget:
        return text
    half = budget // 2 - 8
    return f"{_fitting(text, half)}\n{_fitting(text, half, tail=True)}"


#: The content blocks the daemon keeps something of.
_KEPT_BLOCKS: Final = TEXT_BLOCKS | frozenset(MEDIA_BLOCKS)


def _as_kept(message: JsonObject) -> JsonObject:
    """``message`` with only what the daemon keeps of it, for one too large for a
    request: its role, speaker's name and content only (no tool-call arguments, no
    metadata of the host's); no content for a role whose words are not kept (a
    tool's result, a system prompt) nor for an item of the Responses API; of its blocks
    the text ones whole, each media block only what names it (the daemon keeps
    ``[image omitted: name]`` of it either way), no tool, tool result or thinking block."""
    if "role" not in message and isinstance(message.get("type"), str):
        return {"type": message["type"]}  # an item the daemon drops (function_call_output)
    key = _content_key(message)
    kept = {k: v for k, v in message.items() if k in ("role", "name", CONTINUED, key)}
    content = message.get(key)
    if message.get("role") not in SPEAKERS:
        kept[key] = None
    elif isinstance(content, list):
        kept[key] = [_block_as_kept(b) for b in content
                     if not isinstance(b, dict) or block_kind(b) in _KEPT_BLOCKS]
    return kept


def _block_as_kept(block: object) -> object:
    kind = block_kind(block) if isinstance(block, dict) else None
    if isinstance(block, dict) and kind in MEDIA_BLOCKS:
        return media_stub(kind, block)
    return block


def _content_key(message: JsonObject) -> str:
    """Where ``message`` holds what was said: ``content``, or Gemini's ``parts``."""
    return "content" if "content" in message or "parts" not in message else "parts"


def _cut(message: JsonObject, max_bytes: int) -> list[JsonObject]:
    """``message`` as consecutive messages of its role whose content takes at most
    ``max_bytes`` of JSON each: its text cut, its blocks spread, what the daemon drops
    left out (:func:`_as_kept`). Each piece but the last says ``"continued": true``
    (:data:`CONTINUED`): the daemon counts the message as one user turn and writes it as
    one line of the dialog log."""
    if json_size(message) <= max_bytes:
        return [message]
    message = _as_kept(message)
    key = _content_key(message)
    content = message.get(key)
    if json_size(message) <= max_bytes or not isinstance(content, str | list):
        return [message]
    if isinstance(content, str):
        return _continued([{**message, key: piece}
                           for piece in text_parts(content, max_bytes)])
    blocks: list[object] = []
    for block in content:
        if isinstance(block, str) and json_size(block) > max_bytes:
            blocks += text_parts(block, max_bytes)
            continue
        text = block.get("text") if isinstance(block, dict) else None
        if isinstance(text, str) and json_size(block) > max_bytes:
            blocks += [{**block, "text": piece} for piece in text_parts(text, max_bytes - 64)]
        else:
            blocks.append(block)
    out: list[JsonObject] = []
    for block in blocks:
        last = out[-1][key] if out else None
        if isinstance(last, list) and json_size([*last, block]) <= max_bytes:
            last.append(block)
        else:
            out.append({**message, key: [block]})
    return _continued(out)


def _continued(pieces: list[JsonObject]) -> list[JsonObject]:
    """``pieces`` of one message, each but the last marked as going on in the next."""
    return [{**piece, CONTINUED: True} for piece in pieces[:-1]] + pieces[-1:]


def turn_parts(messages: Sequence[JsonObject], limit_bytes: int,
               ) -> list[list[JsonObject]]:
    """``messages`` in consecutive parts that each fit in one ``memory.add_turns`` request
    of at most ``limit_bytes`` and its ``MAX_TURN_MESSAGES``: a message too large for one
    request is cut into consecutive messages of its role, so none is lost."""
    budget = max(limit_bytes - REQUEST_ROOM_BYTES, 1024)
    parts: list[list[JsonObject]] = [[]]
    size = 0
    for message in messages:
        for piece in _cut(message, budget - 256):
            piece_size = json_size(piece) + 1
            if parts[-1] and (size + piece_size > budget
                              or len(parts[-1]) >= MAX_TURN_MESSAGES):
                parts.append([])
                size = 0
            parts[-1].append(piece)
            size += piece_size
    return parts


async def add_turns_in_parts(client: AsyncClient, agent_id: str, session_id: str,
                             messages: Sequence[JsonObject], request_id: str | None,
                             *, flush: bool = False) -> TurnsAdded:
    """``memory.add_turns`` of ``messages`` in as many requests as the daemon's limits
    take (:func:`turn_parts`), in order, each with its own request id (so a part sent
    again adds nothing twice); only the last flushes. The answer to the last, with the
    messages added by all."""
    parts = turn_parts(messages, client.request_limit)
    added = 0
    for n, part in enumerate(parts):
        answer = await client.add_turns(agent_id, session_id, part,
                                        request_id=part_id(request_id, n),
                                        flush=flush and n == len(parts) - 1)
        added += answer["added_messages"]
    answer["added_messages"] = added
    return answer


def content_request_id(text: str, name: str | None = None, day: date | None = None) -> str:
    """The request id of a note written in parts that its caller gave none: made of the
    day (``day``, today by default), the note's ``name`` and its text, so that the same
    command run again that day (after a failure part-way) adds none of its parts twice,
    as the daemon takes a one-part note that the day's note already holds for one sent
    again. Another day, the same text is appended again."""
    seen = (day or date.today()).isoformat()
    whole = f"{seen}\0{name or ''}\0{text}".encode("utf-8", "surrogatepass")
    return f"note-{seen}-{_sha256_hex(whole)[:32]}"


def note_parts(text: str, limit_bytes: int, request_id: str | None = None,
               name: str | None = None) -> list[tuple[str, str | None]]:
    """The parts of ``text`` one ``memory.add_note`` takes at once
    (:data:`MAX_NOTE_PART_CHARS`, one request of ``limit_bytes``), cut between lines, in
    order, each with its request id (:func:`part_id` of ``request_id``, or of
    :func:`content_request_id` for a text of several parts for the note ``name``): the
    daemon appends a part that repeats an earlier one, and a part sent again adds
    nothing twice."""
    parts = text_parts(text, limit_bytes - REQUEST_ROOM_BYTES, MAX_NOTE_PART_CHARS)
    # A part of blank lines only (or of what shows nothing) says nothing, and the daemon
    # refuses an empty note.
    parts = [part for part in parts if not names_nothing(part)] or parts[:1]
    if request_id is None and len(parts) > 1:
        request_id = content_request_id(text, name)
    return [(part, part_id(request_id, n)) for n, part in enumerate(parts)]


async def in_note_parts(text: str, limit_bytes: int,
                        add: Callable[[str, str | None], Awaitable[NoteAdded]],
                        request_id: str | None = None, name: str | None = None,
                        ) -> NoteWritten:
    """``add(part, part_id)`` (a ``memory.add_note`` to the note ``name``) each of the
    :func:`note_parts` of ``text``, in order; what they wrote (:func:`notes_written`)."""
    return notes_written([await add(part, part_id_)
                          for part, part_id_ in note_parts(text, limit_bytes, request_id, name)])


def notes_written(answers: Sequence[NoteAdded]) -> NoteWritten:
    """The answers to the parts of one text as one: the last, ``created`` and ``changed``
    if any part was, and ``paths``, every note the parts went into (a full note is
    continued in the next: naming the last alone would hide the text's start)."""
    written: NoteWritten = {**answers[-1], "created": any(a["created"] for a in answers),
                            "changed": any(a["changed"] for a in answers),
                            "paths": list(dict.fromkeys(a["path"] for a in answers))}
    return written
