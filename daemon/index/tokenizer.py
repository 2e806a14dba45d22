"""Text to search terms, the same function at index and at query time.

Owns the one tokenizer every keyword path uses: chunk indexing, query parsing and the quality
benchmarks. Pure and synchronous; safe to call from worker threads (the only shared state is a
bounded stem cache, whose races can at worst compute a stem twice).

What it emits, after NFKC normalization, case folding and ``fold``ing (accents, strokes and
bars off Latin and Greek letters, ``æ`` and ``œ`` as ``ae`` and ``oe``, Hebrew and Arabic
points off their letters, an alef's hamza or madda too, soft hyphens and joiners out of
words, digits of every script as ASCII digits: ``café`` meets ``cafe``, ``۲۰۲۶`` ``2026``,
``İstanbul`` meets ``istanbul``, ``Łódź`` ``lodz``, ``DIYARBAKIR`` ``diyarbakır``,
``Œuvre`` ``oeuvre``, a word hyphenated for display is one word, one a non-joiner parts
is the word glued (and gives its parts, as a compound does); ``recalld.ipc.textfold``,
which the clients read lines by too):
- Words of alphabetic scripts, English stopwords dropped, lightly stemmed (``_stem``: plural,
  ``-ed``/``-ing`` and a few derivational suffixes), whatever their case, so that a query typed in
  lower case meets ``ECONNREFUSED`` or ``parseRequests`` in a note.
- Identifiers and compound tokens (``handleWebSocketReconnect``, ``snake_case_name``,
  ``v2.3.1``, ``config.toml``, ``foo-bar.md``, ``__init__.py``, ``std::vector``, ``C++``,
  ``C#``) whole, plus their parts, so both
  an exact query and a query for one part find them; a path (``src/app/config.toml``) also
  gives its compound names whole (``config.toml``), a dotted name its compound keys
  (``max_age`` of ``cache.max_age``).
- A name of three or more Latin letters with a number glued on (``python3``, ``Windows11``,
  ``BRCA1``) whole, plus the name: a query for ``python`` finds it, and one for ``python3``
  ranks the notes holding it first. SciFact nDCG@10 0.6878 without the name, 0.6976 with it.
- Emoji and pictographs (``🚀``, ``✅``, a flag), one term each.
- CJK runs (Han, kana, hangul, and the scripts written without spaces between words: Thai,
  Lao, Khmer, Myanmar) as overlapping character bigrams plus single characters (a middle
  dot joining the parts of a name, ``コンピュータ・ウイルス``, ``迈克尔·乔丹``, taken out:
  the name is one run, found typed with the dot or without it). The query
  side (``tokenize_query``) uses only the bigrams of runs of two or more characters: a bigram
  carries the word signal, and single characters of a long query would only add noise; a
  one-character run is queried by its unigram, so short queries still find something.

Measured with our BM25 (tests/bench/quality_lexical.py), nDCG@10:
- SciFact: 0.691 as shipped; without stemming 0.677, without stopwords 0.684 (bm25s with its
  default tokenizer 0.662, SQLite FTS5 0.668).
- CMRC 2018: 0.984 as shipped; unigrams also at query time 0.986 (kept off: single characters
  have the longest postings lists, so they cost most of the query time for +0.002); no unigrams
  in the index 0.984 (kept: single-character queries must find something).

A document's length for BM25 (``doc_length``) counts its CJK text by characters, one term per
``CJK_CHARS_PER_TERM`` of them (about a word), not by the characters plus pairs it is indexed
as: otherwise a Chinese note is several times as long in terms as an English note of the same
content, and BM25's length normalisation buries a rare term in it. Measured on the generated
bilingual needle set (tests/bench/bilingual.py, keyword only, without exact-term promotion),
hit@1 counting characters plus pairs 0.20, characters 0.24, half the characters 0.47, a third
0.67; CMRC 2018 nDCG@10 0.9842, 0.9838, 0.9836, 0.9833 (English text is unaffected).

Index-time counting in bulk (worker processes) uses ``tokenize_split``: the same terms, with
CJK runs handed over whole so ``postings.Slab.local`` counts their characters and pairs in
numpy instead of making a string of each (most tokens of Chinese text are those).
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from typing import Final

from recalld.daemon.index import nfkc
from recalld.daemon.index.marks import MARK_RUN
from recalld.daemon.index.memo import Memo
from recalld.ipc.textfold import CJK_RANGES as _CJK_RANGES
from recalld.ipc.textfold import INVISIBLE as _INVISIBLE
from recalld.ipc.textfold import SMALL_KANA, ZWNJ, fold

__all__ = ["CJK_CHARS_PER_TERM", "STOPWORDS", "cjk_length", "cjk_re", "doc_length", "fold",
           "tokenize", "tokenize_query", "tokenize_split"]

# The dots that join the parts of a word or a name written in CJK, between two of its
# characters: a katakana loanword or a foreign name (コンピュータ・ウイルス, ジョン・スミス,
# ジャン゠ポール) and a transcribed name in Chinese (迈克尔·乔丹, also typed with a bullet or
# a hyphenation point), written with the dot or without it alike. Taken out there, so the
# parts are one run and their pairs meet across it. No CJK characters themselves (the
# katakana middle dot and double hyphen are punctuation): elsewhere they end words, as a
# bullet before a list item (・項目) does.
_JOINING_DOTS: Final = "\u00b7\u2022\u2027\u30a0\u30fb"
# Compound tokens: alnum runs joined by single connectors, then an optional `++`/`+`/`#`
# suffix (C++, C#, F#; a `+` or `#` before a letter or digit is no suffix: the anchor of
# `exact.py#L42`, a link to a line, is not part of the file name). Connectors only count
# between two alnum runs, so a sentence's final period or a dash used as punctuation is not
# glued to the word. Matched over text without CJK (CJK runs are split off first): Unicode
# letters and digits, then ASCII only (simpler classes match about twice as fast). Not
# possessive: before Python 3.11.5 a possessive repeat of a group that can backtrack
# matched wrongly (gh-106052). A word goes on through combining marks (the vowel signs of
# Indic scripts and Thai, Arabic and Hebrew points), which ``\w`` does not hold.
_ALNUM_RUN: Final = rf"[^\W_]+(?:{MARK_RUN}[^\W_]*)*"
# The connectors: `.`, `-`, `/` (after underscores too: `__init__.py`), underscores, the
# `::` of a namespace path (`tokio::sync::mpsc`, `std::vector`), and the zero-width
# non-joiner inside a word (Persian's می‌خواهم: the word glued, ``fold``, and its parts).
_JOIN: Final = rf"(?:_*[.\-/{ZWNJ}]|_+|::)"
_WORD_TOKEN: Final = rf"{_ALNUM_RUN}(?:{_JOIN}{_ALNUM_RUN})*(?:\+\+|[#+](?![^\W_]))?"
_ASCII_TOKEN_RE: Final = re.compile(
    rf"[A-Za-z0-9]+(?:{_JOIN}[A-Za-z0-9]+)*(?:\+\+|[#+](?![A-Za-z0-9]))?"
)
_CONNECTOR_RE: Final = re.compile(rf"[._\-/+#:{ZWNJ}]+")
# A non-joiner as a connector the parts are found by, which ``fold`` would take out.
_ZWNJ_AS_HYPHEN: Final = str.maketrans(ZWNJ, "-")
# ``SMALL_KANA`` as ``str.translate`` takes it: 一ヵ月 is 一カ月, 霞ヶ関 霞ケ関.
_SMALL_KANA: Final = str.maketrans(SMALL_KANA)
# Emoji and pictographs, each a term of its own (``🚀``, ``✅``, ``■``): they are no
# letters, so words skip them. One class of two ranges, which a scan tests quickly (the
# exact emoji ranges in an alternation cost several times as much on Chinese text);
# ``emoji_terms`` then pairs a flag's two regional indicators and drops skin tones, so ``👍🏽``
# is found by ``👍``. Variation selectors and joiners are no terms: a joined family is
# found by its members. The tag letters after a black flag that name a region's flag
# (🏴 and "gbsct", then a cancel tag: Scotland's, not England's or Wales's) are part of
# its term.
EMOJI: Final = "[\u231a-\u2bff\U0001f000-\U0001faff][\U000e0020-\U000e007e]*"
_TONES: Final = frozenset(map(chr, range(0x1F3FB, 0x1F400)))
# camelCase / PascalCase / HTTPServer / IPv6 pieces.
# A name of at least three letters with a number glued on (``node18``): the name is a part.
_NAME_NUMBER: Final = re.compile(r"([A-Za-z]{3,})[0-9]+")
_CAMEL_RE: Final = re.compile(r"[A-Z]+(?=[A-Z][a-z]{2})|[A-Z]?[a-z]+|[A-Z]+|[0-9]+|[^\W_]+")

# A short list: the words that carry no topic in notes and questions. Measured on SciFact and
# LoCoMo (tests/bench/quality_lexical.py); dropping them helps BM25 slightly and shrinks postings.
STOPWORDS: Final = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own s same she should so some such t than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves""".split()
)

