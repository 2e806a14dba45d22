"""Conversation turns as ``memory.add_turns`` hands them over: checked, counted, sanitized.

:func:`check_session_id` and :func:`check_messages` refuse bad params (InvalidParams);
:func:`sanitize_messages` keeps only what the user and the assistant said, as
:class:`Turn` records (tool results, media and base64 payloads, recalled-memory blocks and
system prompts removed; secrets redacted), before
:class:`~recalld.daemon.memory.sessions.SessionStore` puts them on disk;
:func:`user_texts` gives what the user said in them to ``memory.recall``'s search. No I/O; the
redaction rules are imported when first needed.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple, NotRequired, TypedDict

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.slugs import names_nothing
from recalld.ipc.answers import CONTINUED, MESSAGE_ROLES, SPEAKERS
from recalld.ipc.errors import LOOKS_LIKE_A_CREDENTIAL, InvalidParams
from recalld.ipc.media import (
    MEDIA_BLOCKS,
    TEXT_BLOCKS,
    block_kind,
    is_placeholder,
    media_placeholder,
)
from recalld.ipc.recall_tags import RECALL_TAGS
from recalld.ipc.textcut import cut_text

ROLES = MESSAGE_ROLES
MAX_MESSAGES_PER_CALL = 1000
_RECALL = re.compile(
    r"<(" + "|".join(map(re.escape, RECALL_TAGS)) + r")(?:\s[^>]*)?>.*?(?:</\1>|\Z)", re.S
)
_DATA_URL = re.compile(r"data:[\w/+.\-]+(?:;[\w=.\-]+)*;base64,[A-Za-z0-9+/=]+")
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{200,}={0,2}(?![A-Za-z0-9+/=])")
_SID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}\Z")
#: What a reasoning model served without a reasoning parser (Qwen3 or DeepSeek-R1 on
#: llama.cpp, vLLM, Ollama) puts before its answer in the content: its thinking, not the
#: answer. One cut off by its length limit runs to the end (no answer at all).
THINKING: Final = re.compile(r"\A\s*<think>.*?(?:</think>|\Z)\s*", re.DOTALL)
#: The folder of the dialog logs, as a note's ``source_conversation`` link names it.
_DIALOG_LINK = "mem_session/dialog"
#: The longest speaker name kept (characters; a longer one is cut between clusters).
MAX_NAME_CHARS: Final = 64
#: Bidirectional overrides and isolates: kept in a name, they could turn the text shown
#: after it around.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def speaker_name(message: Mapping[str, object], role: str) -> str | None:
    """Who said ``message`` when several people or agents share a conversation: its
    ``name`` (OpenAI's chat format, AgentScope's ``Msg.name``) as one line of at most
    :data:`MAX_NAME_CHARS` printable characters, secrets masked (before it is cut: a key
    cut short could pass unmasked). None without a name, for a blank one or one that
    only repeats its role (``user``, ``assistant``)."""
    from recalld.daemon.memory.redact import redact

    name = message.get("name")
    if not isinstance(name, str):
        return None
    # A name of megabytes costs no more than a short one (the rest is cut off anyway).
    name = cut_text(name, 4 * MAX_NAME_CHARS)
    # Line breaks and control characters would let a name forge turns of its own in
    # the conversation the auto_memory model reads.
    name = " ".join("".join(
        " " if unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in _BIDI else c
        for c in name).split())
    name = cut_text(redact(name), MAX_NAME_CHARS).strip()
    if name.casefold() in (role.casefold(), str(message.get("role")).casefold()):
        return None
    # Blank, or only what shows nothing (zero-width spaces, a byte order mark, soft
    # hyphens, a mark with no letter, a blank letter): it names nobody. Those inside a
    # name (a ZWNJ) stay.
    return None if names_nothing(name) else name


def said_by(turn: Mapping[str, object]) -> str:
    """Who said ``turn`` (a kept turn), as the auto_memory model is shown it: its role,
    and its speaker's name when it has one (``user (alice)``)."""
    name = turn.get("name")
    return f"{turn['role']} ({name})" if isinstance(name, str) and name else str(turn["role"])


def check_session_id(value: object) -> str:
    if (not isinstance(value, str) or not _SID.match(value) or value in (".", "..")
            or value.startswith(".")):
        raise InvalidParams(
            "session_id must be 1-128 characters of A-Z a-z 0-9 _ . : @ - (not starting with .)")
    from recalld.daemon.memory.redact import masked_in

    # It becomes a file name, a frontmatter field and the link to the dialog log: never a
    # credential, nor what redaction would mask there (the link would name nothing).
    if masked_in(value, f'source_conversation: "[[{_DIALOG_LINK}/{{}}.jsonl]]"'):
        raise InvalidParams("session_id looks like a credential; use another id",
                            {LOOKS_LIKE_A_CREDENTIAL: "session_id"})
    return value


