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

Its parts: scoring (BM25 Okapi) and what searches keep between two writes are
``bm25_search.py``'s, the merges that rewrite main and compactions planned off the owner's
lock ``bm25_compaction.py``'s, the saved form ``bm25_saved.py``'s. The state they read and
the primitive changes that swap in what they make are ``bm25_contents.py``'s (the class
this one extends), with the term dictionary in ``bm25_terms.py`` and what a pass staged in
``bm25_staging.py``; this module holds the index's public writes, when it compacts, its
saved form and its searches.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Final

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from recalld.daemon.index import bm25_saved, bm25_search, postings, saved
from recalld.daemon.index.bm25_compaction import Compaction
from recalld.daemon.index.bm25_contents import BM25Contents
from recalld.daemon.index.bm25_saved import BM25Meta, OutdatedFormat
from recalld.daemon.index.delta import Delta, DeltaDocs, DeltaPostings, SavedDelta
from recalld.daemon.index.postings import I32, Slab
from recalld.daemon.index.tokenizer import doc_length
from recalld.daemon.jsontypes import JsonObject

log = logging.getLogger(__name__)

__all__ = ["BM25Index", "BM25Meta", "Compaction", "OutdatedFormat"]

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
_MAX_KEY: Final = 2**32 - 1


class BM25Index(BM25Contents):
    """An incremental BM25 index keyed by caller-chosen uint32 document keys."""

    # ----------------------------------------------------------------- introspection
    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and 0 <= key <= _MAX_KEY and key in self._live

    @property
    def terms_built(self) -> bool:
        """Whether the term table is in memory (a write needed it), not the saved bytes."""
        return self._terms.built

    @property
    def live(self) -> BitMap:
        """The live document keys (a copy: callers may combine it freely)."""
        return BitMap(self._live)

    @property
    def staged(self) -> BitMap:
        """Keys of the documents a pass holds aside until it merges them (a copy)."""
        return BitMap(self._staging.keys)

    def stats(self) -> dict[str, int]:
        return {
            "docs": len(self._live), "main_rows": len(self._row_keys), "dead_rows": self._n_dead,
            "delta_docs": len(self._delta), "terms": len(self._terms),
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
            SMALL_ADD_DOCS, BACKSTOP_FACTOR * self._delta_limit() - len(self._delta))
        small = sum(len(slab.keys) for _, slab in parts) <= room
        if small or any(key in self._live or key in self._staging.keys
                        for _, slab in parts for key in slab.keys):
            self.merge_staged()  # they come first, as if merged when they were added
        elif stage:
            own = [self._own_ids(terms, slab) for terms, slab in parts]
            staged = len(self._staging.keys) + sum(len(slab.keys) for slab in own)
            if staged >= min(len(self._live), STAGED_MAX_DOCS):
                self._merge_with_staged(own)
            else:
                for slab in own:
                    self._staging.hold(slab)
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
        return self._staging.vocabulary_ids(source, start, terms, self._terms)

    def forget_vocabularies(self) -> None:
        """Drop what :meth:`vocabulary_ids` held (a pass ended)."""
        self._staging.vocabs = {}

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
        if self._staging.slabs:
            self.merge_staged()
        elif self._delta or self._n_dead:
            self._merge([])

    def merge_staged(self) -> None:
        """Merge the documents ``add_encoded`` staged into main (searchable from then on).
        If the merge raises, they stay staged."""
        if self._staging.slabs:
            self._merge(self._staging.slabs)
            self._count_staged()

    def drop_staged(self) -> BitMap:
        """Let go of the staged documents without indexing them (their merge failed);
        returns their keys."""
        return self._staging.drop()

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
        due = len(self._delta) > factor * self._delta_limit() or (
            self._n_dead >= factor * DEAD_MIN_ROWS
            and self._n_dead > dead_fraction * len(self._row_keys))
        return due and len(self._delta) + self._n_dead >= self._compact_retry_at

    def _delta_limit(self) -> int:
        """Delta documents past which a compaction is due: an eighth of main's live ones,
        within ``DELTA_MIN_DOCS`` and ``DELTA_MAX_DOCS``."""
        main_live = len(self._row_keys) - self._n_dead
        return min(DELTA_MAX_DOCS, max(DELTA_MIN_DOCS, main_live // 8))

    def _compaction_failed(self, exc: BaseException) -> None:
        self._compact_retry_at = 2 * (len(self._delta) + self._n_dead)
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
        if self._staging.slabs or self._staging.vocabs or not (
                self.compaction_due() if due else self._delta or self._n_dead):
            return None
        terms: list[str] | tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]
        if self._terms.built:
            terms = list(self._terms.table)
        else:
            terms = self._terms.loaded  # made into strings by run(), not here
        # The delta's dicts (made now if a load left it saved and nothing made them yet).
        return Compaction(self, self._main_rows_gen, self._main, self._alive.copy(),
                          dict(self._delta.docs), terms)

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
        if (done.index is not self or done.rows_gen != self._main_rows_gen
                or self._staging.slabs or self._staging.vocabs or done.result is None):
            return False
        new, delta_docs, delta_post = done.carried_over(self._alive, self._delta.docs)
        # Counted before anything changes: whoever sees the change sees them.
        self.merges += 1
        self.compactions += 1
        self._wrote()
        self._delta.replace(delta_docs, delta_post)
        self._serve(new)
        return True

    def compaction_failed(self, exc: BaseException) -> None:
        """A planned compaction failed (out of memory, or a fault: logged): try again
        once there is twice as much to do (call under the owner's lock)."""
        self._compaction_failed(exc)

    @property
    def delta(self) -> Delta:
        """The documents not merged into main yet (read it; changes go through the
        index's writes)."""
        return self._delta

    @property
    def compaction_retry_at(self) -> int:
        """After a compaction failed: how many delta documents and dead rows there must
        be before the next is tried (0: none failed since the last merge)."""
        return self._compact_retry_at

    def adopt_delta(self, saved_form: SavedDelta, docs: DeltaDocs, post: DeltaPostings
                    ) -> bool:
        """Take the dicts ``saved_form.thaw()`` made off the owner's lock, while the delta
        is still read from that form (``delta.saved_form``: a load leaves it so, and the
        first write that changes it would make them under the lock). Call under the
        owner's lock. False, nothing changed, if something made them meanwhile. What
        searches see does not change."""
        return self._delta.adopt(saved_form, docs, post)

    @property
    def main_generation(self) -> int:
        """Changes whenever the main segment is replaced (merges, loads)."""
        return self._main_gen

    def adopt_main(self, arrays: Mapping[str, npt.NDArray[np.generic]]) -> None:
        """Serve the main segment from ``arrays`` (saved by ``to_arrays`` while main was
        what it is now, e.g. mapped from the file just written). ValueError if they differ
        in shape; the contents are the caller's promise."""
        seg = saved.load_segment(arrays, len(self._terms), check_values=False)
        if (len(seg.indptr), len(seg.rows), len(seg.row_keys)) != (
                len(self._indptr), len(self._rows), len(self._row_keys)):
            raise ValueError("saved keyword index does not match the one in memory")
        old_gen = self._main_gen
        self._set_main(seg)
        self._scorer.main_moved(old_gen, self._main_gen)  # same rows, same lengths

    # ----------------------------------------------------------------- search
    def doc_freq(self, term: str) -> int:
        """How many live documents contain ``term`` (one lookup, no scoring)."""
        return bm25_search.doc_freq(self._corpus(), term)

    def holding(self, term: str, keys: Iterable[int]) -> set[int]:
        """Which of ``keys`` are live documents that contain ``term`` (postings only)."""
        return bm25_search.holding(self._corpus(), term, keys)

    def holders(self, terms: list[str], limit: int, *,
                allowed: BitMap | None = None) -> list[int] | None:
        """The keys :meth:`search` finds when it finds every chunk holding one of
        ``terms`` (at most ``limit``), from the postings alone; None when it may not."""
        return bm25_search.holders(self._corpus(), terms, limit, allowed)

    def holders_of_all(self, terms: list[str], *,
                       allowed: BitMap | None = None) -> list[int] | None:
        """The keys of every chunk holding all of ``terms`` (postings only); None when
        the rarest of them has more than ``bm25_search.ALL_HOLDERS`` postings."""
        return bm25_search.holders_of_all(self._corpus(), terms, allowed)

    def search(
        self, query_tokens: list[str], limit: int, *, allowed: BitMap | None = None
    ) -> list[tuple[int, float]]:
        """Top ``limit`` (doc key, score) pairs, best first; only keys in ``allowed`` if given.

        Corpus statistics always cover every live document: a filter narrows the results, it
        does not change the scores.
        """
        return self._scorer.search(self._corpus(), query_tokens, limit, allowed=allowed)

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
        return self._scorer.score_keys(self._corpus(), query_tokens, keys)

    # ----------------------------------------------------------------- persistence
    def meta(self) -> BM25Meta:
        """JSON-able parameters and counters that go with ``to_arrays``."""
        self.merge_staged()
        return {
            "format": bm25_saved.FORMAT, "version": bm25_saved.VERSION, "k1": self.k1,
            "b": self.b, "docs": len(self._live), "total_len": self._total_len,
            "terms": len(self._terms),
        }

    def to_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        """The whole index as plain numeric arrays (no objects, safe without pickle).

        Main arrays are returned without copying; treat them as read-only (merges replace them,
        never write into them). The delta is exported as its own small doc-major CSR, so
        persisting does not force a merge (staged documents are merged first).
        """
        self.merge_staged()
        form = self._delta.saved_form
        if not self._terms.built and (not self._delta or form is not None):
            # Unchanged since they were loaded (a saved delta: as it was saved).
            delta = Slab.from_counts({}, postings.term_table()) if form is None else form.slab()
            terms = self._terms.loaded
        else:
            delta = self._delta.slab(self._term_ids)
            terms = saved.terms_to_arrays(list(self._term_ids))
        return bm25_saved.to_arrays(terms, self._main, self._alive, delta)

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, npt.NDArray[np.generic]], meta: JsonObject, *,
        check_values: bool = True,
    ) -> BM25Index:
        """Rebuild an index saved by ``to_arrays``; raises ValueError on any inconsistency.

        ``check_values=False``: the postings are not read value by value (arrays this
        process just wrote, mapped: checking would bring every page in; see
        ``saved.load_segment``)."""
        bm25_saved.check_format(meta)
        index = cls(k1=float(meta["k1"]), b=float(meta["b"]))
        index._load(bm25_saved.load(arrays, check_values=check_values))
        if len(index) != meta.get("docs") or index._total_len != meta.get("total_len"):
            raise ValueError("keyword index counters do not match its arrays")
        return index

    def _load(self, loaded: bm25_saved.Loaded) -> None:
        # Searchable as it is: the term strings are made only when a write needs the table.
        self._terms.load(loaded.terms_blob, loaded.terms_offsets, loaded.terms)
        self._set_main(loaded.main)
        self._alive = loaded.alive
        self._index_rows(loaded.live_rows)
        self._n_dead = len(loaded.alive) - len(loaded.live_rows)
        self._live, self._total_len = loaded.live, loaded.total_len
        self._delta = loaded.delta


def _check_key(key: int) -> None:
    if not isinstance(key, int) or not 0 <= key <= _MAX_KEY:
        raise ValueError(f"document keys are uint32, got {key!r}")
