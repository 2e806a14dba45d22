"""The keyword index's delta: the documents added since main was last rewritten.

A write changes it in place as Python dicts: key -> (term counts, length) and
term -> {key: tf}. A load keeps it as it was saved instead, the doc-major arrays of
``bm25_saved`` (:class:`SavedDelta`): making the dicts is about 0.6 µs a posting, and a
full delta of long chunks holds half a million postings (0.35 s of a warm start's first
answer at 110k chunks, 0.1-0.2 s at 3,000 notes). Searches read the saved form where it
is, a term's postings made into a dict when a query asks for them; a merge and a save use
its arrays as they are; the first write that changes the delta, or a planned compaction,
makes the dicts of the whole delta (:meth:`Delta.thaw`), unless the owner made them
beforehand off its lock (:meth:`SavedDelta.thaw`, then :meth:`Delta.adopt`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from recalld.daemon.arraytypes import F32
from recalld.daemon.index import postings, saved
from recalld.daemon.index.postings import I32, I64, Slab, TermTable

#: The delta's documents: key -> (term counts, document length).
DeltaDocs = dict[int, tuple[dict[str, int], int]]
#: The delta's postings: term -> {key: term frequency}.
DeltaPostings = dict[str, dict[int, int]]


class SavedDelta:
    """A delta as a commit saved it: doc-major CSR (``indptr`` over ``tids``/``tfs``, one
    row per key) in the ids of the saved term dictionary ``terms``. The caller checked the
    arrays (bounds, counts, keys unique and not in main); they are copied here, so the
    mapped file they came from may go. With the postings grouped by term as well, about
    20 bytes a posting (11 MB for the 564k of a full delta of long chunks)."""

    __slots__ = ("_by_term", "_keys_by_term", "_terms", "_tfs_by_term", "indptr", "keys",
                 "lens", "n_terms", "repeats", "tfs", "tids")

    def __init__(self, terms: saved.SortedTerms, keys: npt.NDArray[np.uint32], indptr: I64,
                 tids: I32, tfs: F32, lens: I64) -> None:
        self._terms = terms
        #: How many terms the saved dictionary has (the ids ``tids`` are in).
        self.n_terms = len(terms)
        self.keys, self.indptr = np.array(keys, dtype=np.uint32), np.array(indptr)
        self.tids, self.tfs = np.array(tids, dtype=np.int32), np.array(tfs, dtype=np.float32)
        self.lens = np.array(lens, dtype=np.int64)
        # The postings grouped by term (one stable sort): a term's are one run, in
        # document order.
        order = postings.stable_order(self.tids)
        self._by_term = self.tids[order]
        doc_of = np.repeat(np.arange(len(self.keys), dtype=np.int32), np.diff(self.indptr))
        docs = doc_of[order]
        self._keys_by_term = self.keys[docs]
        self._tfs_by_term = self.tfs[order]
        #: Whether a document lists a term twice (no save writes that; a file read as it
        #: is). Its dicts keep the last count, as a merge of these arrays would not.
        self.repeats = bool(np.any((self._by_term[1:] == self._by_term[:-1])
                                   & (docs[1:] == docs[:-1])))

    def postings(self, term: str) -> dict[int, int] | None:
        """``term``'s postings (key -> tf), None if no document here has it."""
        tid = self._terms.get(term)
        if tid is None:
            return None
        # In the array's own type: another would convert the whole array first.
        lo, hi = self._by_term.searchsorted(np.array([tid, tid + 1], dtype=np.int32)).tolist()
        if lo == hi:
            return None
        return dict(zip(self._keys_by_term[lo:hi].tolist(),
                        self._tfs_by_term[lo:hi].astype(np.int64).tolist(), strict=True))

    def slab(self) -> Slab:
        """The documents encoded in the saved term ids (valid in a term table made from
        the saved dictionary, which only grows until a merge or compaction renumbers it:
        the delta is dicts or empty by then)."""
        return Slab(self.tids, self.tfs, np.diff(self.indptr), self.lens.tolist(),
                    self.keys.tolist())

    def thaw(self) -> tuple[DeltaDocs, DeltaPostings]:
        """The dicts of the whole delta (reads only what never changes: safe off the
        owner's lock)."""
        keys, lens = self.keys.tolist(), self.lens.tolist()
        docs: DeltaDocs = {}
        post: DeltaPostings = {}
        if not keys:
            return docs, post
        # Each distinct term decoded once.
        by_term = self._by_term
        first = np.ones(len(by_term), dtype=np.bool_)
        first[1:] = by_term[1:] != by_term[:-1]
        runs = [*np.flatnonzero(first).tolist(), len(by_term)]
        names = self._terms.many(by_term[first].tolist())
        word_of = np.empty(len(by_term), dtype=np.int64)
        word_of[postings.stable_order(self.tids)] = np.cumsum(first) - 1
        words = [names[w] for w in word_of.tolist()]
        counts = self.tfs.astype(np.int64).tolist()
        bounds = self.indptr.tolist()
        for i, (key, length) in enumerate(zip(keys, lens, strict=True)):
            lo, hi = bounds[i], bounds[i + 1]
            docs[key] = (dict(zip(words[lo:hi], counts[lo:hi], strict=True)), int(length))
        doc_keys = self._keys_by_term.tolist()
        tfs = self._tfs_by_term.astype(np.int64).tolist()
        for j, term in enumerate(names):
            lo, hi = runs[j], runs[j + 1]
            post[term] = dict(zip(doc_keys[lo:hi], tfs[lo:hi], strict=True))
        return docs, post


