"""An apply to the index state that raises part-way (out of memory, or a fault): a staged
pass that cannot be merged, an apply that fails in its links or the keyword delta, a
keyword-index compaction that fails after an apply, a removal or the postings merge.
The state stays whole, what failed is left out for the next reconcile to read again,
and a failed compaction is not tried again at every write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from markers import marker
from pass_notes import _write

from recalld.daemon.index import bm25, postings
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.state import IndexState


def test_a_pass_whose_staged_documents_cannot_be_merged_leaves_their_files_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, staged = _write(tmp_path, 0, 100), _write(tmp_path, 100, 70)
    state = IndexState()
    state.apply([prepare_files(tmp_path, first, max_chars=2000, digests={})])
    state.apply([prepare_files(tmp_path, staged, max_chars=2000, digests={})], stage=True)
    assert len(state.bm25.staged) == 70 and len(state.files) == 170

    def merge(*args: object, **kwargs: object) -> object:
        raise MemoryError("no room for the merged postings")

    monkeypatch.setattr(postings, "merge", merge)
    assert sorted(state.end_pass()) == staged  # for the next reconcile to read again
    assert sorted(state.files) == first and not state.bm25.staged
    keys = {k for info in state.files.values() for k in info.keys}
    assert set(state.chunks.live) == keys == set(state.bm25.live)
    assert [k for k, _ in state.keyword_search(marker(7), 5)] == list(
        state.files[first[7]].keys)
    # Dropped for good: a later compaction (the merge working again) takes nothing of
    # them into main.
    monkeypatch.undo()
    state.bm25.compact()
    after = state.bm25.stats()
    assert after["docs"] == after["main_rows"] == len(keys) and after["delta_docs"] == 0
    assert not state.keyword_search(marker(107), 5)


def test_an_apply_that_raises_part_way_leaves_out_the_files_it_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, more = _write(tmp_path, 0, 100), _write(tmp_path, 100, 100)
    state = IndexState()
    state.apply([prepare_files(tmp_path, first, max_chars=2000, digests={})])
    batch = prepare_files(tmp_path, more, max_chars=2000, digests={})
    real, calls = state.graph.add_file, []

    def add_file(path: str, links: object) -> None:
        calls.append(path)
        if len(calls) == 30:
            raise MemoryError("no room for the links")
        real(path, links)  # type: ignore[arg-type]

    monkeypatch.setattr(state.graph, "add_file", add_file)
    with pytest.raises(MemoryError):
        state.apply([batch])
    assert sorted(state.files) == first  # the 29 files made before are left out too
    keys = {k for info in state.files.values() for k in info.keys}
    assert set(state.chunks.live) == keys == set(state.bm25.live)
    monkeypatch.undo()
    state.apply([batch])
    assert len(state.files) == 200
    assert [k for k, _ in state.keyword_search(marker(150), 5)] == list(
        state.files[more[50]].keys)


class _FailingCounts(dict[str, int]):
    """A document's term counts that run out of memory after ``after`` of its terms."""

    after = 0

    def items(self) -> Iterator[tuple[str, int]]:  # type: ignore[override]
        for i, item in enumerate(super().items()):
            if i == self.after:
                raise MemoryError("no room for the delta postings")
            yield item


@pytest.mark.parametrize("part_way", [0, 1, 2])
def test_a_small_apply_that_raises_in_the_delta_leaves_no_keyword_document_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part_way: int) -> None:
    # Few documents go to the keyword index's delta one by one: should the third run out
    # of memory (before its first term, after one, after two), the two before it must
    # leave the delta too, as the files the apply made leave the state.
    first = _write(tmp_path, 0, 100)
    state = IndexState()
    state.apply([prepare_files(tmp_path, first, max_chars=2000, digests={})])
    before = state.bm25.stats()
    more = _write(tmp_path, 100, 5)
    for i, rel in enumerate(more):  # a few terms each, so "part way" is inside a note
        (tmp_path / rel).write_text(f"# Note {100 + i}\n\n{marker(100 + i)} shared words\n",
                                    encoding="utf-8")
    batch = prepare_files(tmp_path, more, max_chars=2000, digests={})
    real = postings.Slab.counts

    def counts(slab: postings.Slab, terms: list[str] | str) -> list[tuple[dict[str, int], int]]:
        out = real(slab, terms)
        failing = _FailingCounts(out[2][0])
        failing.after = part_way
        return [*out[:2], (failing, out[2][1]), *out[3:]]

    monkeypatch.setattr(postings.Slab, "counts", counts)
    with pytest.raises(MemoryError):
        state.apply([batch])
    assert sorted(state.files) == first
    keys = {k for info in state.files.values() for k in info.keys}
    assert set(state.chunks.live) == keys == set(state.bm25.live)
    assert state.bm25.stats() == before
    assert state.keyword_search("shared", 5) == []
    monkeypatch.undo()
    state.apply([batch])
    assert [state.chunks[k].path for k, _ in state.keyword_search(marker(103), 5)] == [more[3]]
    assert len(state.keyword_search("shared", 10)) == 5


