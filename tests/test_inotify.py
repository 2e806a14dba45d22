"""The inotify change source on real directories (Linux)."""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import pytest
import trio
from watchfiles import Change

from recalld.daemon import inotify
from recalld.daemon.watchsource import RawChange, WatchError

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
        await seen.wait_for((Change.added, str(day)))
        late = day / "late.md"
        late.write_text("x")
        await seen.wait_for((Change.added, str(late)))

        # Moving a directory within the tree keeps its files watched under the new name.
        moved = root / "2026-01-03"
        day.rename(moved)
        await seen.wait_for((Change.deleted, str(day)), (Change.added, str(moved)))
        (moved / "late.md").write_text("y")
        await seen.wait_for((Change.modified, str(moved / "late.md")))

        # Moved out: its watches go, no stale paths are reported afterwards.
        outside = tmp_path / "outside"
        moved.rename(outside)
        await seen.wait_for((Change.deleted, str(moved)))
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
        await seen.wait_for((Change.added, str(root / "2026-01-04")))
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


async def test_cancel_is_immediate(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        await started(nursery, [tmp_path])
        began = time.monotonic()
        nursery.cancel_scope.cancel()
    assert time.monotonic() - began < 1.0


async def test_overflow_is_a_watch_error_for_every_source(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    errors: list[str] = []

    async def watch(root: Path, task_status: trio.TaskStatus[None]) -> None:
        try:
            await inotify.InotifySource().run([root], Collector(), task_status=task_status)
        except WatchError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        await nursery.start(watch, tmp_path / "a")
        await nursery.start(watch, tmp_path / "b")
        hub = inotify._hub()
        assert hub._notify is not None
        hub.dispatch(hub._notify, struct.pack("iIII", -1, inotify.IN_Q_OVERFLOW, 0, 0))
    assert len(errors) == 2 and all("overflow" in e for e in errors)
    assert inotify.open_instances() == 0


def _inotify_fds() -> int:
    return sum(os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))


async def test_sources_share_one_instance_and_their_watches(tmp_path: Path) -> None:
    # Forty workspaces' worth of sources hold one inotify instance (the kernel allows 128
    # per user). Two sources watching one directory both see its changes, and one leaving
    # keeps the other's watch.
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    before = _inotify_fds()
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as many:
            for i in range(40):
                (tmp_path / f"ws{i}").mkdir()
                await started(many, [tmp_path / f"ws{i}"])
            assert _inotify_fds() == before + 1 and inotify.open_instances() == 1
            wide = await started(outer, [shared])
            inner_scope = trio.CancelScope()

            async def narrow_source(task_status: trio.TaskStatus[Collector]) -> None:
                with inner_scope:
                    collector = Collector()
                    await inotify.InotifySource().run(
                        [shared / "sub"], collector,
                        task_status=_Relay(task_status, collector))

            narrow = await outer.start(narrow_source)
            (shared / "sub" / "x.md").write_text("x\n")
            created = (Change.added, str(shared / "sub" / "x.md"))
            await wide.wait_for(created)
            await narrow.wait_for(created)
            inner_scope.cancel()
            many.cancel_scope.cancel()
        await trio.sleep(0.05)
        (shared / "sub" / "y.md").write_text("y\n")
        await wide.wait_for((Change.added, str(shared / "sub" / "y.md")))
        assert _inotify_fds() == before + 1
        outer.cancel_scope.cancel()
    assert _inotify_fds() == before and inotify.open_instances() == 0


class _Relay:
    """A task_status that reports ``value`` when the source says it started."""

    def __init__(self, status: trio.TaskStatus[Collector], value: Collector) -> None:
        self._status, self._value = status, value

    def started(self, value: object = None) -> None:
        self._status.started(self._value)


def test_parse_events_reads_names_and_padding() -> None:
    name = b"note.md" + b"\0" * 9
    data = struct.pack("iIII", 3, inotify.IN_CREATE, 0, len(name)) + name
    data += struct.pack("iIII", 4, inotify.IN_DELETE_SELF, 0, 0)
    assert list(inotify.parse_events(data)) == [
        (3, inotify.IN_CREATE, "note.md"), (4, inotify.IN_DELETE_SELF, "")]


async def test_a_failing_receiver_stops_only_its_own_source(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "good").mkdir()
    failures: list[str] = []

    def explode(batch: set[RawChange]) -> None:
        raise RuntimeError("receiver broke")

    async def bad_source(task_status: trio.TaskStatus[None]) -> None:
        try:
            await inotify.InotifySource().run([tmp_path / "bad"], explode,
                                              task_status=task_status)
        except WatchError as exc:
            failures.append(str(exc))

    async with trio.open_nursery() as nursery:
        good = await started(nursery, [tmp_path / "good"])
        await nursery.start(bad_source)
        (tmp_path / "bad" / "x.md").write_text("x\n")
        with trio.fail_after(5):
            while not failures:
                await trio.sleep(0.01)
        assert "receiver broke" in failures[0]
        (tmp_path / "good" / "y.md").write_text("y\n")
        await good.wait_for((Change.added, str(tmp_path / "good" / "y.md")))
        nursery.cancel_scope.cancel()