def check_request_id(value: str | None) -> str | None:
    """``memory.add_turns``'s ``request_id``: kept in the pending-turns log to answer a
    retry, so never what redaction would mask."""
    if value is None:
        return None
    if not 0 < len(value) <= 200:
        raise InvalidParams("request_id must be 1-200 characters")
    from recalld.daemon.memory.redact import masked_in

    if masked_in(value):
        raise InvalidParams("request_id looks like a credential; use another id",
                            {LOOKS_LIKE_A_CREDENTIAL: "request_id"})
    return value


def _strip(text: str) -> str:
    text = _RECALL.sub("", text)
    text = _DATA_URL.sub("[data omitted]", text)
    return _BASE64_RUN.sub("[base64 omitted]", text)


def content_of(message: Mapping[str, object]) -> object:
    """A message's content: ``content``, or Gemini's ``parts`` for a message without one."""
    return message["content"] if "content" in message else message.get("parts")


def _content_blocks(content: object, media: bool = True) -> list[str]:
    """The text pieces of a message's content (string or OpenAI/Anthropic/Gemini content
    blocks); a media block is a placeholder naming it (none without ``media``)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                kind = block_kind(block)
                text = block.get("refusal" if kind == "refusal" else "text")
                if isinstance(text, dict):  # the Assistants API: {"value", "annotations"}
                    text = text.get("value")
                if kind in TEXT_BLOCKS and isinstance(text, str):
                    parts.append(text)
                elif media and kind in MEDIA_BLOCKS:
                    parts.append(media_placeholder(kind, block))
                # tool_use / tool_result / thinking / anything else: not said, dropped
        return [p for p in parts if p]
    raise InvalidParams("message content must be a string, an array of blocks or null")


def user_texts(messages: Sequence[object]) -> list[str]:
    """What each user message says, in order, as a search takes it: its text blocks,
    without recalled-memory blocks, media, data URLs and base64 runs (messages of any
    role and of the shapes :func:`check_messages` takes; no redaction, it is not kept).
    InvalidParams for a message that is not an object with a string role."""
    out: list[str] = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping) and _is_item(m):
            continue
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InvalidParams(f"messages[{i}] must be an object with a string 'role'")
        if m["role"] == "user":
            text = "\n".join(_strip(b) for b in _content_blocks(content_of(m), media=False))
            if not names_nothing(text):
                out.append(text.strip())
    return out


def text_chars(messages: Sequence[Mapping[str, object]]) -> int:
    """The characters of text in ``messages``, strings and text blocks alike: what
    :func:`sanitize_messages` works through."""
    return sum(len(b) for m in messages if m.get("role") in SPEAKERS
               for b in _content_blocks(content_of(m)))


def _is_item(message: Mapping[str, object]) -> bool:
    """An item of a Responses API transcript that is not a message (``function_call``,
    ``function_call_output``, ``reasoning``...): no role, said by nobody, dropped."""
    kind = message.get("type")
    return "role" not in message and isinstance(kind, str) and kind != "message"


def check_messages(messages: object) -> list[JsonObject]:
    """Validate the shape of OpenAI-style chat messages (InvalidParams otherwise)."""
    if not isinstance(messages, list):
        raise InvalidParams("param 'messages' must be an array of messages")
    if len(messages) > MAX_MESSAGES_PER_CALL:
        raise InvalidParams(f"at most {MAX_MESSAGES_PER_CALL} messages per call")
    for i, m in enumerate(messages):
        if isinstance(m, dict) and _is_item(m):
            continue
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise InvalidParams(
                f"messages[{i}] must be an object with role one of {', '.join(sorted(ROLES))}"
                " (or an item of OpenAI's Responses API: a 'type' other than 'message')")
        if not (content_of(m) is None or isinstance(content_of(m), str | list)):
            raise InvalidParams(f"messages[{i}].content must be a string, an array or null")
    return messages


def continued(message: Mapping[str, object]) -> bool:
    """Whether ``message`` is a piece of one cut in several that the next goes on with
    (``"continued": true``, as the client library sends a message too large for one
    request)."""
    return message.get(CONTINUED) is True


def _says_something(content: object) -> bool:
    """True for content with something said in it: text beside blocks of recalled
    memory (see ``RECALL_TAGS``), or media. Tool results (Anthropic's ``tool_result``,
    the Responses API's ``function_call_output``, Gemini's ``functionResponse`` parts),
    thinking and empty or blank text, or text that shows nothing (a zero-width space),
    say nothing."""
    return any(not names_nothing(_RECALL.sub("", b)) for b in _content_blocks(content))


def count_user_turns(messages: Sequence[Mapping[str, object]]) -> int:
    """User turns among ``messages``: ``user`` messages that say something (an
    image-only message is a turn; its text is just not kept; one that only hands back
    tool results or recalled memory, or is empty, is none), each message cut in several
    pieces counted once, at its last (once it is all said), if any of them said
    something."""
    turns = 0
    said = False  # by the pieces of a cut message before this one
    for m in messages:
        if m.get("role") != "user":
            said = False
            continue
        said = said or _says_something(content_of(m))
        if not continued(m):
            turns += said
            said = False
    return turns


def sanitize_messages(messages: Sequence[Mapping[str, object]],
                      before: Tail | None = None) -> list[Turn]:
    """Only what the user and the assistant said, as ``{role, content}`` text, with
    ``name`` when the message names its speaker (:func:`speaker_name`).

    Dropped: tool/function results, system and developer prompts, tool-call arguments,
    blocks of recalled memory (see ``RECALL_TAGS``), media; data URLs and long base64
    runs become placeholders; secrets are redacted.

    ``before``: the end of the text handed over just before these messages (see
    :func:`last_text`). Secrets are found across the blocks of a message, and across two
    messages of one speaker where a run of token characters goes on from one to the
    next (a key split over two messages, or over two calls). The other speaker's words
    never go on with a secret: an answer to a message that ends in one is kept as said.
    """
    return sanitize_turns(messages, before)[0]


def sanitize_turns(messages: Sequence[Mapping[str, object]],
                   before: Tail | None = None) -> tuple[list[Turn], Tail | None]:
    """:func:`sanitize_messages` of ``messages`` and their :func:`last_text`, from one
    reading of them (a batch of megabytes is scanned for open key blocks once, in the
    thread that sanitizes it)."""
    kept = _kept(messages)
    earlier, tail = _earlier(before, kept)
    return _sanitized(kept, earlier), tail


def _sanitized(kept: Sequence[_Kept],
               earlier: Sequence[_Earlier]) -> list[Turn]:
    from recalld.daemon.memory.redact import seam_spans
    from recalld.daemon.memory.secret_cut import cut_token_spans
    from recalld.daemon.memory.secret_keys import key_block_rest

    also: list[list[list[tuple[int, int]]]] = [[[] for _ in blocks] for _, blocks, _, _ in kept]
    for n, ((_, blocks, _, _), (previous, at, inside)) in enumerate(zip(kept, earlier,
                                                                     strict=True)):
        if previous:
            left, right = seam_spans(previous, blocks[0])
            if at is not None:
                also[at][-1].extend(left)
            also[n][0].extend(right)
        if inside and (rest := key_block_rest(blocks[0])):
            also[n][0].append((0, rest))  # a key block its speaker left open
    if kept:
        # The last text may end in a token whose rest comes with the next call: it is
        # written before then, so what starts like one is masked now.
        also[-1][-1].extend(cut_token_spans(kept[-1][1][-1]))
    out: list[Turn] = []
    for (role, blocks, goes_on, name), extra in zip(kept, also, strict=True):
        text = "\n".join(p for p in _redacted(blocks, extra) if p).strip()
        if not names_nothing(text):  # a turn of only what shows nothing says nothing
            out.append({"role": role, "content": text})
            if name is not None:
                out[-1]["name"] = name
            if goes_on:
                out[-1][CONTINUED] = True
        elif not goes_on and out and out[-1].get(CONTINUED):
            del out[-1][CONTINUED]  # the message ends in a piece of which nothing is kept
    return out


def _redacted(blocks: Sequence[str], also: Sequence[Sequence[tuple[int, int]]]) -> list[str]:
    """``blocks`` redacted as :func:`~recalld.daemon.memory.redact.redact_parts` does, each
    run of text blocks between media placeholders as one text: a placeholder is not what
    the speaker typed, so no secret goes on into it or out of it (read glued to the text
    before it, ``token ghp_...[image omitted]`` lost its ``[image``)."""
    from recalld.daemon.memory.redact import redact_parts

    out: list[str] = []
    start = 0
    for n in range(len(blocks) + 1):
        if n == len(blocks) or is_placeholder(blocks[n]):
            out.extend(redact_parts(blocks[start:n], also[start:n]))
            if n < len(blocks):
                out.extend(redact_parts(blocks[n:n + 1], also[n:n + 1]))
            start = n + 1
    return out


#: A message :func:`sanitize_messages` keeps: its role, its text blocks, whether the next
#: message goes on with it (:func:`continued`) and its speaker's name
#: (:func:`speaker_name`).
_Kept = tuple[str, list[str], bool, str | None]


def _kept(messages: Sequence[Mapping[str, object]]) -> list[_Kept]:
    """The speakers' messages :func:`sanitize_messages` keeps, as roles, text blocks,
    whether the next message goes on with it (:func:`continued`) and names."""
    kept: list[_Kept] = []
    for m in messages:
        role = SPEAKERS.get(str(m.get("role")))
        blocks = [_strip(b) for b in _content_blocks(content_of(m))] if role else []
        if role == "assistant":  # its thinking is no more said than a thinking block
            blocks = [b for b in (THINKING.sub("", b, count=1) for b in blocks) if b]
        if role and blocks:
            kept.append((role, blocks, continued(m), speaker_name(m, role)))
        elif kept and kept[-1][2] and not continued(m):
            # The last piece of a cut message says nothing kept: the message ends before.
            kept[-1] = (kept[-1][0], kept[-1][1], False, kept[-1][3])
    return kept


class Tail(NamedTuple):
    """The end of the last text handed over, as given, and who said it (the ``before``
    of the next call's messages): a secret cut there goes on in that speaker's next
    message, not in the other's answer."""

    role: str
    text: str


class _Earlier(NamedTuple):
    """The message just before one, when its speaker said it: the end of its text as
    given, its index among the messages kept (None: handed over before them), and
    whether it ended inside a private key block."""

    text: str
    at: int | None
    inside: bool


def _earlier(before: Tail | None, kept: Sequence[_Kept],
             ) -> tuple[list[_Earlier], Tail | None]:
    """For each of ``kept``: the message just before it if its speaker said it
    (:class:`_Earlier`, empty otherwise); and the tail after them all."""
    from recalld.daemon.memory.secret_keys import open_key_block

    last, role = (None, "") if before is None else (
        _Earlier(before.text, None, open_key_block(before.text)), before.role)
    earlier: list[_Earlier] = []
    for n, (speaker, blocks, _, _) in enumerate(kept):
        previous = last if last is not None and speaker == role else _NOTHING
        earlier.append(previous)
        last, role = _Earlier(blocks[-1], n, open_key_block("\n".join(blocks),
                                                            previous.inside)), speaker
    if last is None or last.at is None:
        return earlier, before
    return earlier, Tail(role, (_OPEN_KEY if last.inside else "") + last.text[-_TAIL_CHARS:])


_NOTHING: Final = _Earlier("", None, False)
#: How much of the last text is kept for the next call (as ``seam_spans`` reads).
_TAIL_CHARS: Final = 400
#: The tail of a text that ended inside a private key block starts so: its speaker's
#: next message's first lines are then masked up to the block's END.
_OPEN_KEY: Final = "-----BEGIN PRIVATE KEY-----\n"


def last_text(messages: Sequence[Mapping[str, object]],
              before: Tail | None = None) -> Tail | None:
    """The end of the last text :func:`sanitize_messages` keeps of ``messages``, as it
    was given, and its speaker (the ``before`` of the next call's messages; ``before``:
    this call's; None: nothing kept)."""
    return _earlier(before, _kept(messages))[1]


class Turn(TypedDict):
    """A sanitized message: only the text the user or the assistant said (``continued``:
    a piece of a message that the next of its session goes on with; ``name``: who said
    it, when the message named its speaker, see :func:`speaker_name`)."""

    role: str
    content: str
    continued: NotRequired[bool]
    name: NotRequired[str]


def joined(turns: Sequence[JsonObject]) -> list[JsonObject]:
    """``turns`` (as the pending-turns log holds them, in order) with the pieces of each
    message cut in several joined again (between lines, where the client cut it): one
    turn with the seq and time of its last piece. A piece whose rest is not among
    ``turns`` (not sent yet, or never: its sender stopped) stays as it is."""
    out: list[JsonObject] = []
    for turn in turns:
        last = out[-1] if out else None
        if last is not None and last.get(CONTINUED) is True and last.get("role") == turn.get(
                "role") and last.get("name") == turn.get("name") and isinstance(
                last.get("content"), str):
            out[-1] = {**turn, "content": f"{last['content']}\n{turn.get('content')}"}
        else:
            out.append(dict(turn))
    return out
