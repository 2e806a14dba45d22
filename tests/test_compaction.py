"""The keyword index compacts without holding the index lock through its merge: searches
and edits go on meanwhile, and what they changed is carried into the compacted index."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
from hooks import run_first
from markers import marker
from waits import until

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index import bm25, postings
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace


def _note(root: Path, i: int, words: str) -> None:
    path = root / f"memory/2026-07-01/n{i:03d}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Note {i}\n\n{marker(i)} {words}\n", encoding="utf-8")


def _index(tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> WorkspaceIndex:
    """An index service over 20 notes whose keyword delta compacts past 4 documents."""
    monkeypatch.setattr(bm25, "DELTA_MIN_DOCS", 4)
    for i in range(20):
        _note(root, i, "first words")
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    return WorkspaceIndex(Workspace("w", root, WorkspaceSettings()), cfg,
                          cpu=trio.CapacityLimiter(2), background=trio.CapacityLimiter(1),
                          watcher_config=WatcherConfig(reconcile_interval_s=3600.0))


async def _settled(index: WorkspaceIndex) -> None:
    """The notes indexed, and the compaction the first 20 of them made due done."""
    await index.sync()
    await until(lambda: not index.state.bm25.compaction_due(), "the first compaction", 60)


async def _paths(index: WorkspaceIndex, query: str) -> list[str]:
    found = await index.candidates(query, 50, Filters(), None)
    return sorted(found.chunks[k].path for k, _ in found.keyword)


async def test_searches_and_edits_go_on_while_the_keyword_index_compacts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    index = _index(tmp_path, root, monkeypatch)
    # Once armed, a merge waits until released (in its worker thread).
    armed, merging, release = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        if armed.is_set():
            merging.set()
            release.wait(120)

    run_first(monkeypatch, postings, "merge", hold)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(index.run)
            await _settled(index)
            merges = index.state.bm25.stats()["merges"]
            compactions = index.state.bm25.compactions
            armed.set()
            with trio.fail_after(60):  # edits fill the delta past its limit of 4
                for i in range(5):
                    _note(root, i, "second words")
                    await index.sync()
            await until(merging.is_set, "the compaction's merge", 60)
            # The merge is under way: searches and edits do not wait for it.
            with trio.fail_after(30):
                assert await _paths(index, "second") == [
                    f"memory/2026-07-01/n{i:03d}.md" for i in range(5)]
                _note(root, 7, "third words")  # a main row, now dead
                _note(root, 2, "third words")  # a delta document being merged, replaced
                _note(root, 30, "third words")  # new
                await index.sync()
                assert await _paths(index, "third") == [
                    f"memory/2026-07-01/n{i:03d}.md" for i in (2, 7, 30)]
            assert index.state.bm25.stats()["merges"] == merges
            release.set()
            await until(lambda: index.state.bm25.stats()["merges"] != merges,
                        "the compaction installed", 60)
            await index.locked(lambda state: None)  # its install, under the lock, is done
            stats = index.state.bm25.stats()
            # The background task's, not a write's.
            assert index.state.bm25.compactions == compactions + 1
            assert stats["delta_docs"] <= 3  # the edits made during the merge
            assert await _paths(index, "third") == [
                f"memory/2026-07-01/n{i:03d}.md" for i in (2, 7, 30)]
            assert await _paths(index, "second") == [
                f"memory/2026-07-01/n{i:03d}.md" for i in (0, 1, 3, 4)]
            assert await _paths(index, "first") == [
                f"memory/2026-07-01/n{i:03d}.md" for i in range(5, 20) if i != 7]
            assert await _paths(index, marker(2)) == ["memory/2026-07-01/n002.md"]
            assert stats["docs"] == len(index.state.chunks) == 21
            await until(lambda: not index.status()["uncommitted_changes"]
                        and index.last_commit is not None, "the compacted index saved", 60)
            nursery.cancel_scope.cancel()
    finally:
        release.set()


async def test_a_compaction_that_fails_leaves_the_index_serving_and_is_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    index = _index(tmp_path, root, monkeypatch)
    # Writes never compact in place here: the retry below is the background task's,
    # however far the edits run ahead of it.
    monkeypatch.setattr(bm25, "BACKSTOP_FACTOR", 1000)
    failing, failed = threading.Event(), threading.Event()

    def fault() -> None:
        if failing.is_set():
            failed.set()
            raise RuntimeError("a fault in the merge")

    run_first(monkeypatch, postings, "merge", fault)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await _settled(index)
        merges = index.state.bm25.stats()["merges"]
        compactions = index.state.bm25.compactions
        failing.set()
        with trio.fail_after(60):
            i = 0
            while not failed.is_set():
                _note(root, 100 + i, "second words")  # new notes: the delta only grows
                await index.sync()
                i += 1
        # The failure is recorded (retry postponed) before the merge may succeed again.
        await until(lambda: index.state.bm25.compaction_retry_at > 0, "the failure noted", 60)
        failing.clear()
        # Still serving: searches answer, edits apply.
        with trio.fail_after(60):
            _note(root, 40, "third words")
            await index.sync()
            assert await _paths(index, "third") == ["memory/2026-07-01/n040.md"]
        assert index.state.bm25.stats()["merges"] == merges
        # Not tried again before there is twice as much to do: the delta is past its
        # limit (4), the retry waits for delta + dead rows to reach twice the failure's.
        bm = index.state.bm25
        retry_at = bm.compaction_retry_at
        assert bm.stats()["delta_docs"] > 4 and not bm.compaction_due()
        assert bm.stats()["delta_docs"] + bm.stats()["dead_rows"] < retry_at
        with trio.fail_after(60):
            i = 0
            while index.state.bm25.compactions == compactions:
                _note(root, 500 + i, "fourth words")
                await index.sync()
                i += 1
        await index.locked(lambda state: None)  # its install, under the lock, is done
        assert await _paths(index, "third") == ["memory/2026-07-01/n040.md"]
        assert index.state.bm25.stats()["merges"] == merges + 1
        nursery.cancel_scope.cancel()