# BM25 counts a document's CJK text as one term per this many characters (see doc_length).
CJK_CHARS_PER_TERM: Final = 2

_VOWELS: Final = frozenset("aeiouy")


def _has_vowel(s: str) -> bool:
    return any(c in _VOWELS for c in s)


# Derivational suffixes replaced when the remaining stem is long enough to stay a word.
_SUFFIXES: Final = (
    ("ational", "ate"), ("ization", "ize"), ("fulness", "ful"), ("iveness", "ive"),
    ("ousness", "ous"), ("tional", "tion"), ("ations", "ate"), ("ation", "ate"), ("ities", "ity"),
    ("ness", ""), ("ment", ""), ("ingly", ""), ("edly", ""), ("ally", "al"), ("ly", ""),
)


def _stem_uncached(w: str) -> str:
    """A light, stable English suffix stripper (Porter step 1 plus common suffixes).

    Deliberately conservative: it only has to map inflections of one word onto one term, the same
    way at index and query time; over-stemming would merge unrelated words.
    """
    n = len(w)
    if n <= 3 or not w.isalpha() or not w.isascii():
        return w
    # Plurals.
    if w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("ies") and n > 4:
        w = w[:-3] + "y"
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    # Past tense and gerund, only when a vowel remains in the stem.
    for suf in ("ing", "ed"):
        if w.endswith(suf) and len(w) - len(suf) >= 3 and _has_vowel(w[: -len(suf)]):
            w = w[: -len(suf)]
            if w.endswith(("at", "bl", "iz")):
                w += "e"
            elif len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]
            break
    for suf, rep in _SUFFIXES:
        if w.endswith(suf) and len(w) - len(suf) >= 4:
            w = w[: -len(suf)] + rep
            break
    if w.endswith("e") and len(w) > 4:
        w = w[:-1]
    if w.endswith("y") and len(w) > 3 and w[-2] not in _VOWELS:
        w = w[:-1] + "i"
    return w


