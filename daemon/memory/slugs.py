"""Node names as file names and texts by what they show: :func:`slugify` (the file name
of a node's name), :func:`continued_from` (the note a note's name continues),
:func:`cut_name`, :func:`in_words`, :func:`shows_no_word` (a text with no letter or
digit); :func:`visible_text` (a name without what hides, reorders or blanks it) and
:func:`names_nothing` (a name, or any text, with nothing seen in it) are
:mod:`recalld.ipc.shown`'s, which clients apply too. Pure functions.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Final

from recalld.ipc.shown import BLANK_LETTERS as _BLANK_LETTERS
from recalld.ipc.shown import JOINERS as _JOINERS
from recalld.ipc.shown import is_variation as _variation
from recalld.ipc.shown import names_nothing as names_nothing
from recalld.ipc.shown import shown_char as _shown
from recalld.ipc.shown import visible_text as visible_text

_DASHES_RE: Final = re.compile(r"-{2,}")
_DEVICE_RE: Final = re.compile(r"(?:con|prn|aux|nul|com[0-9]|lpt[0-9])\Z")
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


def continued_from(stem: str) -> tuple[str, int]:
    """The note ``stem`` continues and its number: ``day-3`` is ``("day", 3)``, ``day``
    is ``("day", 1)``."""
    base, dash, n = stem.rpartition("-")
    return (base, int(n)) if dash and base and n.isdigit() and int(n) > 1 else (stem, 1)


def continued_order(name: str) -> tuple[str, int, str]:
    """A sort key of file names: by name, ``day.md``, ``day-2.md``... ``day-10.md`` in
    that order."""
    stem, suffix = name.rsplit(".", 1) if "." in name else (name, "")
    return (*continued_from(stem), suffix)


_NUMBERED: Final = re.compile(r"(.+?)(-\d{1,3})")


def cut_name(stem: str, limit: int) -> str:
    """``stem`` cut to ``limit`` characters (``-`` and ``_`` stripped at the ends), a
    number it ends with kept (``-2``: a note's name made unique, or one that continues
    another): cut off, the name would be that of another note, the one it follows."""
    numbered = _NUMBERED.fullmatch(stem)
    if numbered and len(stem) > limit:
        return numbered[1][:limit].strip("-_") + numbered[2]
    return stem[:limit].strip("-_")


def _stem(name: str) -> str:
    stem = name.strip()
    return stem[:-3] if stem.lower().endswith(".md") else stem


def has_name(name: str) -> bool:
    """Whether ``name`` holds a letter or digit, which :func:`slug` makes a file name of;
    of one without (``""``, ``".md"``, ``"!!!"``) it makes ``note``, which a caller that
    named the file did not ask for."""
    return any(ch.isalnum() for ch in _stem(name))


def slug(name: str) -> str:
    """A file-name stem from a model-chosen name: words (with their marks, see
    :func:`in_words`) and ``-`` only, cut to 80 characters (:func:`cut_name`)."""
    stem = cut_name(in_words(_stem(name)).strip("-_").lower(), 80)
    if not stem:
        stem = "note"
    if stem == "index":
        stem = "index-note"  # the day's index belongs to the daemon
    return stem
