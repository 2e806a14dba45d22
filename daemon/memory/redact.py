"""Secrets redaction: what looks like a credential becomes ``[REDACTED]`` before it is
written to memory, logged, indexed or sent to a chat model.

Pure functions over text, applying the rules of :mod:`secret_rules`: spans are found on
the original text by every rule and merged, so redacting is idempotent (``[REDACTED]`` is
never found again). :func:`redact_parts` redacts adjacent pieces of one text (content
blocks of a message) as one, so a key split across them is masked in both;
:func:`redact_messages` does it for chat messages. :func:`redact_async` and
:func:`redact_messages_async` move big inputs to a worker thread so the event loop never
stalls on them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final, TypeVar, overload

import orjson

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.secret_anchors import anchor_words, anchors
from recalld.daemon.memory.secret_forms import as_ascii, read_forms
from recalld.daemon.memory.secret_names import MASK as MASK
from recalld.daemon.memory.secret_plan import hints_in, plan_of
from recalld.daemon.memory.secret_reading import token_reading
from recalld.daemon.memory.secret_rules import (
    FORMAT_RULES,
    INVISIBLE_CHARS,
    MIN_RUN_CHARS,
    RULES,
    RUN_CHARS,
    Rule,
    Span,
    rules_token_prefilter,
    token_prefilter,
    token_runs,
)

if TYPE_CHECKING:
    from trio import CapacityLimiter

_T = TypeVar("_T")
#: Called while a long text is searched (see :func:`find_spans`); None: nothing ends it.
Check = Callable[[], None] | None

#: Texts longer than this are redacted in a worker thread by :func:`redact_async`.
INLINE_CHARS: Final = 16_384

#: How many token runs or anchors the rules look at between two calls of a ``check``.
CHECK_EVERY: Final = 256

# -- applying ----------------------------------------------------------------------------


class _Checked(Sequence[_T]):
    """``items`` (token runs, anchors) as the rules read them, ``check`` called every
    :data:`CHECK_EVERY` of them: work on a text of megabytes can be ended midway."""

    __slots__ = ("_check", "_items")

    def __init__(self, items: Sequence[_T], check: Callable[[], None]) -> None:
        self._items, self._check = items, check

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> _T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[_T]: ...

    def __getitem__(self, i: int | slice) -> _T | Sequence[_T]:
        return self._items[i]

    def __iter__(self) -> Iterator[_T]:
        check, items = self._check, self._items
        for at in range(0, len(items), CHECK_EVERY):
            check()
            yield from items[at:at + CHECK_EVERY]


def _checked(items: Sequence[_T], check: Check) -> Sequence[_T]:
    return items if check is None else _Checked(items, check)


def find_spans(text: str, rules: Sequence[Rule] = RULES, *,
               check: Check = None) -> list[Span]:
    """The merged, sorted spans of ``text`` that ``rules`` take for secrets: in ``text``
    as it is, and as it reads inside its tokens (:mod:`secret_reading`: without the
    characters that show nothing there, with the escapes there spelling their
    characters; a span found so covers the characters it was read from). Compatibility
    forms of ASCII characters (full-width ``ｇｈｐ＿``, ``password：``) are read as those
    characters (:mod:`secret_forms`), before the rest. ``check`` (a worker thread's
    ``trio.from_thread.check_cancelled``) is called between rules and every
    :data:`CHECK_EVERY` token runs or anchors; what it raises ends the work."""
    text, invisible = read_forms(text)
    spans = _find_spans(text, rules, check)
    reading = token_reading(text, invisible=invisible)
    if reading is None:
        return spans
    found = [reading.original(s, e) for s, e in _find_spans(reading.text, rules, check)]
    return _merge(spans + found) if found else spans


def _find_spans(text: str, rules: Sequence[Rule], check: Check) -> list[Span]:
    if not text:
        return []
    lower = text.lower()
    if len(lower) != len(text):  # a few characters lowercase to two: keep positions
        lower = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    plan = plan_of(rules)
    groups = plan.groups
    spans: list[Span] = []
    # Rules may share their hints (the context rules all share theirs): each set of hints
    # is looked for once, by its number in the plan. The rules run by kind, each kind's
    # common work done once (the spans are merged in order after).
    hinted: list[bool | None] = [None] * len(groups)

    def has_hint(group: int) -> bool:
        found = hinted[group]
        if found is None:
            found = False
            for hint in groups[group]:
                if hint in lower:
                    found = True
                    break
            hinted[group] = found
        return found

    runs = token_runs(text) if plan.token else []
    # Only the runs where one of the token rules' patterns matches (all of them at once):
    # each rule then scans those, not every run; with none left, no token rule runs.
    # (FORMAT_RULES holds every token rule RULES has: one compiled prefilter.)
    if runs:
        prefilter = (rules_token_prefilter() if rules is RULES or rules is FORMAT_RULES
                     else token_prefilter(rules))
        if prefilter is not None:
            search = prefilter.search
            runs = [r for r in _checked(runs, check) if search(text, r[0], r[1])]
    if runs:
        # Looking for a hint scans the whole text; a token rule's pattern scans only the
        # runs. Where the runs are a small part of the text, the pattern goes first and
        # the hint is looked for only when it found something (the spans kept are the
        # same in either order).
        pattern_first = sum(b - a for a, b in runs) * 8 < len(text)
        for find, group in plan.token:
            if pattern_first:
                found_spans = [s for pos, endpos in _checked(runs, check)
                               for s in find(text, pos, endpos)]
                if found_spans and (group < 0 or has_hint(group)):
                    spans.extend(found_spans)
            elif group < 0 or has_hint(group):
                for pos, endpos in _checked(runs, check):
                    spans.extend(find(text, pos, endpos))
    # The other format rules' hints, all looked for at once: only the rules whose hints
    # the text holds run (in prose, a few of them).
    run = set(plan.plain_always)
    for hint in hints_in(plan, lower):
        run.update(plan.plain_by_hint[hint])
    for i in sorted(run):
        if check is not None:
            check()
        spans.extend(plan.plain[i](text, 0, len(text)))
    if plan.anchored:
        # Where anchor words start: one pass finds them all, and tells which of the
        # context rules' hints (anchor words all) the text holds without a scan for each.
        words = anchor_words(lower)
        word_hinted: list[bool | None] = [None] * len(groups)
        starts: Sequence[int] | None = None
        for anchored, at_words, group in plan.anchored:
            if group >= 0:
                if at_words:
                    found = word_hinted[group]
                    if found is None:
                        hints = groups[group]
                        found = word_hinted[group] = any(lower.startswith(hints, i)
                                                         for i in words)
                    if not found:
                        continue
                elif not has_hint(group):
                    continue
            if starts is None:
                starts = _checked(anchors(text, lower, words), check)
            spans.extend(anchored(text, starts))
    return _merge([s for s in spans if s[1] > s[0]])


def _merge(spans: list[Span]) -> list[Span]:
    spans.sort()
    out: list[Span] = []
    for start, end in spans:
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _apply(text: str, spans: Sequence[Span], keep_lines: bool) -> str:
    if not spans:
        return text
    parts: list[str] = []
    pos = 0
    for start, end in spans:
        parts.append(text[pos:start])
        parts.append(MASK + "\n" * text.count("\n", start, end) if keep_lines else MASK)
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


def redact(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every secret it seems to contain replaced by ``[REDACTED]``.

    ``keep_lines``: a masked span keeps its line breaks (after the mask), so line numbers
    of the rest stay those of the original (the index maps chunks to lines).
    """
    return _apply(text, find_spans(text), keep_lines)


