"""How a word is read whatever its form: the folding the keyword index applies to words
(accents, strokes and points off, ligatures as their letters, joiners out), shared by the
daemon's tokenizer (``recalld.daemon.index.tokenizer``) and the clients' choice of the
part of a hit to show around a query's words (``recalld.ipc.types.cut_part``), so that a
line holds a query's word wherever the index finds it. Pure functions.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Final

__all__ = ["CJK_RANGES", "INVISIBLE", "SMALL_KANA", "ZWNJ", "fold", "read_places"]

# Han (incl. extension A, compatibility ideographs, and the supplementary planes), kana,
# halfwidth forms are folded by NFKC, hangul syllables and jamo, CJK punctuation excluded;
# the ideographic iteration and closing marks and number zero (々 〆 〇) are parts of
# words (佐々木, 人々), not breaks between them. Thai, Lao, Khmer and Myanmar are written
# without spaces between words too (a space ends a phrase): their letters, vowel signs and
# tone marks are treated as CJK, so a word inside a phrase is found by its pairs (their
# digits and punctuation are not). The keyword index pairs the characters of their runs
# (``recalld.daemon.index.tokenizer``); so does the choice of the part of a hit to show.
CJK_RANGES: Final = (
    "\u0e01-\u0e3a\u0e40-\u0e4e\u0e81-\u0ecf\u0edc-\u0edf\u1000-\u103f\u1050-\u108f"
    "\u109a-\u109d\u1780-\u17d3\u17d7\u17dc-\u17dd"
    "\u1100-\u11ff\u3005-\u3007\u3040-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3130-\u318f\u31f0-\u31ff"
    "\u3400-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\U00020000-\U0003134f"
)

# Characters that only shape how a word is shown, never which word it is: the soft hyphen
# (a hyphenation point), the zero-width joiner (emoji sequences, Indic conjuncts), the word
# joiner and the byte-order mark used as one, and Arabic's tatweel (kashida: a stroke that
# stretches a word to justify a line, مرحـــبا for مرحبا). Taken out of the text before
# words are found, so they do not cut a word in two or make another word of it. (The
# zero-width space stays a break.)
INVISIBLE: Final = "\u00ad\u200d\u2060\ufeff\u0640"
# The zero-width non-joiner: inside a Persian word it keeps its parts' letters apart
# (می‌خواهم, کتاب‌ها), which writers as often glue (میخواهم) or part with a space (می
# خواهم). ``fold`` takes it out: the word is its parts glued, as ICU's NFKC case folding
# reads it; the keyword index also finds its parts, as Lucene's Persian analysis, which
# reads it as a space, does (``recalld.daemon.index.tokenizer``).
ZWNJ: Final = "\u200c"


# The combining marks ``fold`` drops: the diacritics of Latin, Greek and Cyrillic letters,
# Hebrew points and cantillation, Arabic harakat (vowels a reader supplies; most text
# omits them), Devanagari's nukta (the dot of ज़ and फ़, the z and f of loanwords, which
# Hindi text as often leaves off: ज़रूर is जरूर), as Lucene's HindiNormalizer drops it. The
# vowel signs of Indic scripts and Thai are letters of their words: kept.
_DROPPED_MARKS: Final = ((0x300, 0x36F), (0x591, 0x5BD), (0x5BF, 0x5BF), (0x5C1, 0x5C2),
                         (0x5C4, 0x5C5), (0x5C7, 0x5C7), (0x610, 0x61A), (0x64B, 0x65F),
                         (0x670, 0x670), (0x93C, 0x93C))
# The precomposed letters ``fold`` takes to their base letter: Latin (with its extended
# blocks), Greek, and Devanagari's letters with a nukta that NFKC keeps composed (``ऩ``,
# ``ऱ``, ``ऴ``). Cyrillic is left alone but for ё and the accented ѐ and ѝ, which
# Bulgarian and Macedonian write to tell one word from another (ѝ "her", и "and") and
# most text writes as е and и (й, ї, ў, ѓ, ќ are letters of their own).
_FOLDED_LETTERS: Final = ((0xC0, 0x24F), (0x370, 0x3FF), (0x1E00, 0x1FFF), (0x400, 0x401),
                          (0x40D, 0x40D), (0x450, 0x451), (0x45D, 0x45D), (0x929, 0x934))
# Devanagari's candrabindu (ँ, a nasal vowel), which Hindi text writes as often as the
# anusvara (ं) it is folded to (हँसना, हंसना), as Lucene's HindiNormalizer folds it.
_CANDRABINDU: Final = {"\u0901": "\u0902"}
# Latin letters whose mark Unicode does not decompose: a stroke or bar drawn through the
# letter (``ø``, ``ł``, ``đ``, ``ħ``) and the dotless ``ı`` and ``ȷ``.
# They fold to their base letter too, so that ``lodz`` meets ``Łódź``, and Turkish text in
# capitals meets its lower case (``DIYARBAKIR`` is ``diyarbakır``, ``ısparta`` ``ISPARTA``).
# Hooks, curls and tails make letters of their own (Hausa ``ƙ``, Ewe ``ƒ``): kept.
_STROKED_LETTERS: Final = ((0xC0, 0x2AF), (0x1E00, 0x1EFF), (0x2C60, 0x2C7F), (0xA720, 0xA7FF))
# Latin's ligature letters, written as the two letters they join as often as not
# (``Œuvre`` and ``oeuvre``, ``encyclopædia`` and ``encyclopaedia``).
_LIGATURES: Final = {"æ": "ae", "œ": "oe"}
# Arabic-script letters written one for another, as search engines fold them (Lucene's
# ArabicNormalizer and PersianNormalizer): Persian's yeh and keheh (ی, ک) and Arabic's
# (ي, ك), and the final yeh written dotless (ى); alef with a hamza or madda (أ, إ, آ) or
# wasla (ٱ), which most writers leave off (أحمد and احمد are one name), and bare alef (ا);
# teh marbuta (ة) and heh (ه), with the heh forms Persian and Urdu write (ۀ, ہ). A query
# typed on one keyboard finds a note written on another. (Urdu's yeh barree, ے, is a
# letter of its own: کی and کے are two words; so are the hamza on waw and yeh, ؤ ئ.)
_ARABIC_LETTERS: Final = {"ی": "ي", "ى": "ي", "ک": "ك", "أ": "ا", "إ": "ا",
                          "آ": "ا", "ٱ": "ا", "ة": "ه", "ۀ": "ه", "ہ": "ه"}
# The small kana ヵ and ヶ (and hiragana's ゕ ゖ) write a counter or the "ga" of a place
# name (一ヵ月, 霞ヶ関) as often as the full-size letters do (一カ月, 霞ケ関): one spelling.
SMALL_KANA: Final = {"ヵ": "カ", "ヶ": "ケ", "ゕ": "か", "ゖ": "け"}
# The zeros of the decimal digits of other scripts (Unicode's ``Nd``, ten in a row from
# zero): Arabic-Indic ``٠``, Persian ``۰``, Devanagari ``०``, Bengali ``০``, Thai ``๐`` and
# the rest, each folded to its ASCII digit, as search engines do (Lucene's
# DecimalDigitFilter, ICU's folding): ``2026`` finds ``۲۰۲۶`` and the other way round.
# (Full-width and mathematical digits are NFKC's.) Every ``Nd`` digit of Unicode 14,
# Python 3.11's: the scripts a later Unicode adds are folded once named here.
DIGIT_ZEROS: Final = (
    0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66,
    0xDE6, 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80,
    0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50,
    0xABF0, 0xFF10, 0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450,
    0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0,
    0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140,
    0x1E2F0, 0x1E950, 0x1FBF0)
_STROKED_NAME: Final = re.compile(
    r"LATIN (SMALL|CAPITAL) LETTER (?:DOTLESS ([A-Z])|([A-Z]) WITH (?:[A-Z ]*STROKE[A-Z ]*|"
    r"BAR|DOUBLE BAR))")


@functools.cache
def _fold_table() -> dict[int, str | None]:
    """``str.translate``'s table for ``fold``, made at its first use (a millisecond)."""
    def dropped(c: str) -> bool:
        return any(a <= ord(c) <= z for a, z in _DROPPED_MARKS)

    table: dict[int, str | None] = dict.fromkeys(map(ord, INVISIBLE + ZWNJ))
    for a, z in _DROPPED_MARKS:
        table.update(dict.fromkeys(range(a, z + 1)))
    for a, z in _FOLDED_LETTERS:
        for code in range(a, z + 1):
            parts = unicodedata.normalize("NFD", chr(code))
            if len(parts) > 1 and all(map(dropped, parts[1:])):
                table[code] = parts[0]
    for a, z in _STROKED_LETTERS:
        for code in range(a, z + 1):
            named = _STROKED_NAME.fullmatch(unicodedata.name(chr(code), ""))
            if named:
                base = named.group(2) or named.group(3)
                table[code] = base if named.group(1) == "CAPITAL" else base.lower()
    # The ligature letters as their two letters, with accents too (``ǽ`` is ``æ`` above).
    for code, to in list(table.items()):
        if to in _LIGATURES:
            table[code] = _LIGATURES[to]
    table.update({ord(lig): pair for lig, pair in _LIGATURES.items()})
    table.update({ord(small): full for small, full in SMALL_KANA.items()})
    table.update({ord(letter): to for letter, to in _ARABIC_LETTERS.items()})
    table.update({zero + n: str(n) for zero in DIGIT_ZEROS for n in range(10)})
    table.update({ord(sign): to for sign, to in _CANDRABINDU.items()})
    return table


