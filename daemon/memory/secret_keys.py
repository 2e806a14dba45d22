"""Private key blocks (PEM, OpenSSH, SSH2, encrypted, PGP armour) for the redaction
rules (:mod:`secret_rules`): a block from its BEGIN line to its END line; one not closed
in a text, over the key-shaped lines below its BEGIN line; and the end of a block whose
start is in another text.

A key is often given in parts: three ``memory.add_note`` calls (the BEGIN line, the body,
the END line), or several conversation messages. Each part is redacted alone first, so
the BEGIN line of a block not closed stays (only what follows it is masked): a note is
redacted again whole as each part is appended to it, and the rest of the key is then the
body of that block. Between messages, :func:`open_key_block` tells that a text ends
inside a block and :func:`key_block_rest` where the block ends in the next text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from recalld.daemon.memory.secret_names import MASK

Span = tuple[int, int]

# PEM and OpenSSH armour (5 dashes), and SSH2's (RFC 4716: ``---- BEGIN SSH2 ... ----``).
_KEY_BEGIN: Final = re.compile(r"-{4,5} ?BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)? ?-{4,5}")
_KEY_END: Final = re.compile(r"-{4,5} ?END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)? ?-{4,5}")
#: A line of a key block's body (or its first, cut short), as a chat or a quote holds it.
_KEY_LINE: Final = re.compile(r"[ \t>]*[A-Za-z0-9+/=]+[ \t]*\r?")
#: A line a key's body may hold: base64 (a part of it masked already), an armour header
#: (``Proc-Type:``, ``DEK-Info:``, ``Version:``, ``Comment:``), or none (a blank line).
_BODY_LINE: Final = (r"[ \t>]*(?:(?:[A-Za-z0-9+/=]|" + re.escape(MASK) + r")+"
                     r"|[A-Za-z][A-Za-z0-9\-]*:[^\n]*)?[ \t]*\r?(?=\n|\Z)")
#: What follows the BEGIN line of a block not closed: the rest of that line (a key in a
#: JSON string is on one line), then the body's lines, up to the first other line.
_OPEN_BODY: Final = re.compile(rf"[^\n]*(?:\n{_BODY_LINE})*")
#: The body's lines at the start of a text (the rest of a block begun before it).
_BODY_LINES: Final = re.compile(rf"{_BODY_LINE}(?:\n{_BODY_LINE})*")
_BLANK: Final = " \t\r\n"


def key_blocks(text: str, pos: int, endpos: int) -> Iterable[Span]:
    """Private key blocks in ``text[pos:endpos]``: each from BEGIN to END; one not
    closed from after its BEGIN line over the key-shaped lines below it (its BEGIN line
    kept: see the module's docstring)."""
    at = pos
    end: re.Match[str] | None = None
    ended = True  # END lines may follow (none does once one search found none)
    while (begin := _KEY_BEGIN.search(text, at, endpos)) is not None:
        if ended and (end is None or end.start() < begin.end()):
            end = _KEY_END.search(text, begin.end(), endpos)
            ended = end is not None
        if end is not None and end.start() >= begin.end():
            yield begin.start(), end.end()
            at = end.end()
            continue
        body = _OPEN_BODY.match(text, begin.end(), endpos)
        start, stop = begin.end(), body.end() if body is not None else begin.end()
        while start < stop and text[start] in _BLANK:
            start += 1
        while stop > start and text[stop - 1] in _BLANK:
            stop -= 1
        if stop > start:
            yield start, stop
        at = max(stop, begin.end())


def open_key_block(text: str, inside: bool = False) -> bool:
    """Does ``text`` end inside a private key block: one begun in it and not ended, only
    key-shaped lines below its BEGIN line; or (``inside``: the text before it ended so)
    is it all key-shaped lines, the block going on?"""
    begin = None
    for begin in _KEY_BEGIN.finditer(text):  # noqa: B007  # the last one
        pass
    if begin is None and not inside:
        return False
    at = 0 if begin is None else begin.end()
    if _KEY_END.search(text, at):
        return False
    body = (_OPEN_BODY if begin is not None else _BODY_LINES).match(text, at)
    return body is not None and not text[body.end():].strip()


def key_block_rest(text: str) -> int:
    """Where the rest of a private key block begun in the text before ``text`` ends in
    it: the key-shaped lines it starts with and the END line below them (0: none)."""
    body = _BODY_LINES.match(text)
    stop = 0 if body is None else body.end()
    end = _KEY_END.match(text, len(text) - len(text[stop:].lstrip()))
    if end is not None:
        return end.end()
    return len(text[:stop].rstrip())


def key_block_tail(text: str, pos: int, endpos: int) -> Iterable[Span]:
    """The end of a key block whose start is in another text (the message before, or the
    note before): the body lines right above its END line, and that line."""
    for m in _KEY_END.finditer(text, pos, endpos):
        line = text.rfind("\n", pos, m.start()) + 1 or pos
        if text[line:m.start()].strip(" \t>"):
            continue  # END after other text on its line: not an armour line
        start = line
        while start > pos:
            above = text.rfind("\n", pos, start - 1) + 1 or pos
            if not _KEY_LINE.fullmatch(text, above, start - 1):
                break
            start = above
        if start < line:
            yield start, m.end()
