"""A credential's value wrapped over lines, as the assignment rule of
:mod:`secret_context` reads it: a long key continued on the lines below its name, more
indented (an INI file's or ``~/.aws/credentials``' continuation lines, a YAML plain
scalar folded over lines, a shell line ended by ``\\``), and a quoted value that closes
on a later line (TOML's and Python's ``\"\"\"...\"\"\"``, a YAML quoted scalar). Masked
on its first line only, the rest of the key stayed as it was; in a text masked so (a note
written before), the pieces below the mask are masked now.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Span

#: The next line holding one piece of a key alone (after a ``\`` ending the line before,
#: or none), more indented than its name's line: the piece's characters are base64's and
#: tokens', never a ``:`` (that starts a key of its own: ``  host: db01``).
_NEXT_PIECE: Final = re.compile(
    r"[ \t]*\\?[ \t]*\r?\n(?P<indent>[ \t]+)(?P<piece>[A-Za-z0-9/+=_\-.~]{4,400})"
    r"[ \t]*\\?[ \t]*(?=\r?\n|\Z)")
#: How many lines one value may be wrapped over.
_MAX_LINES: Final = 16

#: A quoted value going on past its line: three quotes (TOML, Python) or one (YAML).
MULTILINE_QUOTED: Final = (
    r"(?P<mq>\"\"\"|'''|\"|')(?P<mvalue>[^\"'\n]{0,400}(?:\r?\n[^\"'\n]{0,400}){1,16})"
    r"(?P=mq)")


def _piece(value: str) -> bool:
    """A piece of a key, not a word continuing prose (``- password: Xq9...`` then ``  done``
    under it in a Markdown list): a digit or a symbol in it, or capitals after its first
    letter beside small letters."""
    if not value.isalpha():
        return True
    rest = value[1:]
    return any(c.isupper() for c in rest) and any(c.islower() for c in rest)


def pieces_below(text: str, start: int, end: int) -> Span | None:
    """The span of the pieces of a value (``text[start:end]``, ending its line) wrapped
    onto the lines below, each alone on its line and more indented than the line of its
    name; None if there are none."""
    line = text[text.rfind("\n", 0, start) + 1:start].expandtabs()
    indent = len(line) - len(line.lstrip())
    first = None
    for _ in range(_MAX_LINES):
        m = _NEXT_PIECE.match(text, end)
        if (m is None or len(m.group("indent").expandtabs()) <= indent
                or not _piece(m.group("piece"))):
            break
        first = m.start("piece") if first is None else first
        end = m.end("piece")
    return None if first is None else (first, end)


def continued(text: str, span: Span) -> Span:
    """``span`` (an unquoted value that ends its line) with the pieces of it wrapped onto
    the lines below (:func:`pieces_below`)."""
    below = pieces_below(text, *span)
    return span if below is None else (span[0], below[1])


def joined(value: str) -> str:
    """A quoted value wrapped over lines, as one: each line without the indentation that
    starts it, the ``\\`` that ends it and its line break."""
    return "".join(line.strip().removesuffix("\\").strip() for line in value.splitlines())


__all__ = ["MULTILINE_QUOTED", "continued", "joined", "pieces_below"]
