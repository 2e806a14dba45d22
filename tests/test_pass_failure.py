"""A large indexing pass that fails part-way: what it applied stays searchable, the
index stays whole, and the next reconcile indexes what the failure left out. A note that
cannot be read fails no pass at all.

The workspace index runs on real files with its own watcher (a silent change source, so
only the reconciles the test asks for apply anything). The failures are raised where the
real read of one note happens: a read error (EIO from the disk), that note's alone, or
running out of memory, which fails its batch and so the pass; or a keyword-index merge
raises; or the pass is cancelled; or a worker process is killed (SIGKILL). The passes are
large enough to apply some of their files before they fail.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from test_cli import recalld
from waits import wait_value, workspace_status
from watcher_harness import eventually

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index import bm25, postings, prepare
from recalld.daemon.index.passes import APPLY_MIN_FILES, POOL_MIN_FILES
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.procpool import PreparePool
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.state import IndexState
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import Change, ScriptedChangeSource
from recalld.daemon.workspaces import Workspace

# Indexed at start, then a batch of new notes larger than one apply: the first apply of
# the new notes is staged (the index holds more than it adds) before the failure.
BEFORE = 1100
ADDED = 1200
# The new note that cannot be read: prepared only after the pass's first apply (of 512
# files), also when worker processes prepare batches of 128 a few batches ahead.
BAD_AT = 1050


def _write(root: Path, first: int, count: int) -> list[str]:
    """Notes ``first`` to ``first + count - 1``, each with its own marker word; their
    paths sort in their order (as a pass takes them)."""
    assert first + count <= 2800
    rels = []
    for i in range(first, first + count):
        rel = f"memory/2026-07-{i // 100 + 1:02d}/n{i:05d}.md"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {i}\n\ncommon words and marker{i}\n", encoding="utf-8")
        rels.append(rel)
    return rels


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _failing_read(monkeypatch: pytest.MonkeyPatch,
                  error: Callable[[str], BaseException]) -> set[str]:
    """Names of notes whose read raises ``error(path)``, while listed (a removed one
    reads as gone)."""
    bad: set[str] = set()
    real = prepare._read_note

    def read(root: Path, rel: str, real_root: str | None = None,
             ) -> tuple[bytes, os.stat_result] | None:
        if rel.rsplit("/", 1)[-1] in bad and (root / rel).exists():
            raise error(rel)
        return real(root, rel, real_root)

    monkeypatch.setattr(prepare, "_read_note", read)
    return bad


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Names of notes whose read fails with EIO (as a failing disk does), while listed."""
    yield _failing_read(monkeypatch, lambda rel: OSError(errno.EIO, os.strerror(errno.EIO), rel))


