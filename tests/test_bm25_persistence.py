"""The BM25 index saved as arrays and loaded back: round trips, a delta read as it was
saved, a vocabulary kept as bytes until a write, and the input a load refuses."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import numpy.typing as npt
import pytest
from bm25_reference import _OPS, _WORDS, _apply_ops
from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.index import bm25 as bm25_mod
from recalld.daemon.index import saved as saved_mod
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.postings import Slab
from recalld.daemon.index.saved import SortedTerms, terms_to_arrays
from recalld.daemon.index.tokenizer import tokenize


def test_persistence_round_trip_with_delta_and_dead_rows() -> None:
    index = BM25Index(k1=1.5, b=0.6)
    index.add_many((k, ["alpha", f"w{k % 5}", "ünïcode", "中文"]) for k in range(50))
    index.remove(3)
    index.add(100, ["delta", "alpha"])
    arrays = index.to_arrays()
    assert all(isinstance(a, np.ndarray) and a.dtype != object for a in arrays.values())
    back = BM25Index.from_arrays(arrays, index.meta())
    assert (back.k1, back.b) == (1.5, 0.6)
    for q in (["alpha"], ["w2", "delta"], ["中文"], ["ünïcode"]):
        assert back.search(q, 10) == index.search(q, 10)
    assert back.live == index.live
    # Both keep working independently afterwards.
    back.add(200, ["alpha"])
    assert 200 not in index and 200 in back


@settings(max_examples=80, deadline=None)
@given(main=st.lists(st.lists(_WORDS, min_size=1, max_size=6), max_size=12),
       delta=st.lists(st.tuples(st.integers(0, 30), st.lists(_WORDS, max_size=6)),
                      max_size=12),
       removed=st.sets(st.integers(0, 30), max_size=5))
def test_a_loaded_delta_is_the_delta_that_was_saved(
        main: list[list[str]], delta: list[tuple[int, list[str]]], removed: set[int]) -> None:
    # Loaded in bulk (each term decoded once, postings grouped by term), the delta must be
    # the one saved, and a save of the loaded index writes the same arrays.
    index = BM25Index()
    index.add_many(enumerate(main))
    for key, tokens in delta:
        index.add(key, tokens)  # a key of main moves into the delta; a key seen twice too
    for key in removed:
        index.remove(key)
    arrays = index.to_arrays()
    back = BM25Index.from_arrays(arrays, index.meta())
    # Read as it was saved: each term's postings and each document's length, searches,
    # counts, and a save writes the same arrays again.
    form = back.delta.saved_form
    assert (form is not None) == bool(index.stats()["delta_docs"])
    for word in ["alpha", "beta", "中文", "ünïcode", "w1", "w2", "x", "absent"]:
        assert (back.delta.postings(word) or {}) == (index.delta.postings(word) or {})
        assert back.doc_freq(word) == index.doc_freq(word)
        assert back.search([word], 10) == index.search([word], 10)
        assert back.score_keys([word], range(31)) == index.score_keys([word], range(31))
    assert back.delta.lengths == index.delta.lengths
    assert back.live == index.live
    assert {**back.stats(), "merges": 0} == {**index.stats(), "merges": 0}  # this process's
    assert back.delta.saved_form is form  # all of that read it as saved
    for _ in range(2):  # as saved, then as dicts
        again = back.to_arrays()
        assert back.delta.saved_form in (form, None)
        assert set(again) == set(arrays)
        assert all(np.array_equal(again[name], arrays[name]) for name in arrays)
        back.delta.thaw()
        assert back.delta.saved_form is None
        assert back.delta.docs == index.delta.docs
        assert back.delta.post == index.delta.post


def test_a_saved_delta_that_lists_a_term_twice_in_a_document_keeps_the_last_count() -> None:
    # Files on disk are read as they are: a document listing one term id twice (no save
    # writes that) loads as the per-posting loop read it, the last count winning.
    index = BM25Index()
    index.add_many((k, ["a", "b", "长词"]) for k in range(5))
    index.add(10, ["c"])
    arrays = dict(index.to_arrays())
    terms = saved_mod.load_terms(arrays)
    a, b, cjk = terms.index("a"), terms.index("b"), terms.index("长词")
    arrays.update(
        delta_keys=np.asarray([10, 11, 12], dtype=np.uint32),
        delta_indptr=np.asarray([0, 3, 3, 5], dtype=np.int64),  # 11: no postings
        delta_tids=np.asarray([a, cjk, a, cjk, b], dtype=np.int32),
        delta_tfs=np.asarray([2, 1, 5, 3, 1], dtype=np.float32),
        delta_lens=np.asarray([8, 0, 4], dtype=np.int64))
    main_len = index.meta()["total_len"] - 1  # less key 10's one term
    back = BM25Index.from_arrays(arrays, {**index.meta(), "docs": 8,
                                          "total_len": main_len + 8 + 0 + 4})
    # Made into dicts at once: a merge of the arrays as they are would count it twice.
    assert back.delta.saved_form is None
    assert back.delta.docs == {10: ({"a": 5, "长词": 1}, 8), 11: ({}, 0),
                                12: ({"长词": 3, "b": 1}, 4)}
    assert back.delta.post == {"a": {10: 5}, "长词": {10: 1, 12: 3}, "b": {12: 1}}
    assert len(back) == 8 and back.stats()["delta_docs"] == 3


@settings(max_examples=150, deadline=None)
@given(first=st.lists(st.lists(_WORDS, min_size=1, max_size=6), max_size=20),
       delta=_OPS, after=_OPS,
       then=st.sampled_from(["writes", "merge", "compaction", "pass", "save", "adopt",
                             "write before adopt", "remove from main", "stage"]))
def test_a_delta_read_as_saved_answers_and_changes_as_the_one_it_was(
        first: list[list[str]], delta: list[tuple[bool, int, list[str]]],
        after: list[tuple[bool, int, list[str]]], then: str) -> None:
    # A load keeps the delta as saved; whatever comes first (a write, a merge, a planned
    # compaction, a pass's term ids, a save, its dicts made off the lock and adopted, or
    # a write before they are), the index answers as the one that was saved would.
    index = BM25Index()
    index.compact_inline = False
    index.add_many(enumerate(first))
    _apply_ops(index, delta)
    back = BM25Index.from_arrays(index.to_arrays(), index.meta())
    back.compact_inline = False
    form = back.delta.saved_form
    assert (form is not None) == bool(index.stats()["delta_docs"])
    assert back.search(["alpha", "w1"], 50) == index.search(["alpha", "w1"], 50)
    assert back.delta.saved_form is form  # searches read it as saved
    in_main = [k for k in range(len(first)) if k in index and k not in index.delta]
    for one in (index, back):
        if then == "merge":
            one.compact()
        elif then == "compaction":
            plan = one.plan_compaction(due=False)
            _apply_ops(one, after[:3])
            if plan is not None:
                plan.run()
                assert one.install_compaction(plan)
        elif then == "pass":
            one.vocabulary_ids(("pass", 1), 0, ["w1", "zeta"])
            one.forget_vocabularies()
        elif then == "save":
            BM25Index.from_arrays(one.to_arrays(), one.meta())
        elif then == "remove from main":
            for key in in_main[:3]:
                one.remove(key)
        elif then == "stage":  # a pass's documents wait beside main, then merge (a grown
            # term table with the delta still as saved)
            slab, terms = Slab.local([["zeta", "alpha"], ["eta"]] * 40)
            one.add_encoded([(terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens,
                                          list(range(1000, 1080))))], stage=True)
            one.merge_staged()
        if then in ("pass", "save", "remove from main") and one is back:
            assert one.delta.saved_form is form  # none of these changed the delta
        elif then in ("adopt", "write before adopt") and form is not None and one is back:
            docs, post = form.thaw()
            if then == "write before adopt":
                _apply_ops(one, after[:1])  # made the dicts if it changed the delta
            still = one.delta.saved_form is form
            assert still or then != "adopt"
            assert one.adopt_delta(form, docs, post) == still
            assert one.delta.saved_form is None
        _apply_ops(one, after)
    assert back.live == index.live
    assert {**back.stats(), "merges": 0} == {**index.stats(), "merges": 0}
    for word in ["alpha", "beta", "中文", "ünïcode", "w1", "w2", "x", "zeta", "eta", "absent"]:
        assert back.doc_freq(word) == index.doc_freq(word)
        got, want = back.search([word], 50), index.search([word], 50)
        assert [k for k, _ in got] == [k for k, _ in want], word
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-6), word
    again = BM25Index.from_arrays(back.to_arrays(), back.meta())
    assert again.search(["alpha", "x"], 50) == back.search(["alpha", "x"], 50)


@pytest.mark.parametrize("repeat", ["live", "delta"])
def test_from_arrays_refuses_a_delta_that_repeats_a_key(repeat: str) -> None:
    index = BM25Index()
    index.add_many((k, ["a", "b"]) for k in range(5))
    index.add(10, ["c"])
    index.add(11, ["a"])
    arrays = dict(index.to_arrays())
    keys = arrays["delta_keys"].copy()
    keys[1] = 2 if repeat == "live" else keys[0]
    arrays["delta_keys"] = keys
    with pytest.raises(ValueError, match="repeats"):
        BM25Index.from_arrays(arrays, index.meta())


@pytest.mark.parametrize("damage", ["offsets", "rows", "missing", "dtype", "counters", "format"])
def test_from_arrays_refuses_inconsistent_input(damage: str) -> None:
    index = BM25Index()
    index.add_many((k, ["a", "b"]) for k in range(5))
    arrays = dict(index.to_arrays())
    meta = index.meta()
    if damage == "offsets":
        arrays["terms_offsets"] = arrays["terms_offsets"] + 1
    elif damage == "rows":
        arrays["rows"] = arrays["rows"] + 100
    elif damage == "missing":
        del arrays["indptr"]
    elif damage == "dtype":
        arrays["tfs"] = arrays["tfs"].astype(np.float64)
    elif damage == "counters":
        meta = {**meta, "docs": 99}
    else:
        meta = {**meta, "version": 999}
    with pytest.raises(ValueError):
        BM25Index.from_arrays(arrays, meta)


def test_a_loaded_vocabulary_stays_bytes_until_written() -> None:
    # A loaded workspace keeps no term dict: stats, saving, adopting and searching do not
    # build it (searches look terms up in the sorted bytes), and answer as the original
    # index; the first write builds it.
    docs = {i: tokenize(t) for i, t in enumerate(
        ["deploy the server", "数据库 迁移 服务器", "ECONNREFUSED on deploy", "coffee"], 1)}
    built = BM25Index()
    built.add_many(docs.items())
    saved = {k: np.array(v) for k, v in built.to_arrays().items()}
    loaded = BM25Index.from_arrays(saved, built.meta())
    again = loaded.to_arrays()
    assert all(np.array_equal(saved[k], again[k]) for k in saved)
    assert loaded.stats()["terms"] == built.stats()["terms"] == loaded.meta()["terms"]
    loaded.adopt_main(saved)
    assert not loaded.terms_built
    for query in (["deploy"], tokenize("数据库 迁移"), ["econnrefused"], ["absent"]):
        assert loaded.search(query, 5) == built.search(query, 5)
        assert loaded.doc_freq(query[0]) == built.doc_freq(query[0])
        # Link expansion scores a few chosen chunks the same way.
        assert loaded.score_keys(query, [1, 2, 3, 4]) == built.score_keys(query, [1, 2, 3, 4])
    assert not loaded.terms_built
    loaded.add_many([(9, ["deploy", "coffee"])])
    built.add_many([(9, ["deploy", "coffee"])])
    assert loaded.terms_built and loaded.stats()["terms"] == built.stats()["terms"]
    assert loaded.search(["deploy"], 5) == built.search(["deploy"], 5)


def test_sorted_terms_find_every_saved_term_and_refuse_bad_dictionaries() -> None:
    # Short and long terms (over the fixed width), CJK, a term with a NUL byte: each is
    # found under its id; absent terms are not; duplicates and split characters refuse.
    terms = ["deploy", "数据库", "x" * (SortedTerms.WIDTH + 5), "a\x00b", "", "z",
             "handleWebSocketReconnectAfterTimeoutExpired", "迁"]
    blob, offsets = terms_to_arrays(terms)
    table = SortedTerms(blob, offsets)
    assert len(table) == len(terms)
    for tid, term in enumerate(terms):
        assert table.get(term) == tid
        assert table[tid] == term
    for absent in ("deplo", "deploy ", "x" * SortedTerms.WIDTH, "a", "数据", "\udcff"):
        assert table.get(absent) is None
    for dup in (["a", "b", "a"], ["y" * 40, "y" * 40]):
        with pytest.raises(ValueError, match="duplicates"):
            SortedTerms(*terms_to_arrays(dup))
    blob, offsets = terms_to_arrays(["数据"])
    with pytest.raises(ValueError, match="split a character"):
        SortedTerms(blob, np.array([0, 1, len(blob)], dtype=np.int64))


def test_sorted_terms_order_short_terms_by_every_byte_of_their_width() -> None:
    # Short terms are ordered as words of their fixed width: terms that differ only in
    # a later word, or only by their length, must still be told apart and found.
    width = SortedTerms.WIDTH
    stems = ["", "a" * 7, "b" * 8, "c" * 15, "d" * 16, "e" * (width - 1)]
    terms = [stem + tail for stem in stems for tail in ("", "a", "z", "\u00e9", "zz")
             if 0 < len((stem + tail).encode()) <= width]
    terms.reverse()  # ids against the byte order
    table = SortedTerms(*terms_to_arrays(terms))
    for tid, term in enumerate(terms):
        assert table.get(term) == tid
    for stem in stems[1:]:
        assert table.get(stem + "b") is None
        assert table.get(stem[:-1]) is None or stem[:-1] in terms


def _held_after_compaction(saved: dict[str, npt.NDArray[np.generic]],
                           meta: bm25_mod.BM25Meta, *, off_the_lock: bool) -> int:
    """Bytes a loaded index holds once a compaction (planned and merged off the lock, or
    in place) has built its term table: what deleting it frees."""
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        index = BM25Index.from_arrays(saved, meta)
        index.compact_inline = False
        assert [k for k, _ in index.search(["t5x3"], 3)] == [5]
        index.remove(7)  # a dead row: something to compact
        assert not index.terms_built
        if off_the_lock:
            plan = index.plan_compaction(due=False)
            assert plan is not None
            plan.run()
            assert index.install_compaction(plan)
            del plan
        else:
            index.compact()
        assert index.terms_built and [k for k, _ in index.search(["t5x3"], 3)] == [5]
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        del index
        gc.collect()
        return before - tracemalloc.get_traced_memory()[0]
    finally:
        if started:
            tracemalloc.stop()


def test_a_loaded_index_compacted_off_the_lock_keeps_no_lookup_it_no_longer_uses() -> None:
    # Once a compaction gives a loaded index its term table, searches use the table: the
    # sorted lookup over the saved bytes (about a megabyte here) is dropped, whichever
    # way the compaction went.
    built = BM25Index()
    built.add_many((k, [f"t{k}x{j}" for j in range(20)] + ["common"]) for k in range(2000))
    saved = {k: np.array(v) for k, v in built.to_arrays().items()}
    meta = built.meta()
    del built
    in_place = _held_after_compaction(saved, meta, off_the_lock=False)
    off_the_lock = _held_after_compaction(saved, meta, off_the_lock=True)
    assert off_the_lock <= in_place + (64 << 10), (off_the_lock, in_place)
