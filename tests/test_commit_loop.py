"""The persist loop keeps committing after an explicit commit (a compaction, a rebuild)
was made while it waited for changes: edits after one are saved without a stop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
from hooks import run_first
from markers import marker
from test_saved_delta import _committed, _index, _note, _paths
from waits import until

from recalld.daemon.index import persist
from recalld.daemon.index.chunktable import ChunkTable


async def test_edits_after_an_explicit_compaction_are_committed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(12):
        _note(root, i, "first words")
    index = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await index.sync()
        await _committed(index, "the first build's commit", 30)  # the loop waits for changes again
        first = index.last_commit
        await index.compact()  # commits at once, while the loop waits
        assert index.last_commit is not first
        for round_ in range(2):
            _note(root, 100 + round_, "later words")
            await index.sync()
            assert index.status()["uncommitted_changes"] > 0
            await _committed(index, f"the commit of edit {round_} after the compaction", 30)
        nursery.cancel_scope.cancel()


async def test_the_changes_of_a_commit_under_way_are_uncommitted_until_it_is_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A commit took the changes it saves from the count at its snapshot: while its files
    # were being written, status said nothing was uncommitted, and a waiter (a backup,
    # index.verify, a client) saw the last generation as all there was.
    root = tmp_path / "ws"
    for i in range(3):
        _note(root, i, "first words")
    saving, release = threading.Event(), threading.Event()

    def hold() -> None:
        saving.set()
        release.wait(120)

    run_first(monkeypatch, persist.IndexStore, "save", hold)
    index = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        try:  # the held save is let go before the index stops (its last commit waits)
            await index.sync()
            await until(saving.is_set, "the first commit saving")
            assert index.last_commit is None
            assert index.status()["uncommitted_changes"] == 3
            _note(root, 3, "later words")  # applied while the first is saved
            await index.sync()
            assert index.status()["uncommitted_changes"] == 4
        finally:
            release.set()
        await _committed(index, "every change saved", 30)
        assert index.last_commit is not None and index.last_commit["files"] == 4
        nursery.cancel_scope.cancel()


async def test_a_snapshot_that_fails_loses_no_change_and_the_loop_retries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A commit takes the changes from the count before its snapshot: a snapshot that
    # failed (out of memory copying the chunk table) dropped them, so the next commit
    # might never come and status said nothing was uncommitted; the MemoryError also
    # ended the persist loop and with it the index.
    root = tmp_path / "ws"
    for i in range(3):
        _note(root, i, "first words")
    calls, retrying, release = [], threading.Event(), threading.Event()

    def fail_then_hold() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError
        if len(calls) == 2:
            retrying.set()
            release.wait(120)

    run_first(monkeypatch, ChunkTable, "copy", fail_then_hold)
    index = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        try:
            await index.sync()
            await until(retrying.is_set, "the commit after the failed snapshot")
            status = index.status()
            assert status["uncommitted_changes"] == 3, status
            assert status["persist_error"] is not None, status
            assert "out of memory" in status["persist_error"]["error"]
            assert index.last_commit is None
        finally:
            release.set()
        await _committed(index, "every change saved", 30)
        assert index.last_commit is not None and index.last_commit["files"] == 3
        assert index.status()["persist_error"] is None
        nursery.cancel_scope.cancel()


async def test_serving_a_saved_generation_out_of_memory_keeps_the_index_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # After a save the index is served from the files just written (their chunk table
    # read back): out of memory there ended the persist loop, and the index with it,
    # though the generation was saved and the state in memory was whole.
    root = tmp_path / "ws"
    for i in range(3):
        _note(root, i, "first words")
    full = threading.Event()

    def no_memory() -> None:
        if full.is_set():
            raise MemoryError

    run_first(monkeypatch, ChunkTable, "from_arrays", no_memory)
    index = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await index.sync()
        await _committed(index, "the first build's commit", 30)
        full.set()
        for round_ in range(2):  # the persist loop goes on after the first
            first = index.last_commit
            _note(root, 10 + round_, f"{marker(round_, 'later')} words")
            await index.sync()
            await _committed(index, f"edit {round_}'s commit", 30)
            assert index.last_commit is not first
            assert index.status()["persist_error"] is None
            found = await _paths(index, marker(round_, "later"))
            assert found == [f"memory/2026-07-01/n{10 + round_:03d}.md"]
        full.clear()
        nursery.cancel_scope.cancel()
