"""A start serves the keyword delta as the last commit saved it: searches read it at once,
its dicts are made off the index lock once the start is over (or by the first write that
comes sooner), and what is saved next is the same index."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from markers import marker
from waits import until

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index.delta import Delta, DeltaDocs, DeltaPostings, SavedDelta
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace

MAIN_NOTES = 80


def _note(root: Path, i: int, words: str) -> str:
    rel = f"memory/2026-07-01/n{i:03d}.md"
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# Note {i}\n\n{marker(i)} {words}\n", encoding="utf-8")
    return rel


def _index(tmp_path: Path, root: Path,
           hold: Callable[[], trio.Event] | None = None) -> WorkspaceIndex:
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    return WorkspaceIndex(Workspace("w", root, WorkspaceSettings()), cfg,
                          cpu=trio.CapacityLimiter(2), background=trio.CapacityLimiter(1),
                          watcher_config=WatcherConfig(reconcile_interval_s=3600.0),
                          hold=None if hold is None else (lambda: hold().wait()))


async def _paths(index: WorkspaceIndex, query: str) -> list[str]:
    found = await index.candidates(query, 200, Filters(), None)
    return sorted(found.chunks[k].path for k, _ in found.keyword)


async def _committed(index: WorkspaceIndex, what: str = "the commit",
                     deadline_s: float = 120.0) -> None:
    await until(lambda: index.last_commit is not None
                and not index.status()["uncommitted_changes"], what, deadline_s)


def _names(*ids: int) -> list[str]:
    return [f"memory/2026-07-01/n{i:03d}.md" for i in ids]


async def _first_run(tmp_path: Path, root: Path) -> None:
    """80 notes compacted into main, then 5 of them edited and 3 new ones (the delta);
    committed."""
    for i in range(MAIN_NOTES):
        _note(root, i, "first words")
    index = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await index.sync()
        await index.compact()  # (a burst of new notes stays in the delta)
        for i in [*range(5), *range(100, 103)]:
            _note(root, i, "second words")
        await index.sync()
        stats = index.state.bm25.stats()
        assert stats["delta_docs"] == 8 and stats["docs"] == MAIN_NOTES + 3
        await _committed(index)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("first", ["the start's end", "a write"])
async def test_a_start_searches_the_saved_delta_and_makes_its_dicts_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str) -> None:
    root = tmp_path / "ws"
    await _first_run(tmp_path, root)
    # Every delta's dicts are made off the index lock and adopted, none in place.
    in_place = []
    real = Delta.thaw

    def thaw(self: Delta) -> None:
        if self.saved_form is not None:
            in_place.append(True)
        real(self)

    monkeypatch.setattr(Delta, "thaw", thaw)
    started = trio.Event()
    index = _index(tmp_path, root, hold=lambda: started)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        bm25 = index.state.bm25
        form = bm25.delta.saved_form
        assert form is not None
        assert await _paths(index, "second") == _names(0, 1, 2, 3, 4, 100, 101, 102)
        assert await _paths(index, marker(3)) == _names(3)
        assert len(await _paths(index, "first")) == MAIN_NOTES - 5
        assert bm25.delta.saved_form is form  # the searches read it as saved
        if first == "a write":
            # Before the start is over: the write makes the dicts first, off the lock
            # (the watch waits for the start too, so the apply is called as it would).
            _note(root, 2, "third words")
            _note(root, 103, "third words")
            await index.apply_paths({_names(2)[0], _names(103)[0]})
            assert bm25.delta.saved_form is None
            assert await _paths(index, "third") == _names(2, 103)
            assert await _paths(index, "second") == _names(0, 1, 3, 4, 100, 101, 102)
        started.set()
        await until(lambda: bm25.delta.saved_form is None, "the delta's dicts", 60)
        await until(lambda: index.status()["load_checked"], "the checksums", 60)
        second = _names(0, 1, 3, 4, 100, 101, 102) if first == "a write" else _names(
            0, 1, 2, 3, 4, 100, 101, 102)
        assert await _paths(index, "second") == second
        # Then it changes as any delta: an edit of a delta note, one of main, a removal.
        _note(root, 0, "fourth words")
        _note(root, 50, "fourth words")
        (root / _names(101)[0]).unlink()
        await index.sync()
        assert await _paths(index, "fourth") == _names(0, 50)
        assert await _paths(index, marker(101)) == []
        await _committed(index)
        nursery.cancel_scope.cancel()
    # The next start reads what this one saved.
    again = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run)
        assert await _paths(again, "fourth") == _names(0, 50)
        assert await _paths(again, "second") == [p for p in second
                                                 if p not in _names(0, 101)]
        assert await _paths(again, "third") == (_names(2, 103) if first == "a write" else [])
        nursery.cancel_scope.cancel()
    assert not in_place


async def test_a_failure_to_make_the_dicts_after_the_start_leaves_the_delta_as_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    await _first_run(tmp_path, root)
    real = SavedDelta.thaw
    failed = []

    def thaw(self: SavedDelta) -> tuple[DeltaDocs, DeltaPostings]:
        if not failed:  # the background step's: out of memory
            failed.append(True)
            raise MemoryError("no room for the delta's dicts")
        return real(self)

    monkeypatch.setattr(SavedDelta, "thaw", thaw)
    index = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await until(lambda: bool(failed), "the background step", 60)
        await until(lambda: index.status()["load_checked"], "the checksums", 60)
        bm25 = index.state.bm25
        assert bm25.delta.saved_form is not None  # still served as saved
        assert await _paths(index, "second") == _names(0, 1, 2, 3, 4, 100, 101, 102)
        _note(root, 1, "fifth words")  # a write has the dicts made first
        await index.sync()
        assert bm25.delta.saved_form is None
        assert await _paths(index, "fifth") == _names(1)
        assert await _paths(index, "second") == _names(0, 2, 3, 4, 100, 101, 102)
        nursery.cancel_scope.cancel()
