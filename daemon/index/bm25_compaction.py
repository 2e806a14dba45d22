"""How the keyword index (:class:`~.bm25.BM25Index`) rewrites its main segment: a merge of
main's live rows, the delta and new slabs (:func:`merged`), and a compaction planned under
the owner's lock, run without any lock and installed under it again (:class:`Compaction`,
ADR 0032). No I/O, no threads, no locks of its own.

Everything here makes new arrays and tables from the ones given and changes none of them
(apart from numbering the delta's new terms in the table it is given); the index then
swaps the result in (:class:`NewMain`), so one that raises part-way (out of memory) leaves
the index as it was.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from recalld.daemon.index import postings, saved
from recalld.daemon.index.delta import DeltaDocs, DeltaPostings
from recalld.daemon.index.postings import Segment, Slab

if TYPE_CHECKING:
    from recalld.daemon.index.bm25 import BM25Index

class NewMain(NamedTuple):
    """A main segment made by a merge or a compaction, with everything that goes with it,
    for the index to serve in one step."""

    main: Segment
    terms: postings.TermTable
    alive: npt.NDArray[np.bool_]
    key_row: dict[int, int] | None
    n_dead: int


def merged(main: Segment, alive: npt.NDArray[np.bool_], slabs: list[Slab],
           term_ids: postings.TermTable, *, drop_unused: bool) -> NewMain:
    """Main rewritten from its ``alive`` rows and ``slabs`` (the delta's first, in
    ``term_ids``; see ``postings.merge``); ``drop_unused``: terms left without postings
    leave the table."""
    seg, used = postings.merge(main, alive, slabs, len(term_ids),
                               drop_unused=drop_unused)
    if used is not None:
        # Drop terms without postings so the dictionary does not grow forever.
        terms = list(term_ids)
        term_ids = postings.term_table([terms[i] for i in used.tolist()])
    n_rows = len(seg.row_keys)
    return NewMain(seg, term_ids, np.ones(n_rows, dtype=np.bool_),
                   key_rows(seg.row_keys, np.arange(n_rows, dtype=np.int64)), 0)


class Compaction:
    """A compaction of :class:`BM25Index` planned under its owner's lock
    (:meth:`BM25Index.plan_compaction`): :meth:`run` encodes the delta as it was then and
    merges it with main's alive rows into a new main, reading only arrays nothing
    changes and its own copies, so no lock is needed; :meth:`BM25Index.install_compaction`
    serves it."""

    def __init__(self, index: BM25Index, rows_gen: int, main: Segment,
                 alive: npt.NDArray[np.bool_], docs: DeltaDocs,
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

    def carried_over(self, alive: npt.NDArray[np.bool_], delta_docs: DeltaDocs
                     ) -> tuple[NewMain, DeltaDocs, DeltaPostings]:
        """The merged main with what changed since the plan (``alive``: main's alive
        bits now, ``delta_docs``: the delta now): main rows and delta documents removed
        or replaced meanwhile are dead rows of it, documents added meanwhile stay in the
        delta (returned with its postings). Call once :meth:`run` is done."""
        assert self.result is not None
        seg, table, keys = self.result
        docs = self.docs
        still = np.fromiter((delta_docs.get(key) is docs[key] for key in keys),
                            dtype=np.bool_, count=len(keys))
        new_alive = np.concatenate([alive[np.flatnonzero(self.alive)], still])
        kept = {key: entry for key, entry in delta_docs.items() if docs.get(key) is not entry}
        delta_post: DeltaPostings = {}
        for key, (counts, _) in kept.items():
            for term, tf in counts.items():
                delta_post.setdefault(term, {})[key] = tf
        live_rows = np.flatnonzero(new_alive)
        key_row = key_rows(seg.row_keys, live_rows)
        return (NewMain(seg, table, new_alive, key_row, len(new_alive) - len(live_rows)),
                kept, delta_post)


def key_rows(keys: npt.NDArray[np.uint32], rows: npt.NDArray[np.int64]
             ) -> dict[int, int] | None:
    """The map from key to row ``BM25Contents._row_of`` uses for the live ``rows`` of a
    main segment with ``keys``; None when the keys ascend (a binary search finds them)."""
    if len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1])):
        return None
    return dict(zip(keys[rows].tolist(), rows.tolist(), strict=True))
