"""Writes to the BM25 index: adds, replacements and removals, staged passes and the merges
they cause, and the keys it accepts."""

from __future__ import annotations

import numpy as np
import pytest
from bm25_reference import VOCAB, _encoded, assert_matches, small_thresholds
from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.index import bm25 as bm25_mod
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.postings import Slab

__all__ = ["small_thresholds"]  # a fixture, used by name


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


def test_add_encoded_refuses_repeated_keys_and_key_count_mismatch() -> None:
    index = BM25Index()
    slab, terms = Slab.local([["a"], ["b"]])
    with pytest.raises(ValueError, match="repeats"):
        index.add_encoded([(terms, Slab(slab.tids, slab.tfs, slab.nterms, slab.lens, [1, 1]))])
    with pytest.raises(ValueError, match="keys for"):
        slab.remap(terms, index._term_ids, [1])
    assert len(index) == 0
