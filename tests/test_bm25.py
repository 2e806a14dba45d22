"""BM25 index against a naive reference, through adds, removes, merges and persistence."""

from __future__ import annotations

import gc
import itertools
import math
import sys
import tracemalloc
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from recalld.daemon.index import bm25 as bm25_mod
from recalld.daemon.index import bm25_compaction, bm25_search
from recalld.daemon.index import postings as postings_mod
from recalld.daemon.index import saved as saved_mod
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.postings import Slab, stable_order
from recalld.daemon.index.saved import SortedTerms, terms_to_arrays
from recalld.daemon.index.tokenizer import doc_length, tokenize, tokenize_split


def reference_scores(
    docs: dict[int, list[str]], query: list[str], k1: float = 1.2, b: float = 0.75
) -> dict[int, float]:
    """BM25 Okapi with Lucene's IDF, written the obvious way."""
    n = len(docs)
    if n == 0:
        return {}
    avgdl = sum(len(t) for t in docs.values()) / n or 1.0
    scores: dict[int, float] = {}
    for term in query:
        df = sum(1 for t in docs.values() if term in t)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for key, toks in docs.items():
            tf = toks.count(term)
            if tf:
                norm = tf + k1 * (1 - b + b * len(toks) / avgdl)
                scores[key] = scores.get(key, 0.0) + idf * tf * (k1 + 1) / norm
    return scores


def assert_matches(index: BM25Index, docs: dict[int, list[str]], query: list[str],
                   allowed: BitMap | None = None) -> None:
    ref = reference_scores(docs, query)
    if allowed is not None:
        ref = {k: v for k, v in ref.items() if k in allowed}
    got = index.search(query, len(docs) + 5, allowed=allowed)
    assert {k for k, _ in got} == set(ref)
    for key, score in got:
        assert score == pytest.approx(ref[key], rel=1e-6, abs=1e-9)
    # Best first, equal scores by ascending key. Scores that are equal in exact arithmetic
    # but not in floating point (other term frequencies and lengths: 1/1.9 against 3/5.7)
    # may come in either order.
    for (key_a, a), (key_b, b) in itertools.pairwise(got):
        if a == b:
            assert key_a < key_b, got
        else:
            assert a > b or math.isclose(a, b, rel_tol=1e-9), got


VOCAB = ["apple", "bird", "cat", "dog", "egg", "fish", "goat", "hen"]


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny thresholds so that a few dozen operations go through every merge path (constant for
    # the whole test, so sharing it across Hypothesis examples is fine).
    monkeypatch.setattr(bm25_mod, "DELTA_MIN_DOCS", 3)
    monkeypatch.setattr(bm25_mod, "DELTA_MAX_DOCS", 6)
    monkeypatch.setattr(bm25_mod, "DEAD_MIN_ROWS", 2)
    monkeypatch.setattr(bm25_mod, "SLAB_DOCS", 4)
    monkeypatch.setattr(bm25_mod, "SMALL_ADD_DOCS", 2)
    monkeypatch.setattr(postings_mod, "SCATTER_BLOCK", 3)  # merges move postings in steps


@pytest.fixture(params=["numpy", "python"])
def scoring(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both ways of scoring: numpy always, or Python for every posting count.
    monkeypatch.setattr(bm25_search, "FEW_POSTINGS", 0 if request.param == "numpy" else 10**9)


_DOC = st.lists(st.sampled_from(VOCAB), max_size=8)
_OP = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 15), _DOC),
    st.tuples(st.just("remove"), st.integers(0, 15), st.just([])),
    st.tuples(st.just("many"), st.integers(0, 15),
              st.lists(st.tuples(st.integers(0, 15), _DOC), max_size=6)),
    st.tuples(st.just("encoded"), st.integers(0, 15),
              st.dictionaries(st.integers(0, 15), _DOC, max_size=6).map(lambda d: list(d.items()))),
    st.tuples(st.just("staged"), st.integers(0, 15),
              st.dictionaries(st.integers(0, 15), _DOC, max_size=6).map(lambda d: list(d.items()))),
    st.tuples(st.just("compact"), st.just(0), st.just([])),
    st.tuples(st.just("reload"), st.just(0), st.just([])),
)


