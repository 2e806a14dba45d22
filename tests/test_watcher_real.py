"""The watcher on the real watchfiles notifier, on tmp_path with real (short) time: editor
saves and directory moves end to end, a quick cancel, and a root that cannot be watched."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import trio
from watcher_harness import ROOTS, FakeIndex, disk_notes, write

from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import COOKIE_PREFIX, WatchfilesSource


def real(tmp_path: Path) -> tuple[Watcher, FakeIndex]:
    index = FakeIndex(tmp_path)
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=WatchfilesSource(debounce_ms=50, step_ms=10),
                      config=WatcherConfig(sync_timeout_s=5.0))
    return watcher, index


async def test_real_watch_end_to_end(tmp_path: Path) -> None:
    write(tmp_path / "memory" / "2026-07-01" / "old.md", "old")
    outside = tmp_path / "outside"
    for i in range(3):
        write(outside / "2026-07-05" / "deep" / f"m{i}.md", f"m{i}")
    watcher, index = real(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            day = tmp_path / "memory" / "2026-07-23"

            # A brand-new directory and a file in it, then sync.
            note = write(day / "commute.md", "v1")
            await watcher.sync()
            assert index.texts()["memory/2026-07-23/commute.md"] == "v1"

            # Editor save via temp file + rename.
            tmp = write(day / ".commute.md.tmp-9", "v2")
            os.replace(tmp, note)
            await watcher.sync()
            assert index.texts()["memory/2026-07-23/commute.md"] == "v2"

            # vim's sequence.
            swap = write(day / ".commute.md.swp", "swap")
            write(day / "4913", "").unlink()
            os.replace(note, day / "commute.md~")
            write(note, "v3")
            (day / "commute.md~").unlink()
            swap.unlink()
            await watcher.sync()
            assert index.texts()["memory/2026-07-23/commute.md"] == "v3"

            # Rename, delete, directory moves in and out.
            os.replace(note, day / "home.md")
            (tmp_path / "memory" / "2026-07-01" / "old.md").unlink()
            shutil.move(outside / "2026-07-05", tmp_path / "memory" / "2026-07-05")
            await watcher.sync()
            assert index.texts() == disk_notes(tmp_path)
            assert len(index.docs) == 4
            shutil.move(tmp_path / "memory" / "2026-07-05", outside / "back")
            await watcher.sync()
            assert index.texts() == disk_notes(tmp_path) == {"memory/2026-07-23/home.md": "v3"}

            status = watcher.status()
            assert status["state"] == "watching"
            assert status["sync_fallbacks"] == 0
            assert status["last_reconcile"]["reason"] == "startup"
            assert not any(COOKIE_PREFIX in p for p in index.applied_paths())
            nursery.cancel_scope.cancel()


async def test_real_watch_cancels_in_under_a_second(tmp_path: Path) -> None:
    watcher, index = real(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        write(tmp_path / "digest" / "x.md", "x")
        await watcher.sync()
        assert "digest/x.md" in index.docs
        began = time.monotonic()
        nursery.cancel_scope.cancel()
    assert time.monotonic() - began < 1.0


async def test_real_watch_of_a_missing_root_degrades_to_reconcile(tmp_path: Path) -> None:
    index = FakeIndex(tmp_path)
    # A root that cannot exist (a file is in the way): the watch fails, reconcile serves.
    (tmp_path / "digest").write_text("not a directory", encoding="utf-8")
    write(tmp_path / "memory" / "a.md", "a")
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      config=WatcherConfig(restart_backoff_initial_s=30.0))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            assert watcher.status()["state"] == "failed"
            assert watcher.status()["why"]
            assert index.texts() == {"memory/a.md": "a"}
            write(tmp_path / "memory" / "b.md", "b")
            await watcher.sync()  # no watch: sync reconciles
            assert set(index.docs) == {"memory/a.md", "memory/b.md"}
            nursery.cancel_scope.cancel()


async def test_a_folder_link_below_a_root_is_not_followed_by_events_either(
        tmp_path: Path) -> None:
    # Scans do not descend links below a root; a folder event of a link did, so a link
    # to another folder of the workspace indexed its notes twice and every scan then
    # dropped them (health `pending`, churn). Events and scans now agree.
    index = FakeIndex(tmp_path)
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      config=WatcherConfig(sync_timeout_s=5.0))  # inotify where there is
    write(tmp_path / "digest" / "wiki" / "tent.md", "blue tent")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            os.symlink(tmp_path / "digest" / "wiki", tmp_path / "memory" / "2026-12-20")
            write(tmp_path / "memory" / "2026-12-21" / "stove.md", "butane")
            await watcher.sync()
            assert set(index.texts()) == {"digest/wiki/tent.md", "memory/2026-12-21/stove.md"}
            again = await watcher.reconcile("check")
            assert (again.added, again.changed, again.deleted) == (0, 0, 0), again
            assert set(watcher.scan()) == set(index.texts())
            nursery.cancel_scope.cancel()
