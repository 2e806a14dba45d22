"""BM25 compaction planned under the lock, merged off it and installed: it ends as one
merged in place, is never installed over a newer main, changes nothing when it runs out
of memory; and when writes compact in place instead."""

from __future__ import annotations

import pytest
from bm25_reference import _OPS, _WORDS, _apply_ops
from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.index import bm25 as bm25_mod
from recalld.daemon.index import bm25_compaction
from recalld.daemon.index.bm25 import BM25Index
from recalld.daemon.index.postings import Slab


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
