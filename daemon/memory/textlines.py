"""The lines of two versions of a text compared, as the memory jobs compare a node or a
note with its update: which lines a new version keeps (all of their words, so detail
added inside a line keeps it), which list items it drops, which lines it changed.
Pure functions.
"""

from __future__ import annotations

import re
import unicodedata

from recalld.daemon.index.marks import MARK_RUN


def norm_line(line: str) -> str:
    """``line`` as lines are compared: without its bullet, whitespace and case, in one
    Unicode form (NFKC, as node names are compared). A node edited by hand where text is
    saved decomposed (``e`` and a combining accent, as macOS names files) had no line in
    common with the model's rewrite of it, which comes composed: every REFINE of it was
    refused as dropping all of its lines. A list item's mark is no part of it, numbered
    ones too: a step put into a numbered procedure renumbers the steps after it, which
    say what they said."""
    mark = _BULLET_MARK.match(line)
    if mark:
        line = line[mark.end():]
    folded = unicodedata.normalize("NFKC", line).strip()
    marks = len(folded) - len(folded.lstrip("-*+> "))
    if marks and folded[marks - 1] == "-" and folded[marks:marks + 1].isdigit():
        marks -= 1  # the sign of a number (-5 °C), not a mark
    return " ".join(folded[marks:].split()).casefold()


def content_lines(text: str) -> list[str]:
    """The non-blank lines of ``text``, as :func:`norm_line` gives them."""
    return [n for n in (norm_line(ln) for ln in text.splitlines()) if n]


# A list item's mark: Markdown's (``-``, ``*``, ``+``, ``1.``, ``1)``, then a space), the
# bullets people paste (``•``, ``◦``, ``▪``, ``–``), and the numbering of Chinese and
# Japanese lists, often with no space after it (``1、``, ``（1）``, ``①``, ``・``).
_BULLET_MARK = re.compile(
    r"^\s*(?:(?:[-*+•◦‣▪▫●○■□–]|\d+[.)])\s+"
    r"|(?:[•・·]|\d+[、．）]|[（(]\d+[）)]|[①-⑳⑴-⒇])\s*)")
# Scripts written without spaces between words (Chinese, Japanese with its half-width
# kana; Korean syllables; Thai, Lao, Khmer, Myanmar, Tibetan): each character is a word of
# its own, so a refinement that inserts detail inside such a run ("妹妹住在格拉茨" ->
# "妹妹安娜住在格拉茨", "ฉันชอบชาเขียว" -> "ฉันชอบชาเขียวร้อน") still holds every word of
# the old line.
_CJK = ("\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff"
        "\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f")
# Any other word goes on through combining marks (the vowel signs and viramas of Indic
# scripts, Arabic and Hebrew points), which ``\w`` does not hold: cut at them, a word
# became its consonants, and "चेन्नई" (Chennai) was held by a line saying "रांची" (Ranchi),
# "بَغْدَادَ" (Baghdad) by one saying "دُبَيّ" (Dubai).
# A number is one word, whatever writes it: Chinese and Japanese numerals ("九百五十",
# "十五日") and the digits of the scripts above (Thai "๙๕๐"). Taken a character at a time,
# "九百" (900) was held by a line saying "九百五十" (950), "三月五日" by "三月十五日": a
# note stating an older number corroborated the new one, or turned it back by a refinement.
_NUMERALS = "〇零一二三四五六七八九十百千万萬亿億两兩"
# A number written with separators is one word too, with its sign: "2.0.1" is not
# "2.1.0", nor "2026-05-03" "2026-03-05", nor "-5 °C" "5 °C" (their parts were words of
# their own, the same set in each).
_WORD = re.compile(f"(?=[{_NUMERALS}]|[{_CJK}])[{_NUMERALS}\\d]+"
                   f"|[{_CJK}]|(?:(?<![\\w.,])[-\u2212](?=\\d))?[^\\W{_CJK}]"
                   f"(?:[^\\W{_CJK}]|{MARK_RUN}|(?<=\\d)[.,:/\\-](?=\\d))*")


# Lines that state nothing of their own: headings, rules, code fences, table rules. The
# indent is taken whole (a lookahead and its backreference: never given back). Given back
# a space at a time, the table rule's own \s* read the rest of it again each time, so a
# line of 16,000 spaces took 2 s.
_NO_FACT = re.compile(r"^(?=(\s*))\1(?:#|```|~~~|(?:[-*_]\s*){3,}$|\|?\s*:?-{3,})")


_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+\S")


def dropped_bullets(old: str, new: str, *, prose: bool = False) -> list[str]:
    """The list items of ``old`` (``-``, ``*``, ``+``, ``•``, numbered, ``1、``, nested too)
    that no line of ``new`` keeps, as written in ``old``; with ``prose``, its lines of
    prose too (not headings, rules or code fences). A line keeps an item if it holds
    all of the item's words (case-insensitive; in CJK text, its characters): a refinement
    that adds detail keeps it."""
    new_words = [set(_WORD.findall(ln)) for ln in content_lines(new)]
    out = []
    for line in old.splitlines():
        mark = _BULLET_MARK.match(line)
        if mark:
            item = line[mark.end():]
        elif prose and not _NO_FACT.match(line):
            item = line
        else:
            continue
        if item.strip():
            words = set(_WORD.findall(norm_line(item)))
            if words and not any(words <= have for have in new_words):
                out.append(line.strip())
    return out


def with_headings(text: str, lines: list[str], held: str) -> list[str]:
    """``lines`` (of ``text``, as :func:`dropped_bullets` gives them: what a note
    ``held`` lacks), each group after the heading of ``text`` it is under when ``held``
    has no such heading yet: facts added at a note's end keep the section they were
    written in. A line not found in ``text`` comes last, as it is."""
    have = {ln.strip() for ln in held.splitlines() if _HEADING.match(ln)}
    left = list(lines)
    out: list[str] = []
    heading = None
    for line in text.splitlines():
        if _HEADING.match(line):
            heading = line.strip()
        elif line.strip() in left:
            left.remove(line.strip())
            if heading is not None and heading not in have:
                out += ["", heading]
                have.add(heading)
            out.append(line.strip())
    return out + left


def kept_fraction(old: str, new: str) -> float:
    """The share of the old content's lines that a line of new keeps: holds all of its
    words (as :func:`dropped_bullets` reads them), so detail added inside a line keeps
    it; a line without words (a rule) must be there as it is (whitespace-insensitive)."""
    old_lines = content_lines(old)
    if not old_lines:
        return 1.0
    new_lines = content_lines(new)
    new_words = [set(_WORD.findall(ln)) for ln in new_lines]

    def kept(line: str) -> bool:
        words = set(_WORD.findall(line))
        return any(words <= have for have in new_words) if words else line in new_lines

    return sum(1 for ln in old_lines if kept(ln)) / len(old_lines)


def changed_lines(old: str, new: str) -> list[str]:
    """The content lines of ``old`` that ``new`` does not hold as they are (whitespace-
    and bullet-insensitive), as written in ``old``: what an update leaves behind."""
    new_lines = set(content_lines(new))
    return [ln for ln in old.splitlines() if norm_line(ln) and norm_line(ln) not in new_lines]
