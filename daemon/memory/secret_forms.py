"""Compatibility forms of ASCII characters, as the redaction rules read them.

A key typed or pasted through a Chinese or Japanese input method comes in full-width
forms (``ｇｈｐ＿…``, ``password：``); a styled text may carry mathematical letters
(``𝐠𝐡𝐩_…``), small or vertical forms of punctuation, or other spaces. Each of these
characters is one whose NFKC form is one printable ASCII character: the rules read it as
that character. One character each, so the spans found are the original text's, and the
characters that show nothing inside a token (``secret_rules.INVISIBLE_IN_TOKEN``) are
looked for in the text so read: a zero-width space inside a full-width key is taken out
as inside an ASCII one.

:func:`ascii_forms` is computed from ``unicodedata`` over :data:`_BLOCKS`, the blocks
that hold such characters (tests/test_redact_forms.py checks that no other block does).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["as_ascii", "ascii_forms", "read_forms"]

#: The code point ranges holding every character whose NFKC form is one printable ASCII
#: character (Latin-1 and spacing modifiers, Greek question mark, phonetic modifiers,
#: spaces and leaders, letterlike symbols and numerals, enclosed letters, Latin
#: extended-C and -D modifiers, Hebrew plus, small, vertical and full-width forms,
#: mathematical letters, segmented digits).
_BLOCKS: Final = (
    (0xA0, 0x2FF), (0x37E, 0x37E), (0x1D2C, 0x1DBF), (0x1FEF, 0x1FEF),
    (0x2000, 0x200A), (0x2024, 0x2024), (0x202F, 0x202F), (0x205F, 0x205F),
    (0x2070, 0x209F), (0x2100, 0x218F), (0x2460, 0x24FF), (0x2C7C, 0x2C7D),
    (0x3000, 0x3000), (0xA7F2, 0xA7F4), (0xFB29, 0xFB29), (0xFE10, 0xFE6F),
    (0xFF01, 0xFF5E), (0x107A5, 0x107A5), (0x1D400, 0x1D7FF), (0x1F100, 0x1F1FF),
    (0x1FBF0, 0x1FBF9),
)


def _ascii_form(char: str) -> int | None:
    form = unicodedata.normalize("NFKC", char)
    return ord(form) if len(form) == 1 and form.isascii() and form.isprintable() else None


@functools.cache
def ascii_forms() -> dict[int, int]:
    """Code point -> the ASCII code point it stands for (a ``str.translate`` table); made
    at the first text that is not ASCII (~10 ms), not at import."""
    return {c: a for lo, hi in _BLOCKS for c in range(lo, hi + 1)
            if (a := _ascii_form(chr(c))) is not None and a != c}


@functools.cache
def _forms_or_beyond() -> re.Pattern[str]:
    """Finds a character of :func:`ascii_forms` or one that shows nothing
    (``secret_rules.INVISIBLE_BMP_CHARS``) within the BMP, or any character beyond it.
    Written as ranges of code points: the BMP's are one table lookup a character; beyond
    it, each range of a class is tried one after the other at every position of the text
    (the mathematical letters' ~740 code points make dozens of ranges, ~1 us a
    character), one range is not."""
    from recalld.daemon.memory.secret_rules import INVISIBLE_BMP_CHARS

    runs: list[list[int]] = []
    for c in sorted(ascii_forms()):
        if c > 0xFFFF:
            break
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return re.compile("[" + "".join(re.escape(chr(lo)) + "-" + re.escape(chr(hi))
                                    for lo, hi in runs)
                      + INVISIBLE_BMP_CHARS + "\U00010000-\U0010FFFF]")


#: How many kinds of characters :func:`as_ascii` replaces one by one (or passes: those
#: that show nothing, those beyond the BMP read as they are) before it reads the rest of
#: the text at once.
_KINDS: Final = 16


def as_ascii(text: str) -> str:
    """``text`` with each compatibility form of an ASCII character read as that
    character (the same length: positions are kept)."""
    return read_forms(text)[0]


def read_forms(text: str) -> tuple[str, bool]:
    """:func:`as_ascii` of ``text``, and whether it may hold a character that shows
    nothing (``secret_rules.INVISIBLE``; False: surely none, found in the same pass)."""
    if text.isascii():
        return text, False
    # Most texts hold none of these characters, or one or two kinds of them (a Chinese
    # text's full-width comma): found by a search from the place the last was found,
    # each kind is replaced in the whole text at once. None of the kinds found before is
    # left anywhere (a replacement is ASCII, never one of them nor one that shows
    # nothing): what the search finds no more is what ``str.translate`` would leave as it
    # is, and no character that shows nothing was passed unseen.
    forms = ascii_forms()
    search = _forms_or_beyond().search
    invisible = False
    found = search(text)
    for _ in range(_KINDS):
        if found is None:
            return text, invisible
        char = found.group()
        read = forms.get(ord(char))
        if read is not None:
            text = text.replace(char, chr(read))
        elif not invisible:
            from recalld.daemon.memory.secret_rules import INVISIBLE

            invisible = INVISIBLE.match(char) is not None
        found = search(text, found.end())
    if len(text) >= _ARRAY_CHARS:
        return "".join(_read_array(text[i:i + _ARRAY_PIECE])
                       for i in range(0, len(text), _ARRAY_PIECE)), True
    return text.translate(forms), True


#: Texts this long or longer, holding many kinds of these characters (or of characters
#: beyond the BMP), are read by a table lookup over their code points (numpy): 4,000
#: characters in ~0.15 ms instead of ~1 ms for ``str.translate`` (a dict lookup, and a
#: KeyError, for each character). Shorter ones are not worth the arrays.
_ARRAY_CHARS: Final = 512
#: ... in pieces of this many characters, so that a note of megabytes does not make
#: arrays of four bytes a character all at once.
_ARRAY_PIECE: Final = 1 << 16


@functools.cache
def _form_table() -> npt.NDArray[np.uint32]:
    """Code point -> the code point the rules read (itself for most), up to the last
    code point :func:`ascii_forms` maps."""
    import numpy as np

    forms = ascii_forms()
    table = np.arange(max(forms) + 1, dtype="<u4")
    table[list(forms)] = list(forms.values())
    return table


def _read_array(text: str) -> str:
    import numpy as np

    table = _form_table()
    # "surrogatepass": a lone surrogate (a file name's undecodable byte) is a code point
    # like any other here.
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    read = np.where(points < len(table), table[np.minimum(points, len(table) - 1)], points)
    if np.array_equal(read, points):
        return text
    return read.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")
