"""Scoring of the BM25 keyword index (:class:`~.bm25.BM25Index`): its ``search`` and
``score_keys`` over what the index hands them at that moment (:class:`Corpus`), and what
searches keep between two writes (:class:`Scorer`). No I/O, no threads, no locks: the
index's caller serializes its calls.

Scoring: BM25 Okapi with Lucene's non-negative IDF ``log(1 + (N - df + 0.5) / (df + 0.5))``,
where N, df and avgdl count live documents only, so scores do not depend on merge timing. A
repeated query term counts once per repetition. Ties are broken by ascending doc key. Summing
and ranking the postings a query found is ``ranking.py``'s.

Between two writes, searches keep what does not change until the next one: each query term's
live postings and their ``tf / (norm + tf)`` (bounded by ``TERM_CACHE_POSTINGS``), and the
full scores of the last ``SCORED_MAX`` unfiltered searches, which ``score_keys`` reads for the
same query (the chunks of linked files are scored right after the search that found the
hits). Every write drops both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from recalld.daemon.arraytypes import F32
from recalld.daemon.index import postings, ranking, saved
from recalld.daemon.index.delta import Delta
from recalld.daemon.index.postings import I32, Segment

# Unfiltered searches of a main segment of at most this many rows sum and rank with one
# bincount over all rows (see ranking.top_dense); larger ones sort the postings instead.
DENSE_ROWS: Final = 32768
# A search over at most this many postings scores them in Python (see ranking.top_few):
# for so few, a Python loop costs less than numpy's per-call overhead.
FEW_POSTINGS: Final = 48
# holders_of_all answers when the rarest of its terms has at most this many postings: the
# chunks holding every term of an exact-term lookup (more is no needle; each is read).
ALL_HOLDERS: Final = 256
# score_keys looks up each term's postings of the given keys for queries of at most this
# many distinct terms; longer queries run a search restricted to the keys.
SCORE_KEYS_MAX_TERMS: Final = 8
# How many searches' full scores score_keys can read back (see _Scored): a search's
# own and its exact-term search's.
SCORED_MAX: Final = 2
# Searches keep query terms' postings and weights until the next write, up to about this
# many postings (then they start again).
TERM_CACHE_POSTINGS: Final = 131_072
# Queries of at most this many terms with postings in main reuse each term's weights;
# longer ones compute them for all terms at once.
BASES_MAX_TERMS: Final = 16


class Corpus(NamedTuple):
    """What a search reads from the index, as it is when the search runs: the BM25
    parameters, the live keys and their summed lengths, the main segment with its alive
    bits (``key_row``: key -> main row, None while main's keys ascend), the delta and the
    term lookup."""

    k1: float
    b: float
    live: BitMap
    total_len: int
    main: Segment
    main_gen: int
    alive: npt.NDArray[np.bool_]
    n_dead: int
    key_row: dict[int, int] | None
    delta: Delta
    lookup: postings.TermTable | saved.SortedTerms


class Scorer:
    """Scores queries over a :class:`Corpus` and keeps what searches computed until the
    next write (:meth:`forget`): the full scores of the last few unfiltered searches
    (query tokens -> them), so ``score_keys`` for the same query reads them instead of
    scoring again, query terms' live postings and weights (see :meth:`_terms_now`), and
    the per-row length norms."""

    def __init__(self) -> None:
        self._scored: dict[tuple[str, ...], _Scored] = {}
        self._terms: dict[str, _TermPostings] = {}
        self._terms_size = 0
        self._norm_key: tuple[float, int] | None = None
        self._norms: npt.NDArray[np.float64] = np.zeros(0, dtype=np.float64)

    def search(
        self, c: Corpus, query_tokens: list[str], limit: int, *, allowed: BitMap | None = None
    ) -> list[tuple[int, float]]:
        """:meth:`BM25Index.search <recalld.daemon.index.bm25.BM25Index.search>` over ``c``."""
        n_docs = len(c.live)
        if n_docs == 0 or limit <= 0 or not query_tokens:
            return []
        k1, b = c.k1, c.b
        avgdl = c.total_len / n_docs if c.total_len else 1.0
        row_keys = c.main.row_keys
        all_rows, all_tfs = c.main.rows, c.main.tfs
        # Each term's main postings and (k1 + 1) * idf; the arithmetic over the postings
        # is then done once for all terms, not once per term.
        row_parts: list[I32] = []
        tf_parts: list[F32] = []
        factors: list[float] = []
        part_terms: list[str] = []
        delta_scores: dict[int, float] = {}
        terms = self._terms_now()
        for term, qf in _counts(query_tokens).items():
            found = terms.get(term)
            if found is None:
                start, end = span(c, term)
                rows = tfs = None
                if end > start:
                    rows, tfs = all_rows[start:end], all_tfs[start:end]
                    if c.n_dead:
                        keep = c.alive[rows]
                        rows, tfs = rows[keep], tfs[keep]
                found = terms[term] = _TermPostings(rows, tfs)
                self._terms_size += 1 + (0 if rows is None else len(rows))
            rows, tfs = found.rows, found.tfs
            df = 0 if rows is None else len(rows)
            dpost = c.delta.postings(term)
            if dpost:
                df += len(dpost)
            if df == 0:
                continue
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)) * qf
            factor = idf * (k1 + 1.0)
            if rows is not None and tfs is not None and len(rows):
                row_parts.append(rows)
                tf_parts.append(tfs)
                factors.append(factor)
                part_terms.append(term)
            if dpost:
                lengths = c.delta.lengths
                for key, tf in dpost.items():
                    norm_d = k1 * (1.0 - b + b * (lengths[key] / avgdl))
                    # As the main segment's weights are computed, to the last bit.
                    delta_scores[key] = delta_scores.get(key, 0.0) + tf / (norm_d + tf) * factor
        if sum(len(r) for r in row_parts) + len(delta_scores) <= FEW_POSTINGS:
            # Rare terms (identifiers, names): plain Python beats a dozen numpy calls.
            scores = ranking.few_scores(row_keys, self.row_norms(c, avgdl), row_parts,
                                        tf_parts, factors, extra=delta_scores)
            self._remember(query_tokens, _Scored(scores=scores))
            return ranking.top_few(scores, limit, allowed=allowed)
        if not row_parts:
            cand_keys, cand_scores = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        else:
            norms = self.row_norms(c, avgdl)
            if len(row_parts) == 1:
                rows, weights = row_parts[0], terms[part_terms[0]].base(norms) * factors[0]
            else:
                rows = np.concatenate(row_parts)
                if len(row_parts) <= BASES_MAX_TERMS:
                    # Each term's tf / (norm + tf) is kept until the next write.
                    weights = np.concatenate([terms[t].base(norms) for t in part_terms])
                else:  # one pass over all postings beats an array operation per term
                    tfs = np.concatenate(tf_parts)
                    weights = tfs / (norms[rows] + tfs)
                at = 0
                for part, factor in zip(row_parts, factors, strict=True):
                    weights[at:at + len(part)] *= factor
                    at += len(part)
            if allowed is None and len(row_keys) <= DENSE_ROWS:
                acc = (ranking.row_sums(rows, weights, len(row_keys))
                       if len(row_parts) > 1 else None)
                self._remember(query_tokens, _Scored(
                    rows=rows, weights=weights, acc=acc, extra=delta_scores))
                return ranking.top_dense(row_keys, rows, weights, len(row_parts), acc,
                                         delta_scores, limit)
            cand_keys, cand_scores = ranking.summed(row_keys, rows, weights, len(row_parts))
        return ranking.top_k(cand_keys, cand_scores, limit, extra=delta_scores,
                             allowed=allowed)

    def score_keys(self, c: Corpus, query_tokens: list[str],
                   keys: Iterable[int]) -> dict[int, float]:
        """:meth:`BM25Index.score_keys <recalld.daemon.index.bm25.BM25Index.score_keys>`
        over ``c``.

        For a short query this looks up each term's postings of just those rows instead of
        scoring the whole index and filtering: a search restricted to the chunks of a few
        files costs as much as an unrestricted one. A query of many terms is a restricted
        search: a handful of array operations per term would cost more than one pass over
        every term's postings (and hold the interpreter for as long).
        """
        n_docs = len(c.live)
        live, delta = c.live, c.delta
        wanted = [k for k in keys if k in live]
        if n_docs == 0 or not wanted or not query_tokens:
            return {}
        counts = _counts(query_tokens)
        if len(counts) > SCORE_KEYS_MAX_TERMS:
            return dict(self.search(c, query_tokens, len(wanted), allowed=BitMap(wanted)))
        main_keys = [k for k in wanted if k not in delta]
        delta_keys = [k for k in wanted if k in delta]
        scored = self._scored.get(tuple(query_tokens))
        if scored is not None:
            return scored.of(main_keys, rows_of_keys(c, main_keys), delta_keys)
        k1, b = c.k1, c.b
        avgdl = c.total_len / n_docs if c.total_len else 1.0
        key_rows = rows_of_keys(c, main_keys)
        norms = self.row_norms(c, avgdl)[key_rows].tolist()
        all_rows, all_tfs = c.main.rows, c.main.tfs
        scores: dict[int, float] = {}
        for term, qf in counts.items():
            start, end = span(c, term)
            df = live_in(c, start, end)
            dpost = delta.postings(term)
            if dpost:
                df += len(dpost)
            if df == 0:
                continue
            factor = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)) * qf * (k1 + 1.0)
            if main_keys and end > start:
                # A term's postings are sorted by row; a live key has one live row.
                # (Array methods and ufuncs: numpy's function wrappers cost more than the
                # lookup for a few keys.)
                rows, tfs = all_rows[start:end], all_tfs[start:end]
                pos = np.minimum(rows.searchsorted(key_rows), len(rows) - 1)
                for i in (rows[pos] == key_rows).nonzero()[0].tolist():
                    tf, norm, key = float(tfs[pos[i]]), norms[i], main_keys[i]
                    scores[key] = scores.get(key, 0.0) + tf / (norm + tf) * factor
            if dpost:
                for key in delta_keys:
                    dtf = dpost.get(key)
                    if dtf:
                        norm_d = k1 * (1.0 - b + b * (delta.lengths[key] / avgdl))
                        scores[key] = scores.get(key, 0.0) + dtf / (norm_d + dtf) * factor
        return scores

    def forget(self) -> None:
        """What searches kept no longer holds (a write): drop it (new dicts, since a
        remembered search may hold views of arrays a merge replaces)."""
        if self._terms or self._scored:
            self._terms, self._scored, self._terms_size = {}, {}, 0

    def _terms_now(self) -> dict[str, _TermPostings]:
        """Query terms' live main postings as searches found them since the last write
        (an empty table after one, or once it holds :data:`TERM_CACHE_POSTINGS`)."""
        if self._terms_size > TERM_CACHE_POSTINGS:
            self._terms, self._terms_size = {}, 0
        return self._terms

    def _remember(self, query_tokens: list[str], scored: _Scored) -> None:
        if len(self._scored) >= SCORED_MAX:
            del self._scored[next(iter(self._scored))]
        self._scored[tuple(query_tokens)] = scored

    def row_norms(self, c: Corpus, avgdl: float) -> npt.NDArray[np.float64]:
        """``k1 * (1 - b + b * dl / avgdl)`` per main row, cached until avgdl or main changes
        (queries between two writes share it)."""
        key = (avgdl, c.main_gen)
        if self._norm_key != key:
            dl = c.main.doclen.astype(np.float64)
            self._norms = c.k1 * (1.0 - c.b + c.b * (dl / avgdl))
            self._norm_key = key
        return self._norms

    def main_moved(self, old_gen: int, new_gen: int) -> None:
        """Main generation ``old_gen`` is served from other memory as ``new_gen`` (same
        rows, same lengths): the cached norms still hold."""
        if self._norm_key is not None and self._norm_key[1] == old_gen:
            self._norm_key = (self._norm_key[0], new_gen)


def _counts(tokens: list[str]) -> dict[str, int]:
    """How often each token comes, in the order they first come (``Counter``'s counts,
    without its construction, which costs a search more than the counting)."""
    counts: dict[str, int] = {}
    for token in tokens:
        counts[token] = counts.get(token, 0) + 1
    return counts


def doc_freq(c: Corpus, term: str) -> int:
    """How many live documents contain ``term`` (one lookup, no scoring)."""
    return len(c.delta.postings(term) or ()) + live_in(c, *span(c, term))


def holding(c: Corpus, term: str, keys: Iterable[int]) -> set[int]:
    """Which of ``keys`` are live documents that contain ``term``: its postings of those
    keys looked up (as ``Scorer.score_keys`` does), no text read and nothing scored."""
    delta = c.delta
    wanted = [k for k in keys if k in c.live]
    dpost = delta.postings(term)
    out = {k for k in wanted if k in delta and dpost and dpost.get(k)}
    main_keys = [k for k in wanted if k not in delta]
    start, end = span(c, term)
    if main_keys and end > start:
        rows, key_rows = c.main.rows[start:end], rows_of_keys(c, main_keys)
        pos = np.minimum(rows.searchsorted(key_rows), len(rows) - 1)
        out.update(main_keys[i] for i in (rows[pos] == key_rows).nonzero()[0].tolist())
    return out


def holders(c: Corpus, terms: list[str], limit: int,
            allowed: BitMap | None = None) -> list[int] | None:
    """The keys :meth:`Scorer.search` finds for ``terms`` at ``limit`` when it finds every
    document holding one of them (a few postings, at most ``limit`` documents in
    ``allowed``), read from the postings without scoring, ascending; None otherwise."""
    if not len(c.live) or limit <= 0:
        return []
    found: set[int] = set()
    seen = 0
    for term in dict.fromkeys(terms):
        start, end = span(c, term)
        dpost = c.delta.postings(term)
        seen += end - start + (len(dpost) if dpost else 0)
        if seen > FEW_POSTINGS:
            return None  # the search's numpy paths: their own ties and cuts
        if end > start:
            rows = c.main.rows[start:end]
            if c.n_dead:
                rows = rows[c.alive[rows]]
            found.update(c.main.row_keys.take(rows).tolist())
        if dpost:
            found.update(dpost)
    if allowed is not None:
        found = {key for key in found if key in allowed}
    return sorted(found) if len(found) <= limit else None


def holders_of_all(c: Corpus, terms: list[str],
                   allowed: BitMap | None = None) -> list[int] | None:
    """The live keys (in ``allowed``) of the documents holding every one of ``terms``,
    ascending, however they would score: read from the postings of the rarest term and
    looked up in the others' (``holding``); None when the rarest has more than
    ``ALL_HOLDERS`` live postings (or there are no terms)."""
    # Each term's span in main and its delta postings, looked up once.
    where = {term: (span(c, term), c.delta.postings(term) or ()) for term in dict.fromkeys(terms)}
    if not where:
        return None
    counts = {term: end - start + len(dpost) for term, ((start, end), dpost) in where.items()}
    if min(counts.values()) > ALL_HOLDERS and c.n_dead:
        # Main keeps the rows of deleted and edited documents until a compaction: count
        # only the live ones, as a search does, or churn would hide the holders.
        counts = {term: live_in(c, start, end) + len(dpost)
                  for term, ((start, end), dpost) in where.items()}
    rarest = min(counts, key=counts.__getitem__)
    if counts[rarest] > ALL_HOLDERS:
        return None
    (start, end), dpost = where[rarest]
    keys = set(c.main.row_keys.take(c.main.rows[start:end]).tolist()) if end > start else set()
    keys.update(dpost)
    if allowed is not None:
        keys = {key for key in keys if key in allowed}
    for term in counts:  # the rarest too: a key's live version may no longer hold it
        keys = holding(c, term, keys)
    return sorted(keys)


def span(c: Corpus, term: str) -> tuple[int, int]:
    """Where ``term``'s postings lie in main's ``rows`` and ``tfs`` (an empty span
    when main has none)."""
    tid = c.lookup.get(term)
    indptr = c.main.indptr
    if tid is None or tid >= len(indptr) - 1:
        return 0, 0
    return int(indptr[tid]), int(indptr[tid + 1])


def live_in(c: Corpus, start: int, end: int) -> int:
    """How many of main's postings ``start:end`` are of live rows."""
    if not c.n_dead or start == end:
        return end - start
    return int(np.count_nonzero(c.alive[c.main.rows[start:end]]))


def rows_of_keys(c: Corpus, keys: list[int]) -> I32:
    """The main rows of live main ``keys`` (without ``BM25Contents._row_of``'s bookkeeping),
    in the postings' dtype.

    Searched and compared in the arrays' own dtypes: numpy casts the whole array to
    a wider needle's dtype on every call (all rows, or all of a term's postings)."""
    if c.key_row is not None:
        key_row = c.key_row
        return np.fromiter((key_row[k] for k in keys), dtype=np.int32, count=len(keys))
    return c.main.row_keys.searchsorted(np.asarray(keys, dtype=np.uint32)).astype(np.int32)


class _TermPostings:
    """One query term's live postings in main (None: it has none there) and, once a
    search needed them, their ``tf / (norm + tf)`` with the norms of the current average
    length: what every search computed again between two writes."""

    __slots__ = ("_base", "rows", "tfs")

    def __init__(self, rows: I32 | None, tfs: F32 | None) -> None:
        self.rows, self.tfs = rows, tfs
        self._base: npt.NDArray[np.float64] | None = None

    def base(self, norms: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """``tf / (norm + tf)`` per posting (``norms``: per row, for the current average
        document length; they change only with a write, which drops this record)."""
        if self._base is None:
            assert self.rows is not None and self.tfs is not None
            self._base = self.tfs / (norms[self.rows] + self.tfs)
        return self._base


class _Scored:
    """Every score one search gave: ``scores`` (key -> score, the Python path), or the
    postings' ``rows`` and ``weights`` with their per-row sums ``acc`` (None: one term, a
    row's weight is its sum) and the delta's scores ``extra``. The values are those
    :meth:`BM25Index.score_keys` computes (summed term after term alike), so it reads
    them for the query's other keys (the chunks of linked files, exact hits outside the
    pool) instead of walking the postings again."""

    __slots__ = ("_acc", "_rows", "_weights", "extra", "scores")

    def __init__(self, *, scores: dict[int, float] | None = None, rows: I32 | None = None,
                 weights: npt.NDArray[np.float64] | None = None,
                 acc: npt.NDArray[np.float64] | None = None,
                 extra: dict[int, float] | None = None) -> None:
        self.scores = scores
        self._rows, self._weights, self._acc = rows, weights, acc
        self.extra = extra or {}

    def of(self, main_keys: list[int], key_rows: I32,
           delta_keys: list[int]) -> dict[int, float]:
        """The scores of the live keys given (main keys with their rows, delta keys); keys
        no query term matched are left out."""
        if self.scores is not None:
            scores = self.scores
            return {k: scores[k] for k in (*main_keys, *delta_keys) if k in scores}
        out: dict[int, float] = {}
        if main_keys:
            if self._acc is None:
                assert self._rows is not None and self._weights is not None
                # One term: each row has at most one posting, its weight is the sum.
                pos = np.minimum(self._rows.searchsorted(key_rows), len(self._rows) - 1)
                hit = (self._rows[pos] == key_rows).tolist()
                values = self._weights[pos].tolist()
            else:
                values = self._acc[key_rows].tolist()
                hit = [v > 0.0 for v in values]  # a matched term always adds a weight > 0
            out = {k: v for k, v, h in zip(main_keys, values, hit, strict=True) if h}
        extra = self.extra
        out.update((k, extra[k]) for k in delta_keys if k in extra)
        return out