def _encoded(key: int, docs: list[tuple[int, list[str]]]) -> list[tuple[str | list[str], Slab]]:
    """``docs`` as worker processes send them: in two parts (split by ``key``), each with
    its own vocabulary, keys set on apply."""
    parts: list[tuple[str | list[str], Slab]] = []
    for piece in (docs[: key % 4], docs[key % 4:]):
        slab, terms = Slab.local([doc for _, doc in piece])
        parts.append((terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens,
                                  [k for k, _ in piece])))
    return parts


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_OP, max_size=30), st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4),
       st.sets(st.integers(0, 15)))
def test_matches_reference_through_any_sequence(
    small_thresholds: None, scoring: None, score_keys_path: None,
    ops: list[tuple[str, int, list]],  # type: ignore[type-arg]
    query: list[str], allowed_keys: set[int],
) -> None:
    index = BM25Index()
    docs: dict[int, list[str]] = {}
    staged: dict[int, list[str]] = {}  # added with stage=True, not searchable yet
    for op, key, arg in ops:
        if op != "staged":  # any other write merges what was staged first
            docs.update(staged)
            staged = {}
        if op == "add":
            index.add(key, arg)
            docs[key] = arg
        elif op == "remove":
            assert index.remove(key) == (key in docs)
            docs.pop(key, None)
        elif op == "many":
            index.add_many(arg)
            docs.update(dict(arg))
        elif op == "encoded":
            index.add_encoded(_encoded(key, arg))
            docs.update(dict(arg))
        elif op == "staged":
            index.add_encoded(_encoded(key, arg), stage=True)
            merged = {**docs, **staged, **dict(arg)}
            if index.live == BitMap(merged):  # merged now (few, replacing, or enough)
                docs, staged = merged, {}
            else:
                staged.update(dict(arg))
        elif op == "compact":
            index.compact()
        else:
            index = BM25Index.from_arrays(index.to_arrays(), index.meta())
        assert len(index) == len(docs)
        assert index.live == BitMap(docs)
        assert index.staged == BitMap(staged)
        assert_matches(index, docs, query)
        assert_scores_keys_like_search(index, query, allowed_keys)
    assert_matches(index, docs, query, BitMap(allowed_keys))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(0, 30))
def test_a_staged_pass_builds_the_same_index(sizes: list[int], before: int) -> None:
    # A pass applied in calls that stage all but the last gives the arrays the same calls
    # give unstaged; staged documents are not searchable until they are merged. Calls of
    # any size are merged (as a pass's batches of hundreds of files are), not put in
    # the delta.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bm25_mod, "SMALL_ADD_DOCS", 0)
        _staged_and_plain(sizes, before)


