"""The inotify change source on real directories (Linux)."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import struct
import time
from pathlib import Path

import pytest
import trio

from recalld.daemon import inotify
from recalld.daemon.libc import libc
from recalld.daemon.watchsource import Change, RawChange, WatchError

pytestmark = pytest.mark.skipif(not inotify.available(), reason="inotify is Linux-only")


class Collector:
    def __init__(self) -> None:
        self.changes: set[RawChange] = set()
        self.arrived = trio.Event()

    def __call__(self, batch: set[RawChange]) -> None:
        self.changes |= batch
        self.arrived.set()

    async def wait_for(self, *expected: RawChange) -> None:
        with trio.fail_after(5):
            while not set(expected) <= self.changes:
                await self.arrived.wait()
                self.arrived = trio.Event()


async def started(nursery: trio.Nursery, roots: list[Path]) -> Collector:
    collector = Collector()
    await nursery.start(inotify.InotifySource().run, roots, collector)
    return collector


async def test_files_and_directories_are_reported(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    (root / "2026-01-01").mkdir(parents=True)
    async with trio.open_nursery() as nursery:
        seen = await started(nursery, [root])
        note = root / "2026-01-01" / "a.md"
        note.write_text("one")
        await seen.wait_for((Change.added, str(note)))
        with note.open("a") as fh:
            fh.write("two")
        await seen.wait_for((Change.modified, str(note)))
        renamed = note.with_name("b.md")
        note.rename(renamed)
        await seen.wait_for((Change.deleted, str(note)), (Change.added, str(renamed)))

        # A new directory is watched at once: a file written into it later is seen.
        day = root / "2026-01-02"
        day.mkdir()
        await seen.wait_for((Change.folder, str(day)))
        # Whatever its name: one with a dot, or a note's name.
        for name in ("v1.2 notes", "old.md"):
            (root / name).mkdir()
            await seen.wait_for((Change.folder, str(root / name)))
        late = day / "late.md"
        late.write_text("x")
        await seen.wait_for((Change.added, str(late)))

        # Moving a directory within the tree keeps its files watched under the new name.
        moved = root / "2026-01-03"
        seen.changes.clear()
        day.rename(moved)
        await seen.wait_for((Change.folder, str(day)), (Change.folder, str(moved)))
        (moved / "late.md").write_text("y")
        await seen.wait_for((Change.modified, str(moved / "late.md")))

        # Moved out: its watches go, no stale paths are reported afterwards.
        outside = tmp_path / "outside"
        seen.changes.clear()
        moved.rename(outside)
        await seen.wait_for((Change.folder, str(moved)))
        seen.changes.clear()
        (outside / "late.md").write_text("z")
        (root / "2026-01-01" / "b.md").unlink()
        await seen.wait_for((Change.deleted, str(root / "2026-01-01" / "b.md")))
        assert not any("outside" in p or "2026-01-03" in p for _, p in seen.changes)

        # Moved in, with a file already inside: the directory event carries it.
        incoming = tmp_path / "incoming"
        incoming.mkdir()
        (incoming / "c.md").write_text("c")
        shutil.move(str(incoming), str(root / "2026-01-04"))
        await seen.wait_for((Change.folder, str(root / "2026-01-04")))
        (root / "2026-01-04" / "c.md").write_text("cc")
        await seen.wait_for((Change.modified, str(root / "2026-01-04" / "c.md")))
        nursery.cancel_scope.cancel()


async def test_losing_a_root_is_a_deletion_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "digest"
    root.mkdir()
    async with trio.open_nursery() as nursery:
        seen = await started(nursery, [root])
        shutil.rmtree(root)
        await seen.wait_for((Change.deleted, str(root)))
        nursery.cancel_scope.cancel()


async def test_sources_open_without_a_library_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every watcher of every workspace opens a source at start-up; finding the C library
    # by name runs ``ldconfig -p`` in a child process, so the sources must not search.
    def no_search(name: str) -> str | None:
        raise AssertionError(f"library search for {name!r} while opening a watch")

    monkeypatch.setattr(ctypes.util, "find_library", no_search)
    libc.cache_clear()
    roots = [tmp_path / f"ws{i}" for i in range(3)]
    for root in roots:
        root.mkdir()
    async with trio.open_nursery() as nursery:
        seen = [await started(nursery, [root]) for root in roots]
        for root, collector in zip(roots, seen, strict=True):
            note = root / "a.md"
            note.write_text("one")
            await collector.wait_for((Change.added, str(note)))
            assert all(path.startswith(str(root)) for _, path in collector.changes)
        nursery.cancel_scope.cancel()


async def test_cancel_is_immediate(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        await started(nursery, [tmp_path])
        began = time.monotonic()
        nursery.cancel_scope.cancel()
    assert time.monotonic() - began < 1.0


async def test_overflow_is_a_watch_error_of_every_source(tmp_path: Path) -> None:
    # The instance is shared: a queue overflow lost events of every source on it.
    failed: list[str] = []

    async def watch(root: Path, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            await inotify.InotifySource().run([root], lambda batch: None,
                                              task_status=task_status)
        except WatchError as exc:
            failed.append(str(exc))

    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for root in roots:
                await nursery.start(watch, root)
            instance = inotify._INSTANCE.get()
            assert instance is not None
            instance.route(struct.pack("iIII", -1, inotify.IN_Q_OVERFLOW, 0, 0))
    assert len(failed) == 2 and all("overflow" in why for why in failed)
    assert inotify._INSTANCE.get() is None  # closed with its last source


async def test_every_source_shares_one_instance(tmp_path: Path) -> None:
    # More sources than the per-user instance limit (often 128): one descriptor for all,
    # and each source hears of its own files only, even where two watch one directory.
    def instances() -> int:
        return sum(os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
                   for fd in os.listdir("/proc/self/fd") if _is_link(fd))

    before = instances()
    roots = [tmp_path / f"ws{i}" / "memory" for i in range(150)]
    for root in roots:
        (root / "day").mkdir(parents=True)
    async with trio.open_nursery() as nursery:
        seen = [await started(nursery, [root]) for root in roots]
        inner = await started(nursery, [roots[7] / "day"])  # inside another's tree
        assert instances() == before + 1
        for i in (0, 7, 149):
            (roots[i] / "day" / "a.md").write_text("x")
        for i in (0, 7, 149):
            await seen[i].wait_for((Change.added, str(roots[i] / "day" / "a.md")))
        await inner.wait_for((Change.added, str(roots[7] / "day" / "a.md")))
        assert all(not s.changes for i, s in enumerate(seen) if i not in (0, 7, 149))
        nursery.cancel_scope.cancel()
    assert instances() == before


def _is_link(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return True


def test_parse_events_reads_names_and_padding() -> None:
    name = b"note.md" + b"\0" * 9
    data = struct.pack("iIII", 3, inotify.IN_CREATE, 0, len(name)) + name
    data += struct.pack("iIII", 4, inotify.IN_DELETE_SELF, 0, 0)
    assert list(inotify.parse_events(data)) == [
        (3, inotify.IN_CREATE, "note.md"), (4, inotify.IN_DELETE_SELF, "")]


def _watch_count() -> int:
    """The watches of this process's inotify instances, as the kernel lists them."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        if _is_link(fd) and os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
            with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
                count += sum(line.startswith("inotify wd:") for line in info)
    return count


