"""BM25 keyword index over numpy arrays, with live-document bitmaps and self-compaction.

Owns one in-memory inverted index; no I/O, no threads, no locks. The caller (the per-workspace
index service) serializes writers and readers, typically by running every call in one worker
thread at a time, and persists it through ``to_arrays``/``meta`` and ``from_arrays``.

Layout. A *main* segment in CSR form: term ids (``dict[str, int]``, strings kept in term id
order), ``indptr`` (int64, one slot per term + 1), ``rows`` (int32, postings sorted by row per
term) and ``tfs`` (float32), plus per-row ``doclen``, ``row_keys`` (the caller's uint32 doc key)
and ``alive``. New documents go to a small Python *delta* (term -> {key: tf}). A delete clears a
bit (``alive`` or the delta entry) in O(1); dead rows stay in the postings and are masked at query
time until the next merge.

Compaction is part of ``add``/``remove``: the delta is merged into main once it holds more than an
eighth of the live main documents (at least ``DELTA_MIN_DOCS``, at most ``DELTA_MAX_DOCS``), and
main is rewritten once a quarter of its rows are dead. A merge is linear in the postings (main is
never re-sorted, see ``postings.merge``); below the cap the thresholds grow geometrically with the
index, so the total merge work over n adds is O(n). The cap bounds the delta's Python memory and
its per-query cost on very large indexes, at the price of one main rewrite per 2,048 single adds
there. ``add_many`` encodes documents into numpy
slabs and merges once: that is the cold-build path.

Filters are the caller's: pass ``allowed`` (a BitMap of doc keys, e.g. built from path prefix,
daily-note date or digest bucket) and only those keys are returned; a narrow filter is applied
as one vectorized membership test, a wide one lazily while walking the ranked candidates.

Its speed is measured by tests/bench/quality_lexical.py and bench_index.py (figures in
tests/bench/README.md).

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

import logging
import math
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Final, TypedDict

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from recalld.daemon.arraytypes import F32
from recalld.daemon.index import postings, ranking, saved
from recalld.daemon.index.postings import I32, I64, Segment, Slab
from recalld.daemon.index.tokenizer import doc_length
from recalld.daemon.jsontypes import JsonObject

log = logging.getLogger(__name__)

__all__ = ["BM25Index", "OutdatedFormat"]

FORMAT: Final = "recalld-bm25"
# 2: CJK text counts by characters in document lengths (tokenizer.doc_length).
VERSION: Final = 2
DELTA_MIN_DOCS: Final = 256
DELTA_MAX_DOCS: Final = 2048
DEAD_MIN_ROWS: Final = 1024
DEAD_FRACTION: Final = 0.25
# With compaction in the background (``compact_inline`` off), a write still compacts
# inline once the delta or the dead rows are this far past their limits.
BACKSTOP_FACTOR: Final = 4
BACKSTOP_DEAD_FRACTION: Final = 0.75
SLAB_DOCS: Final = 8192
# add_encoded puts up to this many documents in the delta instead of merging main (more
# with compaction off the lock: see add_encoded).
SMALL_ADD_DOCS: Final = 64
# add_encoded(stage=True) merges once this many documents are staged (or as many as main
# holds, if fewer): a merge's temporary arrays grow with the documents it adds.
STAGED_MAX_DOCS: Final = 8192
# Unfiltered searches of a main segment of at most this many rows sum and rank with one
# bincount over all rows (see ranking.top_dense); larger ones sort the postings instead.
DENSE_ROWS: Final = 32768
# A search over at most this many postings scores them in Python (see ranking.top_few):
# for so few, a Python loop costs less than numpy's per-call overhead.
FEW_POSTINGS: Final = 48
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
_MAX_KEY: Final = 2**32 - 1


class BM25Meta(TypedDict):
    """The parameters and counters saved beside :meth:`BM25Index.to_arrays`."""

    format: str
    version: int
    k1: float
    b: float
    docs: int
    total_len: int
    terms: int


class OutdatedFormat(ValueError):
    """Saved arrays of another format or version: rebuild, nothing is damaged."""


class BM25Index:
    """An incremental BM25 index keyed by caller-chosen uint32 document keys."""

    def __init__(self, *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        # Term -> id; its insertion order is id order (the term list, without a list).
        # After a load it stays the saved (blob, offsets) until something needs it: a
        # workspace that is neither searched nor written keeps no dict and no strings
        # (about 2 MB for 50k terms).
        self._table: postings.TermTable | None = postings.term_table()
        self._saved_terms: tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]] | None = None
        # Searches look terms up here while there is no ``_table`` (see _lookup).
        self._sorted_terms: saved.SortedTerms | None = None
        self._main_gen = 0
        # What searches keep until the next write (every change of what a search sees
        # calls _wrote): the full scores of the last few unfiltered searches (query
        # tokens -> them), so ``score_keys`` for the same query reads them instead of
        # scoring again, and query terms' live postings and weights (see _terms_now).
        self._scored: dict[tuple[str, ...], _Scored] = {}
        self._terms: dict[str, _TermPostings] = {}
        self._terms_size = 0
        self._set_main(Segment.empty())
        self._norm_key: tuple[float, int] | None = None
        self._norms: npt.NDArray[np.float64] = np.zeros(0, dtype=np.float64)
        self._alive: npt.NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)
        # key -> main row; None while main's rows are in ascending key order (the index
        # service adds keys in order), when a binary search of row_keys finds them instead.
        self._key_row: dict[int, int] | None = None
        # After a compaction ran out of memory: the delta documents and dead rows there
        # must be before the next one is tried (0: none failed).
        self._compact_retry_at = 0
        #: False: the owner compacts in the background (plan_compaction, run off any lock,
        #: install_compaction); writes then compact inline only far past the limits.
        self.compact_inline = True
        # Changes whenever main's rows change (merges, loads), not when the same rows are
        # served from other memory (adopt_main): what a planned compaction was made from.
        self._main_rows_gen = 0
        self._n_dead = 0
        self._delta_docs: dict[int, tuple[dict[str, int], int]] = {}
        self._delta_post: dict[str, dict[int, int]] = {}
        self._live = BitMap()
        self._total_len = 0
        self.merges = 0
        #: Of those, compactions planned and merged off the owner's lock (installed).
        self.compactions = 0
        # Slabs added with ``stage``: remapped, not yet searchable, merged into main
        # together (see add_encoded); their keys and summed lengths.
        self._staged: list[Slab] = []
        self._staged_keys = BitMap()
        self._staged_len = 0
        # Vocabularies kept by worker processes over the batches of a pass: (pass token,
        # pid) -> this index's id of each of their terms (see vocabulary_ids).
        self._vocabs: dict[tuple[str, int], I32] = {}

    # ----------------------------------------------------------------- introspection
    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and 0 <= key <= _MAX_KEY and key in self._live

    @property
    def terms_built(self) -> bool:
        """Whether the term table is in memory (a write needed it), not the saved bytes."""
        return self._table is not None

    @property
    def _term_ids(self) -> postings.TermTable:
        if self._table is None:
            assert self._saved_terms is not None
            blob, offsets = self._saved_terms
            terms = saved.load_terms({"terms_blob": blob, "terms_offsets": offsets},
                                        unique=False)  # checked when loaded
            # Interned: workspaces of one daemon share one string per common term.
            self._table = postings.term_table([sys.intern(t) for t in terms])
            self._saved_terms = self._sorted_terms = None
        return self._table

    @_term_ids.setter
    def _term_ids(self, table: postings.TermTable) -> None:
        self._table, self._saved_terms, self._sorted_terms = table, None, None

    @property
    def _lookup(self) -> postings.TermTable | saved.SortedTerms:
        """Term -> id for searches: the table once a write needed it, else the loaded
        dictionary's sorted form (no string per term: a loaded index that is only
        searched never builds the table)."""
        if self._table is not None:
            return self._table
        if self._sorted_terms is None:
            assert self._saved_terms is not None
            self._sorted_terms = saved.SortedTerms(*self._saved_terms)
        return self._sorted_terms

    def _n_terms(self) -> int:
        if self._table is not None:
            return len(self._table)
        assert self._saved_terms is not None
        return len(self._saved_terms[1]) - 1  # offsets: one more than terms

    @property
    def live(self) -> BitMap:
        """The live document keys (a copy: callers may combine it freely)."""
        return BitMap(self._live)

    @property
    def staged(self) -> BitMap:
        """Keys of the documents a pass holds aside until it merges them (a copy)."""
        return BitMap(self._staged_keys)

    def stats(self) -> dict[str, int]:
        return {
            "docs": len(self._live), "main_rows": len(self._row_keys), "dead_rows": self._n_dead,
            "delta_docs": len(self._delta_docs), "terms": self._n_terms(),
            "postings": len(self._rows), "merges": self.merges,
        }

    # ----------------------------------------------------------------- writes
    def add(self, doc_key: int, tokens: list[str]) -> None:
        """Index ``tokens`` under ``doc_key``, replacing any earlier version of that key."""
        _check_key(doc_key)
        self.merge_staged()
        if doc_key in self._live:
            self._remove(doc_key)
        self._add_counts(doc_key, dict(Counter(tokens)), doc_length(tokens))
        self._maybe_compact()

    def _add_counts(self, doc_key: int, counts: dict[str, int], length: int) -> None:
        self._wrote()
        self._delta_docs[doc_key] = (counts, length)
        for term, tf in counts.items():
            post = self._delta_post.get(term)
            if post is None:
                self._delta_post[term] = {doc_key: tf}
            else:
                post[doc_key] = tf
        self._live.add(doc_key)
        self._total_len += length

    def _take_back(self, doc_key: int, counts: dict[str, int], length: int) -> None:
        """Undo :meth:`_add_counts` of ``doc_key``, also one that raised part-way."""
        self._wrote()
        self._delta_docs.pop(doc_key, None)
        for term in counts:
            post = self._delta_post.get(term)
            if post is not None and doc_key in post:
                del post[doc_key]
                if not post:
                    del self._delta_post[term]
        if doc_key in self._live:
            self._live.discard(doc_key)
            self._total_len -= length

    def add_encoded(self, parts: Iterable[tuple[list[str] | str | None, Slab]], *,
                    stage: bool = False) -> None:
        """Index slabs encoded elsewhere (``Slab.local``): pairs of (their terms, the slab
        with its ``keys`` set to the documents' keys). Few documents go to the delta (with
        ``compact_inline`` off, as many as keep it below the backstop), more join main in
        one merge; keys already indexed are replaced. Terms None: the slab's
        term ids are this index's already (``Slab.mapped`` with :meth:`vocabulary_ids`).

        ``stage`` (a pass of many calls, such as a first build): many new documents wait
        beside main, in this index's term ids, and join it in one merge with later ones:
        at the next call without ``stage`` or any other write (or :meth:`merge_staged`),
        at the latest once they are as many as main's (or ``STAGED_MAX_DOCS``). A merge
        rewrites main, so a pass then copies main fewer times than once per call. Staged
        documents are not searchable yet and do not count in the corpus statistics.

        A merge that raises (out of memory) adds none of ``parts``, neither to main nor
        to the staged documents, and leaves those staged before as they were; so does a
        small add to the delta that raises (the documents they replace stay removed).
        """
        parts = list(parts)
        for _, slab in parts:
            for key in slab.keys:
                _check_key(key)
        if len({k for _, slab in parts for k in slab.keys}) != sum(len(s.keys) for _, s in parts):
            raise ValueError("a document key repeats within one add_encoded call")
        # Few documents go to the delta. With compaction off the lock (the watcher's
        # applies), so do many, as long as the delta stays below the backstop: a merge
        # rewrites main under the caller's lock (seconds at 100k chunks), where adding to
        # the delta costs about a microsecond a posting and the merge comes later, off it.
        room = SMALL_ADD_DOCS if self.compact_inline or stage else max(
            SMALL_ADD_DOCS, BACKSTOP_FACTOR * self._delta_limit() - len(self._delta_docs))
        small = sum(len(slab.keys) for _, slab in parts) <= room
        if small or any(key in self._live or key in self._staged_keys
                        for _, slab in parts for key in slab.keys):
            self.merge_staged()  # they come first, as if merged when they were added
        elif stage:
            own = [self._own_ids(terms, slab) for terms, slab in parts]
            staged = len(self._staged_keys) + sum(len(slab.keys) for slab in own)
            if staged >= min(len(self._live), STAGED_MAX_DOCS):
                self._merge_with_staged(own)
            else:
                for slab in own:
                    self._staged.append(slab)
                    self._staged_keys.update(slab.keys)
                    self._staged_len += sum(slab.lens)
            return
        for _, slab in parts:
            for key in slab.keys:
                if key in self._live:
                    self._remove(key)
        if small:
            table: list[str] = []  # the term table by id, made once (no merge below)
            added: list[tuple[int, dict[str, int], int]] = []
            try:
                for terms, slab in parts:
                    if terms is None and not table:
                        table = list(self._term_ids)
                    named = table if terms is None else terms
                    for key, (counts, length) in zip(slab.keys, slab.counts(named),
                                                     strict=True):
                        added.append((key, counts, length))
                        self._add_counts(key, counts, length)
            except BaseException:
                for key, counts, length in added:  # as a merge that raises: none of parts
                    self._take_back(key, counts, length)
                raise
        else:
            self._merge_with_staged([self._own_ids(terms, slab) for terms, slab in parts])
        self._maybe_compact()

    def _merge_with_staged(self, slabs: list[Slab]) -> None:
        """Merge the staged documents and then ``slabs`` (this index's term ids) into
        main; counted as live only once the merge succeeded (if it raises, the staged
        documents stay staged and ``slabs`` join nothing)."""
        self._merge([*self._staged, *slabs])
        self._count_staged()
        for slab in slabs:
            self._live.update(slab.keys)
            self._total_len += sum(slab.lens)

    def _own_ids(self, terms: list[str] | str | None, slab: Slab) -> Slab:
        return slab if terms is None else slab.remap(terms, self._term_ids, slab.keys)

    def vocabulary_ids(self, source: tuple[str, int], start: int,
                       terms: list[str] | str) -> I32:
        """This index's id of every term of a vocabulary that ``source`` keeps over many
        batches (a worker process's over a pass): ``terms`` are those it added since it
        held ``start`` terms (0: it began again). New terms join this index in their order,
        as :meth:`add_encoded` would add them. ValueError if ``start`` is not what this
        index has of that vocabulary.

        While any vocabulary is held, merges keep terms left without postings, so the ids
        given stay valid; :meth:`forget_vocabularies` lets them go.
        """
        held = self._vocabs.get(source) if start else None
        if (0 if held is None else len(held)) != start:
            raise ValueError(f"a vocabulary of {start} terms is not the one held for {source}")
        new = postings.global_ids(postings.split_terms(terms), self._term_ids)
        ids = new if held is None else np.concatenate([held, new])
        self._vocabs[source] = ids
        return ids

    def forget_vocabularies(self) -> None:
        """Drop what :meth:`vocabulary_ids` held (a pass ended)."""
        self._vocabs = {}

    def add_many(self, docs: Iterable[tuple[int, list[str]]]) -> None:
        """Index many documents at once: they bypass the delta and join main in one merge.

        This is the cold-build path; documents are encoded a slab at a time with numpy, and the
        single merge is linear in the postings of the index.
        """
        self.merge_staged()
        slabs: list[Slab] = []
        batch: dict[int, list[str]] = {}
        pending: set[int] = set()  # keys in encoded slabs, not yet merged
        try:
            for key, tokens in docs:
                _check_key(key)
                if key in batch or key in pending:
                    # The same key twice in one call: merge what came before, the later wins.
                    slabs.append(Slab.encode(batch, self._term_ids))
                    self._merge(slabs)
                    slabs, batch, pending = [], {}, set()
                if key in self._live:
                    self._remove(key)
                batch[key] = tokens
                self._live.add(key)
                self._total_len += doc_length(tokens)
                if len(batch) >= SLAB_DOCS:
                    slabs.append(Slab.encode(batch, self._term_ids))
                    pending.update(batch)
                    batch = {}
        finally:
            # Even when a bad key stops the batch, what was accepted is indexed consistently.
            if batch:
                slabs.append(Slab.encode(batch, self._term_ids))
            if slabs:
                self._merge(slabs)
        self._maybe_compact()

    def remove(self, doc_key: int) -> bool:
        """Delete ``doc_key``; returns whether it was indexed. O(1) apart from compaction."""
        self.merge_staged()
        if doc_key not in self:
            return False
        self._remove(doc_key)
        self._maybe_compact()
        return True

    def compact(self) -> None:
        """Merge the delta and drop dead rows now (normally automatic)."""
        if self._staged:
            self.merge_staged()
        elif self._delta_docs or self._n_dead:
            self._merge([])

    def merge_staged(self) -> None:
        """Merge the documents ``add_encoded`` staged into main (searchable from then on).
        If the merge raises, they stay staged."""
        if self._staged:
            self._merge(self._staged)
            self._count_staged()

    def drop_staged(self) -> BitMap:
        """Let go of the staged documents without indexing them (their merge failed);
        returns their keys."""
        keys = self._staged_keys
        self._staged, self._staged_keys, self._staged_len = [], BitMap(), 0
        return keys

    def _count_staged(self) -> None:
        """The staged documents were merged into main: count them as live."""
        self._staged = []
        self._live |= self._staged_keys
        self._total_len += self._staged_len
        self._staged_keys, self._staged_len = BitMap(), 0

    def _remove(self, key: int) -> None:
        self._wrote()
        entry = self._delta_docs.pop(key, None)
        if entry is not None:
            counts, length = entry
            for term in counts:
                post = self._delta_post[term]
                del post[key]
                if not post:
                    del self._delta_post[term]
            self._total_len -= length
        else:
            row = self._row_of(key)
            self._alive[row] = False
            self._n_dead += 1
            self._total_len -= int(self._doclen[row])
        self._live.discard(key)

    def _row_of(self, key: int) -> int:
        """The main row of live ``key`` (which must be in main, not the delta)."""
        if self._key_row is not None:
            return self._key_row.pop(key)
        return int(self._row_keys.searchsorted(np.uint32(key)))  # see _rows_of_keys

    def _index_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Set up :meth:`_row_of` for the live ``rows`` of main."""
        self._key_row = _key_rows(self._row_keys, rows)

    def _maybe_compact(self) -> None:
        """Merge the delta and drop dead rows once they are many. Only upkeep: the write
        before it is done whether or not it succeeds, so running out of memory here
        changes nothing (``_merge`` leaves main and the delta as they were), and it is
        tried again once the delta documents and dead rows are twice as many (so is
        one that fails otherwise, logged). With
        ``compact_inline`` off the owner compacts in the background; a write compacts
        only once there is ``BACKSTOP_FACTOR`` times as much (should that never come)."""
        if not self.compaction_due(backstop=not self.compact_inline):
            return
        try:
            self._merge([])
        except Exception as exc:  # upkeep: the write is done, the index as it was
            self._compaction_failed(exc)

    def compaction_due(self, *, backstop: bool = False) -> bool:
        """Whether the delta documents or dead rows are many enough for a compaction
        (``backstop``: far past the limits), and not fewer than where the last one failed."""
        factor, dead_fraction = (BACKSTOP_FACTOR, BACKSTOP_DEAD_FRACTION) if backstop else (
            1, DEAD_FRACTION)
        due = len(self._delta_docs) > factor * self._delta_limit() or (
            self._n_dead >= factor * DEAD_MIN_ROWS
            and self._n_dead > dead_fraction * len(self._row_keys))
        return due and len(self._delta_docs) + self._n_dead >= self._compact_retry_at

    def _delta_limit(self) -> int:
        """Delta documents past which a compaction is due: an eighth of main's live ones,
        within ``DELTA_MIN_DOCS`` and ``DELTA_MAX_DOCS``."""
        main_live = len(self._row_keys) - self._n_dead
        return min(DELTA_MAX_DOCS, max(DELTA_MIN_DOCS, main_live // 8))

    def _compaction_failed(self, exc: BaseException) -> None:
        self._compact_retry_at = 2 * (len(self._delta_docs) + self._n_dead)
        memory = isinstance(exc, MemoryError)
        log.warning("keyword index: compaction postponed (%s: %s)",
                    "out of memory" if memory else type(exc).__name__, exc,
                    exc_info=None if memory else exc)

    def plan_compaction(self, *, due: bool = True) -> Compaction | None:
        """What a compaction needs, taken under the owner's lock and cheap to take (the
        delta's entries, not their counts; main's alive bits; the term list; main's
        arrays, which never change): :meth:`Compaction.run` then encodes and merges
        without any lock while searches and writes go on, and :meth:`install_compaction`
        swaps the result in. None when none is ``due`` (False: whenever there is a delta
        or a dead row), or while a pass holds staged documents or term ids (its end
        merges anyway)."""
        if self._staged or self._vocabs or not (
                self.compaction_due() if due else self._delta_docs or self._n_dead):
            return None
        terms: list[str] | tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]
        if self._table is not None:
            terms = list(self._table)
        else:
            assert self._saved_terms is not None
            terms = self._saved_terms  # made into strings by run(), not here
        return Compaction(self, self._main_rows_gen, self._main, self._alive.copy(),
                          dict(self._delta_docs), terms)

    def install_compaction(self, done: Compaction) -> bool:
        """Serve what ``done`` merged (call under the owner's lock), with what changed
        since it was planned: main rows and delta documents removed or replaced meanwhile
        are dead rows of the new main, documents added meanwhile stay in the delta.
        False (nothing changes) if it was planned by another index, main's rows changed
        meanwhile (a merge, a load) or a pass now holds staged documents or term ids.
        Everything new is made before any of it replaces the old (out of memory part-way,
        nothing changed). The term table becomes the compaction's: terms numbered since
        the plan (a save numbers the delta's) had no postings in main, and the delta
        keeps terms as strings."""
        if (done.index is not self or done.rows_gen != self._main_rows_gen or self._staged
                or self._vocabs or done.result is None):
            return False
        seg, table, keys = done.result
        still = np.fromiter((self._delta_docs.get(key) is done.docs[key] for key in keys),
                            dtype=np.bool_, count=len(keys))
        alive = np.concatenate([self._alive[np.flatnonzero(done.alive)], still])
        delta_docs = {key: entry for key, entry in self._delta_docs.items()
                      if done.docs.get(key) is not entry}
        delta_post: dict[str, dict[int, int]] = {}
        for key, (counts, _) in delta_docs.items():
            for term, tf in counts.items():
                delta_post.setdefault(term, {})[key] = tf
        live_rows = np.flatnonzero(alive)
        key_row = _key_rows(seg.row_keys, live_rows)
        # Counted before anything changes: whoever sees the change sees them.
        self.merges += 1
        self.compactions += 1
        self._wrote()
        self._delta_docs, self._delta_post = delta_docs, delta_post
        self._term_ids = table
        self._set_main(seg)
        self._main_rows_gen += 1
        self._alive, self._key_row, self._n_dead = alive, key_row, len(alive) - len(live_rows)
        self._compact_retry_at = 0
        return True

    def compaction_failed(self, exc: BaseException) -> None:
        """A planned compaction failed (out of memory, or a fault: logged): try again
        once there is twice as much to do (call under the owner's lock)."""
        self._compaction_failed(exc)

    def _set_main(self, seg: Segment) -> None:
        self._main = seg
        self._main_gen += 1  # invalidates the cached length norms
        self._wrote()
        self._indptr, self._rows, self._tfs = seg.indptr, seg.rows, seg.tfs
        self._doclen, self._row_keys = seg.doclen, seg.row_keys

    def _merge(self, slabs: list[Slab]) -> None:
        """Rewrite main from its live rows, the delta and ``slabs`` (see ``postings.merge``).
        If it raises (out of memory), main and the delta stay as they were: everything
        new is made before any of it replaces the old."""
        delta = Slab.from_counts(self._delta_docs, self._term_ids)
        seg, used = postings.merge(self._main, self._alive, [delta, *slabs], len(self._term_ids),
                                   drop_unused=not self._vocabs)
        term_ids = self._term_ids
        if used is not None:
            # Drop terms without postings so the dictionary does not grow forever.
            terms = list(self._term_ids)
            term_ids = postings.term_table([terms[i] for i in used.tolist()])
        alive = np.ones(len(seg.row_keys), dtype=np.bool_)
        key_row = _key_rows(seg.row_keys, np.arange(len(seg.row_keys), dtype=np.int64))
        self.merges += 1
        self._delta_docs.clear()
        self._delta_post.clear()
        self._term_ids = term_ids
        self._set_main(seg)
        self._main_rows_gen += 1
        self._alive, self._key_row, self._n_dead = alive, key_row, 0
        self._compact_retry_at = 0

    @property
    def main_generation(self) -> int:
        """Changes whenever the main segment is replaced (merges, loads)."""
        return self._main_gen

    def adopt_main(self, arrays: Mapping[str, npt.NDArray[np.generic]]) -> None:
        """Serve the main segment from ``arrays`` (saved by ``to_arrays`` while main was
        what it is now, e.g. mapped from the file just written). ValueError if they differ
        in shape; the contents are the caller's promise."""
        seg = saved.load_segment(arrays, self._n_terms(), check_values=False)
        if (len(seg.indptr), len(seg.rows), len(seg.row_keys)) != (
                len(self._indptr), len(self._rows), len(self._row_keys)):
            raise ValueError("saved keyword index does not match the one in memory")
        norm_key, norms, old_gen = self._norm_key, self._norms, self._main_gen
        self._set_main(seg)
        if norm_key is not None and norm_key[1] == old_gen:
            # Same rows, same lengths: the cached norms still hold.
            self._norm_key, self._norms = (norm_key[0], self._main_gen), norms

    # ----------------------------------------------------------------- search
    def doc_freq(self, term: str) -> int:
        """How many live documents contain ``term`` (one lookup, no scoring)."""
        return len(self._delta_post.get(term, ())) + self._live_in(*self._span(term))

    def _span(self, term: str) -> tuple[int, int]:
        """Where ``term``'s postings lie in main's ``rows`` and ``tfs`` (an empty span
        when main has none)."""
        tid = self._lookup.get(term)
        if tid is None or tid >= len(self._indptr) - 1:
            return 0, 0
        return int(self._indptr[tid]), int(self._indptr[tid + 1])

    def _live_in(self, start: int, end: int) -> int:
        """How many of main's postings ``start:end`` are of live rows."""
        if not self._n_dead or start == end:
            return end - start
        return int(np.count_nonzero(self._alive[self._rows[start:end]]))

    def search(
        self, query_tokens: list[str], limit: int, *, allowed: BitMap | None = None
    ) -> list[tuple[int, float]]:
        """Top ``limit`` (doc key, score) pairs, best first; only keys in ``allowed`` if given.

        Corpus statistics always cover every live document: a filter narrows the results, it
        does not change the scores.
        """
        n_docs = len(self._live)
        if n_docs == 0 or limit <= 0 or not query_tokens:
            return []
        k1, b = self.k1, self.b
        avgdl = self._total_len / n_docs if self._total_len else 1.0
        all_rows, all_tfs = self._rows, self._tfs
        # Each term's main postings and (k1 + 1) * idf; the arithmetic over the postings
        # is then done once for all terms, not once per term.
        row_parts: list[I32] = []
        tf_parts: list[F32] = []
        factors: list[float] = []
        part_terms: list[str] = []
        delta_scores: dict[int, float] = {}
        terms = self._terms_now()
        for term, qf in Counter(query_tokens).items():
            found = terms.get(term)
            if found is None:
                start, end = self._span(term)
                rows = tfs = None
                if end > start:
                    rows, tfs = all_rows[start:end], all_tfs[start:end]
                    if self._n_dead:
                        keep = self._alive[rows]
                        rows, tfs = rows[keep], tfs[keep]
                found = terms[term] = _TermPostings(rows, tfs)
                self._terms_size += 1 + (0 if rows is None else len(rows))
            rows, tfs = found.rows, found.tfs
            df = 0 if rows is None else len(rows)
            dpost = self._delta_post.get(term)
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
                docs = self._delta_docs
                for key, tf in dpost.items():
                    norm_d = k1 * (1.0 - b + b * (docs[key][1] / avgdl))
                    # As the main segment's weights are computed, to the last bit.
                    delta_scores[key] = delta_scores.get(key, 0.0) + tf / (norm_d + tf) * factor
        if sum(len(r) for r in row_parts) + len(delta_scores) <= FEW_POSTINGS:
            # Rare terms (identifiers, names): plain Python beats a dozen numpy calls.
            scores = ranking.few_scores(self._row_keys, self._row_norms(avgdl), row_parts,
                                        tf_parts, factors, extra=delta_scores)
            self._remember(query_tokens, _Scored(scores=scores))
            return ranking.top_few(scores, limit, allowed=allowed)
        if not row_parts:
            cand_keys, cand_scores = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        else:
            norms = self._row_norms(avgdl)
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
            if allowed is None and len(self._row_keys) <= DENSE_ROWS:
                acc = (ranking.row_sums(rows, weights, len(self._row_keys))
                       if len(row_parts) > 1 else None)
                self._remember(query_tokens, _Scored(
                    rows=rows, weights=weights, acc=acc, extra=delta_scores))
                return ranking.top_dense(self._row_keys, rows, weights, len(row_parts), acc,
                                         delta_scores, limit)
            cand_keys, cand_scores = ranking.summed(self._row_keys, rows, weights,
                                                    len(row_parts))
        return ranking.top_k(cand_keys, cand_scores, limit, extra=delta_scores,
                             allowed=allowed)

    def score_keys(self, query_tokens: list[str], keys: Iterable[int]) -> dict[int, float]:
        """The scores :meth:`search` gives ``keys`` for the query, computed for them alone
        (summed term after term, as search's bincount and Python paths sum; its sorting
        path may differ in the last bit); keys that are not live or match no query term
        are left out.

        For a short query this looks up each term's postings of just those rows instead of
        scoring the whole index and filtering: a search restricted to the chunks of a few
        files costs as much as an unrestricted one. A query of many terms is a restricted
        search: a handful of array operations per term would cost more than one pass over
        every term's postings (and hold the interpreter for as long).
        """
        n_docs = len(self._live)
        live, delta_docs = self._live, self._delta_docs
        wanted = [k for k in keys if k in live]
        if n_docs == 0 or not wanted or not query_tokens:
            return {}
        counts = Counter(query_tokens)
        if len(counts) > SCORE_KEYS_MAX_TERMS:
            return dict(self.search(query_tokens, len(wanted), allowed=BitMap(wanted)))
        main_keys = [k for k in wanted if k not in delta_docs]
        delta_keys = [k for k in wanted if k in delta_docs]
        scored = self._scored.get(tuple(query_tokens))
        if scored is not None:
            return scored.of(main_keys, self._rows_of_keys(main_keys), delta_keys)
        k1, b = self.k1, self.b
        avgdl = self._total_len / n_docs if self._total_len else 1.0
        key_rows = self._rows_of_keys(main_keys)
        norms = self._row_norms(avgdl)[key_rows].tolist()
        all_rows, all_tfs = self._rows, self._tfs
        scores: dict[int, float] = {}
        for term, qf in counts.items():
            start, end = self._span(term)
            df = self._live_in(start, end)
            dpost = self._delta_post.get(term)
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
                        norm_d = k1 * (1.0 - b + b * (delta_docs[key][1] / avgdl))
                        scores[key] = scores.get(key, 0.0) + dtf / (norm_d + dtf) * factor
        return scores

    def _wrote(self) -> None:
        """What searches kept no longer holds: drop it (new dicts, since a remembered
        search may hold views of arrays a merge replaces)."""
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

    def _rows_of_keys(self, keys: list[int]) -> I32:
        """The main rows of live main ``keys`` (without :meth:`_row_of`'s bookkeeping), in
        the postings' dtype.

        Searched and compared in the arrays' own dtypes: numpy casts the whole array to
        a wider needle's dtype on every call (all rows, or all of a term's postings)."""
        if self._key_row is not None:
            key_row = self._key_row
            return np.fromiter((key_row[k] for k in keys), dtype=np.int32, count=len(keys))
        return self._row_keys.searchsorted(np.asarray(keys, dtype=np.uint32)).astype(
            np.int32)

    def _row_norms(self, avgdl: float) -> npt.NDArray[np.float64]:
        """``k1 * (1 - b + b * dl / avgdl)`` per main row, cached until avgdl or main changes
        (queries between two writes share it)."""
        key = (avgdl, self._main_gen)
        if self._norm_key != key:
            dl = self._doclen.astype(np.float64)
            self._norms = self.k1 * (1.0 - self.b + self.b * (dl / avgdl))
            self._norm_key = key
        return self._norms

    # ----------------------------------------------------------------- persistence
    def meta(self) -> BM25Meta:
        """JSON-able parameters and counters that go with ``to_arrays``."""
        self.merge_staged()
        return {
            "format": FORMAT, "version": VERSION, "k1": self.k1, "b": self.b,
            "docs": len(self._live), "total_len": self._total_len, "terms": self._n_terms(),
        }

    def to_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        """The whole index as plain numeric arrays (no objects, safe without pickle).

        Main arrays are returned without copying; treat them as read-only (merges replace them,
        never write into them). The delta is exported as its own small doc-major CSR, so
        persisting does not force a merge (staged documents are merged first).
        """
        self.merge_staged()
        if self._table is None and not self._delta_docs:
            assert self._saved_terms is not None
            delta = Slab.from_counts({}, postings.term_table())
            blob, offsets = self._saved_terms  # unchanged since they were loaded
        else:
            delta = Slab.from_counts(self._delta_docs, self._term_ids)
            blob, offsets = saved.terms_to_arrays(list(self._term_ids))
        d_indptr = np.zeros(len(delta.lens) + 1, dtype=np.int64)
        np.cumsum(delta.nterms, out=d_indptr[1:])
        return {
            "terms_blob": blob, "terms_offsets": offsets,
            "indptr": self._indptr, "rows": self._rows, "tfs": self._tfs,
            "doclen": self._doclen, "row_keys": self._row_keys,
            "alive": self._alive.astype(np.uint8),
            "delta_keys": np.asarray(delta.keys, dtype=np.uint32), "delta_indptr": d_indptr,
            "delta_tids": delta.tids, "delta_tfs": delta.tfs,
            "delta_lens": np.asarray(delta.lens, dtype=np.int64),
        }

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, npt.NDArray[np.generic]], meta: JsonObject, *,
        check_values: bool = True,
    ) -> BM25Index:
        """Rebuild an index saved by ``to_arrays``; raises ValueError on any inconsistency.

        ``check_values=False``: the postings are not read value by value (arrays this
        process just wrote, mapped: checking would bring every page in; see
        ``saved.load_segment``)."""
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise OutdatedFormat(
                f"unsupported keyword index {meta.get('format')}/{meta.get('version')}"
            )
        index = cls(k1=float(meta["k1"]), b=float(meta["b"]))
        index._load(arrays, check_values=check_values)
        if len(index) != meta.get("docs") or index._total_len != meta.get("total_len"):
            raise ValueError("keyword index counters do not match its arrays")
        return index

    def _load(self, arrays: Mapping[str, npt.NDArray[np.generic]], *, check_values: bool) -> None:
        # Checked now (offsets, UTF-8, no duplicates) and searchable as it is: the term
        # strings are made only when a write needs the table.
        blob = saved.array(arrays, "terms_blob", np.uint8)
        offsets = saved.array(arrays, "terms_offsets", np.int64)
        terms = saved.SortedTerms(blob, offsets)
        seg = saved.load_segment(arrays, len(terms), check_values=check_values)
        alive = saved.array(arrays, "alive", np.uint8).astype(np.bool_)
        if len(alive) != len(seg.row_keys):
            raise ValueError("keyword index alive bits do not match its rows")
        self._table = None
        self._saved_terms = (blob, offsets)
        self._sorted_terms = terms
        self._set_main(seg)
        self._alive = alive
        live_rows = np.flatnonzero(alive)
        live_keys = seg.row_keys[live_rows]
        # Keys are handed out in ascending order, so a sorted check usually suffices.
        ascending = len(live_keys) < 2 or bool(np.all(live_keys[1:] > live_keys[:-1]))
        if not ascending and len(np.unique(live_keys)) != len(live_rows):
            raise ValueError("keyword index has duplicate live keys")
        self._index_rows(live_rows)
        self._n_dead = len(alive) - len(live_rows)
        self._live = BitMap(live_keys.tolist())
        self._total_len = int(seg.doclen[live_rows].astype(np.int64).sum())
        d_keys = saved.array(arrays, "delta_keys", np.uint32)
        d_indptr = saved.array(arrays, "delta_indptr", np.int64)
        d_tids = saved.array(arrays, "delta_tids", np.int32)
        d_tfs = saved.array(arrays, "delta_tfs", np.float32)
        d_lens = saved.array(arrays, "delta_lens", np.int64)
        if (
            len(d_indptr) != len(d_keys) + 1 or len(d_lens) != len(d_keys) or d_indptr[0] != 0
            or d_indptr[-1] != len(d_tids) or len(d_tfs) != len(d_tids)
            or np.any(np.diff(d_indptr) < 0) or (len(d_lens) and d_lens.min() < 0)
            or (len(d_tids) and (d_tids.min() < 0 or d_tids.max() >= len(terms)))
        ):
            raise ValueError("keyword index delta arrays are inconsistent")
        if len(d_keys):
            self._load_delta(terms, d_keys, d_indptr, d_tids, d_tfs, d_lens)

    def _load_delta(self, terms: saved.SortedTerms, d_keys: npt.NDArray[np.uint32],
                    d_indptr: I64, d_tids: I32, d_tfs: F32, d_lens: I64) -> None:
        """The saved delta (doc-major CSR, checked by the caller) as the live delta."""
        keys, lens = d_keys.tolist(), d_lens.tolist()
        if len(set(keys)) != len(keys) or any(k in self._live for k in keys):
            raise ValueError("keyword index delta repeats a key")
        # Each distinct term decoded once and the postings grouped by term in one stable
        # sort: a delta of a couple of thousand documents holds most of a million postings.
        order = postings.stable_order(d_tids)
        by_term = d_tids[order]
        first = np.ones(len(by_term), dtype=np.bool_)
        first[1:] = by_term[1:] != by_term[:-1]
        runs = [*np.flatnonzero(first).tolist(), len(by_term)]
        names = terms.many(by_term[first].tolist())
        word_of = np.empty(len(by_term), dtype=np.int64)
        word_of[order] = np.cumsum(first) - 1
        words = [names[w] for w in word_of.tolist()]
        counts = d_tfs.astype(np.int64).tolist()
        bounds = d_indptr.tolist()
        for i, (key, length) in enumerate(zip(keys, lens, strict=True)):
            lo, hi = bounds[i], bounds[i + 1]
            counted = dict(zip(words[lo:hi], counts[lo:hi], strict=True))
            self._delta_docs[key] = (counted, int(length))
        docs = np.repeat(d_keys, np.diff(d_indptr))[order].tolist()
        tfs = d_tfs.astype(np.int64)[order].tolist()
        for j, term in enumerate(names):
            lo, hi = runs[j], runs[j + 1]
            self._delta_post[term] = dict(zip(docs[lo:hi], tfs[lo:hi], strict=True))
        self._live.update(keys)
        self._total_len += sum(lens)


class Compaction:
    """A compaction of :class:`BM25Index` planned under its owner's lock
    (:meth:`BM25Index.plan_compaction`): :meth:`run` encodes the delta as it was then and
    merges it with main's alive rows into a new main, reading only arrays nothing
    changes and its own copies, so no lock is needed; :meth:`BM25Index.install_compaction`
    serves it."""

    def __init__(self, index: BM25Index, rows_gen: int, main: Segment,
                 alive: npt.NDArray[np.bool_], docs: dict[int, tuple[dict[str, int], int]],
                 terms: list[str] | tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]],
                 ) -> None:
        self.index, self.rows_gen = index, rows_gen
        self.main, self.alive, self.terms = main, alive, terms
        #: The delta documents merged (key -> the entry it had): one removed or replaced
        #: meanwhile is a dead row of the new main.
        self.docs = docs
        #: The new main, its term table and the keys of the delta rows in it (in order).
        self.result: tuple[Segment, postings.TermTable, list[int]] | None = None

    def run(self) -> None:
        if isinstance(self.terms, tuple):  # the saved dictionary, checked when loaded
            blob, offsets = self.terms
            names = [sys.intern(t) for t in saved.load_terms(
                {"terms_blob": blob, "terms_offsets": offsets}, unique=False)]
        else:
            names = self.terms
        table = postings.term_table(names)
        delta = Slab.from_counts(self.docs, table)  # numbers the delta's new terms
        seg, used = postings.merge(self.main, self.alive, [delta], len(table))
        if used is not None:  # terms left without postings are dropped
            names = list(table)
            table = postings.term_table([names[i] for i in used.tolist()])
        self.result = seg, table, delta.keys


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


def _check_key(key: int) -> None:
    if not isinstance(key, int) or not 0 <= key <= _MAX_KEY:
        raise ValueError(f"document keys are uint32, got {key!r}")


def _key_rows(keys: npt.NDArray[np.uint32], rows: npt.NDArray[np.int64]
              ) -> dict[int, int] | None:
    """The map from key to row :meth:`BM25Index._row_of` uses for the live ``rows`` of a
    main segment with ``keys``; None when the keys ascend (a binary search finds them)."""
    if len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1])):
        return None
    return dict(zip(keys[rows].tolist(), rows.tolist(), strict=True))
