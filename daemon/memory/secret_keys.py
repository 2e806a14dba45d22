"""Private key blocks (PEM, OpenSSH, SSH2, encrypted, PGP armour) for the redaction
rules (:mod:`secret_rules`): the block from its BEGIN line to its END line, and the end
of a block whose start is in another text."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

Span = tuple[int, int]

# PEM and OpenSSH armour (5 dashes), and SSH2's (RFC 4716: ``---- BEGIN SSH2 ... ----``).
KEY_BLOCK: Final = (
    r"-{4,5} ?BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)? ?-{4,5}"
    r".*?(?:-{4,5} ?END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)? ?-{4,5}|\Z)"
)
_KEY_END = re.compile(r"-{4,5} ?END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)? ?-{4,5}")
#: A line of a key block's body (or its first, cut short), as a chat or a quote holds it.
_KEY_LINE = re.compile(r"[ \t>]*[A-Za-z0-9+/=]+[ \t]*\r?")


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