def redact_prefix(text: str, length: int, *, keep_lines: bool = False) -> str:
    """The first ``length`` characters of ``text``, redacted as in the whole of it: a
    secret the cut falls inside is masked, not left as a piece too short to be found."""
    spans = [(start, min(end, length)) for start, end in find_spans(text) if start < length]
    return _apply(text[:length], spans, keep_lines)


#: In a note's frontmatter block: the session id recalld writes and the link to that
#: session's dialog log it writes beside it (``fileops.daily_write``; ``turns.check_session_id``
#: holds the id's characters).
_NOTE_ID = r"[A-Za-z0-9_.:@\-]{1,128}"
_SESSION_FIELD: Final = re.compile(
    rf"^session_id:[ \t]*(?P<q>[\"']?)(?P<id>{_NOTE_ID})(?P=q)[ \t]*$", re.MULTILINE)
_SOURCE_FIELD: Final = re.compile(
    rf"^source_conversation:[ \t]*[\"']?\[\[[^\]\n]*/dialog/(?P<id>{_NOTE_ID})\.jsonl\]\]",
    re.MULTILINE)


def note_spans(text: str, *, check: Check = None) -> list[Span]:
    """:func:`find_spans` of a note as the index holds it: a ``session_id`` in its
    frontmatter block is kept where the ``source_conversation`` link beside it names the
    same id unmasked. The link shows the id anyway, and a conversation's id (a chat's
    number, a ULID, a random-looking slug) is no credential; an id the rules mask in the
    link too (a key's shape: refused when recalld writes a note) stays masked in both."""
    spans = find_spans(text, check=check)
    if not spans or not text.lstrip("\ufeff").startswith("---"):
        return spans
    fence = text.find("\n---", 3)
    block = len(text) if fence < 0 else fence
    field = _SESSION_FIELD.search(text, 0, block)
    link = _SOURCE_FIELD.search(text, 0, block)
    if field is None or link is None or field.group("id") != link.group("id"):
        return spans
    at, end = link.span("id")
    if any(s < end and e > at for s, e in spans):
        return spans
    at, end = field.span("id")
    out: list[Span] = []
    for s, e in spans:
        if s < end and e > at:  # the id's part of it is kept
            out.extend(p for p in ((s, at), (end, e)) if p[1] > p[0])
        else:
            out.append((s, e))
    return out