@pytest.fixture
def out_of_memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Names of notes whose read runs out of memory, while listed: their batch fails."""
    yield _failing_read(monkeypatch, lambda rel: MemoryError(f"reading {rel}"))


def _index(tmp_path: Path, pool: PreparePool | None = None,
           source: ScriptedChangeSource | None = None) -> WorkspaceIndex:
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace("w", root, WorkspaceSettings())
    # No commit during the test: what a search sees comes from the passes alone.
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=3600.0)
    cpu = trio.CapacityLimiter(2)
    index = WorkspaceIndex(ws, cfg, cpu=cpu, pool=pool)
    index.watcher = Watcher(
        root, ["memory", "digest"], apply=index.apply_paths,
        known=index.known_files, source=source or ScriptedChangeSource(),
        config=WatcherConfig(reconcile_interval_s=3600.0, restart_backoff_initial_s=3600.0,
                             apply_batch_max=1 << 30),
        limiter=cpu)
    return index


def _unsearchable(index: WorkspaceIndex) -> list[str]:
    """The indexed notes a search for their own marker does not find."""
    missing = []
    state = index.state
    for path, info in state.files.items():
        marker = f"marker{int(path.rsplit('/n', 1)[1][:-3])}"
        if [k for k, _ in state.keyword_search(marker, 5)] != list(info.keys):
            missing.append(path)
    return sorted(missing)


def _whole(index: WorkspaceIndex) -> None:
    """Files, chunks and keyword index hold the same documents, none waiting aside."""
    state = index.state
    keys = {k for info in state.files.values() for k in info.keys}
    assert set(state.chunks.live) == keys
    assert set(state.bm25.live) == keys
    assert not state.bm25.staged


async def test_a_failure_part_way_leaves_what_was_applied_searchable(
        tmp_path: Path, out_of_memory: set[str]) -> None:
    assert ADDED >= POOL_MIN_FILES and BAD_AT >= 2 * APPLY_MIN_FILES
    index = _index(tmp_path)
    root = index.root
    _write(root, 0, BEFORE)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)  # after its startup reconcile (the first build)
        assert len(index.state.files) == BEFORE and not _unsearchable(index)
        added = _write(root, BEFORE, ADDED)
        bad = added[BAD_AT]
        out_of_memory.add(bad.rsplit("/", 1)[-1])
        with pytest.raises(BaseException) as failed:
            await index.watcher.reconcile("a batch of new notes")
        assert isinstance(_leaf(failed.value), MemoryError)
        # Some of the new notes were applied before the failure, the failing one not.
        applied = set(index.state.files)
        assert BEFORE < len(applied) < BEFORE + ADDED and bad not in applied
        # Everything the index lists is found, before any commit.
        assert _unsearchable(index) == []
        _whole(index)
        # The next reconcile indexes the rest once the note reads again.
        out_of_memory.clear()
        await index.watcher.reconcile("after the failure")
        assert len(index.state.files) == BEFORE + ADDED and bad in index.state.files
        assert _unsearchable(index) == []
        _whole(index)
        nursery.cancel_scope.cancel()


async def test_a_note_that_cannot_be_read_holds_back_no_other(
        tmp_path: Path, unreadable: set[str]) -> None:
    # A read error is the note's, not the pass's: the others are indexed, the note keeps
    # what the index had of it, and a reconcile once it reads again indexes it.
    index = _index(tmp_path)
    root = index.root
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        rels = _write(root, 0, BEFORE)
        unreadable.add(rels[100].rsplit("/", 1)[-1])
        await index.watcher.reconcile("a first build")
        assert sorted(index.state.files) == sorted(set(rels) - {rels[100]})
        assert _unsearchable(index) == []
        _whole(index)
        assert list(index.unreadable) == [rels[100]]
        assert index.unreadable[rels[100]]["error"] == os.strerror(errno.EIO)
        assert index.status()["unreadable_paths"] == [rels[100]]
        # An indexed note changed on disk and unreadable now: its last version stays.
        edited = root / rels[5]
        edited.write_text("# Note 5\n\nmarker5 rewritten with newword\n", encoding="utf-8")
        unreadable.add(rels[5].rsplit("/", 1)[-1])
        await index.watcher.reconcile("an edit that cannot be read")
        assert rels[5] in index.state.files and _unsearchable(index) == []
        assert not index.state.keyword_search("newword", 5)
        assert sorted(index.unreadable) == sorted([rels[5], rels[100]])
        # A note never indexed and gone now is no longer listed: the watcher knows it
        # (as a note without a stat), so the reconcile applies its removal.
        gone = root / rels[100]
        gone_text = gone.read_bytes()
        gone.unlink()
        await index.watcher.reconcile("an unreadable note removed")
        assert list(index.unreadable) == [rels[5]]
        unreadable.discard(gone.name)
        gone.write_bytes(gone_text)
        # A rebuild reads every note again: one it cannot read is not in the new index,
        # and still listed (the reconcile after the swap tries it again).
        await index.rebuild(lambda done, total, stage: None)
        assert rels[5] not in index.state.files and list(index.unreadable) == [rels[5]]
        assert sorted(set(rels) - set(index.state.files)) == [rels[5]]
        unreadable.clear()
        await index.watcher.reconcile("readable again")
        assert len(index.state.files) == BEFORE and _unsearchable(index) == []
        assert index.unreadable == {} and index.status()["unreadable"] == 0
        assert [k for k, _ in index.state.keyword_search("newword", 5)] == list(
            index.state.files[rels[5]].keys)
        _whole(index)
        nursery.cancel_scope.cancel()


async def test_a_note_that_cannot_be_read_leaves_the_list_with_its_directory(
        tmp_path: Path, unreadable: set[str]) -> None:
    # Never indexed, so only the list knows it: a directory removed as a whole (one
    # event, no event per note in it) takes it off the list.
    source = ScriptedChangeSource()
    index = _index(tmp_path, source=source)
    root = index.root
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        kept = _write(root, 0, 10)
        (lost,) = _write(root, 900, 1)
        unreadable.add(lost.rsplit("/", 1)[-1])
        await index.watcher.reconcile("one note cannot be read")
        assert list(index.unreadable) == [lost] and sorted(index.state.files) == kept
        folder = (root / lost).parent
        shutil.rmtree(folder)
        assert source.emit([(Change.deleted, folder)])
        await eventually(lambda: not index.unreadable)
        assert sorted(index.state.files) == kept
        nursery.cancel_scope.cancel()


async def test_a_worker_killed_part_way_loses_no_note(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A worker process that dies fails no pass: its batches are prepared in threads.
    pool = PreparePool(2)
    index = _index(tmp_path, pool)
    root = index.root
    _write(root, 0, BEFORE)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await nursery.start(index.run)
        _write(root, BEFORE, ADDED)
        killed: list[int] = []
        others = set(multiprocessing.active_children())  # none of the pool's yet

        async def kill_a_worker_after_an_apply() -> None:
            with trio.fail_after(120):
                while len(index.state.files) == BEFORE:
                    await trio.sleep(0.005)
            workers = [p.pid for p in multiprocessing.active_children()
                       if p not in others and p.pid is not None]
            if workers:  # the pool's, working on the pass's next batches
                killed.append(workers[0])
                os.kill(workers[0], signal.SIGKILL)

        nursery.start_soon(kill_a_worker_after_an_apply)
        await index.watcher.reconcile("a batch of new notes")
        assert pool.status()["calls"] > 0
        assert len(index.state.files) == BEFORE + ADDED
        assert _unsearchable(index) == []
        _whole(index)
        nursery.cancel_scope.cancel()
    # The kill came while the pass still had batches for the pool (else it showed nothing).
    assert killed
    assert "indexing worker processes failed" in caplog.text


async def test_a_merge_that_raises_leaves_the_index_whole_and_retries_its_notes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = _index(tmp_path)
    root = index.root
    _write(root, 0, BEFORE)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        added = _write(root, BEFORE, ADDED)
        real = postings.merge
        failures = [MemoryError("no room for the merged postings")]

        def merge(*args: object, **kwargs: object) -> object:
            if failures:
                raise failures.pop()
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(postings, "merge", merge)
        with pytest.raises(BaseException) as failed:
            await index.watcher.reconcile("a batch of new notes")
        assert isinstance(_leaf(failed.value), MemoryError)
        # The staged applies are found; the notes of the apply whose merge failed are
        # left out, for the next reconcile to read again.
        assert BEFORE < len(index.state.files) < BEFORE + ADDED
        _whole(index)
        assert _unsearchable(index) == []
        # Committed as it is, and served from the files written (loaded back whole).
        await index.compact()
        assert index.last_commit is not None
        assert index.last_commit["files"] == len(index.state.files)
        assert index.state.mapped and not index.state.bm25.terms_built
        _whole(index)
        assert _unsearchable(index) == []
        await index.watcher.reconcile("after the failed merge")
        assert set(index.state.files) >= set(added)
        assert len(index.state.files) == BEFORE + ADDED
        assert _unsearchable(index) == []
        _whole(index)
        nursery.cancel_scope.cancel()


async def test_a_pass_cancelled_part_way_leaves_what_it_applied_searchable(
        tmp_path: Path) -> None:
    index = _index(tmp_path)
    root = index.root
    _write(root, 0, BEFORE)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        _write(root, BEFORE, ADDED)
        with trio.CancelScope() as scope:
            async def cancel_after_an_apply() -> None:
                with trio.fail_after(120):
                    while len(index.state.files) == BEFORE:
                        await trio.sleep(0.005)
                scope.cancel()

            nursery.start_soon(cancel_after_an_apply)
            await index.watcher.reconcile("a batch of new notes")
        assert scope.cancelled_caught
        assert BEFORE < len(index.state.files) < BEFORE + ADDED
        assert _unsearchable(index) == []
        _whole(index)
        await index.watcher.reconcile("after the cancelled pass")
        assert len(index.state.files) == BEFORE + ADDED and _unsearchable(index) == []
        _whole(index)
        nursery.cancel_scope.cancel()


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
    assert [k for k, _ in state.keyword_search("marker7", 5)] == list(
        state.files[first[7]].keys)
    # Dropped for good: a later compaction (the merge working again) takes nothing of
    # them into main.
    monkeypatch.undo()
    state.bm25.compact()
    after = state.bm25.stats()
    assert after["docs"] == after["main_rows"] == len(keys) and after["delta_docs"] == 0
    assert not state.keyword_search("marker107", 5)


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
    assert [k for k, _ in state.keyword_search("marker150", 5)] == list(
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
        (tmp_path / rel).write_text(f"# Note {100 + i}\n\nmarker{100 + i} shared words\n",
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
    assert [state.chunks[k].path for k, _ in state.keyword_search("marker103", 5)] == [more[3]]
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
    assert [k for k, _ in state.keyword_search(f"marker{i}", 5)] == list(
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
    (tmp_path / rels[50]).write_text("# Note 50\n\nmarker50 edited\n", encoding="utf-8")
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
    (tmp_path / rels[0]).unlink()  # marker0, its only term, goes at the next merge
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
        assert [k for k, _ in state.keyword_search(f"marker{i}", 5)] == list(
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
    assert [k for k, _ in state.keyword_search("marker1010", 5)] == list(
        state.files[more[10]].keys)


# --------------------------------------------------- a real daemon with two workspaces

# Loaded by every process of the daemon (its worker processes too) through PYTHONPATH:
# while the trigger file exists, reading a note of the listed names runs out of memory
# (or, with FAILING_ERROR=eio, fails as a failing disk does).
SITECUSTOMIZE = """\
import os
names = os.environ.get("FAILING_NAMES")
if names:
    from pathlib import Path
    from recalld.daemon.index import prepare
    _trigger = Path(os.environ["FAILING_TRIGGER"])
    _real = prepare._read_note
    def _read_note(root, rel, real_root=None):
        if _trigger.exists() and rel.rsplit("/", 1)[-1] in names.split(","):
            if os.environ.get("FAILING_ERROR") != "eio":
                raise MemoryError("reading " + rel)
            if os.path.exists(os.path.join(root, rel)):  # a removed note reads as gone
                import errno
                raise OSError(errno.EIO, os.strerror(errno.EIO), rel)
        return _real(root, rel, real_root)
    prepare._read_note = _read_note
