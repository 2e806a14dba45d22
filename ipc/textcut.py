"""Text cut to a number of characters without breaking what a reader sees as one character.

A cut by code points can leave a combining mark without its letter (``é`` written as ``e``
and U+0301), half of a flag (two regional indicators), an emoji sequence ending in a zero
width joiner, a skin tone or variation selector without its emoji, or a Hangul syllable
without its last jamo: the model reads a different or broken character. :func:`cut_text`
cuts before the whole cluster instead (an approximation of Unicode's extended grapheme
clusters, UAX #29, without a library). Pure functions.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["cut_text"]

_ZWJ: Final = "\u200d"
#: Ranges of code points that attach to the character before them (besides marks).
_EXTENDING: Final = (
    (0xFE00, 0xFE0F),    # variation selectors (text or emoji presentation)
    (0x1F3FB, 0x1F3FF),  # emoji skin tone modifiers
    (0xE0020, 0xE007F),  # tags (subdivision flags)
    (0xE0100, 0xE01EF),  # variation selectors supplement
    (0x1160, 0x11FF),    # Hangul jungseong and jongseong (a syllable's vowel and final)
    (0xD7B0, 0xD7FF),    # their extensions
)


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _extends(ch: str) -> bool:
    if ch == _ZWJ or unicodedata.category(ch) in ("Mn", "Me", "Mc"):
        return True
    code = ord(ch)
    return any(low <= code <= high for low, high in _EXTENDING)


def _boundary(text: str, i: int) -> bool:
    """Whether ``text`` may be cut before index ``i`` (0 < i < len(text))."""
    before, after = text[i - 1], text[i]
    if _extends(after) or before == _ZWJ or (before, after) == ("\r", "\n"):
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