def redact_note(text: str, length: int | None = None, *,
                check: Check = None) -> str:
    """A note's text as the index holds it (:func:`note_spans`), its lines kept;
    ``length``: its first ``length`` characters only, a secret the cut falls inside
    masked (as :func:`redact_prefix`); ``check`` as :func:`find_spans` calls it."""
    spans = note_spans(text, check=check)
    if length is None:
        return _apply(text, spans, True)
    return _apply(text[:length], [(s, min(e, length)) for s, e in spans if s < length], True)


def redact_count(text: str) -> tuple[str, int]:
    """The redacted text and how many secrets were masked."""
    spans = find_spans(text)
    return _apply(text, spans, False), len(spans)


def redact_inserted(text: str, start: int, end: int) -> str:
    """``text`` with the secrets touching ``text[start:end]`` (a piece just put in it)
    masked, read with the lines around it: a piece innocent alone may be a secret where
    it goes (a plain word after "wifi_password:")."""
    first = text.rfind("\n", 0, start) + 1
    last = text.find("\n", end)
    last = len(text) if last < 0 else last
    spans = [(first + s, first + e) for s, e in find_spans(text[first:last])
             if first + s < max(end, start + 1) and first + e > start]
    return _apply(text, spans, False)


def has_secret(text: str) -> bool:
    """Does ``text`` hold something redaction would mask?"""
    return bool(find_spans(text))


def masked_in(value: str, *places: str) -> bool:
    """Would redaction mask a part of ``value`` alone or where it is written: in one of
    ``places``, each a text with ``{}`` where the value stands (a name in a link, an id
    in a frontmatter field)? A name or an id so masked leaves a link or a field that no
    longer names it: it is refused, not written."""
    for place in ("{}", *places):
        at = place.index("{}")
        end = at + len(value)
        if any(s < end and e > at for s, e in find_spans(place[:at] + value + place[at + 2:])):
            return True
    return False


def redact_parts(parts: Sequence[str], also: Sequence[Sequence[Span]] = ()) -> list[str]:
    """Redact adjacent pieces of one text (content blocks of a message) as one text.

    A secret split across pieces is found in their concatenation and masked in each piece
    it touches; what is found in a piece alone is masked too. ``also``: spans to mask in
    each piece besides (see :func:`seam_spans`).
    """
    extra = [list(a) for a in also] + [[] for _ in range(len(parts) - len(also))]
    if len(parts) <= 1:
        return [_apply(p, _merge(find_spans(p) + x), False) for p, x in zip(parts, extra,
                                                                            strict=True)]
    joined = "".join(parts)
    spans = find_spans(joined)
    out: list[str] = []
    offset = 0
    for part, local in zip(parts, extra, strict=True):
        end = offset + len(part)
        local.extend((max(s, offset) - offset, min(e, end) - offset) for s, e in spans
                     if s < end and e > offset)
        local.extend(find_spans(part))
        out.append(_apply(part, _merge(local), False))
        offset = end
    return out


#: How much of each side of a seam between two messages is read, and the token runs a
#: secret cut there is made of (``secret_rules.TOKEN_RUN``'s characters; characters that
#: show nothing, ``secret_rules.INVISIBLE_CHARS``, may end the one or start the other).
SEAM: Final = 400
RUN_END: Final = re.compile(rf"[{RUN_CHARS}]+[{INVISIBLE_CHARS}]*\Z")
_RUN_START: Final = re.compile(rf"[{INVISIBLE_CHARS}]*[{RUN_CHARS}]+")


def seam_spans(before: str, after: str) -> tuple[list[Span], list[Span]]:
    """The spans, in ``before`` and in ``after``, of a secret cut where one text ends and
    the next starts (a chat client splitting a long paste into two messages): found in
    the two read as one, when a run of token characters goes on across the cut (in
    compatibility forms too: read as ASCII, :mod:`secret_forms`)."""
    start = max(0, len(before) - SEAM)
    end_of, start_of = as_ascii(before[start:]), as_ascii(after[:SEAM])
    tail = RUN_END.search(end_of)
    head = _RUN_START.match(start_of)
    if (tail is None or head is None
            or tail.end() - tail.start() + head.end() < MIN_RUN_CHARS):
        return [], []
    cut = len(end_of)
    crossing = [(s, e) for s, e in find_spans(end_of + start_of) if s < cut < e]
    return ([(start + s, len(before)) for s, _ in crossing],
            [(0, e - cut) for _, e in crossing])


