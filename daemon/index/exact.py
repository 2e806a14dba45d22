"""Exact-match protection: which keyword hits must not be buried, in either search mode.

BM25 alone can bury them too. A query for an identifier is tokenized into the identifier
and its parts (``QX_TORVEL_5831`` -> the whole, ``qx``, ``torvel``, ``5831``); a short
English note that mentions a sibling (``QX_TORVEL_5832``) and the parts can outscore the
one long note, Chinese say, that holds the identifier itself. And weighted RRF ranks by
position only, so with QwenPaw's 0.7/0.3 any vector-only candidate in the top 80 outranks a
keyword-only hit, even when the query is ``ECONNREFUSED`` and only one note contains it.
This module picks the query's *special* terms, finds the chunks that contain all of them
(also beyond the keyword candidate pool) and ranks those first: in the keyword list
(:func:`exact_first`) and in fusion (``fusion.py``).

Special terms:
- identifier-like words of the raw query: camelCase, ALLCAPS of three or more letters,
  letters mixed with digits (``v2``, ``k8s``), snake_case, dotted or hyphenated names
  (``config.toml``, ``foo-bar``), a ticket or record key (``VORP-4471``);
- very rare query terms: a term (after the index's own tokenizer) that at most
  ``RARE_DF`` chunks contain, in an index of at least ``RARE_MIN_DOCS`` chunks.

A hit is exact when it holds every special term: an identifier as a whole word of its
heading + text, read as the tokenizer reads it (NFKC, case folded: full-width forms count;
``v4.27`` is not in ``v4.27.3``, ``user_id`` not in ``user_id_hash``, but a dotted name is
in its members' names, ``payments.retry`` in ``payments.retry.max_ms``), a rare term where
its index has it (the term is a stem the text may not spell: ``strategi`` of strategy).
Only lookups count: when the special terms are under a third of the query's content words
(a long question or claim with one rare word), no hit is exact, unless the query is short
(``LOOKUP_WORDS``) and names an identifier. A number (``NUMBER_DIGITS``) in a query naming
an identifier is special too, read as a whole word (``user_id=771203``). When no hit holds
every special term but the identifiers alone make a lookup (the query's rare word or
number is in other notes, not the identifier's), a hit holding every identifier is exact.
Of the exact hits, those holding the names as the query joins them are the exact ones, when
any is: each query word joining a name to more, as typed (``users%2F42``,
``--max-old-space-size=8192``), then every name in one word (``payments.retry.max_ms`` for
``max_ms of payments.retry``), not apart.
Pure functions; the caller runs them under the index lock.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Final, Protocol

from pyroaring import BitMap

from recalld.daemon.index import nfkc
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.chunker import index_text
from recalld.daemon.index.marks import MARKS
from recalld.daemon.index.memo import Memo
from recalld.daemon.index.state import StoredChunk
from recalld.daemon.index.tokenizer import (
    STOPWORDS,
    cjk_length,
    cjk_re,
    fold,
    tokenize,
    tokenize_query,
)

RARE_DF = 2
# A number of at least this many digits in a query naming an identifier is a name too.
NUMBER_DIGITS = 3
RARE_MIN_DOCS = 50
# A query of at most this many content words that names an identifier is a lookup, however
# few of its words are special ("what broke in kelmo v4.27.3?").
LOOKUP_WORDS = 6
# A query naming more identifiers than this is no lookup: no hit must hold them all (and
# the rare-term check, which compares each term with each identifier, stays short).
MAX_LOOKUP_IDENTIFIERS = 32
# Queries of at most this many characters have their identifiers and content words
# remembered.
MEMO_QUERY_CHARS = 256
# How many chunk texts (each of at most this many characters) have their read form
# remembered (_as_read): a few lookups' pools, a few MB at most (the steady memory).
READ_MEMO_TEXTS = 256
READ_MEMO_CHARS = 4096
# A word goes on through combining marks and a namespace's `::`, as the tokenizer's do.
_WORD = re.compile(rf"\w(?:[\w.\-{MARKS}]|::(?=\w))*[\w{MARKS}]|\w")
_ALNUM = re.compile(r"[^\W_]")
# One pattern (a search per word, not six).
_IDENT = re.compile("|".join((
    # camelCase, handleWebSocket: a run of lower-case letters and digits holding a letter,
    # then an upper-case one. Tried only where a run starts, so a long word costs a pass or
    # two, not one per character (a 30,000-letter query took 17 s).
    r"(?<![a-z0-9])[0-9]*[a-z][a-z0-9]*[A-Z]",
    r"[A-Z][a-z0-9]+[A-Z]",  # PascalCase with a second hump
    r"^[A-Z][A-Z0-9]{2,}$",  # ECONNREFUSED, HNSW
    r"[A-Za-z]\d|\d[A-Za-z]",  # v2, k8s, 3DES
    r"[A-Za-z]-\d",  # KEL-4471, CVE-2026-1234: a ticket, a record, a standard
    r"[A-Za-z0-9]_[A-Za-z0-9]",  # snake_case
    r"[A-Za-z0-9_][.\-][A-Za-z]",  # config.toml, foo-bar, __init__.py
    r"[A-Za-z0-9]::[A-Za-z_]",  # tokio::sync, std::vector
    r"\d\.\d+\.\d",  # 5.24.0, 10.0.3.17: a release or an address, not a decimal
)))


class KeywordIndex(Protocol):
    """What the exact check asks of a keyword index: :class:`~.bm25.BM25Index`, or the
    chunks of a shared workspace searched in PostgreSQL (``remote/search.py``)."""

    def __len__(self) -> int: ...

    def doc_freq(self, term: str) -> int: ...

    def search(self, query_tokens: list[str], limit: int, *,
               allowed: BitMap | None = None) -> list[tuple[int, float]]: ...

    def score_keys(self, query_tokens: list[str], keys: Iterable[int]) -> dict[int, float]: ...

    def holders_of_all(self, terms: list[str], *,
                       allowed: BitMap | None = None) -> list[int] | None: ...


def identifier_terms(query: str) -> list[str]:
    """The identifier-like words of ``query``, lower-cased, in order, without repeats."""
    return list(_identifiers(query))


def _find_identifiers(query: str) -> tuple[str, ...]:
    out: dict[str, None] = {}  # in order, without repeats (a list would be searched)
    # Normalized as the tokenizer normalizes: an identifier typed in full-width forms
    # (ＥＣＯＮＮＲＥＦＵＳＥＤ, a Chinese input method's) is the identifier. And, as there,
    # CJK characters end a word: a Chinese question glues its words to the identifier
    # (``QX_TORVEL_5831是什么错误``), which is no part of it.
    text = nfkc.normalize(query)
    if not text.isascii():
        text = cjk_re().sub(" ", text)
    for m in _WORD.finditer(text):
        word = m.group(0).strip(".-")
        if len(word) >= 2 and _IDENT.search(word):
            out[fold(word.casefold())] = None
    return tuple(out)


# What depends on a short query alone is remembered (``_identifiers``, ``_content_words``,
# ``_whole_form``): agents repeat queries, and the regular expressions cost more than the
# rest of the check.
_identifiers: Final = Memo(_find_identifiers, 1024, max_chars=MEMO_QUERY_CHARS).__getitem__


def _find_numbers(query: str) -> tuple[str, ...]:
    """The numbers of ``query`` (runs of at least ``NUMBER_DIGITS`` digits, in any width:
    ``771203`` of ``user_id=771203``, ``88123`` of ``#88123`` or ``工单88123``), in order,
    without repeats."""
    text = nfkc.normalize(query)
    if not text.isascii():
        text = cjk_re().sub(" ", text)
    out: dict[str, None] = {}
    for m in _WORD.finditer(text):
        word = m.group(0).strip(".-")
        if len(word) >= NUMBER_DIGITS and word.isascii() and word.isdigit():
            out[word] = None
    return tuple(out)


_numbers: Final = Memo(_find_numbers, 1024, max_chars=MEMO_QUERY_CHARS).__getitem__


def rare_terms(query: str, bm25: KeywordIndex, *, skip: Iterable[str] = (),
               tokens: list[str] | None = None) -> list[str]:
    """Query terms that at most ``RARE_DF`` chunks contain (none in a tiny index);
    ``tokens``: ``tokenize_query(query)`` when the caller has it."""
    if len(bm25) < RARE_MIN_DOCS:
        return []
    skipped = set(skip)
    out: list[str] = []
    for term in dict.fromkeys(tokenize_query(query) if tokens is None else tokens):
        if term in skipped or any(term in s for s in skipped):
            continue
        if term.isascii() and len(term) < 3:
            continue
        if 0 < bm25.doc_freq(term) <= RARE_DF:
            out.append(term)
    return out


def special_terms(query: str, bm25: KeywordIndex) -> list[str]:
    """The terms a hit must contain to count as exact; none for a long natural-language
    query in which they are a small part (fewer than a third of its content words): there
    a rare word is not a lookup, and ranking every chunk that has it first cost SciFact
    0.02 nDCG@10."""
    return _special(query, bm25)[0]


def _special(query: str, bm25: KeywordIndex, tokens: list[str] | None = None,
             ) -> tuple[list[str], list[str], list[str]]:
    """(the special terms, those of them read as whole words in the text: identifiers and
    the numbers beside them, the identifiers alone if they make the query a lookup)."""
    idents = identifier_terms(query)
    if len(idents) > MAX_LOOKUP_IDENTIFIERS:
        return [], [], []  # a pasted log or listing: no chunk is looked up by all of them
    # A number beside an identifier is a value of it (``user_id=771203``, ``ERR_X_42 on
    # host 8812``): the note holding both answers the lookup, ahead of the notes holding the
    # identifier with other values, however much shorter.
    names = idents + [n for n in (_numbers(query) if idents else ())
                      if not any(n in ident for ident in idents)]
    if len(names) > MAX_LOOKUP_IDENTIFIERS:
        names = idents
    special = names + rare_terms(query, bm25, skip=names, tokens=tokens)
    words = _content_words(query)
    if not _lookup(len(special), words, idents=bool(idents)):
        return [], [], []
    return special, names, idents if _lookup(len(idents), words, idents=bool(idents)) else []


def _lookup(special: int, words: int, *, idents: bool) -> bool:
    """Whether a query of ``words`` content words, ``special`` of them special, is a
    lookup: they are a third of its words at least, or it is short and names an identifier."""
    return special > 0 and (special * 3 >= words or (idents and words <= LOOKUP_WORDS))


def _count_content_words(query: str) -> int:
    """How many content words ``query`` has: its words as typed between spaces that are
    not stopwords (a path, an address or a flag joined by punctuation is one name:
    ``/var/lib/kelmo/cache.db`` is one word, not four), a CJK run counted as
    ``tokenizer.cjk_length`` of its characters (about a word per two), not as one word: a
    Chinese question is one run, and two rare pairs of it are no lookup. CJK characters
    end a word, as for identifiers."""
    n = 0
    for piece in query.split():
        if not piece.isascii():
            cjk = len(cjk_re().findall(piece))
            if cjk:
                n += cjk_length(cjk)
                n += sum(_content(part) for part in cjk_re().sub(" ", piece).split())
                continue
        n += _content(piece)
    return n


def _content(piece: str) -> bool:
    """Whether ``piece`` (no space, no CJK in it) holds a word that is no stopword."""
    return any(word.lower() not in STOPWORDS for word in _WORD.findall(piece))


_content_words: Final = Memo(_count_content_words, 1024, max_chars=MEMO_QUERY_CHARS).__getitem__


def _first_token(term: str) -> tuple[str, ...]:
    """The first token of a special term (the tokenizer emits an identifier whole before
    its parts)."""
    return tuple(tokenize_query(term)[:1])


# Remembered: a special term is a word of the query or one of its tokens.
_whole_form: Final = Memo(_first_token, 1024, max_chars=MEMO_QUERY_CHARS).__getitem__


@functools.lru_cache(maxsize=256)
def _pattern(term: str, *, whole: bool) -> re.Pattern[str]:
    """``term`` not glued to a preceding ASCII letter or digit and, ``whole`` (a name):
    not glued to one by ``_`` or ``-`` unless it is a number (``max_ms`` is not in
    ``http_max_ms``; ``8812`` is in ``host-8812``), nor followed by one, nor by ``_`` or
    ``-`` and one (``user_id`` is not in ``user_id_hash``), nor by a dot and a digit
    (``v4.27`` is not in ``v4.27.3``). A dotted name's member goes on from it, as a
    namespace's ``::`` does: ``payments.retry`` and ``max_ms`` are both in
    ``payments.retry.max_ms`` (the tokenizer gives its compound keys too). CJK has no word
    boundaries: next to CJK characters a term always matches."""
    escaped = re.escape(term)
    # The left check looks back from the end of the term ("term, not preceded by a letter
    # or digit"), so the pattern starts with the term itself and the engine scans for it
    # as a literal; a leading look-behind would be tried at every position of the text.
    left = ""
    if term[:1].isascii() and term[:1].isalnum():
        # A rare term (not ``whole``) is a stem, the index's term of an identifier's part
        # too, and a number a value named before it (``host-8812``): either may follow a
        # connector (``kelm`` of ``FP_KELMO``).
        glued = whole and not term.isdigit()
        left = rf"(?<![a-z0-9]{escaped})" + (rf"(?<![a-z0-9][_\-]{escaped})" if glued else "")
    right = (r"(?![a-z0-9]|[_\-][a-z0-9]|\.[0-9])" if whole and term[-1:].isascii()
             and term[-1:].isalnum() else "")
    return re.compile(escaped + left + right)


class _Term:
    """A term to find in chunks, its pattern (:func:`_pattern`) compiled at the first chunk
    that holds its letters: compiling costs ~3 us a character in ``re``'s parser (a
    300,000-character identifier in a query, 1 s), and most terms never get that far."""

    __slots__ = ("_pattern", "term", "whole")

    def __init__(self, term: str, *, whole: bool) -> None:
        self.term, self.whole = term, whole
        self._pattern: re.Pattern[str] | None = None

    def search(self, text: str) -> bool:
        if self._pattern is None:
            self._pattern = _pattern(self.term, whole=self.whole)
        return self._pattern.search(text) is not None


def _contains_all(text: str, terms: list[_Term]) -> bool:
    low = text.lower()
    if all(t.term in low and t.search(low) for t in terms):
        return True
    if text.isascii():
        return False  # NFKC leaves ASCII as it is, and casefold is lower there
    low = _as_read(text)
    return all(t.term in low and t.search(low) for t in terms)


def _as_read(text: str) -> str:
    """``text`` as the tokenizer reads it (NFKC, case folded), so that a chunk holds a term
    whenever its index has it: a Chinese note may spell an identifier in full-width forms
    (ＱＸ＿ＴＯＲＶＥＬ＿５８３１), a word in another case form (Straße) or with accents the
    index folds away (café)."""
    return text.lower() if text.isascii() else _read_forms[text]


def _read_form(text: str) -> str:
    return fold(nfkc.normalize(text).casefold())


# Remembered for the chunk texts that are not ASCII: the same chunks are checked query
# after query (a lookup's pool), and normalizing and folding a Chinese chunk costs more than
# the rest of checking it. Keyed by the text, so a changed chunk is read anew.
_read_forms: Final = Memo(_read_form, READ_MEMO_TEXTS, max_chars=READ_MEMO_CHARS)


def _find_forms(query: str) -> tuple[str, ...]:
    """The words of ``query`` as typed between spaces, read as :func:`_as_read` reads
    text, without the punctuation around them (``--max-old-space-size=8192``:
    ``max-old-space-size=8192``; ``users%2F42?``: ``users%2f42``), in order, without
    repeats; CJK characters end a word, as for identifiers."""
    text = nfkc.normalize(query)
    if not text.isascii():
        text = cjk_re().sub(" ", text)
    out: dict[str, None] = {}
    for word in fold(text.casefold()).split():
        lead = next((i for i, ch in enumerate(word) if ch.isalnum()), len(word))
        tail = next((i for i in range(len(word), 0, -1) if word[i - 1].isalnum()), 0)
        if lead < tail:
            out[word[lead:tail]] = None
    return tuple(out)


_forms: Final = Memo(_find_forms, 1024, max_chars=MEMO_QUERY_CHARS).__getitem__


def _joined(query: str, names: list[str], exact: set[int],
            chunks: Mapping[int, StoredChunk]) -> set[int]:
    """The ``exact`` hits that hold the query's names as the query joins them, or
    ``exact`` when none does: first those that hold, as typed, each query word joining a
    name to more (``users%2F42``, ``--max-old-space-size=8192``: not a note holding
    ``users`` and ``2f42`` apart); then, of those, the ones holding every name in one word
    (``payments.retry.max_ms`` for ``max_ms of payments.retry``: not a note naming
    ``payments.retry`` and another thing's ``max_ms``)."""
    if not exact:
        return exact
    terms = [_Term(name, whole=True) for name in names]
    forms = [_Term(form, whole=True) for form in _forms(query)
             if form not in names and any(t.term in form and t.search(form) for t in terms)]
    if not forms and len(names) < 2:
        return exact  # nothing to tell the exact hits apart by: their texts are not read
    texts = {key: _as_read(chunks[key].heading + "\n" + chunks[key].text)
             for key in exact if key in chunks}
    if forms:
        held = {key for key, low in texts.items()
                if all(f.term in low and f.search(low) for f in forms)}
        exact = held or exact
    if len(names) < 2:
        return exact
    held = {key for key in exact if key in texts and any(
        all(t.term in word and t.search(word) for t in terms)
        for word in texts[key].split() if terms[0].term in word)}
    return held or exact


def exact_keys(
    terms: list[str], hits: Iterable[tuple[int, float]], chunks: Mapping[int, StoredChunk],
    *, idents: Iterable[str] = (),
) -> set[int]:
    """Keyword hits whose chunk contains every one of ``terms`` (none without terms);
    ``idents`` (among ``terms``) must appear as whole words."""
    if not terms:
        return set()
    whole = frozenset(idents)
    patterns = [_Term(t, whole=t in whole) for t in terms]
    out: set[int] = set()
    seen: set[int] = set()
    for key, _ in hits:
        # The same chunk can come twice (found by the whole forms and by the query): its
        # text is read and matched once.
        if key in seen:
            continue
        seen.add(key)
        chunk = chunks.get(key)
        if chunk is None:
            continue
        if _contains_all(chunk.heading + "\n" + chunk.text, patterns):
            out.add(key)
    return out


def exact_first(
    query: str, bm25: KeywordIndex, hits: list[tuple[int, float]],
    chunks: Mapping[int, StoredChunk], *, limit: int, allowed: BitMap | None = None,
    tokens: list[str] | None = None,
) -> tuple[list[tuple[int, float]], set[int]]:
    """``hits`` (a keyword search's, best first) with the exact ones first, and their keys.

    The chunks to check are those a search for the special terms' whole forms alone finds
    (the tokenizer emits an identifier whole before its parts; the parts are what the
    chunks that bury it have too): usually a few, however many ``hits`` there are, and
    also those that scored below the pool (a long note, many shorter ones sharing the
    parts). Without special terms, ``hits`` come back as they are. ``tokens``:
    ``tokenize_query(query)`` when the caller has it (the search that found ``hits``).
    """
    if tokens is None:
        tokens = tokenize_query(query)
    special, names, idents = _special(query, bm25, tokens)
    if not special:
        return hits, set()
    joined = any(f not in names and any(n in f for n in names) for f in _forms(query))
    hold = functools.partial(_holding, bm25=bm25, hits=hits, chunks=chunks, limit=limit,
                             allowed=allowed, joined=joined)
    exact = hold(special, names)
    if not exact and idents and len(idents) < len(special):
        # A rare word or a number of the query that other notes have, not the identifier's
        # (``ERR_X_42 kelvinator``): the notes that hold the identifiers still answer the
        # lookup, ahead of notes that share only the identifiers' parts.
        names = idents
        exact = hold(idents, idents)
    if not exact:
        return hits, set()
    exact = _joined(query, names, exact, chunks)
    scores = dict(hits)
    missing = [key for key in exact if key not in scores]
    if missing:
        # Their score for the whole query, so exact hits rank among themselves as BM25
        # has it (the same search restricted to them).
        scores = bm25.score_keys(tokens, missing)
        hits = hits + sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
    ordered = [kv for kv in hits if kv[0] in exact]
    ordered.sort(key=lambda kv: (-kv[1], kv[0]))
    ordered += [kv for kv in hits if kv[0] not in exact]
    return ordered[:max(limit, len(exact))], exact


def _holding(
    special: list[str], idents: list[str], bm25: KeywordIndex, hits: list[tuple[int, float]],
    chunks: Mapping[int, StoredChunk], *, limit: int, allowed: BitMap | None, joined: bool,
) -> set[int]:
    """The keys of the chunks that hold every one of ``special`` (``idents`` among them,
    read in their text as whole words), found beyond ``hits`` too (``joined``: ``_found``)."""
    wholes = [t for term in special for t in _whole_form(term)]
    own = _found(bm25, wholes, limit, allowed, every=joined or len(set(wholes)) > 1)
    # The hits may hold others of them when more chunks hold the terms than one pool, or
    # when a name is dotted: it is held as a member's parent, which the index has no term
    # of (``payments.retry`` in ``payments.retry.max_ms``). Otherwise the pool is every
    # chunk holding them, and reading the hits' texts too would cost each lookup ~0.15 ms.
    pool = own
    if len(own) >= limit or any("." in name for name in idents):
        found = set(own)
        pool = [*own, *(key for key, _ in hits if key not in found)]
    # A rare term is a term of the index, often a stem the text does not spell
    # (``strategi`` of strategy, ``copi`` of copying): a chunk holds it when the index
    # has it there (a few chunks: it is rare), and only the identifiers are read in the text.
    rare = [term for term in special if term not in idents]
    if rare:
        held = set(_found(bm25, rare[:1], limit, allowed))
        if len(rare) > 1:
            # A chunk holding them all holds the first: one of a few.
            held = {key for key in held if key in chunks}
            if isinstance(bm25, BM25Index):
                # Looked up in each other term's postings: reading a chunk's terms costs
                # ~0.8 ms for 1,500 Chinese characters.
                for term in rare[1:]:
                    held = bm25.holding(term, held)
            else:
                # A shared workspace's index answers each call with a query: the few
                # chunks' terms are read here instead.
                rest = set(rare[1:])
                held = {key for key in held if rest <= set(tokenize(index_text(
                    chunks[key].text, chunks[key].heading, chunks[key].metadata)))}
        pool = [key for key in pool if key in held]
    return (exact_keys(idents, ((key, 0.0) for key in pool), chunks, idents=idents)
            if idents else set(pool))


def _found(bm25: KeywordIndex, terms: list[str], limit: int,
           allowed: BitMap | None, *, every: bool = False) -> list[int]:
    """The keys of a search for ``terms`` at ``limit`` (a few holders, of an identifier or
    a rare name, read from the local postings: no score of them is used); when more hold
    them and ``every`` (names, or a query word joining one to more), with every chunk holding
    all: the best scored are short notes with some or a sibling, not the URL as typed."""
    if isinstance(bm25, BM25Index):
        keys = bm25.holders(terms, limit, allowed=allowed)
        if keys is not None:
            return keys
    found = [key for key, _ in bm25.search(terms, limit, allowed=allowed)]
    if every and len(found) >= limit:  # fewer: the search found every holder of one
        found += sorted(set(bm25.holders_of_all(terms, allowed=allowed) or ()) - set(found))
    return found


__all__ = ["KeywordIndex", "exact_first", "exact_keys", "identifier_terms", "rare_terms",
           "special_terms"]