class Delta:
    """The delta of one keyword index: saved (read as it is) until something changes it,
    then dicts (see the module's docstring). Not thread-safe: its owner's."""

    __slots__ = ("_docs", "_lengths", "_post", "_saved")

    def __init__(self, saved_form: SavedDelta | None = None) -> None:
        self._docs: DeltaDocs = {}
        self._post: DeltaPostings = {}
        self._saved = saved_form
        if saved_form is not None and saved_form.repeats:
            self.thaw()
        # Kept in both forms: searches read a length for every delta posting they score.
        self._lengths: dict[int, int] = {} if saved_form is None else dict(
            zip(saved_form.keys.tolist(), saved_form.lens.tolist(), strict=True))

    def __len__(self) -> int:
        return len(self._lengths)

    def __contains__(self, key: object) -> bool:
        return key in self._lengths

    @property
    def lengths(self) -> Mapping[int, int]:
        """Key -> document length (do not change it)."""
        return self._lengths

    def postings(self, term: str) -> Mapping[int, int] | None:
        """``term``'s postings (key -> tf; do not change them), None or empty if none."""
        return self._post.get(term) if self._saved is None else self._saved.postings(term)

    @property
    def saved_form(self) -> SavedDelta | None:
        """The saved form it is still read from, None once it is dicts."""
        return self._saved

    @property
    def docs(self) -> DeltaDocs:
        """Its documents as dicts (made now if it is still the saved form)."""
        self.thaw()
        return self._docs

    @property
    def post(self) -> DeltaPostings:
        """Its postings as dicts, term by term (made now if it is still the saved form;
        do not change them)."""
        self.thaw()
        return self._post

    def thaw(self) -> None:
        """Make the dicts now if it is still the saved form."""
        if self._saved is not None:
            self._docs, self._post = self._saved.thaw()
            self._saved = None

    def adopt(self, saved_form: SavedDelta, docs: DeltaDocs, post: DeltaPostings) -> bool:
        """Take the dicts ``saved_form.thaw()`` made, if it is still read from that form
        (else nothing changes: a write made them meanwhile). Whether it took them."""
        if self._saved is not saved_form:
            return False
        self._docs, self._post, self._saved = docs, post, None
        return True

    def replace(self, docs: DeltaDocs, post: DeltaPostings) -> None:
        """Be ``docs`` and ``post`` (what a compaction carried over)."""
        self._docs, self._post, self._saved = docs, post, None
        self._lengths = {key: length for key, (_, length) in docs.items()}

    def add(self, key: int, counts: dict[str, int], length: int) -> None:
        """Hold document ``key`` (not here yet) with its term ``counts``."""
        self.thaw()
        self._docs[key] = (counts, length)
        self._lengths[key] = length
        for term, tf in counts.items():
            post = self._post.get(term)
            if post is None:
                self._post[term] = {key: tf}
            else:
                post[key] = tf

    def take_back(self, key: int, counts: dict[str, int]) -> None:
        """Undo :meth:`add` of ``key`` with ``counts``, also one that raised part-way."""
        self.thaw()
        self._docs.pop(key, None)
        self._lengths.pop(key, None)
        for term in counts:
            post = self._post.get(term)
            if post is not None and key in post:
                del post[key]
                if not post:
                    del self._post[term]

    def remove(self, key: int) -> int | None:
        """Drop document ``key``; its length, None if it is not here (nothing changes)."""
        if key not in self:
            return None
        self.thaw()
        counts, length = self._docs.pop(key)
        del self._lengths[key]
        for term in counts:
            post = self._post[term]
            del post[key]
            if not post:
                del self._post[term]
        return length

    def clear(self) -> None:
        self._docs, self._post, self._saved, self._lengths = {}, {}, None, {}

    def slab(self, ids: TermTable) -> Slab:
        """The documents encoded in ``ids`` (new terms numbered there): the saved arrays
        as they are while it is the saved form (``ids`` then the table made from the
        saved dictionary, grown or not), else ``Slab.from_counts``."""
        if self._saved is not None:
            assert len(ids) >= self._saved.n_terms, "a term table not made from the saved one"
            return self._saved.slab()
        return Slab.from_counts(self._docs, ids)
