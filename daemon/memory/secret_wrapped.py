"""A credential's value wrapped over lines, as the assignment rule of
:mod:`secret_context` reads it: a long key continued on the lines below its name, more
indented (an INI file's or ``~/.aws/credentials``' continuation lines, a YAML plain
scalar folded over lines, a shell line ended by ``\\``), and a quoted value that closes
on a later line (TOML's and Python's ``\"\"\"...\"\"\"``, a YAML quoted scalar). Masked
on its first line only, the rest of the key stayed as it was; in a text masked so (a note
written before), the pieces below the mask are masked now.

:func:`fixed_tokens_finder`: a token of a fixed prefix and length (``ghp_`` and 36
characters, ``AKIA`` and 16, ``sk-ant-api03-`` and 95) broken at a line's end, as a
terminal or a mail client wraps a long paste: the first line ends in its prefix and a
part of it, the next line starts with exactly the rest, and the two read as one are the
token a format rule knows. Only then is the rest taken: a line that goes on with more or
fewer of the token's characters is not the rest of one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Finder, Rule, Span

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


#: Tokens of a fixed prefix, alphabet and length: ``(prefix, alphabet, tail length)``,
#: the tail the characters after the prefix (a format rule of ``secret_rules`` knows each).
#: Prefixes prose spells too (AWS's temporary ``ASIA``: "Asia") are left out: their hint
#: would have every such text read again.
_FIXED: Final = (
    (r"gh[pousr]_", "A-Za-z0-9", 36),
    (r"github_pat_", "A-Za-z0-9_", 82),
    (r"AKIA", "A-Z0-9", 16),
    (r"npm_", "A-Za-z0-9", 36),
    (r"AIza", "0-9A-Za-z_\\-", 35),
    (r"sk-ant-(?:api03|admin01)-", "A-Za-z0-9_\\-", 95),
    (r"shp(?:at|ca|pa|ss)_", "a-fA-F0-9", 32),
    (r"do[opr]_v1_", "a-f0-9", 64),
)
#: The start of such a token broken at the end of its line (its prefix and a part of its
#: tail, shorter than the whole), then the next line's start: its run of the alphabet.
_BROKEN: Final = tuple(
    (re.compile(rf"(?<![A-Za-z0-9_\-])(?P<head>{prefix}(?P<part>[{alphabet}]{{0,{length - 1}}}))"
                rf"[ \t]*\r?\n[ \t]*(?P<rest>[{alphabet}]+)(?![A-Za-z0-9_\-])"), length)
    for prefix, alphabet, length in _FIXED)
#: Where one of them may be broken: its prefix, then token characters up to a line's end
#: (one pass over a text, its patterns tried only there).
_AT_LINE_END: Final = re.compile(
    r"(?<![A-Za-z0-9_\-])(?:" + "|".join(prefix for prefix, _, _ in _FIXED)
    + r")[A-Za-z0-9_\-]*[ \t]*\r?\n")
#: What a hint of every such token holds (lowercase), for the rule's ``hints``.
FIXED_HINTS: Final = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "akia", "npm_",
                      "aiza", "sk-ant-", "shpat_", "shpca_", "shppa_", "shpss_", "_v1_")


def fixed_tokens_finder(shape_rules: Sequence[Rule]) -> Finder:
    """The finder of tokens of a fixed length broken over two lines that one of
    ``shape_rules`` knows whole."""
    return functools.partial(_broken_tokens, shape_rules)


def _broken_tokens(shape_rules: Sequence[Rule], text: str, pos: int,
                   endpos: int) -> Iterable[Span]:
    for at in _AT_LINE_END.finditer(text, pos, endpos):
        for pattern, length in _BROKEN:
            m = pattern.match(text, at.start(), endpos)
            if m is None or len(m.group("part")) + len(m.group("rest")) != length:
                continue  # the next line goes on with more, or stops short: not the rest
            token = m.group("head") + m.group("rest")
            if any(span == (0, len(token)) for rule in shape_rules if rule.find is not None
                   for span in rule.find(token, 0, len(token))):
                yield m.start("head"), m.end("rest")
                break


__all__ = ["FIXED_HINTS", "MULTILINE_QUOTED", "continued", "fixed_tokens_finder", "joined",
           "pieces_below"]
