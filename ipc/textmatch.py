"""Where a hit holds a query: the line of a hit, and the place in one line, that a part
shown to a model is cut around (``recalld.ipc.types.cut_part``), read as the keyword index
reads words (``recalld.ipc.textfold.read_places``). Pure functions.

Words are found as they are; a run of Chinese, Japanese, Korean, Thai, Lao, Khmer or
Myanmar characters (no spaces between its words) is found by its pairs of characters, as
the index finds it. A common pair of such a run (``的人``, the ``ม่`` of ``ไม่``) turns up
all over a text about something else, so the place a run matches best is where the whole
run is, else where the most of its distinct pairs are close together; not the first of
its pairs.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from recalld.ipc.textfold import CJK_RANGES, read_places

__all__ = ["QueryWords", "match_span", "matched_line", "query_words"]


@functools.cache
def _cjk() -> re.Pattern[str]:
    """The class of :data:`CJK_RANGES` (several hundred ranges: compiled with the first
    word beyond ASCII, which holds none of them)."""
    return re.compile(f"[{CJK_RANGES}]")


def _in_cjk(word: str) -> bool:
    return not word.isascii() and _cjk().search(word) is not None


class QueryWords(NamedTuple):
    """A query's ``words`` as the index reads them (a run of CJK or Thai characters as
    its pairs), and its ``phrases``: those runs whole (of two characters or more)."""

    words: frozenset[str]
    phrases: frozenset[str]


def _words(text: str) -> list[str]:
    """The runs of letters and digits of ``text``, each going on through the combining
    marks in it (an accent typed decomposed, a Hindi or Thai vowel sign, a Hebrew point)."""
    words: list[str] = []
    word: list[str] = []
    for ch in text:
        if ch.isalnum() or (word and unicodedata.category(ch)[0] == "M"):
            word.append(ch)
        elif word:
            words.append("".join(word))
            word = []
    if word:
        words.append("".join(word))
    return words


def query_words(query: str) -> QueryWords:
    """The words of ``query`` a line is searched for, read as the index reads words
    (``read_places``: ``viet`` is in ``Việt``, ``ガ`` in ``ｶﾞ``): each run of letters and
    digits, a run of Chinese, Japanese, Korean, Thai, Lao, Khmer or Myanmar characters
    (``CJK_RANGES``) as its pairs (as the daemon reads such text: no spaces between its
    words) and as a phrase."""
    words: set[str] = set()
    phrases: set[str] = set()
    for word in _words(unicodedata.normalize("NFKC", query)):
        cjk = _in_cjk(word)
        if cjk and len(word) > 1 and (read := read_places(word)[0]):
            phrases.add(read)
        if cjk and len(word) > 2:
            pairs: Iterable[str] = (word[i:i + 2] for i in range(len(word) - 1))
        else:
            pairs = (word,)
        words.update(read for pair in pairs if (read := read_places(pair)[0]))
    return QueryWords(frozenset(words), frozenset(phrases))


def matched_line(lines: list[str], query: str) -> int | None:
    """The index of the line of ``lines`` that holds the query best: the most of its
    phrases whole first, then the most of its words, each weighing the less the more
    lines hold it (a word on every line tells nothing); the first of equals; None when no
    line holds any word."""
    asked = query_words(query) if query.strip() else QueryWords(frozenset(), frozenset())
    if not asked.words:
        return None
    read = [read_places(line)[0] for line in lines]

    def weights(words: frozenset[str]) -> list[float]:
        out = [0.0] * len(lines)
        for word in words:
            held = [i for i, line in enumerate(read) if word in line]
            for i in held:
                out[i] += 1 / len(held)
        return out

    scores = list(zip(weights(asked.phrases), weights(asked.words), strict=True))
    best = max(scores)
    return scores.index(best) if best[1] else None


def match_span(line: str, query: str, width: int) -> tuple[int, int]:
    """Where in ``line`` the query matches best: the ends (indexes just past them) of
    the first and the last match of it there, at most about ``width`` apart (the first
    one not found again later there: a common pair before a phrase is not its start);
    (0, 0) when none is in it. A query of words only: its first word in the line. A query with runs
    found by pairs: the place holding the most of its phrases whole, then the most of its
    distinct words and pairs; the first of equals. One pass over the matches (sorted)."""
    asked = query_words(query)
    read, places = read_places(line)
    if not asked.phrases:
        ends = [i + len(w) for w in asked.words if (i := read.find(w)) >= 0]
        end = places[min(ends) - 1] + 1 if ends else 0
        return end, end
    found: list[tuple[int, int]] = []  # (end in read, which word: phrases first)
    for which, word in enumerate([*asked.phrases, *asked.words]):
        i = read.find(word)
        while i >= 0:
            found.append((i + len(word), which))
            i = read.find(word, i + 1)
    if not found:
        return 0, 0
    found.sort()
    # A score of phrases whole first, then words: a phrase outweighs every word.
    weight = [len(asked.words) + 1 if which < len(asked.phrases) else 1
              for which in range(len(asked.phrases) + len(asked.words))]
    held = [0] * len(weight)
    full = sum(weight)
    score = best = left = 0  # the score of the matches ending within width
    first = last = 0  # the matches of the best place: found[first:last + 1]
    for right, (end, which) in enumerate(found):
        if not held[which]:
            score += weight[which]
        held[which] += 1
        while found[left][0] <= end - width:
            gone = found[left][1]
            held[gone] -= 1
            if not held[gone]:
                score -= weight[gone]
            left += 1
        if score > best:
            best, first, last = score, left, right
            if best == full:  # all of the query: none can be better
                break
    # Its first matches that are again later in it add nothing: the part starts after.
    again = Counter(which for _end, which in found[first:last + 1])
    while again[found[first][1]] > 1:
        again[found[first][1]] -= 1
        first += 1
    return places[found[first][0] - 1] + 1, places[found[last][0] - 1] + 1