#: A word's stem, remembered (a bounded memo).
_stem: Final = Memo(_stem_uncached, 1 << 18).__getitem__


class _Unicode:
    """The patterns only text beyond ASCII needs. Compiled for the first such text, not
    at import: their classes take a few milliseconds to compile, which every start would
    pay before its first answer, and a keyword query is mostly ASCII."""

    __slots__ = ("cjk", "cjk_runs", "emoji", "invisible", "respelt", "small_kana", "word")

    def __init__(self) -> None:
        self.cjk = re.compile(f"[{_CJK_RANGES}]")  # one CJK character
        # What lies between CJK runs, and the runs (``split`` keeps them: a group).
        self.cjk_runs = re.compile(f"([{_CJK_RANGES}]+)")
        self.word = re.compile(_WORD_TOKEN)
        self.emoji = re.compile(EMOJI)
        self.invisible = re.compile(f"[{_INVISIBLE}]")
        # What CJK text rarely holds and is read otherwise: one scan finds none.
        self.respelt = re.compile(f"[{_JOINING_DOTS}{''.join(SMALL_KANA)}]")
        self.small_kana = re.compile(f"[{''.join(SMALL_KANA)}]")


@functools.cache
def _unicode() -> _Unicode:
    return _Unicode()


def cjk_re() -> re.Pattern[str]:
    """One CJK character (Han, kana, hangul; Thai, Lao, Khmer, Myanmar), as the tokenizer
    defines them. ASCII text holds none: callers check ``str.isascii`` first."""
    return _unicode().cjk


