"""Change events into index batches: editor saves, renames and deletes, directory moves,
coalescing, bounded memory in an event storm, a silent source caught up by the periodic
reconcile, and editor litter that is not a note.

Under the autojump clock, with a scripted change source.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trio
from watcher_harness import disk_notes, eventually, make, write
from watchfiles import Change


async def test_editor_saves_renames_and_deletes(tmp_path: Path, autojump_clock: object) -> None:
    day = tmp_path / "memory" / "2026-07-23"
    note = write(day / "commute.md", "v1")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert index.texts() == {"memory/2026-07-23/commute.md": "v1"}

        # Save through a temp file and a rename.
        tmp = write(day / "commute.md.tmp.1234", "v2")
        os.replace(tmp, note)
        src.emit([(Change.added, tmp), (Change.deleted, tmp), (Change.added, note)])
        await eventually(lambda: index.texts().get("memory/2026-07-23/commute.md") == "v2")

        # vim: swap file, probe file 4913, original renamed to a backup, new file, cleanup.
        swap = write(day / ".commute.md.swp", "swap")
        probe = write(day / "4913", "")
        probe.unlink()
        backup = day / "commute.md~"
        os.replace(note, backup)
        write(note, "v3")
        backup.unlink()
        swap.unlink()
        src.emit([(Change.added, swap), (Change.added, probe), (Change.deleted, probe),
                  (Change.deleted, note), (Change.added, backup), (Change.added, note),
                  (Change.deleted, backup), (Change.deleted, swap)])
        await eventually(lambda: index.texts().get("memory/2026-07-23/commute.md") == "v3")

        # Rename, then delete.
        renamed = day / "commute-home.md"
        os.replace(note, renamed)
        src.emit([(Change.deleted, note), (Change.added, renamed)])
        await eventually(lambda: "memory/2026-07-23/commute.md" not in index.docs)
        assert index.texts() == disk_notes(tmp_path) == {"memory/2026-07-23/commute-home.md": "v3"}
        renamed.unlink()
        src.emit([(Change.deleted, renamed)])
        await eventually(lambda: not index.docs)

        # The consumer never saw editor litter, and the event path did the work.
        junk = {p for p in index.applied_paths() if not p.endswith(".md") or "/." in p}
        assert junk == set()
        assert watcher.status()["last_reconcile"]["reason"] == "startup"
        nursery.cancel_scope.cancel()


async def test_directory_moves_expand_to_their_files(
    tmp_path: Path, autojump_clock: object
) -> None:
    outside = tmp_path / "outside"
    for i in range(3):
        write(tmp_path / "memory" / "2026-07-01" / f"a{i}.md", f"a{i}")
        write(outside / "2026-07-02" / "sub" / f"b{i}.md", f"b{i}")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert len(index.docs) == 3

        # Out of the watched root: one event for the directory, none for its files.
        old = tmp_path / "memory" / "2026-07-01"
        shutil.move(old, outside / "2026-07-01")
        src.emit([(Change.deleted, old)])
        await eventually(lambda: not index.docs)

        # Into the watched root: files inside were never reported by the kernel.
        new = tmp_path / "memory" / "2026-07-02"
        shutil.move(outside / "2026-07-02", new)
        src.emit([(Change.added, new)])
        await eventually(lambda: len(index.docs) == 3)

        # Renamed inside the root.
        renamed = tmp_path / "memory" / "2026-07-03"
        os.replace(new, renamed)
        src.emit([(Change.deleted, new), (Change.added, renamed)])
        await eventually(lambda: all(p.startswith("memory/2026-07-03/") for p in index.docs))
        assert index.texts() == disk_notes(tmp_path)
        assert len(index.docs) == 3

        # A metadata event on a directory re-applies only what differs from the snapshot.
        index.batches.clear()
        write(renamed / "sub" / "b0.md", "b0 edited!")
        src.emit([(Change.modified, renamed)])
        await eventually(lambda: bool(index.batches))
        assert index.batches == [{"memory/2026-07-03/sub/b0.md"}]
        assert watcher.status()["last_reconcile"]["reason"] == "startup"
        nursery.cancel_scope.cancel()


async def test_event_storm_uses_bounded_memory(tmp_path: Path, autojump_clock: object) -> None:
    day = tmp_path / "memory" / "2026-07-04"
    real = [write(day / f"n{i:03d}.md", f"n{i}") for i in range(300)]
    # Most of the storm is files that came and went (a checkout, a sync tool).
    transient = [day / "tmp" / f"t{i:05d}.md" for i in range(9_700)]
    # No periodic reconcile in sight: only the overflow can make the index converge.
    watcher, index, src = make(tmp_path, max_pending=1_000, reconcile_interval_s=1e6)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert len(index.docs) == 300
        for i, path in enumerate(real):
            path.write_text(f"edited {i}", encoding="utf-8")
        for _ in range(3):
            src.emit([(Change.added, p) for p in transient] + [(Change.modified, p) for p in real])
        status = watcher.status()
        assert status["max_pending_seen"] <= 1_000 + 1
        assert status["overflows"] >= 1
        await eventually(lambda: watcher.status()["last_reconcile"]["reason"]
                         == "pending set overflow")
        assert index.texts() == disk_notes(tmp_path)
        assert watcher.pending_count() == 0
        nursery.cancel_scope.cancel()


async def test_repeated_paths_count_once(tmp_path: Path, autojump_clock: object) -> None:
    watcher, _, src = make(tmp_path, max_pending=20_000)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        paths = [tmp_path / "memory" / "d" / f"{i}.md" for i in range(10_000)]
        for change in (Change.added, Change.modified, Change.deleted):
            src.emit([(change, p) for p in paths])
        assert watcher.pending_count() == 10_000
        assert watcher.status()["overflows"] == 0
        await eventually(lambda: watcher.pending_count() == 0)
        nursery.cancel_scope.cancel()


async def test_repeated_events_coalesce_into_one_batch(
    tmp_path: Path, autojump_clock: object
) -> None:
    note = write(tmp_path / "digest" / "wiki" / "trio.md", "x")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        index.batches.clear()
        # Many events in one tick: the flush task has not run in between.
        for _ in range(50):
            src.emit([(Change.modified, note)])
        assert watcher.pending_count() == 1
        await eventually(lambda: len(index.batches) >= 1)
        assert index.batches == [{"digest/wiki/trio.md"}]
        nursery.cancel_scope.cancel()


async def test_silent_source_converges_within_one_reconcile_period(
    tmp_path: Path, autojump_clock: object
) -> None:
    write(tmp_path / "memory" / "d" / "keep.md", "keep")
    gone = write(tmp_path / "memory" / "d" / "gone.md", "gone")
    watcher, index, src = make(tmp_path, reconcile_interval_s=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        start = trio.current_time()
        src.silent = True  # inotify overflow: events vanish without a word
        gone.unlink()
        write(tmp_path / "memory" / "d" / "keep.md", "keep, edited")
        write(tmp_path / "digest" / "new.md", "new")
        assert not src.emit([(Change.added, tmp_path / "digest" / "new.md")])
        await eventually(lambda: index.texts() == disk_notes(tmp_path), timeout_s=120)
        status = watcher.status()
        assert status["last_reconcile"]["reason"] == "periodic"
        assert status["last_reconcile"]["found"] == {"added": 1, "changed": 1, "deleted": 1}
        assert status["last_reconcile"]["time"] - start <= 60.0 + 1.0
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("name", ["a.md~", ".a.md.swp", "4913", "#a.md#", "a.md.tmp", ".a.md"])
def test_editor_litter_is_not_a_note(tmp_path: Path, name: str) -> None:
    watcher, _, _ = make(tmp_path)
    assert not watcher.is_note(f"memory/2026-07-01/{name}")
    assert watcher.is_note("memory/2026-07-01/a.md")
    assert not watcher.is_note("memory/mem_metadata/a.md")


async def test_a_write_through_one_name_applies_every_name_of_the_note(
        tmp_path: Path, autojump_clock: object) -> None:
    # Hard links: the write makes an event for the name written through, and no other.
    first = write(tmp_path / "memory" / "2026-11-04" / "first.md", "v1")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        second = tmp_path / "memory" / "2026-11-06" / "second.md"
        second.parent.mkdir()
        os.link(first, second)  # known by the new name's event alone
        src.emit([(Change.added, second)])
        await eventually(lambda: "memory/2026-11-06/second.md" in index.docs)
        second.write_text("v2", encoding="utf-8")
        src.emit([(Change.modified, second)])
        await eventually(lambda: index.texts().get("memory/2026-11-06/second.md") == "v2")
        assert index.texts() == disk_notes(tmp_path) == {
            "memory/2026-11-04/first.md": "v2", "memory/2026-11-06/second.md": "v2"}
        assert watcher.status()["last_reconcile"]["reason"] == "startup"
        nursery.cancel_scope.cancel()