def _staged_and_plain(sizes: list[int], before: int) -> None:
    rng = np.random.default_rng(sum(sizes) + before)
    words = [f"w{i}" for i in range(60)]

    def doc() -> list[str]:
        return [words[int(i)] for i in rng.integers(0, len(words), int(rng.integers(0, 12)))]

    first = [(k, doc()) for k in range(before)]
    calls = []
    key = before
    for n in sizes:
        calls.append([(key + i, doc()) for i in range(n)])
        key += n
    plain, staged = BM25Index(), BM25Index()
    for index in (plain, staged):
        if first:
            index.add_encoded(_encoded(0, first))
    for i, call in enumerate(calls):
        plain.add_encoded(_encoded(i, call))
        last = i == len(calls) - 1
        staged.add_encoded(_encoded(i, call), stage=not last)
        if not last:
            assert staged.live <= plain.live
            assert len(staged) == len(staged.live)
            assert all(k in staged.live for k, _ in staged.search(["w1", "w2"], 50))
    assert staged.live == plain.live
    got, want = staged.to_arrays(), plain.to_arrays()
    assert set(got) == set(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    assert staged.meta() == plain.meta()
    assert staged.merges <= plain.merges


def test_staged_documents_are_searchable_after_any_other_write() -> None:
    index = BM25Index()
    index.add_encoded(_encoded(0, [(k, ["base"]) for k in range(200)]))
    index.add_encoded(_encoded(1, [(k, ["fresh"]) for k in range(200, 300)]), stage=True)
    assert index.search(["fresh"], 5) == []  # staged: 100 < 200 live
    assert len(index) == 200
    index.remove(0)  # a write: the staged documents join main first
    assert [k for k, _ in index.search(["fresh"], 3)] == [200, 201, 202]
    assert len(index) == 299
    index.add_encoded(_encoded(2, [(k, ["late"]) for k in range(300, 400)]), stage=True)
    saved = BM25Index.from_arrays(index.to_arrays(), index.meta())  # saving merges them
    assert [k for k, _ in saved.search(["late"], 1)] == [300]
    assert len(saved) == 399


def test_staging_merges_at_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # However large main is, at most STAGED_MAX_DOCS documents wait: a merge's temporary
    # arrays grow with the documents it adds.
    monkeypatch.setattr(bm25_mod, "STAGED_MAX_DOCS", 150)
    index = BM25Index()
    index.add_encoded(_encoded(0, [(k, ["base"]) for k in range(1000)]))
    index.add_encoded(_encoded(1, [(k, ["a"]) for k in range(1000, 1100)]), stage=True)
    assert index.search(["a"], 1) == [] and len(index) == 1000  # 100 wait
    index.add_encoded(_encoded(2, [(k, ["b"]) for k in range(1100, 1200)]), stage=True)
    assert len(index) == 1200  # 200 >= 150: merged, though main holds 1,000
    assert [k for k, _ in index.search(["b"], 1)] == [1100]


@pytest.fixture(params=["per-term", "search"])
def score_keys_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both ways score_keys works: term by term, or a search restricted to the keys.
    monkeypatch.setattr(bm25_search, "SCORE_KEYS_MAX_TERMS", 0 if request.param == "search" else 99)


def assert_scores_keys_like_search(index: BM25Index, query: list[str], keys: set[int]) -> None:
    """``score_keys`` gives the keys what a search restricted to them gives (the sorting
    path may sum in another order: equal up to the last bits)."""
    got = index.score_keys(query, keys)
    expected = dict(index.search(query, len(keys) + 1, allowed=BitMap(keys)))
    assert set(got) == set(expected)
    for key, score in got.items():
        assert score == pytest.approx(expected[key], rel=1e-12)


def test_compaction_happens_by_itself(small_thresholds: None) -> None:
    index = BM25Index()
    for key in range(20):
        index.add(key, ["apple", "bird"] if key % 2 else ["cat"])
    stats = index.stats()
    assert stats["merges"] >= 2 and stats["delta_docs"] <= 6
    for key in range(0, 20, 2):
        index.remove(key)
    assert index.stats()["dead_rows"] <= max(2, index.stats()["main_rows"] // 4)
    assert_matches(index, {k: ["apple", "bird"] for k in range(1, 20, 2)}, ["cat", "bird"])


def test_merge_work_is_amortized() -> None:
    # With the real thresholds, 20k single adds take a few dozen merges, not one per add.
    index = BM25Index()
    for key in range(20_000):
        index.add(key, [VOCAB[key % 8], VOCAB[(key * 7) % 8], f"t{key % 97}"])
    assert index.stats()["merges"] <= 30
    assert len(index) == 20_000
    assert index.search(["t5"], 3)


def test_query_details() -> None:
    index = BM25Index()
    index.add_many([(1, ["x", "y"]), (2, ["x"]), (3, ["z"])])
    assert index.search([], 5) == []
    assert index.search(["nope"], 5) == []
    assert index.search(["x"], 0) == []
    # A repeated query term counts twice.
    once = dict(index.search(["y"], 5))[1]
    assert dict(index.search(["y", "y"], 5))[1] == pytest.approx(2 * once)
    # Scores are never negative, even for a term in every document.
    index.add(4, ["x"])
    index.add(3, ["x"])
    assert all(s > 0 for _, s in index.search(["x"], 5))
    # Ties resolve by key, and the limit holds.
    assert [k for k, _ in index.search(["x"], 2)] == [2, 3]
    assert index.search(["x"], 10, allowed=BitMap()) == []
    assert [k for k, _ in index.search(["x"], 10, allowed=BitMap([4, 99]))] == [4]


def test_narrow_and_wide_filters_agree_with_reference(scoring: None) -> None:
    docs = {k: [VOCAB[k % 8], VOCAB[(k * 3) % 8], VOCAB[(k * 5) % 7]] for k in range(300)}
    index = BM25Index()
    index.add_many(docs.items())
    index.add(1000, ["apple", "apple"])
    docs[1000] = ["apple", "apple"]
    query = ["apple", "cat"]
    full = index.search(query, 400)
    for allowed in (BitMap([5, 77, 150, 1000]), BitMap(range(0, 300, 2)), BitMap(range(290, 2000)),
                    BitMap(range(7, 300, 97))):
        assert_matches(index, docs, query, allowed)
        # A small limit gives the best allowed hits, in the unfiltered order.
        expected = [kv for kv in full if kv[0] in allowed][:3]
        assert index.search(query, 3, allowed=allowed) == expected


@pytest.mark.parametrize("dense", [True, False])
def test_small_limits_rank_like_the_reference(monkeypatch: pytest.MonkeyPatch,
                                              dense: bool) -> None:
    # Many tied documents, some in the delta, limits far below the candidates: the dense
    # ranking (bincount, best postings only) and the sorting one agree with the reference.
    monkeypatch.setattr(bm25_search, "DENSE_ROWS", 10**9 if dense else 0)
    monkeypatch.setattr(bm25_search, "FEW_POSTINGS", 0)
    docs = {k: [VOCAB[k % 8], VOCAB[(k * 3) % 8], VOCAB[(k * 5) % 7]] for k in range(300)}
    index = BM25Index()
    index.add_many(docs.items())
    for k in range(300, 310):
        docs[k] = [VOCAB[k % 5], "apple", VOCAB[k % 3]]
        index.add(k, docs[k])
    assert index.stats()["delta_docs"] == 10
    for query in (["apple"], ["apple", "cat"], ["apple", "cat", "apple"], ["dog", "egg", "hen"]):
        ref = reference_scores(docs, query)
        expected = [k for k, _ in sorted(ref.items(), key=lambda kv: (-round(kv[1], 9), kv[0]))]
        for limit in (1, 3, 7, 20, 400):
            got = index.search(query, limit)
            assert [k for k, _ in got] == expected[:limit], (query, limit)
            for key, score in got:
                assert score == pytest.approx(ref[key], rel=1e-9)


def test_add_many_repeated_key_and_bad_key(small_thresholds: None) -> None:
    index = BM25Index()
    index.add_many([(1, ["a"]), (2, ["b"]), (1, ["c"]), *((k, ["d"]) for k in range(10, 20))])
    assert index.search(["a"], 5) == [] and [k for k, _ in index.search(["c"], 5)] == [1]
    with pytest.raises(ValueError, match="uint32"):
        index.add_many([(30, ["e"]), (-5, ["e"])])
    # What came before the bad key is indexed consistently.
    assert [k for k, _ in index.search(["e"], 5)] == [30]
    assert len(index) == 13


def test_replacing_a_key_keeps_one_version() -> None:
    index = BM25Index()
    index.add(7, ["old"])
    index.compact()
    index.add(7, ["new"])
    assert index.search(["old"], 5) == []
    assert [k for k, _ in index.search(["new"], 5)] == [7]
    assert len(index) == 1


def test_keys_must_be_uint32() -> None:
    index = BM25Index()
    with pytest.raises(ValueError, match="uint32"):
        index.add(-1, ["a"])
    with pytest.raises(ValueError, match="uint32"):
        index.add(2**32, ["a"])
    assert index.remove(-1) is False


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


_WORDS = st.sampled_from(["alpha", "beta", "中文", "ünïcode", "w1", "w2", "x"])


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


_OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.lists(_WORDS, max_size=5)),
                max_size=20)