@overload
def redact_value(value: str) -> str: ...
@overload
def redact_value(value: dict[str, object]) -> JsonObject: ...
@overload
def redact_value(value: object) -> object: ...


def redact_value(value: object) -> object:
    """Redact every string inside a JSON-like value (dicts, lists, strings). A string
    under a key is read with its key (``{"password": "bluebird7"}`` as ``password:
    bluebird7``): alone, a plain password has nothing that tells it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _redact_keyed(k, v) if isinstance(v, str) and isinstance(k, str)
                else redact_value(v) for k, v in value.items()}
    return value


def _redact_keyed(key: str, value: str) -> str:
    """``value``, redacted as the value of ``key``."""
    if "\n" in key or len(key) > 64:
        return redact(value)
    prefix = f"{key}: "
    spans = [(max(a, len(prefix)) - len(prefix), b - len(prefix))
             for a, b in find_spans(prefix + value) if b > len(prefix)]
    return _apply(value, _merge(spans + find_spans(value)), False)


def redact_messages(messages: Iterable[Mapping[str, object]]) -> list[JsonObject]:
    """Chat messages (OpenAI format) with secrets redacted in their text: string content,
    adjacent text blocks (across block boundaries), the fields of other blocks (an
    ``image_url``'s URL; not a ``data:`` URL's payload) and tool-call arguments."""
    out: list[JsonObject] = []
    for message in messages:
        msg: JsonObject = dict(message)
        content = msg.get("content")
        if isinstance(content, str):
            msg["content"] = redact(content)
        elif isinstance(content, list):
            msg["content"] = _redact_blocks(content)
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [_redact_call(c) for c in msg["tool_calls"]]
        if isinstance(msg.get("function_call"), dict):  # the older OpenAI form
            call = _redact_call({"function": msg["function_call"]})
            assert isinstance(call, dict)
            msg["function_call"] = call["function"]
        out.append(msg)
    return out


_DATA_URL: Final = re.compile(r"data:[\w/+.\-]*(?:;[\w=.\-]+)*;base64,")


def _redact_fields(value: object) -> object:
    """:func:`redact_value` for what a media block holds (an image's URL, a file's name),
    leaving a ``data:`` URL's payload as it is (an image's bytes are no text)."""
    if isinstance(value, str) and _DATA_URL.match(value):
        return value
    if isinstance(value, list):
        return [_redact_fields(v) for v in value]
    if isinstance(value, dict):
        return {k: _redact_fields(v) if not isinstance(v, str) or _DATA_URL.match(v)
                else redact_value({k: v})[k] for k, v in value.items()}
    return redact_value(value)


def _redact_blocks(blocks: list[object]) -> list[object]:
    texts = [(i, b) for i, b in enumerate(blocks) if isinstance(b, dict)
             and isinstance(b.get("text"), str)]
    out = [_redact_fields(b) if isinstance(b, dict) and not isinstance(b.get("text"), str)
           else b for b in blocks]
    for (i, block), text in zip(texts, redact_parts([b["text"] for _, b in texts]),
                                strict=True):
        out[i] = {**block, "text": text}
    return out


def _redact_call(call: object) -> object:
    if not isinstance(call, dict):
        return call
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = orjson.loads(fn["arguments"])
    except orjson.JSONDecodeError:
        return {**call, "function": {**fn, "arguments": redact(fn["arguments"])}}
    return {**call, "function": {**fn, "arguments": orjson.dumps(redact_value(args)).decode()}}


async def redact_messages_async(messages: Sequence[Mapping[str, object]], *,
                                limiter: CapacityLimiter | None = None) -> list[JsonObject]:
    """:func:`redact_messages`, in a worker thread (under ``limiter``) when the messages
    are long."""
    import trio  # here: index worker processes import this module and need no trio

    size = sum(len(str(m.get("content") or "")) for m in messages)
    if size <= INLINE_CHARS:
        return redact_messages(messages)
    return await trio.to_thread.run_sync(redact_messages, messages, limiter=limiter)


async def redact_async(text: str, *, keep_lines: bool = False,
                       limiter: CapacityLimiter | None = None) -> str:
    """:func:`redact`, in a worker thread (under ``limiter``) when ``text`` is long (the
    loop keeps serving). Cancellation while in the thread abandons the result."""
    import trio

    if len(text) <= INLINE_CHARS:
        return redact(text, keep_lines=keep_lines)
    return await trio.to_thread.run_sync(lambda: redact(text, keep_lines=keep_lines),
                                         limiter=limiter)


__all__ = ["CHECK_EVERY", "INLINE_CHARS", "MASK", "Check", "find_spans", "has_secret",
           "masked_in", "note_spans", "redact", "redact_async", "redact_count",
           "redact_inserted", "redact_messages", "redact_messages_async", "redact_note",
           "redact_parts", "redact_prefix", "redact_value", "seam_spans"]