async def test_hidden_folders_take_no_watches(tmp_path: Path) -> None:
    # A memory folder kept in git: .git holds hundreds of folders the watcher passes by
    # anyway. They took a watch each (of the per-user limit, which doctor counts without
    # them), and git's own writes there flooded the event queue.
    root = tmp_path / "memory"
    for sub in [f"objects/{i:02x}" for i in range(40)] + ["refs/heads", "logs"]:
        (root / ".git" / sub).mkdir(parents=True)
    (root / ".obsidian" / "plugins").mkdir(parents=True)
    (root / "2026-02-01").mkdir()
    before = _watch_count()
    async with trio.open_nursery() as nursery:
        seen = await started(nursery, [root])
        assert _watch_count() - before == 2  # memory/ and memory/2026-02-01/
        (root / ".git" / "objects" / "00" / "x.md").write_text("x")
        (root / ".drafts").mkdir()
        (root / ".drafts" / "later").mkdir()
        (root / "2026-02-01" / "a.md").write_text("a")
        await seen.wait_for((Change.added, str(root / "2026-02-01" / "a.md")))
        assert not any("/.git/" in p or "/.drafts/" in p for _, p in seen.changes)
        assert _watch_count() - before == 2
        # A hidden folder renamed to a visible name is watched from then on, below too.
        (root / ".drafts").rename(root / "drafts")
        await seen.wait_for((Change.folder, str(root / "drafts")))
        (root / "drafts" / "later" / "b.md").write_text("b")
        await seen.wait_for((Change.added, str(root / "drafts" / "later" / "b.md")))
        assert _watch_count() - before == 4
        nursery.cancel_scope.cancel()