def _no_merge(*args: object, **kwargs: object) -> object:
    raise MemoryError("no room for the merged postings")


def _faulty_merge(*args: object, **kwargs: object) -> object:
    raise RuntimeError("a fault in the merge")


@pytest.mark.parametrize("merge", [_no_merge, _faulty_merge], ids=["memory", "fault"])
def test_a_compaction_that_runs_out_of_memory_after_a_small_apply_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        merge: Callable[..., object]) -> None:
    # Small applies go to the keyword index's delta; the one that fills it compacts. It
    # is upkeep: out of memory or a fault, the apply is done and the index as it was.
    state = IndexState()
    state.apply([prepare_files(tmp_path, _write(tmp_path, 0, 300), max_chars=2000,
                               digests={})])
    i = 300
    while state.bm25.stats()["delta_docs"] < bm25.DELTA_MIN_DOCS:
        state.apply([prepare_files(tmp_path, _write(tmp_path, i, 1), max_chars=2000,
                                   digests={})])
        i += 1
    monkeypatch.setattr(postings, "merge", merge)
    last = _write(tmp_path, i, 1)
    state.apply([prepare_files(tmp_path, last, max_chars=2000, digests={})])
    assert state.bm25.stats()["delta_docs"] == bm25.DELTA_MIN_DOCS + 1  # not compacted
    keys = {k for info in state.files.values() for k in info.keys}
    assert set(state.chunks.live) == keys == set(state.bm25.live)
    assert [k for k, _ in state.keyword_search(marker(i), 5)] == list(
        state.files[last[0]].keys)
    # (When the compaction is tried again: the next test.)


def test_a_compaction_that_runs_out_of_memory_after_a_removal_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm25, "DEAD_MIN_ROWS", 8)
    rels = _write(tmp_path, 0, 100)
    state = IndexState()
    state.apply([prepare_files(tmp_path, rels, max_chars=2000, digests={})])
    for rel in rels[:25]:
        (tmp_path / rel).unlink()
    state.apply([prepare_files(tmp_path, rels[:25], max_chars=2000, digests={})])
    assert state.bm25.stats()["dead_rows"] == 25  # one more and it compacts
    (tmp_path / rels[50]).write_text(f"# Note 50\n\n{marker(50)} edited\n", encoding="utf-8")
    monkeypatch.setattr(postings, "merge", _no_merge)
    state.apply([prepare_files(tmp_path, [rels[50]], max_chars=2000,
                               digests={rels[50]: None})])
    keys = {k for info in state.files.values() for k in info.keys}
    assert set(state.chunks.live) == keys == set(state.bm25.live)
    assert [state.chunks[k].path for k, _ in state.keyword_search("edited", 5)] == [rels[50]]


def test_a_compaction_that_runs_out_of_memory_after_the_postings_merge_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The merge itself succeeds; making the new term table (terms of removed notes are
    # dropped) runs out of memory: nothing of the merge may have replaced the old state.
    rels = _write(tmp_path, 0, 300)
    state = IndexState()
    state.apply([prepare_files(tmp_path, rels, max_chars=2000, digests={})])
    (tmp_path / rels[0]).unlink()  # its marker, its only term, goes at the next merge
    state.apply([prepare_files(tmp_path, rels[:1], max_chars=2000, digests={})])

    def term_table(*args: object, **kwargs: object) -> object:
        raise MemoryError("no room for the term table")

    monkeypatch.setattr(postings, "term_table", term_table)
    added = _write(tmp_path, 300, bm25.DELTA_MIN_DOCS + 1)
    for rel in added:  # one apply each: the delta fills, the last one compacts
        state.apply([prepare_files(tmp_path, [rel], max_chars=2000, digests={})])
    assert state.bm25.stats()["merges"] == 1  # the first build's; the compaction failed
    keys = {k for info in state.files.values() for k in info.keys}
    assert set(state.chunks.live) == keys == set(state.bm25.live)
    for i in (1, 150, 300, 300 + bm25.DELTA_MIN_DOCS):
        rel = rels[i] if i < 300 else added[i - 300]
        assert [k for k, _ in state.keyword_search(marker(i), 5)] == list(
            state.files[rel].keys), i
    # Until there is twice as much to do, no write tries the compaction again.
    attempts = []
    real = postings.merge

    def counted(*args: object, **kwargs: object) -> object:
        attempts.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(postings, "merge", counted)
    more = _write(tmp_path, 1000, 20)
    for rel in more:
        state.apply([prepare_files(tmp_path, [rel], max_chars=2000, digests={})])
    assert attempts == []
    monkeypatch.undo()
    for rel in _write(tmp_path, 1100, bm25.DELTA_MIN_DOCS + 1):
        state.apply([prepare_files(tmp_path, [rel], max_chars=2000, digests={})])
    assert state.bm25.stats()["merges"] == 2, state.bm25.stats()  # compacted again
    assert [k for k, _ in state.keyword_search(marker(1010), 5)] == list(
        state.files[more[10]].keys)