def _apply_ops(index: BM25Index, ops: list[tuple[bool, int, list[str]]]) -> None:
    for add, key, tokens in ops:
        if add:
            index.add(key, tokens)
        else:
            index.remove(key)


@settings(max_examples=150, deadline=None)
@given(first=st.lists(st.lists(_WORDS, min_size=1, max_size=6), min_size=1, max_size=30),
       before=_OPS, during=_OPS, save_during=st.booleans())
def test_a_compaction_merged_off_the_lock_ends_as_one_merged_in_place(
        first: list[list[str]], before: list[tuple[bool, int, list[str]]],
        during: list[tuple[bool, int, list[str]]], save_during: bool) -> None:
    # Planned under the lock, merged without it while writes go on (keys of main and of
    # the delta removed, replaced, added; a commit's save numbering new terms), then
    # installed: the index answers as one that saw the same writes and compacted in place.
    off, inline = BM25Index(), BM25Index()
    for index in (off, inline):
        index.compact_inline = False
        index.add_many(enumerate(first))
        _apply_ops(index, before)
    plan = off.plan_compaction(due=False)
    _apply_ops(off, during)
    _apply_ops(inline, during)
    if save_during:
        off.to_arrays()
    if plan is not None:
        plan.run()
        assert off.install_compaction(plan)
        assert off.stats()["merges"] == 2 and off.stats()["delta_docs"] <= len(during)
    inline.compact()
    assert off.live == inline.live and len(off) == len(inline)
    for word in ["alpha", "beta", "中文", "ünïcode", "w1", "w2", "x", "absent"]:
        got, want = off.search([word], 50), inline.search([word], 50)
        assert [k for k, _ in got] == [k for k, _ in want], word
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5), word
    back = BM25Index.from_arrays(off.to_arrays(), off.meta())
    assert back.search(["alpha", "x"], 50) == off.search(["alpha", "x"], 50)
    off.compact()  # and it goes on as any index
    got, want = off.search(["w1"], 50), inline.search(["w1"], 50)
    assert [k for k, _ in got] == [k for k, _ in want]


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