def fold(text: str) -> str:
    """``text`` (NFKC-normalized, case folded) as the index spells its words: accents off
    Latin and Greek letters (``é`` → ``e``, ``ά`` → ``α``, the ``i`` and dot that ``İ``
    folds to → ``i``, strokes too: ``ł`` → ``l``, ``ø`` → ``o``, dotless ``ı`` → ``i``;
    the ligatures ``æ`` → ``ae``, ``œ`` → ``oe``),
    ``ё`` → ``е``, ``ѝ`` → ``и``, ``ヶ`` → ``ケ``, Hebrew and Arabic points and Devanagari's
    nukta dropped (its candrabindu ``ँ`` → ``ं``), Arabic-script
    letters written one for another as one (``_ARABIC_LETTERS``: ``ی`` → ``ي``, ``أ`` →
    ``ا``), digits of every script as ASCII ones (``۲۰۲۶`` → ``2026``), and the
    characters that only join or hyphenate words (``INVISIBLE``) and the non-joiner
    (``ZWNJ``) taken out."""
    return text if text.isascii() else text.translate(_fold_table())


def read_places(text: str) -> tuple[str, list[int]]:
    """``text`` as the index reads its words (NFKC, case folded, :func:`fold`ed), then
    decomposed (NFD), character by character; and for each character of that form, the
    index in ``text`` of the character it comes from. Two spellings the index reads as one
    word read alike here whichever form each was written in, composed or decomposed,
    full-width or half-width (``Việt`` and ``viet``, NFD ``한`` and ``한``, ``ｶﾞ`` and ``ガ``),
    and a place found in the read form is a place in ``text``."""
    if text.isascii():
        return text.lower(), list(range(len(text)))
    out: list[str] = []
    places: list[int] = []
    for i, ch in enumerate(text):
        read = _read_char(ch)
        out.append(read)
        places.extend([i] * len(read))
    return "".join(out), places


@functools.lru_cache(maxsize=4096)
def _read_char(ch: str) -> str:
    return unicodedata.normalize("NFD", fold(unicodedata.normalize("NFKC", ch).casefold()))
