"""CSR postings building blocks for the BM25 index: encode documents, count terms, merge.

Pure numpy functions and small value types, no state of their own; ``bm25.BM25Index`` owns the
index and calls these for its writes and merges (its saved form is read back by ``saved.py``).
A batch's CJK runs are counted in ``cjk_counts.py``.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.cjk_counts import DOC_SHIFT, TERM_MASK, KnownTokens, count_cjk, local_ids
from recalld.daemon.index.tokenizer import doc_length

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Segment:
    """An immutable CSR segment: per term ``indptr`` slices of ``rows``/``tfs``, rows sorted."""

    indptr: I64
    rows: I32
    tfs: F32
    doclen: F32
    row_keys: npt.NDArray[np.uint32]

    @classmethod
    def empty(cls) -> Segment:
        return cls(
            np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32),
            np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.float32),
            np.zeros(0, dtype=np.uint32),
        )


# The int objects 0, 1, 2, ... that every workspace's term ids point at: a daemon with
# many workspaces holds one int per id, not one per id per workspace (ids above 256 are
# separate objects in CPython). Grown under a lock: index threads of several workspaces
# may assign new ids at once.
_IDS: list[int] = []
_IDS_LOCK = threading.Lock()


def _shared_id(i: int) -> int:
    if i >= len(_IDS):
        with _IDS_LOCK:
            if i >= len(_IDS):
                _IDS.extend(range(len(_IDS), max(i + 1, 2 * len(_IDS))))
    return _IDS[i]


class TermTable(dict[str, int]):
    """Term -> id, where looking up a new term with ``[]`` assigns it the next id.

    Insertion order is id order, so the new terms of a batch are the table's tail.
    Searches use ``.get``, which never adds.
    """

    __slots__ = ()

    def __missing__(self, term: str) -> int:
        tid = self[term] = _shared_id(len(self))
        return tid


def term_table(terms: Iterable[str] = ()) -> TermTable:
    """A :class:`TermTable` holding ``terms`` with ids 0, 1, 2, ..."""
    terms = list(terms)
    if terms:
        _shared_id(len(terms) - 1)
    table = TermTable(zip(terms, _IDS, strict=False))  # _IDS may be longer
    if len(table) != len(terms):
        raise ValueError("duplicate terms")
    return table


class Vocabulary:
    """The local term ids of :meth:`Slab.local`, kept over several calls (a worker's over
    the batches of one pass): term -> id, and the CJK tokens (characters and pairs, as
    integers) that already have one, so a batch makes strings only of the ones new to it."""

    __slots__ = ("cjk", "ids")

    def __init__(self) -> None:
        # A plain dict: local ids need not be the shared ints of ``TermTable``, and new
        # terms are added in bulk (``local_ids``), not one ``__missing__`` call each.
        self.ids: dict[str, int] = {}
        self.cjk = KnownTokens(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


class Slab:
    """Documents encoded as term ids (doc-major), waiting to become part of a segment."""

    __slots__ = ("keys", "lens", "nterms", "tfs", "tids")

    def __init__(self, tids: I32, tfs: F32, nterms: I64, lens: list[int], keys: list[int]) -> None:
        self.tids, self.tfs, self.nterms = tids, tfs, nterms
        self.lens, self.keys = lens, keys

    @classmethod
    def encode(cls, batch: dict[int, list[str]], ids: TermTable) -> Slab:
        """Encode documents with numpy: one dict lookup per token, the counting in C.

        New terms join ``ids`` in first-occurrence order, so term ids do not depend on hash
        seeds.
        """
        flat = [t for toks in batch.values() for t in toks]
        # One C-level pass: a missing term gets the next id on first lookup.
        tids = np.fromiter(map(ids.__getitem__, flat), dtype=np.int64, count=len(flat))
        sizes = [len(toks) for toks in batch.values()]
        n_docs, n_terms = len(sizes), max(len(ids), 1)
        docs = np.repeat(np.arange(n_docs, dtype=np.int64), sizes)
        pairs, counts = np.unique(docs * n_terms + tids, return_counts=True)
        return cls(
            (pairs % n_terms).astype(np.int32), counts.astype(np.float32),
            np.bincount(pairs // n_terms, minlength=n_docs).astype(np.int64),
            [doc_length(toks) for toks in batch.values()], list(batch),
        )

    @classmethod
    def from_counts(
        cls, docs: Mapping[int, tuple[dict[str, int], int]], ids: TermTable
    ) -> Slab:
        """Encode already counted documents (key -> ({term: tf}, length)), in key order."""
        tids: list[int] = []
        tfs: list[int] = []
        nterms: list[int] = []
        lens: list[int] = []
        keys = sorted(docs)
        for key in keys:
            counts, length = docs[key]
            for term, tf in counts.items():
                tid = ids.get(term)
                tids.append(ids[sys.intern(term)] if tid is None else tid)
                tfs.append(tf)
            nterms.append(len(counts))
            lens.append(length)
        return cls(
            np.asarray(tids, dtype=np.int32), np.asarray(tfs, dtype=np.float32),
            np.asarray(nterms, dtype=np.int64), lens, keys,
        )

    @classmethod
    def local(cls, docs: list[list[str]], runs: list[list[str]] | None = None, *,
              vocab: Vocabulary | None = None) -> tuple[Slab, list[str]]:
        """Encode ``docs`` against a vocabulary of their own: (slab keyed 0..n-1, its terms).

        Worker processes do this, so the daemon only maps each batch's distinct terms to its
        own ids (:meth:`remap`) instead of looking up every token. ``runs`` (per document,
        from ``tokenizer.tokenize_split``) are CJK runs, counted as their characters and
        neighbouring pairs in numpy: only distinct ones become strings.

        ``vocab`` (with ``runs``): a vocabulary to go on with, such as a worker's over the
        batches of one pass; its terms keep their ids, new ones get the next, in the order
        a new vocabulary would give them, and only the new terms are returned.
        """
        if runs is None:
            if vocab is not None:
                raise ValueError("a vocabulary to go on with needs the CJK runs split off")
            ids = term_table()
            slab = cls.encode(dict(enumerate(docs)), ids)
            return slab, list(ids)
        if vocab is None:
            vocab = Vocabulary()
        local = vocab.ids
        start = len(local)
        flat = list(itertools.chain.from_iterable(docs))
        word_tids = local_ids(flat, local)
        word_docs = np.repeat(np.arange(len(docs), dtype=np.int64), [len(d) for d in docs])
        word_pairs, word_tfs = np.unique(word_docs << DOC_SHIFT | word_tids,
                                         return_counts=True)
        cjk_pairs, cjk_tfs, cjk_lens = count_cjk(runs, vocab.cjk)
        # Words and CJK runs never share a term: their (document, term) pairs are disjoint.
        pairs = np.concatenate([word_pairs, cjk_pairs])
        tfs = np.concatenate([word_tfs, cjk_tfs])
        order = np.argsort(pairs)
        pairs, tfs = pairs[order], tfs[order]
        lens = [len(d) + n for d, n in zip(docs, cjk_lens, strict=True)]
        slab = cls((pairs & TERM_MASK).astype(np.int32), tfs.astype(np.float32),
                   np.bincount(pairs >> DOC_SHIFT, minlength=len(docs)).astype(np.int64),
                   lens, list(range(len(docs))))
        return slab, list(itertools.islice(local, start, None))

    def remap(self, local_terms: list[str] | str, ids: TermTable, keys: list[int]) -> Slab:
        """This slab (encoded by :meth:`local`) in the ids of ``ids`` (new terms join it),
        under ``keys``; ``local_terms`` as :meth:`local` gives them or :func:`join_terms`d."""
        return self.mapped(global_ids(split_terms(local_terms), ids), keys)

    def mapped(self, to_global: I32, keys: list[int]) -> Slab:
        """This slab with term id ``i`` replaced by ``to_global[i]``, under ``keys``."""
        if len(keys) != len(self.lens):
            raise ValueError(f"{len(keys)} keys for {len(self.lens)} documents")
        return Slab(to_global[self.tids], self.tfs, self.nterms, self.lens, keys)

    def counts(self, local_terms: list[str] | str) -> list[tuple[dict[str, int], int]]:
        """Per document ({term: tf}, length), for the few documents that go to a delta."""
        local_terms = split_terms(local_terms)
        bounds = [0, *itertools.accumulate(self.nterms.tolist())]
        tids, tfs = self.tids.tolist(), self.tfs.astype(np.int64).tolist()
        return [
            ({local_terms[t]: f for t, f in zip(tids[lo:hi], tfs[lo:hi], strict=True)}, length)
            for lo, hi, length in zip(bounds[:-1], bounds[1:], self.lens, strict=True)
        ]

    def arrays(self, first_row: int) -> tuple[I32, I32, F32, F32, npt.NDArray[np.uint32]]:
        """(tids, rows, tfs, lens, keys) with rows numbered from ``first_row``."""
        n = len(self.lens)
        rows = np.repeat(np.arange(first_row, first_row + n, dtype=np.int32), self.nterms)
        return (
            self.tids, rows, self.tfs, np.asarray(self.lens, dtype=np.float32),
            np.asarray(self.keys, dtype=np.uint32),
        )


def global_ids(terms: list[str], ids: TermTable) -> I32:
    """The ids of ``terms`` in ``ids``; new terms join it in their order."""
    # Known terms are looked up as they come (the table's keys are interned already);
    # new ones join in their order, interned: workspaces of one daemon share one string
    # per common term.
    to_global = np.fromiter(map(ids.get, terms, itertools.repeat(-1)),
                            dtype=np.int32, count=len(terms))
    new = np.flatnonzero(to_global < 0)
    if len(new):
        to_global[new] = [ids[sys.intern(terms[i])] for i in new.tolist()]
    return to_global


def join_terms(terms: list[str]) -> str:
    """``terms`` (of :meth:`Slab.local`: none empty, none with a line break) as one string.

    What a worker process hands back: one string instead of one per term (tens of
    thousands a batch) is one block of the daemon's heap, returned to the system once
    freed, where many small strings would spread over the interpreter's small-object
    arenas, which stay resident while any object in them lives.
    """
    joined = "\n".join(terms)
    if joined.count("\n") != max(len(terms) - 1, 0):
        raise ValueError("a term holds a line break")
    if (terms and not joined) or "\n\n" in joined or joined[:1] == "\n" or joined[-1:] == "\n":
        raise ValueError("a term is empty")
    return joined


def split_terms(terms: list[str] | str) -> list[str]:
    """The terms :func:`join_terms` joined (a list is returned as it is)."""
    if not isinstance(terms, str):
        return terms
    return terms.split("\n") if terms else []


def merge(
    seg: Segment, alive: npt.NDArray[np.bool_], slabs: list[Slab], n_terms: int, *,
    drop_unused: bool = True,
) -> tuple[Segment, I64 | None]:
    """A new segment from ``seg``'s alive rows plus ``slabs``; linear, main is never re-sorted.

    Main postings are grouped by term and sorted by row, and every new document gets a row after
    all of main's, so each term's new list is its surviving postings followed by its new ones:
    both are scattered straight to their final positions. Returns the segment and, when some
    of the ``n_terms`` terms are left without postings, the ids of the terms kept (the returned
    segment is already renumbered to them); with ``drop_unused`` off, terms are never
    dropped (ids held elsewhere stay valid).
    """
    n_terms_main = len(seg.indptr) - 1
    rows_m, tfs_m = seg.rows, seg.tfs
    alive_rows = np.flatnonzero(alive)
    if len(alive_rows) < len(alive):
        remap = np.full(len(alive), -1, dtype=np.int32)
        remap[alive_rows] = np.arange(len(alive_rows), dtype=np.int32)
        keep = alive[rows_m]
        counts_m = _kept_per_term(keep, seg.indptr)
        rows_m, tfs_m = remap[rows_m[keep]], tfs_m[keep]
    else:
        counts_m = np.diff(seg.indptr)
    first_row = len(alive_rows)
    parts: list[tuple[I32, I32, F32]] = []
    lens = [seg.doclen[alive_rows]]
    keys = [seg.row_keys[alive_rows]]
    for slab in slabs:
        if slab.lens:
            t, r, f, ln, k = slab.arrays(first_row)
            first_row += len(ln)
            parts.append((t, r, f))
            lens.append(ln)
            keys.append(k)
    if parts:
        tids_x = np.concatenate([p[0] for p in parts])
        order = stable_order(tids_x)
        # Counted unsorted: the sorted term ids are not needed, only their counts.
        counts_x = np.bincount(tids_x, minlength=n_terms).astype(np.int64)
        del tids_x
        rows_x = np.concatenate([p[1] for p in parts])[order]
        tfs_x = np.concatenate([p[2] for p in parts])[order]
        del order
    else:
        rows_x, tfs_x = np.zeros(0, np.int32), np.zeros(0, np.float32)
        counts_x = np.zeros(n_terms, dtype=np.int64)
    counts_all = counts_x.copy()
    counts_all[:n_terms_main] += counts_m
    indptr = np.zeros(n_terms + 1, dtype=np.int64)
    np.cumsum(counts_all, out=indptr[1:])
    out_rows = np.empty(int(indptr[-1]), dtype=np.int32)
    out_tfs = np.empty(int(indptr[-1]), dtype=np.float32)
    main_counts = np.zeros(n_terms, dtype=np.int64)
    main_counts[:n_terms_main] = counts_m
    _interleave(indptr, (main_counts, rows_m, tfs_m), (counts_x, rows_x, tfs_x),
                out_rows, out_tfs)
    used: I64 | None = None
    if drop_unused and n_terms and not counts_all.all():
        used = np.flatnonzero(counts_all).astype(np.int64)
        indptr = np.concatenate([indptr[:1], indptr[1:][used]])
    doclen = np.concatenate(lens).astype(np.float32, copy=False)
    row_keys = np.concatenate(keys).astype(np.uint32, copy=False)
    return Segment(indptr, out_rows, out_tfs, doclen, row_keys), used


def _kept_per_term(keep: npt.NDArray[np.bool_], indptr: I64) -> I64:
    """How many of each term's postings ``keep`` keeps (the terms' runs given by
    ``indptr``)."""
    # Counted in integers made first: numpy's cumulative sum of booleans casts as it
    # goes, which holds the interpreter's lock throughout (0.05-0.4 s over 22M postings,
    # every search of the daemon waiting), where these steps release it.
    if not len(keep):
        return np.zeros(len(indptr) - 1, dtype=np.int64)
    kept = keep.astype(np.int32 if len(keep) < 2**31 else np.int64)
    np.cumsum(kept, out=kept)  # kept[i]: postings kept up to and with i

    def through(ends: I64) -> I64:  # postings kept before each of ``ends``
        counted: I64 = np.where(ends > 0, kept[np.maximum(ends - 1, 0)], 0).astype(np.int64)
        return counted

    return through(indptr[1:]) - through(indptr[:-1])


# Postings written per step of ``_interleave``: its masks (1 byte a posting) and the
# positions of new postings (16 bytes each) stay this small however large the index is.
SCATTER_BLOCK = 1 << 20

Runs = tuple[I64, I32, F32]  # postings grouped by term: (count per term, rows, tfs)


def _interleave(indptr: I64, main: Runs, new: Runs, out_rows: I32, out_tfs: F32) -> None:
    """Write each term's ``main`` run followed by its ``new`` run to
    ``out_*[indptr[t]:indptr[t + 1]]``, about ``SCATTER_BLOCK`` postings at a time.

    Only new postings get a position: main's, in order in what is left, are copied
    through a mask. A merge makes main's arrays anew (pages the kernel zeroes first), so
    positions for every posting of main (16 bytes each) cost more than the copy itself;
    a mask costs 1 byte a posting, and a compaction (nothing new) copies main straight.
    """
    counts_m, rows_m, tfs_m = main
    counts_x, rows_x, tfs_x = new
    n = len(indptr) - 1
    src_m = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts_m, out=src_m[1:])
    src_x = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts_x, out=src_x[1:])
    t0 = 0
    while t0 < n:
        # The terms whose runs fit in one block from here (at least one term).
        t1 = int(np.searchsorted(indptr, indptr[t0] + SCATTER_BLOCK, side="right")) - 1
        t1 = min(n, max(t0 + 1, t1))
        a, b = int(indptr[t0]), int(indptr[t1])
        ma, mb = int(src_m[t0]), int(src_m[t1])
        xa, xb = int(src_x[t0]), int(src_x[t1])
        o_rows, o_tfs = out_rows[a:b], out_tfs[a:b]
        if xa == xb:
            o_rows[:] = rows_m[ma:mb]
            o_tfs[:] = tfs_m[ma:mb]
        elif ma == mb:
            o_rows[:] = rows_x[xa:xb]
            o_tfs[:] = tfs_x[xa:xb]
        else:
            # A new posting's place in the block: after its term's main run.
            pos = np.repeat(indptr[t0:t1] + counts_m[t0:t1] - src_x[t0:t1] - a,
                            counts_x[t0:t1])
            pos += np.arange(xa, xb, dtype=np.int64)
            is_new = np.zeros(b - a, dtype=np.bool_)
            is_new[pos] = True
            del pos
            o_rows[is_new] = rows_x[xa:xb]
            o_tfs[is_new] = tfs_x[xa:xb]
            np.logical_not(is_new, out=is_new)
            o_rows[is_new] = rows_m[ma:mb]
            o_tfs[is_new] = tfs_m[ma:mb]
        t0 = t1


def stable_order(values: I32) -> I64:
    """``np.argsort(values, kind="stable")`` for non-negative int32, in O(n): numpy radix-sorts
    16-bit keys, so sort by the low half, then stably by the high half (linear, where int32
    would get a comparison sort; this is most of a cold build's merge time)."""
    if not len(values) or int(values.max()) <= 0xFFFF:
        return np.argsort(values.astype(np.uint16), kind="stable").astype(np.int64, copy=False)
    low = np.argsort((values & 0xFFFF).astype(np.uint16), kind="stable")
    high = (values[low] >> 16).astype(np.uint16)
    return low[np.argsort(high, kind="stable")].astype(np.int64, copy=False)
