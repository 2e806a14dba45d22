"""The keyword index's (:class:`~.bm25.BM25Index`) term dictionary: term -> id, in one of
two forms. Built, a :class:`~.postings.TermTable` whose insertion order is id order; loaded,
the saved (blob, offsets) arrays, with a sorted lookup over them for searches, until a
write needs the table. No I/O, no threads, no locks: the index's caller serializes its
calls.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt

from recalld.daemon.index import postings, saved


class Terms:
    """The term dictionary of one keyword index (see the module docstring)."""

    def __init__(self) -> None:
        # Term -> id; its insertion order is id order (the term list, without a list).
        # After a load it stays the saved (blob, offsets) until something needs it: a
        # workspace that is neither searched nor written keeps no dict and no strings
        # (about 2 MB for 50k terms).
        self._table: postings.TermTable | None = postings.term_table()
        self._saved_terms: tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]] | None = None
        # Searches look terms up here while there is no ``_table`` (see lookup).
        self._sorted_terms: saved.SortedTerms | None = None

    @property
    def built(self) -> bool:
        """Whether the term table is in memory (a write needed it), not the saved bytes."""
        return self._table is not None

    @property
    def table(self) -> postings.TermTable:
        if self._table is None:
            assert self._saved_terms is not None
            blob, offsets = self._saved_terms
            terms = saved.load_terms({"terms_blob": blob, "terms_offsets": offsets},
                                        unique=False)  # checked when loaded
            # Interned: workspaces of one daemon share one string per common term.
            self._table = postings.term_table([sys.intern(t) for t in terms])
            self._saved_terms = self._sorted_terms = None
        return self._table

    @table.setter
    def table(self, table: postings.TermTable) -> None:
        self._table, self._saved_terms, self._sorted_terms = table, None, None

    @property
    def lookup(self) -> postings.TermTable | saved.SortedTerms:
        """Term -> id for searches: the table once a write needed it, else the loaded
        dictionary's sorted form (no string per term: a loaded index that is only
        searched never builds the table)."""
        if self._table is not None:
            return self._table
        if self._sorted_terms is None:
            assert self._saved_terms is not None
            self._sorted_terms = saved.SortedTerms(*self._saved_terms)
        return self._sorted_terms

    def __len__(self) -> int:
        if self._table is not None:
            return len(self._table)
        assert self._saved_terms is not None
        return len(self._saved_terms[1]) - 1  # offsets: one more than terms

    @property
    def loaded(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """The dictionary as it was loaded (blob, offsets); only while not :attr:`built`."""
        assert self._saved_terms is not None
        return self._saved_terms

    def load(self, blob: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64],
             sorted_terms: saved.SortedTerms) -> None:
        """Take the saved dictionary: searchable as it is, the term strings are made only
        when a write needs the table."""
        self._table = None
        self._saved_terms = (blob, offsets)
        self._sorted_terms = sorted_terms
