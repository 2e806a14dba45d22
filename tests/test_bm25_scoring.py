"""BM25 scores and rankings against a naive reference: through any sequence of writes,
with filters and small limits, for repeated query terms, and through score_keys; and
which documents hold a term (holding)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from bm25_reference import VOCAB, _encoded, assert_matches, reference_scores, small_thresholds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from recalld.daemon.index import bm25_search
from recalld.daemon.index.bm25 import BM25Index

__all__ = ["small_thresholds"]  # a fixture, used by name


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
        assert_holders_like_search(index, query, allowed_keys)
        for term in query:  # holding: the keys of live documents that contain the term
            assert index.holding(term, allowed_keys) == {
                k for k in allowed_keys if term in docs.get(k, ())}
    assert_matches(index, docs, query, BitMap(allowed_keys))


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


def assert_holders_like_search(index: BM25Index, query: list[str], keys: set[int]) -> None:
    """``holders`` gives the keys a search finds whenever that search finds every
    document holding a query term, and answers whenever it does on the Python path."""
    for allowed in (None, BitMap(keys)):
        every = index.search(query, 10**6, allowed=allowed)
        for limit in (1, 2, 5, 40):
            got = index.holders(query, limit, allowed=allowed)
            if got is not None:
                assert got == sorted(k for k, _ in index.search(query, limit, allowed=allowed))
                assert len(every) <= limit
            elif bm25_search.FEW_POSTINGS >= 10**9:
                assert len(every) > limit


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