@pytest.mark.parametrize("meanwhile", ["merge", "pass", "another index"])
def test_a_planned_compaction_is_not_installed_over_a_newer_main(meanwhile: str) -> None:
    index = BM25Index()
    index.compact_inline = False
    index.add_many((k, ["a", f"w{k}"]) for k in range(20))
    index.add(3, ["b"])
    index.add(30, ["c"])
    plan = index.plan_compaction(due=False)
    assert plan is not None
    if meanwhile == "merge":
        index.compact()  # main's rows change
    elif meanwhile == "pass":
        index.vocabulary_ids(("pass", 1), 0, ["z"])  # a pass holds term ids
    else:  # a state loaded again in place: the same counters, another index
        index = BM25Index.from_arrays(index.to_arrays(), index.meta())
        index._main_rows_gen = plan.rows_gen
    before = (index.stats(), index.search(["c"], 5), index.search(["b"], 5))
    plan.run()
    assert not index.install_compaction(plan)
    assert (index.stats(), index.search(["c"], 5), index.search(["b"], 5)) == before


@pytest.mark.parametrize("fails_at", ["key rows", "nothing"])
def test_an_install_that_runs_out_of_memory_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, fails_at: str) -> None:
    index = BM25Index()
    index.compact_inline = False
    index.add_many((k, ["a", f"w{k}"]) for k in range(0, 40, 2))  # keys not in order below
    index.add(5, ["b"])
    index.add(1, ["c", "w1"])
    index.remove(4)
    plan = index.plan_compaction(due=False)
    assert plan is not None
    plan.run()
    before = (index.stats(), index.live, [index.search([w], 50) for w in ("a", "b", "w1")])
    if fails_at == "key rows":
        def key_rows(*args: object) -> None:
            raise MemoryError("no room for the key map")

        monkeypatch.setattr(bm25_compaction, "key_rows", key_rows)
        with pytest.raises(MemoryError):
            index.install_compaction(plan)
        assert (index.stats(), index.live,
                [index.search([w], 50) for w in ("a", "b", "w1")]) == before
        monkeypatch.undo()
        index.remove(6)  # rows are still found by key
        assert [k for k, _ in index.search(["w6"], 5)] == []
    else:
        assert index.install_compaction(plan)
        assert index.stats()["delta_docs"] == 0 and index.stats()["dead_rows"] == 0
        index.remove(1)
        index.remove(6)
        assert index.search(["w1"], 5) == [] and index.search(["w6"], 5) == []
        assert [k for k, _ in index.search(["b"], 5)] == [5]