def _normalize(text: str) -> str:
    # ASCII is already NFKC-normal, and so is much other text: the quick check costs a
    # small fraction of normalizing; ``nfkc.normalize`` changes only the characters that
    # change where it can (a Chinese note's full-width punctuation).
    return nfkc.normalize(text)


def _parts(raw: str, out: list[str]) -> None:
    """Emit the parts of a compound token or identifier (its whole form is emitted elsewhere,
    except when it spells a stopword: `iN`, induced neurons, is not the word "in")."""
    whole = raw.casefold()
    if whole in STOPWORDS:
        out.append(whole)
    pieces = _CONNECTOR_RE.split(raw) if not raw.isalnum() else [raw]
    parts: list[str] = []
    for piece in pieces:
        if not piece:
            continue
        if piece.islower() or piece.isupper() or piece[1:].islower() or not piece.isalnum():
            parts.append(piece.casefold())
        else:
            parts.extend(p.casefold() for p in _CAMEL_RE.findall(piece))
    if len(parts) <= 1 and (not parts or parts[0] == whole):
        return
    for p in parts:
        if p and p not in STOPWORDS:
            out.append(_stem(p))
    if "/" in raw or "." in raw:
        # The names of a path that are compounds themselves, whole: a query for the file
        # name ``exact.py`` meets ``daemon/index/exact.py`` on a term of its own, not only
        # on ``exact`` and ``py``, which any note about Python may hold; so do the
        # compound keys of a dotted name (``max_age`` of ``zenra.cache.max_age``).
        for name in raw.split("/"):
            if name.isalnum():
                continue
            if name != raw:
                out.append(name.casefold())
            if "." in name:
                keys = (key.strip("_") for key in name.split("."))
                out.extend(key.casefold() for key in keys if key and not key.isalnum())


def _is_plain(word: str) -> bool:
    """A word without parts: one case pattern (lower, UPPER, Title or digits), no connectors."""
    return word.isalnum() and (
        word.islower() or word.isupper() or word[1:].islower() or word.isdigit()
    )


def _cjk(run: str, out: list[str], *, unigrams: bool) -> None:
    if len(run) == 1:
        out.append(run)
        return
    out.extend(map(operator.add, run[:-1], run[1:]))
    if unigrams:
        out.extend(run)


def tokenize_split(text: str) -> tuple[list[str], list[str]]:
    """``tokenize(text)`` in two parts, for counting in bulk: the terms outside CJK runs,
    and the CJK runs case-folded, each of which stands for its every character and every
    pair of neighbouring characters (``postings.Slab.local`` counts those without making
    strings of them)."""
    # The hot path of cold builds: per-token work is kept to list comprehensions over the
    # regex's matches; text without CJK (most notes) uses a simpler, faster pattern, and ASCII
    # text also skips NFKC.
    norm = _normalize(text)
    runs: list[str] = []
    if norm.isascii():
        words: list[str] = _ASCII_TOKEN_RE.findall(norm)
    elif (u := _unicode()).invisible.search(norm) is not None:
        return tokenize_split(u.invisible.sub("", norm))
    elif u.cjk.search(norm) is None:
        words = u.word.findall(norm) + emoji_terms(norm)
    else:
        # CJK runs split off (no CJK character has a case to fold), the words of what is
        # between them found as in text without CJK: a run separates words as the space
        # that joins the pieces does (neither is a letter, a digit or a connector), so
        # this gives the words of a single pattern with both alternatives, faster.
        pieces = u.cjk_runs.split(norm)
        if u.respelt.search(norm) is not None:
            pieces = _respelt(pieces, small_kana=u.small_kana.search(norm) is not None)
        runs = pieces[1::2]
        rest = " ".join(pieces[0::2])
        words = (_ASCII_TOKEN_RE if rest.isascii() else u.word).findall(rest)
        words += emoji_terms(rest)
    # Every word's whole form, case-folded and stemmed (stemming leaves non-alphabetic tokens
    # alone and ignores case, so `ECONNREFUSED` and `econnrefused` meet on one term), then
    # the parts of identifiers and compounds; both looked up per distinct word. Most words
    # have no parts: their empty tuples are dropped in C before the chain.
    out = list(filter(None, map(_WHOLE.__getitem__, words)))
    out.extend(itertools.chain.from_iterable(filter(None, map(_PARTS.__getitem__, words))))
    return out, runs


