"""Text cut to a number of characters without breaking what a reader sees as one character.

A cut by code points can leave a combining mark without its letter (``é`` written as ``e``
and U+0301), half of a flag (two regional indicators), an emoji sequence ending in a zero
width joiner, a skin tone or variation selector without its emoji, a Hangul syllable
without its last jamo, a Thai consonant without its sara am, a Hindi conjunct (``क्ष``)
halved at its virama, or an Arabic number sign without its number: the model reads a
different or broken character. :func:`cut_text`
cuts before the whole cluster instead (an approximation of Unicode's extended grapheme
clusters, UAX #29, without a library). Pure functions.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["cluster_start", "cut_text"]

_ZWJ: Final = "\u200d"
#: Ranges of code points that attach to the character before them (besides marks).
_EXTENDING: Final = (
    (0xFE00, 0xFE0F),    # variation selectors (text or emoji presentation)
    (0x1F3FB, 0x1F3FF),  # emoji skin tone modifiers
    (0xE0020, 0xE007F),  # tags (subdivision flags)
    (0xE0100, 0xE01EF),  # variation selectors supplement
    (0x1160, 0x11FF),    # Hangul jungseong and jongseong (a syllable's vowel and final)
    (0xD7B0, 0xD7FF),    # their extensions
    (0x0E33, 0x0E33),    # Thai sara am and Lao am: vowels written after their consonant,
    (0x0EB3, 0x0EB3),    # letters by category but spacing marks to a reader
)
#: Ranges of code points that attach to the character after them (UAX #29's Prepend:
#: Arabic number and year signs, the Syriac abbreviation mark, ...).
_PREPENDING: Final = (
    (0x0600, 0x0605), (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891),
    (0x08E2, 0x08E2), (0x0D4E, 0x0D4E), (0x110BD, 0x110BD), (0x110CD, 0x110CD),
    (0x111C2, 0x111C3), (0x1193F, 0x1193F), (0x11941, 0x11941), (0x11A3A, 0x11A3A),
    (0x11A84, 0x11A89), (0x11D46, 0x11D46), (0x11F02, 0x11F02),
)
#: The viramas that join the consonant before them to the one after them into one
#: conjunct (UAX #29's InCB=Linker: Devanagari, Bengali, Gujarati, Oriya, Telugu,
#: Malayalam): ``क्ष`` is one character to a reader, ``क्`` another.
_LINKERS: Final = frozenset("\u094d\u09cd\u0acd\u0b4d\u0c4d\u0d4d")


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _extends(ch: str) -> bool:
    if ch == _ZWJ or unicodedata.category(ch) in ("Mn", "Me", "Mc"):
        return True
    code = ord(ch)
    return any(low <= code <= high for low, high in _EXTENDING)


def _prepends(ch: str) -> bool:
    code = ord(ch)
    return any(low <= code <= high for low, high in _PREPENDING)


def _conjunct(before: str, after: str) -> bool:
    """Whether a linking virama ``before`` joins the consonant ``after`` (a letter of its
    own script's block) to the one before it."""
    return (before in _LINKERS and ord(after) >> 7 == ord(before) >> 7
            and unicodedata.category(after) == "Lo")


def _boundary(text: str, i: int) -> bool:
    """Whether ``text`` may be cut before index ``i`` (0 < i < len(text))."""
    before, after = text[i - 1], text[i]
    if _extends(after) or before == _ZWJ or (before, after) == ("\r", "\n"):
        return False
    if (_prepends(before) and after not in "\r\n") or _conjunct(before, after):
        return False
    if 0x1100 <= ord(before) <= 0x115F and (  # a leading jamo takes what follows it
            0x1100 <= ord(after) <= 0x115F or 0xAC00 <= ord(after) <= 0xD7A3):
        return False
    if _regional(before) and _regional(after):
        run = i - 1
        while run > 0 and _regional(text[run - 1]):
            run -= 1
        return (i - run) % 2 == 0  # flags pair the indicators from the run's start
    return True


def cut_text(text: str, limit: int) -> str:
    """The longest start of ``text`` of at most ``limit`` characters that ends between
    two whole clusters (all of ``text`` when it fits; "" when its first cluster does
    not)."""
    if len(text) <= limit:
        return text
    i = max(limit, 0)
    while i > 0 and not _boundary(text, i):
        i -= 1
    return text[:i]


def cluster_start(text: str, i: int) -> int:
    """The first index at or after ``i`` where a whole cluster of ``text`` starts (a part
    of ``text`` taken from there shows no half character at its start)."""
    i = max(i, 0)
    while 0 < i < len(text) and not _boundary(text, i):
        i += 1
    return min(i, len(text))