@pytest.mark.parametrize("inline", [True, False])
def test_many_documents_go_to_the_delta_when_compaction_is_off_the_lock(inline: bool) -> None:
    # A merge rewrites main under the caller's lock; with compaction elsewhere, a batch
    # that fits below the backstop goes to the delta instead, a larger one is merged.
    index = BM25Index()
    index.add_many((k, ["a", f"w{k}"]) for k in range(3000))
    index.compact_inline = inline
    slab, terms = Slab.local([["b", f"n{k}"] for k in range(200)])
    keys = list(range(5000, 5200))
    index.add_encoded([(terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens, keys))])
    assert index.stats()["merges"] == (2 if inline else 1)
    assert index.stats()["delta_docs"] == (0 if inline else 200)
    assert [k for k, _ in index.search(["n7"], 5)] == [5007]
    room = bm25_mod.BACKSTOP_FACTOR * 375 - 200  # a delta limit of main's live / 8
    big, big_terms = Slab.local([["c"] for _ in range(room + 1)])
    keys = list(range(10_000, 10_000 + room + 1))
    index.add_encoded([(big_terms, Slab(big.tids, big.tfs, big.nterms, big.lens, keys))])
    assert index.stats()["merges"] == (3 if inline else 2)  # past the backstop: merged
    assert len(index.search(["c"], 10_000)) == room + 1


def test_writes_compact_in_place_only_far_past_the_limits_when_compaction_is_elsewhere(
        ) -> None:
    index = BM25Index()
    index.compact_inline = False
    index.add_many((k, ["a"]) for k in range(100))
    for key in range(100, 100 + bm25_mod.DELTA_MIN_DOCS + 1):
        index.add(key, ["b"])
    assert index.compaction_due() and index.stats()["merges"] == 1  # left to its owner
    for key in range(100 + bm25_mod.DELTA_MIN_DOCS + 1,
                     100 + bm25_mod.BACKSTOP_FACTOR * bm25_mod.DELTA_MIN_DOCS):
        index.add(key, ["c"])
    assert index.stats()["merges"] == 1  # at the backstop, not past it
    index.add(99_999, ["c"])
    assert index.stats()["merges"] == 2 and not index.compaction_due()  # the backstop


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


def test_add_encoded_refuses_repeated_keys_and_key_count_mismatch() -> None:
    index = BM25Index()
    slab, terms = Slab.local([["a"], ["b"]])
    with pytest.raises(ValueError, match="repeats"):
        index.add_encoded([(terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens, [1, 1]))])
    with pytest.raises(ValueError, match="keys for"):
        slab.remap(terms, index._term_ids, [1])
    assert len(index) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 70_000), max_size=200))
def test_stable_order_is_a_stable_argsort(values: list[int]) -> None:
    arr = np.asarray(values, dtype=np.int32)
    assert np.array_equal(stable_order(arr), np.argsort(arr, kind="stable"))


def _slab_counts(slab: Slab, terms: list[str]) -> list[dict[str, int]]:
    bounds = [0, *np.cumsum(slab.nterms).tolist()]
    return [
        {terms[t]: int(f) for t, f in zip(slab.tids[lo:hi].tolist(),
                                           slab.tfs[lo:hi].tolist(), strict=True)}
        for lo, hi in itertools.pairwise(bounds)
    ]


# Latin words, identifiers, CJK of several planes and scripts, full-width forms, spacing.
_TEXT = st.lists(st.sampled_from([
    "memory", "the", "ECONNREFUSED", "handleWebSocket", "v2.3.1", "C++", " ", "\n", "，",
    "中", "文", "记忆", "𠀀", "𠀁", "한국어", "カタカナ", "ＡＢＣ", "１２", "é", "ß", "—",
]), max_size=40).map("".join)


@settings(max_examples=120, deadline=None)
@given(st.lists(_TEXT, max_size=8))
def test_bulk_cjk_counting_matches_the_token_lists(texts: list[str]) -> None:
    # Worker processes count CJK runs in numpy (tokenize_split); the result must be the
    # counts of tokenize(), which queries and rebuilds use.
    split = [tokenize_split(t) for t in texts]
    bulk, bulk_terms = Slab.local([w for w, _ in split], [r for _, r in split])
    plain, plain_terms = Slab.local([tokenize(t) for t in texts])
    assert bulk.lens == plain.lens == [doc_length(tokenize(t)) for t in texts]
    assert _slab_counts(bulk, bulk_terms) == _slab_counts(plain, plain_terms)
    assert sorted(bulk_terms) == sorted(plain_terms)