"""


def _found(d: Any, agent: str, i: int) -> bool:
    hits = d.call("memory.search", {"agent_id": agent, "query": f"marker{i}",
                                    "max_results": 3})["results"]
    return any(h["path"].endswith(f"/n{i:05d}.md") for h in hits)


def _index_status(d: Any, agent: str) -> dict[str, Any]:
    status: dict[str, Any] = (workspace_status(d, agent) or {"index": {}})["index"]
    return status


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_daemon_serves_what_a_failed_pass_applied_and_the_other_workspace(
        daemon_factory: Any, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, 0, BEFORE)
    _write(b, 0, 50)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    trigger = tmp_path / "memory-runs-out"
    # No commit while the failure is on: what a search finds comes from the passes alone.
    config = (f'[workspaces.a]\npath = "{a}"\n[workspaces.b]\npath = "{b}"\n'
              '[daemon]\npersist_delay_s = 600\n')
    bad = f"n{BEFORE + BAD_AT:05d}.md"
    env = {"PYTHONPATH": str(hooks), "FAILING_NAMES": bad, "FAILING_TRIGGER": str(trigger)}
    d = daemon_factory(config, **env)
    d.call("index.sync", {"agent_id": "a"}, timeout=100)
    d.call("index.sync", {"agent_id": "b"}, timeout=100)
    assert d.stop() == 0  # commits the first build
    # Written while the daemon is down: its startup reconcile is one large pass.
    added = _write(a, BEFORE, ADDED)
    trigger.touch()
    d = daemon_factory(config, **env)
    status = wait_value(lambda: _index_status(d, "a"),
                        lambda s: s.get("watcher", {}).get("errors"),
                        "the startup pass of a fails", 100)
    assert "MemoryError: reading" in status["watcher"]["last_error"], status
    # What the failed pass applied is found (it is listed as indexed), before any commit.
    listed = status["files"]
    assert BEFORE < listed < BEFORE + ADDED
    assert status["loaded_generation"] == 1 and status["last_commit"] is None
    for i in (BEFORE, BEFORE + 255, BEFORE + 511):
        assert _found(d, "a", i), i
    assert _found(d, "a", 7)
    # The other workspace serves and indexes as before.
    assert _found(d, "b", 3)
    (b / "memory/2026-07-01/late.md").write_text("# Late\n\nmarker99999 in b\n")
    d.call("index.sync", {"agent_id": "b"}, timeout=120)
    hits = d.call("memory.search", {"agent_id": "b", "query": "marker99999"})["results"]
    assert [h["path"] for h in hits] == ["memory/2026-07-01/late.md"]
    # Memory again: the watcher's retry indexes the rest of a.
    trigger.unlink()
    # (The retry comes after the watcher's backoff, at most restart_backoff_max_s.)
    wait_value(lambda: _index_status(d, "a"), lambda s: s.get("files") == BEFORE + ADDED,
               "every note of a is indexed", 150)
    for i in (BEFORE + BAD_AT, BEFORE + ADDED - 1, BEFORE + 100):
        assert _found(d, "a", i), i
    assert len(added) == ADDED


@pytest.mark.timeout(120)
def test_a_daemon_lists_the_notes_it_cannot_read_until_they_read_or_go(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "w"
    rels = _write(root, 0, 40)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    trigger = tmp_path / "disk-fails"
    edited, new = rels[7], "memory/2026-07-01/n00090.md"
    others = [f"memory/2026-07-01/n0009{i}.md" for i in (1, 2, 3)]
    env = {"PYTHONPATH": str(hooks),
           "FAILING_NAMES": ",".join(p.rsplit("/", 1)[1] for p in [edited, new, *others]),
           "FAILING_TRIGGER": str(trigger), "FAILING_ERROR": "eio"}
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n', **env)
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable"] == 0
    trigger.touch()
    (root / edited).write_text("# Note 7\n\nmarker7 rewritten with freshword\n")
    (root / new).write_text("# Note 90\n\nmarker90 never read\n")
    for rel in others:
        (root / rel).write_text("# Another\n\nnever read either\n")
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    listed = [edited, new, *others]
    status = _index_status(d, "w")
    assert status["unreadable"] == 5 and status["unreadable_paths"] == listed
    health = (workspace_status(d, "w") or {})["health"]
    assert health["state"] == "degraded" and health["unreadable_paths"] == listed
    assert any("5 note(s) could not be read" in r and edited in r for r in health["reasons"])
    # The first few in last_errors (many must not push other errors out).
    eio = os.strerror(errno.EIO)
    assert {e["what"]: e["error"] for e in health["last_errors"]
            if e["what"].startswith("read ")} == {f"read {p}": eio for p in listed[:3]}
    verbose = recalld("status", "--verbose", env=d.env)
    assert f"w: could not be read: {', '.join(listed)}" in verbose.stdout, verbose.stdout
    for rel in others:
        (root / rel).unlink()
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable_paths"] == [edited, new]
    # The last version read stays searchable; the daemon answers on.
    assert _found(d, "w", 7) and not _found(d, "w", 90)
    assert not d.call("memory.search", {"agent_id": "w", "query": "freshword"})["results"]
    # Removed: no longer listed.
    (root / new).unlink()
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable_paths"] == [edited]
    # Readable again (the next change to it is read): indexed, and health has no reason
    # of it left.
    trigger.unlink()
    (root / edited).write_text("# Note 7\n\nmarker7 rewritten with freshword again\n")
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable"] == 0
    hits = d.call("memory.search", {"agent_id": "w", "query": "freshword"})["results"]
    assert [h["path"] for h in hits] == [edited]
    health = (workspace_status(d, "w") or {})["health"]
    assert health["unreadable"] == 0 and health["state"] != "degraded", health