def _respelt(pieces: list[str], *, small_kana: bool) -> list[str]:
    """``pieces`` (text, a CJK run, text, ...) with the runs that only joining dots part
    joined (``_JOINING_DOTS``), and with ``small_kana``, small kana full-size. (Cheaper
    than a pattern over the text: most runs are not looked at twice.)"""
    if small_kana:
        pieces = [piece.translate(_SMALL_KANA) for piece in pieces]
    out = [pieces[0]]
    for i in range(1, len(pieces), 2):
        if i > 1 and out[-1] and not out[-1].strip(_JOINING_DOTS):
            out.pop()
            out[-1] += pieces[i]
        else:
            out.append(pieces[i])
        out.append(pieces[i + 1])
    return out


def emoji_terms(text: str) -> list[str]:
    """The terms of the pictographs in ``text`` (NFKC-normalized), in its order: a regional
    indicator paired with the next one (a flag), a black flag with the tags that follow it
    (a region's flag), skin tones dropped."""
    out: list[str] = []
    for sign in _unicode().emoji.findall(text):
        if sign in _TONES:
            continue
        if "\U0001f1e6" <= sign <= "\U0001f1ff" and out and len(out[-1]) == 1 and (
                "\U0001f1e6" <= out[-1] <= "\U0001f1ff"):
            out[-1] += sign
        else:
            out.append(sign)
    return out


def _whole(word: str) -> str:
    """The term a word stands for whole ("" for a stopword)."""
    folded = fold(word.casefold())
    return "" if folded in STOPWORDS else _stem(folded)


def _word_parts(word: str) -> tuple[str, ...]:
    """The terms of a word's parts (none for a plain word but a name with a number glued
    on: ``python3``, ``Windows11``, ``BRCA1`` are also ``python``, ``window``, ``brca``)."""
    if (word.islower() and word.isalnum()) or _is_plain(word):
        named = _NAME_NUMBER.fullmatch(word)
        if named is None:
            return ()
        name = named.group(1).casefold()
        return () if name in STOPWORDS else (_stem(name),)
    word = fold(word.translate(_ZWNJ_AS_HYPHEN))
    out: list[str] = []
    _parts(word, out)
    return tuple(out)


_WHOLE: Final = Memo(_whole, 1 << 17)
_PARTS: Final = Memo(_word_parts, 1 << 17)


def cjk_length(chars: int) -> int:
    """The BM25 length of ``chars`` CJK characters of one document."""
    return -(-chars // CJK_CHARS_PER_TERM)


def doc_length(tokens: list[str]) -> int:
    """The BM25 length of a document indexed as ``tokens`` (``tokenize``'s output): its
    non-CJK terms plus ``cjk_length`` of its CJK characters (one unigram each)."""
    cjk = [t for t in tokens if t[:1] >= "\u0e01" and len(t) <= 2]
    if cjk:  # tokens of one or two characters beyond ASCII: which of them are CJK
        match = _unicode().cjk.match
        cjk = [t for t in cjk if match(t)]
    chars = sum(len(t) == 1 for t in cjk)
    return len(tokens) - len(cjk) + cjk_length(chars)


def _tokenize(text: str, *, unigrams: bool) -> list[str]:
    out, runs = tokenize_split(text)
    for run in runs:
        _cjk(run, out, unigrams=unigrams)
    return out


def tokenize(text: str) -> list[str]:
    """Index-time terms of ``text`` (a bag: order is not meaningful, repeats count)."""
    return _tokenize(text, unigrams=True)


def tokenize_query(text: str) -> list[str]:
    """Query-time terms: like ``tokenize`` but CJK runs of 2+ characters give only bigrams."""
    return _tokenize(text, unigrams=False)