@settings(max_examples=120, deadline=None)
@given(st.lists(_TEXT, max_size=8), st.integers(1, 40))
def test_bulk_counting_does_not_depend_on_its_blocks(texts: list[str], block: int) -> None:
    # CJK runs are counted a block of characters at a time: small blocks (one per few
    # characters, documents split across none) give the same counts and lengths; word
    # terms are numbered first, in the order they first occur (as a TermTable would).
    split = [tokenize_split(t) for t in texts]
    whole, whole_terms = Slab.local([w for w, _ in split], [r for _, r in split])
    saved = postings_mod.CJK_BLOCK_CHARS
    postings_mod.CJK_BLOCK_CHARS = block
    try:
        small, small_terms = Slab.local([w for w, _ in split], [r for _, r in split])
    finally:
        postings_mod.CJK_BLOCK_CHARS = saved
    assert _slab_counts(small, small_terms) == _slab_counts(whole, whole_terms)
    assert sorted(small_terms) == sorted(whole_terms)
    assert (small.lens, small.keys) == (whole.lens, whole.keys)
    words = [t for w, _ in split for t in w]
    assert whole_terms[:len(dict.fromkeys(words))] == list(dict.fromkeys(words))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([*VOCAB, "中", "文件", "x" * 40]), unique=True, max_size=12),
       st.lists(st.sampled_from([*VOCAB, "中", "文件", "x" * 40, "新"]), unique=True,
                max_size=12))
def test_remap_is_a_lookup_of_every_term(known: list[str], local: list[str]) -> None:
    # Known terms are looked up, new ones join in local order, interned; as if each term
    # were looked up in turn.
    ids = postings_mod.term_table(known)
    reference = postings_mod.term_table(known)
    slab = Slab(np.arange(len(local), dtype=np.int32)[::-1].copy(),
                np.ones(len(local), dtype=np.float32),
                np.asarray([len(local)], dtype=np.int64), [len(local)], [0])
    got = slab.remap(["".join(t) for t in local], ids, [7])  # new string objects
    expected = [reference[sys.intern(t)] for t in local][::-1]
    assert got.tids.tolist() == expected and got.keys == [7]
    assert list(ids.items()) == list(reference.items())
    for term in ids:
        assert term is sys.intern(term)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(_TEXT, min_size=1, max_size=5), min_size=1, max_size=6),
       st.lists(st.integers(0, 1), min_size=6, max_size=6))
def test_batches_counted_against_a_kept_vocabulary_index_the_same(
    batches: list[list[str]], workers: list[int],
) -> None:
    # Worker processes keep one vocabulary over a pass and hand back only the terms a
    # batch added to it; the daemon maps them through vocabulary_ids. The index built is
    # the one per-batch vocabularies build, array for array, when batches are merged (as
    # a pass's batches of 128 files are; the delta of a few documents numbers its terms
    # as they come, a merge in batch order).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bm25_mod, "SMALL_ADD_DOCS", 0)
        _build_both(batches, workers)


def _build_both(batches: list[list[str]], workers: list[int]) -> None:
    plain, kept = BM25Index(), BM25Index()
    held = [postings_mod.Vocabulary(), postings_mod.Vocabulary()]
    key = 0
    for i, texts in enumerate(batches):
        split = [tokenize_split(t) for t in texts]
        words, runs = [w for w, _ in split], [r for _, r in split]
        keys = list(range(key, key + len(texts)))
        key += len(texts)
        slab, terms = Slab.local(words, runs)
        plain.add_encoded([(terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens, keys))],
                          stage=i < len(batches) - 1)
        vocab = held[workers[i]]
        start = len(vocab)
        slab, new_terms = Slab.local(words, runs, vocab=vocab)
        assert new_terms == list(vocab.ids)[start:]
        to_global = kept.vocabulary_ids(("pass", workers[i]), start,
                                        postings_mod.join_terms(new_terms))
        kept.add_encoded([(None, slab.mapped(to_global, keys))], stage=i < len(batches) - 1)
    got, want = kept.to_arrays(), plain.to_arrays()
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def test_a_vocabulary_out_of_step_is_refused_and_held_terms_stay() -> None:
    index = BM25Index()
    index.add(0, ["gone"])
    index.compact()
    ids = index.vocabulary_ids(("p", 1), 0, "alpha\nbeta")
    assert ids.tolist() == [1, 2]
    with pytest.raises(ValueError, match="not the one held"):
        index.vocabulary_ids(("p", 1), 5, "gamma")
    with pytest.raises(ValueError, match="not the one held"):
        index.vocabulary_ids(("p", 2), 3, "gamma")
    assert index.vocabulary_ids(("p", 1), 2, "gamma").tolist() == [1, 2, 3]
    assert index.vocabulary_ids(("p", 1), 0, "beta").tolist() == [2]  # began again
    # While a vocabulary is held, a merge keeps terms without postings: its ids hold.
    index.remove(0)
    index.compact()
    assert index.stats()["terms"] == 4
    index.forget_vocabularies()
    index.add(5, ["beta"])
    index.compact()
    assert index.stats()["terms"] == 1


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


