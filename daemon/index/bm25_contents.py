"""What the keyword index (:class:`~.bm25.BM25Index`, which extends :class:`BM25Contents`)
holds, and the changes that keep it consistent: the main segment with its alive bits and
generations, the delta, the live keys and their summed lengths, the term dictionary
(``bm25_terms.py``) and what a pass staged (``bm25_staging.py``); adding to the delta and
taking back, removing a document, merging into main and serving the new main, counting
staged documents once merged, and what a search reads (:meth:`BM25Contents._corpus`).
``bm25.py`` builds the index's writes, compactions and saved form on them. No I/O, no
threads, no locks: the index's caller serializes its calls.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from recalld.daemon.index import bm25_compaction, bm25_search, postings
from recalld.daemon.index.bm25_compaction import NewMain
from recalld.daemon.index.bm25_staging import Staging
from recalld.daemon.index.bm25_terms import Terms
from recalld.daemon.index.delta import Delta
from recalld.daemon.index.postings import Segment, Slab


class BM25Contents:
    """The state of a :class:`~.bm25.BM25Index` and its primitive changes."""

    def __init__(self, *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        # Term -> id (built, or as loaded until a write needs it: see bm25_terms).
        self._terms = Terms()
        self._main_gen = 0
        # Scores searches and keeps what they computed until the next write (every
        # change of what a search sees calls _wrote).
        self._scorer = bm25_search.Scorer()
        self._set_main(Segment.empty())
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
        self._delta = Delta()
        self._live = BitMap()
        self._total_len = 0
        self.merges = 0
        #: Of those, compactions planned and merged off the owner's lock (installed).
        self.compactions = 0
        # Documents staged by a pass (see add_encoded) and the vocabularies it holds.
        self._staging = Staging()

    @property
    def _term_ids(self) -> postings.TermTable:
        return self._terms.table

    def _add_counts(self, doc_key: int, counts: dict[str, int], length: int) -> None:
        self._wrote()
        self._delta.add(doc_key, counts, length)
        self._live.add(doc_key)
        self._total_len += length

    def _take_back(self, doc_key: int, counts: dict[str, int], length: int) -> None:
        """Undo :meth:`_add_counts` of ``doc_key``, also one that raised part-way."""
        self._wrote()
        self._delta.take_back(doc_key, counts)
        if doc_key in self._live:
            self._live.discard(doc_key)
            self._total_len -= length

    def _merge_with_staged(self, slabs: list[Slab]) -> None:
        """Merge the staged documents and then ``slabs`` (this index's term ids) into
        main; counted as live only once the merge succeeded (if it raises, the staged
        documents stay staged and ``slabs`` join nothing)."""
        self._merge([*self._staging.slabs, *slabs])
        self._count_staged()
        for slab in slabs:
            self._live.update(slab.keys)
            self._total_len += sum(slab.lens)

    def _own_ids(self, terms: list[str] | str | None, slab: Slab) -> Slab:
        return slab if terms is None else slab.remap(terms, self._term_ids, slab.keys)

    def _count_staged(self) -> None:
        """The staged documents were merged into main: count them as live."""
        staging = self._staging
        staging.slabs = []
        self._live |= staging.keys
        self._total_len += staging.length
        staging.keys, staging.length = BitMap(), 0

    def _remove(self, key: int) -> None:
        self._wrote()
        length = self._delta.remove(key)
        if length is not None:
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
        return int(self._row_keys.searchsorted(np.uint32(key)))  # see bm25_search.rows_of_keys

    def _index_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Set up :meth:`_row_of` for the live ``rows`` of main."""
        self._key_row = bm25_compaction.key_rows(self._row_keys, rows)

    def _set_main(self, seg: Segment) -> None:
        self._main = seg
        self._main_gen += 1  # invalidates the cached length norms
        self._wrote()
        self._indptr, self._rows = seg.indptr, seg.rows
        self._doclen, self._row_keys = seg.doclen, seg.row_keys

    def _merge(self, slabs: list[Slab]) -> None:
        """Rewrite main from its live rows, the delta and ``slabs`` (see ``postings.merge``).
        If it raises (out of memory), main and the delta stay as they were: everything
        new is made before any of it replaces the old."""
        table = self._term_ids
        new = bm25_compaction.merged(self._main, self._alive, [self._delta.slab(table), *slabs],
                                     table, drop_unused=not self._staging.vocabs)
        self.merges += 1
        self._delta.clear()
        self._serve(new)

    def _serve(self, new: NewMain) -> None:
        """Serve a main segment a merge or a compaction made."""
        # Its term table renumbers: a delta still in the saved ids would be misread.
        assert self._delta.saved_form is None
        self._terms.table = new.terms
        self._set_main(new.main)
        self._main_rows_gen += 1
        self._alive, self._key_row, self._n_dead = new.alive, new.key_row, new.n_dead
        self._compact_retry_at = 0

    def _corpus(self) -> bm25_search.Corpus:
        """What a search reads, as it is now."""
        return bm25_search.Corpus(
            self.k1, self.b, self._live, self._total_len, self._main, self._main_gen,
            self._alive, self._n_dead, self._key_row, self._delta, self._terms.lookup)

    def _wrote(self) -> None:
        """What searches kept no longer holds: drop it."""
        self._scorer.forget()
