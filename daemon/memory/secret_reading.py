"""A text as the redaction rules read it inside its tokens, beside the text as it is.

A key is cut into pieces no rule knows, while it still reads and pastes as one, by

- characters that show nothing put inside it (a zero-width space, a soft hyphen, a word
  joiner: ``secret_rules.INVISIBLE_IN_TOKEN``), which the reading drops;
- an escape spelling one of its characters, as an encoder or a log writes it: percent-
  encoding, once or twice (``ghp%5F...``, ``sk%2Dproj%2D...``, ``gh%2570_...``), a JSON or
  C string's ``\\u0070`` or ``\\x70``, an HTML character reference (``&#95;``,
  ``&#x5f;``), quoted-printable's ``=5F``, ``=2D`` or ``=2E`` and its soft line break
  (``=`` ending a line inside a word: ``AKIAIOSF=\\nODNN7...``; not one after a "=" or
  before a character no token holds); the reading puts the character in its place (the
  soft break: nothing).

Only escapes spelling a character a token is made of (a letter, a digit, ``_``, ``-``,
``.``, and base64's ``/`` and ``+``: an AWS secret key URL-encoded, ``...%2FK7MDENG%2Bb...``,
or in a JSON string that escapes "/") are read so, a token spelled by escapes alone
too: ``=3D``, ``%20`` or ``caf%C3%A9`` read as they are. :func:`token_reading` gives
the reading with the way back from its positions to the text's (a span found there covers
the characters it was read from), or None where it is the text itself, as in most texts.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Final

from recalld.daemon.memory.secret_rules import INVISIBLE, INVISIBLE_IN_TOKEN, Span

__all__ = ["Reading", "token_reading"]

#: The characters tokens are made of that an escape inside one may spell.
_TOKEN_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
#: ...and those of base64 (an AWS secret key, a key's body) it may spell too.
_SPELLED: Final = _TOKEN_CHARS | {"/", "+"}
#: One escape: percent-encoding (``%25`` once more when encoded twice), a backslash
#: escape (JSON's ``\\/`` too), an HTML character reference, quoted-printable and its
#: soft line break. An encoder of quoted-printable writes a letter or a digit as it is
#: ("n=48" is no escape); it escapes "_" in an encoded word (RFC 2047), "-" or "." where
#: a line ends.
_ESCAPE: Final = (r"%(?:25)?[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\x[0-9A-Fa-f]{2}|\\/"
                  r"|&#[0-9]{2,3};|&#[xX][0-9A-Fa-f]{2};|=(?:5F|2D|2E|\r?\n)")
_ESCAPES: Final = re.compile(_ESCAPE)
#: Places tried one by one for an escape starting with one character, before a search.
_MAX_TRIES: Final = 16
_QP_SPELLED: Final = {"5F": "_", "2D": "-", "2E": "."}


def _spelled(escape: str) -> str | None:
    """The token character ``escape`` spells ("" for a soft line break), or None."""
    if escape[0] == "=":
        return "" if escape[1] in "\r\n" else _QP_SPELLED[escape[1:]]
    if escape[0] == "%":
        code = int(escape[-2:], 16)
    elif escape[0] == "&":
        code = int(escape[3:-1], 16) if escape[2] in "xX" else int(escape[2:-1])
    elif escape[1] == "/":
        return "/"  # JSON's escaped solidus (PHP's json_encode writes every "/" so)
    else:
        code = int(escape[2:], 16)
    char = chr(code)
    return char if char in _SPELLED else None


@dataclass(frozen=True, slots=True)
class Reading:
    """``text``, read from an original text where pieces were read otherwise: the
    ``n``-th such piece starts at ``at[n]`` in ``text`` and is ``read[n]`` long there (0:
    dropped, 1: a character spelled), and it came from ``source[n]``, ``source_len[n]``
    characters of the original."""

    text: str
    at: list[int]
    read: list[int]
    source: list[int]
    source_len: list[int]

    def _place(self, i: int) -> tuple[int, int]:
        """Where the character at ``i`` of :attr:`text` came from: (start, end)."""
        n = bisect.bisect_right(self.at, i) - 1
        if n < 0:
            return i, i + 1
        if i < self.at[n] + self.read[n]:
            return self.source[n], self.source[n] + self.source_len[n]
        start = i - self.at[n] - self.read[n] + self.source[n] + self.source_len[n]
        return start, start + 1

    def original(self, start: int, end: int) -> Span:
        """The span of the original text that ``text[start:end]`` was read from."""
        return self._place(start)[0], self._place(end - 1)[1]


def _has_escape(text: str) -> bool:
    """Whether ``text`` holds an escape. Each character an escape starts with is found
    by ``str.find`` and an escape tried there: a search for one escape pattern tries
    every place of every text that holds one of those characters ("50%", "n=48"), ~6
    times slower over prose; a text holding many of one (a line of "=") is searched."""
    match = _ESCAPES.match
    for head in "%\\&=":
        at = text.find(head)
        for _ in range(_MAX_TRIES):
            if at < 0:
                break
            if match(text, at) is not None:
                return True
            at = text.find(head, at + 1)
        else:
            if _ESCAPES.search(text, at) is not None:
                return True
    return False


def token_reading(text: str, *, invisible: bool = True) -> Reading | None:
    """``text`` read without what shows nothing inside its tokens and with the escapes
    inside them spelling their characters; None when that reads as ``text`` does.
    ``invisible``: False where ``text`` surely holds no character that shows nothing
    (``secret_forms.read_forms`` tells), not looked for then."""
    pieces: list[tuple[int, int, str]] = []  # (start, end, read as)
    if invisible and not text.isascii() and INVISIBLE.search(text) is not None:
        pieces.extend((m.start(), m.end(), "") for m in INVISIBLE_IN_TOKEN.finditer(text))
    if _has_escape(text):
        size = len(text)
        for e in _ESCAPES.finditer(text):
            spelled = _spelled(e.group())
            start, end = e.span()
            if spelled == "" and not (start and text[start - 1] in _TOKEN_CHARS
                                      and end < size and text[end] in _TOKEN_CHARS):
                continue  # a line ending in "=" (base64's padding, an assignment)
            if spelled is not None:
                pieces.append((start, end, spelled))
    if not pieces:
        return None
    pieces.sort()
    parts: list[str] = []
    at: list[int] = []
    read: list[int] = []
    source: list[int] = []
    source_len: list[int] = []
    pos = length = 0
    for start, end, spelled in pieces:
        parts.append(text[pos:start])
        length += start - pos
        at.append(length)
        read.append(len(spelled))
        source.append(start)
        source_len.append(end - start)
        parts.append(spelled)
        length += len(spelled)
        pos = end
    parts.append(text[pos:])
    return Reading("".join(parts), at, read, source, source_len)
