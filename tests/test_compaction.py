"""The keyword index compacts without holding the index lock through its merge: searches
and edits go on meanwhile, and what they changed is carried into the compacted index."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index import bm25, postings
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.state import Filters
from recalld.daemon.watcher import WatcherConfig
from recalld.daemon.workspaces import Workspace


def _note(root: Path, i: int, words: str) -> None:
    path = root / f"memory/2026-07-01/n{i:03d}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Note {i}\n\nmarker{i} {words}\n", encoding="utf-8")


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


async def _paths(index: WorkspaceIndex, query: str) -> list[str]:
    found = await index.candidates(query, 50, Filters(), None)
    return sorted(found.chunks[k].path for k, _ in found.keyword)


async def test_searches_and_edits_go_on_while_the_keyword_index_compacts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    index = _index(tmp_path, root, monkeypatch)
    # Once armed, a merge waits until released (in its worker thread).
    armed, merging, release = threading.Event(), threading.Event(), threading.Event()
    real = postings.merge

    def merge(*args: object, **kwargs: object) -> object:
        if armed.is_set():
            merging.set()
            release.wait(120)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(postings, "merge", merge)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(index.run)
            await index.sync()
            merges = index.state.bm25.stats()["merges"]
            armed.set()
            with trio.fail_after(60):  # edits fill the delta past its limit of 4
                for i in range(5):
                    _note(root, i, "second words")
                    await index.sync()
                while not merging.is_set():
                    await trio.sleep(0.01)
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
            with trio.fail_after(60):
                while index.state.bm25.stats()["merges"] == merges:
                    await trio.sleep(0.01)
            stats = index.state.bm25.stats()
            assert index._access.compactions == 1  # the background task's, not a write's
            assert stats["delta_docs"] <= 3  # the edits made during the merge
            assert await _paths(index, "third") == [
                f"memory/2026-07-01/n{i:03d}.md" for i in (2, 7, 30)]
            assert await _paths(index, "second") == [
                f"memory/2026-07-01/n{i:03d}.md" for i in (0, 1, 3, 4)]
            assert await _paths(index, "first") == [
                f"memory/2026-07-01/n{i:03d}.md" for i in range(5, 20) if i != 7]
            assert await _paths(index, "marker2") == ["memory/2026-07-01/n002.md"]
            assert stats["docs"] == len(index.state.chunks) == 21
            with trio.fail_after(60):  # and the compacted index is saved
                while index.status()["uncommitted_changes"] or index.last_commit is None:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        release.set()


async def test_a_compaction_that_fails_leaves_the_index_serving_and_is_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    index = _index(tmp_path, root, monkeypatch)
    failing, failed = threading.Event(), threading.Event()
    real = postings.merge

    def merge(*args: object, **kwargs: object) -> object:
        if failing.is_set():
            failed.set()
            raise RuntimeError("a fault in the merge")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(postings, "merge", merge)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await index.sync()
        merges = index.state.bm25.stats()["merges"]
        failing.set()
        with trio.fail_after(60):
            i = 0
            while not failed.is_set():
                _note(root, 100 + i, "second words")  # new notes: the delta only grows
                await index.sync()
                i += 1
                await trio.sleep(0.01)
        failing.clear()
        # Still serving: searches answer, edits apply.
        with trio.fail_after(60):
            _note(root, 40, "third words")
            await index.sync()
            assert await _paths(index, "third") == ["memory/2026-07-01/n040.md"]
        assert index.state.bm25.stats()["merges"] == merges
        # Tried again once there is twice as much to do.
        retry_at = index.state.bm25._compact_retry_at
        assert retry_at > 0
        with trio.fail_after(60):
            i = 0
            while index._access.compactions == 0:
                _note(root, 500 + i, "fourth words")
                await index.sync()
                i += 1
                await trio.sleep(0.01)
        assert await _paths(index, "third") == ["memory/2026-07-01/n040.md"]
        assert index.state.bm25.stats()["merges"] == merges + 1
        # Not before there was twice as much to do: each edit above added one document,
        # from the failure's delta + dead rows (retry_at / 2), n040 one more.
        assert i >= retry_at // 2 - 1
        nursery.cancel_scope.cancel()
