"""Node names as they are seen and as file names: :func:`visible_text` (a name without
what hides, reorders or blanks it), :func:`names_nothing` (a name with nothing seen in
it), :func:`shows_no_word` (a text with no letter or digit) and :func:`slugify` (the
file name of a node's name). Pure functions.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Final

_DASHES_RE: Final = re.compile(r"-{2,}")
_GRAPHIC_ASCII_RE: Final = re.compile(r"[!-~]")
_DEVICE_RE: Final = re.compile(r"(?:con|prn|aux|nul|com[0-9]|lpt[0-9])\Z")
#: Joiners that shape words of some scripts (Persian, Indic conjuncts) and emoji sequences:
#: kept between two characters beyond ASCII; elsewhere they only hide (``ad\u200cmin``).
_JOINERS: Final = "\u200c\u200d"
#: Characters that show as blank space though they are letters or symbols: Hangul
#: fillers, the braille blank, the musical null notehead, the Khmer inherent vowels.
_BLANK_LETTERS: Final = "\u115f\u1160\u3164\uffa0\u2800\U0001d159\u17b4\u17b5"
#: Code points Unicode reserves as default ignorable (drawn as nothing once assigned).
#: (Outside the tags and the variation selectors, which are dealt with on their own.)
_IGNORABLE: Final = (("\u2065", "\u2065"), ("\ufff0", "\ufff8"), ("\U000e0000", "\U000e001f"),
                     ("\U000e0080", "\U000e00ff"), ("\U000e01f0", "\U000e0fff"))
#: Tag characters, and the flag they spell a subdivision's flag after.
_TAGS: Final = ("\U000e0020", "\U000e007f", "\U0001f3f4")


def _shown(ch: str) -> bool:
    return not (ch.isspace() or ch.isascii() or unicodedata.category(ch)[0] == "C")


def visible_text(text: str) -> str:
    """``text`` on one line, as it is seen: runs of white space (line breaks too) as one
    space; without control characters, nor invisible ones that make two names look alike
    or show a name in another order (zero-width spaces, soft hyphens, bidi marks,
    embeddings, overrides and isolates, blank letters). Joiners stay where they join (see
    ``_JOINERS``); right-to-left text stays as written."""
    text = " ".join(text.split())
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch in _JOINERS:
            if 0 < i < len(text) - 1 and _shown(text[i - 1]) and _shown(text[i + 1]):
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
    return (unicodedata.category(ch) in ("Cc", "Cf") or ch in _BLANK_LETTERS
            or any(low <= ch <= high for low, high in _IGNORABLE))


def names_nothing(text: str) -> bool:
    """Whether ``text`` has nothing seen to name a node by: only white space, invisible
    characters, combining marks with no letter to sit on, variation selectors (its slug
    would be a hash of nothing a person can read). Also what a text of any length with
    nothing seen in it is: a note, a turn, a node's content."""
    if _GRAPHIC_ASCII_RE.search(text):  # seen as it is (a long note: no walk through it)
        return False
    return not any(not (ch.isspace() or ch in _JOINERS or _variation(ch)
                        or unicodedata.category(ch)[0] == "M")
                   for ch in unicodedata.normalize("NFKC", visible_text(text)))


#: Markup spelt with letters that shows none: a task's box (``[x]``), an HTML tag without
#: attributes (``<br/>``, ``</div>``), a character reference (``&nbsp;``, ``&#8203;``);
#: else a letter (ideographs and syllables are letters) or a digit of any script, but for
#: the blank letters: a character that shows part of a word (group ``word``). Markup
#: starts before its letters, so a search meets it first.
_MARKUP_OR_WORD: Final = re.compile(
    r"\[[xX]\]|</?[A-Za-z][A-Za-z0-9]*\s*/?>|&(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);"
    f"|(?P<word>[^\\W_{_BLANK_LETTERS}])")


def shows_no_word(text: str) -> bool:
    """Whether ``text`` shows no word: no letter or digit of any script outside the markup
    spelt with letters (``_MARKUP_OR_WORD``); only markup, rules, punctuation, symbols,
    white space and invisible characters (``#``, ``---``, ``- [x]``, ``<br>``, zero-width
    spaces). Its embedding would mean nothing. Most text ends at its first letter."""
    pos = 0
    while (found := _MARKUP_OR_WORD.search(text, pos)) is not None:
        if found.group("word") is not None:
            return False
        pos = found.end()
    return True


