"""What a text shows: :func:`visible_text` (a text without what hides, reorders or blanks
it) and :func:`names_nothing` (a text with nothing seen in it: blank, or only invisible
characters). One rule for the daemon (a note, a turn, a node's name or content that
shows nothing is refused or dropped as a blank one is) and its clients (a fact of a
memory tool that shows nothing is no fact). Pure functions.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = ["BLANK_LETTERS", "JOINERS", "is_variation", "names_nothing", "shown_char",
           "visible_text"]

_GRAPHIC_ASCII_RE: Final = re.compile(r"[!-~]")
#: Joiners that shape words of some scripts (Persian, Indic conjuncts) and emoji sequences:
#: kept between two characters beyond ASCII; elsewhere they only hide (``ad\u200cmin``).
JOINERS: Final = "\u200c\u200d"
#: Characters that show as blank space though they are letters or symbols: Hangul
#: fillers, the braille blank, the musical null notehead, the Khmer inherent vowels.
BLANK_LETTERS: Final = "\u115f\u1160\u3164\uffa0\u2800\U0001d159\u17b4\u17b5"
#: Arabic's tatweel (kashida): a stroke that stretches the word it is drawn in (مرحـــبا)
#: to justify a line; with no letter it stretches none, and spells no word.
_TATWEEL: Final = "\u0640"
#: Code points Unicode reserves as default ignorable (drawn as nothing once assigned).
#: (Outside the tags and the variation selectors, which are dealt with on their own.)
_IGNORABLE: Final = (("\u2065", "\u2065"), ("\ufff0", "\ufff8"), ("\U000e0000", "\U000e001f"),
                     ("\U000e0080", "\U000e00ff"), ("\U000e01f0", "\U000e0fff"))
#: Tag characters, and the flag they spell a subdivision's flag after.
_TAGS: Final = ("\U000e0020", "\U000e007f", "\U0001f3f4")


def shown_char(ch: str) -> bool:
    """Whether ``ch`` is a character beyond ASCII that is seen (a joiner joins two)."""
    return not (ch.isspace() or ch.isascii() or unicodedata.category(ch)[0] == "C")


def visible_text(text: str) -> str:
    """``text`` on one line, as it is seen: runs of white space (line breaks too) as one
    space; without control characters, nor invisible ones that make two names look alike
    or show a name in another order (zero-width spaces, soft hyphens, bidi marks,
    embeddings, overrides and isolates, blank letters). Joiners stay where they join (see
    ``JOINERS``); right-to-left text stays as written."""
    text = " ".join(text.split())
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch in JOINERS:
            if 0 < i < len(text) - 1 and shown_char(text[i - 1]) and shown_char(text[i + 1]):
                out.append(ch)
        elif _TAGS[0] <= ch <= _TAGS[1]:  # a flag's subdivision (🏴 + tags: Scotland)
            if out and (out[-1] == _TAGS[2] or _TAGS[0] <= out[-1] <= _TAGS[1]):
                out.append(ch)
        elif not _blank(ch):
            out.append(ch)
    return " ".join("".join(out).split())


def _blank(ch: str) -> bool:
    """``ch`` shows nothing: a control or format character, a blank letter or symbol,
    or a code point reserved as default ignorable (the tags were dealt with before)."""
    return (unicodedata.category(ch) in ("Cc", "Cf") or ch in BLANK_LETTERS
            or any(low <= ch <= high for low, high in _IGNORABLE))


def names_nothing(text: str) -> bool:
    """Whether ``text`` has nothing seen to name a node by: only white space, invisible
    characters, combining marks with no letter to sit on, variation selectors, tatweel
    with no letter to stretch (its slug would be a hash of nothing a person can read).
    Also what a text of any length with nothing seen in it is: a note, a turn, a node's
    content."""
    if _GRAPHIC_ASCII_RE.search(text):  # seen as it is (a long note: no walk through it)
        return False
    return not any(not (ch.isspace() or ch in JOINERS or ch == _TATWEEL or is_variation(ch)
                        or unicodedata.category(ch)[0] == "M")
                   for ch in unicodedata.normalize("NFKC", visible_text(text)))


def is_variation(ch: str) -> bool:
    """A variation selector: it only picks how the character before it is drawn."""
    return "\ufe00" <= ch <= "\ufe0f" or "\U000e0100" <= ch <= "\U000e01ef"
