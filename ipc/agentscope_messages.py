"""The messages AgentScope middlewares read from and add to an agent's context.

The user's text of a reply's inputs, the user and assistant turns written back, the
context message that carries recalled memory (named :data:`MEMORY_MSG_NAME`, never
written back), the search hits formatted for a model and what the memory middleware
adds to the system prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import orjson
from agentscope.event import ReplyEndEvent, RequireExternalExecutionEvent, RequireUserConfirmEvent
from agentscope.message import AssistantMsg, DataBlock, HintBlock, Msg, TextBlock

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.answers import JsonObject
from recalld.ipc.types import SearchResponse

#: Name of the context message that carries recalled memory (never written back).
MEMORY_MSG_NAME = "memory"
MAX_HIT_CHARS = 1200
#: Replies waiting for the user (a tool call to confirm) remembered per middleware.
MAX_PARKED = 1000
#: The daemon's bound on the messages of one ``memory.add_turns`` call.
MAX_TURN_MESSAGES = 1000
#: What a ``memory.add_turns`` request holds besides its messages (method, ids, flags).
REQUEST_ROOM_BYTES = 4096
#: The characters one ``memory.add_note`` takes (32,000), less room for what redaction
#: adds to the text it checks.
MAX_NOTE_PART_CHARS = 30_000
V = TypeVar("V")

TOOL_INSTRUCTIONS = (
    "## Long-term memory\n\n"
    "You have a long-term memory shared across conversations. Call `memory_search` "
    "when the request may depend on something from an earlier session (a preference, a "
    "name, a decision, how something was done). Call `add_memory` to keep a durable fact "
    "the user states or asks you to remember; the conversation itself is recorded "
    "automatically."
)
INDEX_HEADER = "## Memory index (long-term notes: name — when to read it)"


def format_hits(response: SearchResponse) -> list[str]:
    """One text per hit: where it comes from, then the text (cut to a bound)."""
    out = []
    for hit in response:
        text = hit.text if len(hit.text) <= MAX_HIT_CHARS else hit.text[:MAX_HIT_CHARS] + "…"
        owner = hit.extra.get("agent_id")
        where = f"{owner}:" if isinstance(owner, str) else ""
        out.append(f"[{where}{hit.path}:{hit.start_line}-{hit.end_line}]\n{text.strip()}")
    return out


def _msg_text(msg: Msg) -> str:
    text = msg.get_text_content()
    return text.strip() if text else ""


def _content(msg: Msg) -> str | list[JsonObject]:
    """What ``msg`` says: its text; with data blocks (an image, a recording, a file), its
    text and data blocks in order, each data block without its bytes or URL (the daemon
    puts a placeholder naming it, as for every client)."""
    if not any(isinstance(b, DataBlock) for b in msg.content):
        return _msg_text(msg)
    out: list[JsonObject] = []
    for block in msg.content:
        if isinstance(block, TextBlock) and block.text.strip():
            out.append({"type": "text", "text": block.text})
        elif isinstance(block, DataBlock):
            out.append({"type": "data", "name": block.name,
                        "source": {"media_type": block.source.media_type}})
    return out


def _turns(msgs: Sequence[Msg]) -> list[JsonObject]:
    """The user and assistant messages of ``msgs`` that say something, as chat messages."""
    return [{"role": m.role, "content": content} for m in msgs
            if m.role in ("user", "assistant") and (content := _content(m))]


def text_parts(text: str, max_bytes: int, max_chars: int | None = None) -> list[str]:
    """``text`` in consecutive pieces of at most ``max_bytes`` of JSON (and ``max_chars``
    characters) each, cut after a line where there is one (the daemon strips what it is
    given: a cut between two lines loses nothing)."""
    if len(text) < 2 or (len(orjson.dumps(text)) <= max_bytes
                         and (max_chars is None or len(text) <= max_chars)):
        return [text]
    half = len(text) // 2
    cut = text.rfind("\n", 0, half) + 1 or text.find("\n", half) + 1
    if not 0 < cut < len(text):
        cut = half
    return (text_parts(text[:cut], max_bytes, max_chars)
            + text_parts(text[cut:], max_bytes, max_chars))


def _cut(message: JsonObject, max_bytes: int) -> list[JsonObject]:
    """``message`` as consecutive messages of its role whose content takes at most
    ``max_bytes`` of JSON each: its text cut, its blocks spread."""
    content = message.get("content")
    if len(orjson.dumps(content)) <= max_bytes or not isinstance(content, str | list):
        return [message]
    if isinstance(content, str):
        return [{**message, "content": piece} for piece in text_parts(content, max_bytes)]
    blocks: list[JsonObject] = []
    for block in content:
        text = block.get("text")
        if isinstance(text, str) and len(orjson.dumps(block)) > max_bytes:
            blocks += [{**block, "text": piece} for piece in text_parts(text, max_bytes - 64)]
        else:
            blocks.append(block)
    out: list[JsonObject] = []
    for block in blocks:
        last = out[-1]["content"] if out else None
        if isinstance(last, list) and len(orjson.dumps([*last, block])) <= max_bytes:
            last.append(block)
        else:
            out.append({**message, "content": [block]})
    return out


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
            piece_size = len(orjson.dumps(piece)) + 1
            if parts[-1] and (size + piece_size > budget
                              or len(parts[-1]) >= MAX_TURN_MESSAGES):
                parts.append([])
                size = 0
            parts[-1].append(piece)
            size += piece_size
    return parts


async def add_turns_in_parts(client: AsyncClient, agent_id: str, session_id: str,
                             messages: Sequence[JsonObject], request_id: str,
                             *, flush: bool = False) -> None:
    """``memory.add_turns`` of ``messages`` in as many requests as the daemon's limits
    take (:func:`turn_parts`), in order, each with its own request id (so a part sent
    again adds nothing twice); only the last flushes."""
    parts = turn_parts(messages, client.request_limit)
    for n, part in enumerate(parts):
        part_id = request_id if n == 0 else f"{request_id[:190]}#{n}"
        await client.add_turns(agent_id, session_id, part, request_id=part_id,
                               flush=flush and n == len(parts) - 1)


async def in_note_parts(text: str, limit_bytes: int,
                        add: Callable[[str], Awaitable[V]]) -> V:
    """``add`` (a ``memory.add_note``) each part of ``text`` one note takes at once
    (:data:`MAX_NOTE_PART_CHARS`, one request of ``limit_bytes``), cut between lines, in
    order; the answer to the last."""
    parts = text_parts(text, limit_bytes - REQUEST_ROOM_BYTES, MAX_NOTE_PART_CHARS)
    for part in parts[:-1]:
        await add(part)
    return await add(parts[-1])


def memory_message(hits: Sequence[str]) -> Msg:
    """The context message carrying recalled hits. The tag lets the daemon drop the block
    if the message is ever written back."""
    body = "\n\n".join(hits)
    hint = ("## Relevant memories\nNotes from long-term memory that may be relevant; use "
            f"them only if pertinent.\n<recalled-memory>\n{body}\n</recalled-memory>")
    return AssistantMsg(name=MEMORY_MSG_NAME, content=[HintBlock(hint=hint)])


def _query_text(inputs: object) -> str | None:
    """The user's text in the reply inputs (None for resumption events)."""
    msgs = inputs if isinstance(inputs, list) else [inputs]
    texts = [_msg_text(m) for m in msgs if isinstance(m, Msg) and m.role == "user"]
    joined = "\n".join(t for t in texts if t)
    return joined or None


class Parked(OrderedDict[int, V]):
    """What a reply that ended before the agent answered (it waits for the user to
    confirm a tool call, or for an external execution) leaves for the reply that resumes
    it, by the id of the agent's state; the oldest is forgotten past ``MAX_PARKED``."""

    def park(self, key: int, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > MAX_PARKED:
            self.popitem(last=False)


def still_waiting(item: object, waiting: bool) -> bool:
    """Whether a reply waits for the user (to confirm a tool call) or for a tool run
    elsewhere, after ``item`` of its stream: it then ends without its answer, and the
    reply given the user's decision resumes it (without a user message of its own)."""
    if isinstance(item, RequireUserConfirmEvent | RequireExternalExecutionEvent):
        return True
    return False if isinstance(item, ReplyEndEvent) else waiting