def test_cjk_text_counts_by_characters_in_lengths() -> None:
    # Indexed as characters plus pairs, counted as one term per two characters, so a
    # Chinese note is not several times as long as an English note of the same content.
    assert doc_length(tokenize("数据迁移")) == 2  # 4 characters + 3 pairs indexed
    assert doc_length(tokenize("数据迁移计划 ECONNREFUSED on deploy")) == 3 + 2
    assert doc_length(tokenize("deploy the server")) == 2
    split = tokenize_split("迁移 ECONNREFUSED 服务器")
    bulk, _ = Slab.local([split[0]], [split[1]])
    assert bulk.lens == [doc_length(tokenize("迁移 ECONNREFUSED 服务器"))] == [1 + 3]


@pytest.mark.parametrize("query", [["cat"], ["cat", "dog"], ["apple", "cat", "apple", "t3"],
                                   ["t5"], ["hen", "nothing"]])
@pytest.mark.parametrize("bases_max_terms", [0, 16])
def test_score_keys_after_a_search_reads_its_scores_to_the_bit(
        scoring: None, query: list[str], bases_max_terms: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The search remembers its scores; score_keys for the same query then reads them and
    # must give exactly what walking the postings gives (main rows, dead rows, delta),
    # whether the search reused each term's weights or computed them for all at once.
    monkeypatch.setattr(bm25_search, "BASES_MAX_TERMS", bases_max_terms)
    def build() -> BM25Index:
        index = BM25Index()
        index.add_many((key, [VOCAB[key % 8], VOCAB[(key * 3) % 8], f"t{key % 7}"] * (key % 3 + 1))
                       for key in range(60))
        for key in range(0, 60, 9):
            index.remove(key)  # dead rows in main
        for key in range(60, 70):
            index.add(key, [VOCAB[key % 8], "cat", f"t{key % 7}"])  # delta documents
        return index

    keys = set(range(0, 75))
    walked = build().score_keys(query, keys)
    index = build()
    hits = index.search(query, 5)
    assert index.search(query, 5) == hits  # again, from the kept postings and weights
    assert index.score_keys(query, keys) == walked
    assert all(walked[k] == s for k, s in hits)
    index.add(80, ["cat", "dog"])  # a write: the remembered scores no longer hold
    assert index.score_keys(query, keys | {80}) == build_after(build, query, keys | {80})


def build_after(build: Callable[[], BM25Index], query: list[str],
                keys: set[int]) -> dict[int, float]:
    index = build()
    index.add(80, ["cat", "dog"])
    return index.score_keys(query, keys)


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(st.lists(st.booleans(), max_size=6), max_size=12))
def test_a_merge_counts_the_postings_it_keeps_per_term(runs: list[list[bool]]) -> None:
    # Terms with no postings, with none kept, with all kept: as counting them one by one.
    keep = np.asarray([k for run in runs for k in run], dtype=np.bool_)
    indptr = np.zeros(len(runs) + 1, dtype=np.int64)
    np.cumsum([len(run) for run in runs], out=indptr[1:])
    counts = postings_mod._kept_per_term(keep, indptr)
    assert counts.dtype == np.int64
    assert counts.tolist() == [sum(run) for run in runs]