def _variation(ch: str) -> bool:
    """A variation selector: it only picks how the character before it is drawn."""
    return "\ufe00" <= ch <= "\ufe0f" or "\U000e0100" <= ch <= "\U000e01ef"


def _slug_of(norm: str, limit: int) -> str:
    kept: list[str] = []
    for i, ch in enumerate(norm):
        # A mark is kept on the letter it belongs to, a joiner inside a word (Persian
        # ``می\u200cخواهم``); alone either would be an invisible file name.
        inside = bool(kept) and kept[-1] != "-"
        if ch in _JOINERS:
            if inside and norm[i + 1:i + 2].isalnum():
                kept.append(ch)
        elif not _variation(ch):
            mark = inside and unicodedata.category(ch)[0] == "M"
            kept.append(ch if ch.isalnum() or ch == "_" or mark else "-")
    return _DASHES_RE.sub("-", "".join(kept)).strip("-_")[:limit].rstrip("-_")


def in_words(text: str) -> str:
    """``text`` with each run of characters that are no part of a word made one ``-``:
    kept are letters, digits, ``_`` and ``-``, and as in :func:`slugify` a combining mark
    on the character before it (a vowel sign of Devanagari, Tamil or Thai: a word
    without it is another word; not one on a wide character, Han or kana) and a joiner
    inside a word beyond ASCII (Persian ``می\u200cخواهم``; between ASCII letters it
    only hides)."""
    kept: list[str] = []
    gap = False  # the last character kept stands for a run replaced
    for i, ch in enumerate(text):
        inside = bool(kept) and not gap and kept[-1] != "-"
        if ch.isalnum() or ch in "_-" or (inside and (
                (unicodedata.category(ch)[0] == "M" and not _wide(kept[-1]))
                or (ch in _JOINERS and _shown(kept[-1]) and text[i + 1:i + 2].isalnum()
                    and _shown(text[i + 1])))):
            kept.append(ch)
            gap = False
        elif not gap:
            kept.append("-")
            gap = True
    return "".join(kept)


def _wide(ch: str) -> bool:
    """Whether ``ch`` is a wide character (Han, kana, Hangul): a mark after one is no part
    of a word (kana's voicing marks are composed before)."""
    return unicodedata.east_asian_width(ch) in ("W", "F")


def _symbol_slug(norm: str, limit: int) -> str:
    """The slug of a name with no letter or digit (``🍵``, ``🚀``, ``!!!``): the Unicode
    names of its characters (``teacup-without-handle``); one too long for ``limit`` is cut
    and ends in a short hash of the name, so that every such name has a file of its own."""
    words = [unicodedata.name(ch, "") for ch in norm if not (
        ch.isspace() or ch in _JOINERS or _variation(ch) or unicodedata.category(ch)[0] == "M")]
    slug = _slug_of(" ".join(w for w in words if w).lower(), 10 * limit)
    if slug and len(slug) <= limit:
        return slug
    tag = hashlib.sha256(norm.encode()).hexdigest()[:8]
    return f"{slug[:limit - len(tag) - 1].rstrip('-_') or 'node'}-{tag}"


def slugify(text: str, limit: int = 60) -> str:
    """A file-name-safe slug; keeps letters of any script with their combining marks (CJK
    names stay readable, and so do Devanagari, Thai or Arabic ones: their vowel signs are
    marks, and a name without them is another word). A name without a letter or digit is
    named by its characters' Unicode names (:func:`_symbol_slug`). What is not seen
    (:func:`visible_text`, variation selectors) is left out. A name Windows reserves for a
    device (``con``, ``nul``, ``lpt1``) gets a ``_``: a workspace restored there keeps the
    file."""
    norm = unicodedata.normalize("NFKC", visible_text(text)).lower()
    slug = _slug_of(norm, limit) or _symbol_slug(norm, limit)
    return f"{slug}_" if _DEVICE_RE.match(slug) else slug
