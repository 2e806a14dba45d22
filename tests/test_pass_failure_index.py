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

import pytest
import trio
from markers import marker
from pass_notes import ADDED, BAD_AT, BEFORE, _write
from watcher_harness import eventually

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index import postings, prepare
from recalld.daemon.index.passes import APPLY_MIN_FILES, POOL_MIN_FILES
from recalld.daemon.index.procpool import PreparePool
from recalld.daemon.index.records import note_stamp
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import Change, ScriptedChangeSource
from recalld.daemon.workspaces import Workspace


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
        limiter=cpu, stamp=note_stamp)
    return index


def _unsearchable(index: WorkspaceIndex) -> list[str]:
    """The indexed notes a search for their own marker does not find."""
    missing = []
    state = index.state
    for path, info in state.files.items():
        word = marker(int(path.rsplit('/n', 1)[1][:-3]))
        if [k for k, _ in state.keyword_search(word, 5)] != list(info.keys):
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
        edited.write_text(f"# Note 5\n\n{marker(5)} rewritten with newword\n", encoding="utf-8")
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
