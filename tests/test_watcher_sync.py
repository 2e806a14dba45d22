"""The watcher's sync: it waits for the batch of its cookie, waits out a long first build
without scanning again, and falls back to a reconcile when events are lost.

Under the autojump clock, with a scripted change source.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trio
import trio.testing
from watcher_harness import ROOTS, FakeIndex, disk_notes, inline, make, write
from watchfiles import Change

from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import COOKIE_PREFIX, ScriptedChangeSource
from recalld.ipc.errors import UnknownWorkspace


async def test_sync_waits_for_the_cookie_batch(tmp_path: Path, autojump_clock: object) -> None:
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        note = write(tmp_path / "memory" / "d" / "fresh.md", "fresh")

        async def kernel() -> None:
            # The note's event, then the cookie's: delivered in write order.
            src.emit([(Change.added, note)])
            while not src.emit_cookies():
                await trio.sleep(0.001)

        nursery.start_soon(kernel)
        before = trio.current_time()
        await watcher.sync()
        assert trio.current_time() - before < 1.0  # no fallback wait
        assert index.texts() == {"memory/d/fresh.md": "fresh"}
        assert watcher.status()["sync_fallbacks"] == 0
        assert not list((tmp_path / "memory").glob(COOKIE_PREFIX + "*"))
        # Cookies are never handed to the consumer.
        assert all(COOKIE_PREFIX not in p for p in index.applied_paths())
        nursery.cancel_scope.cancel()


async def test_sync_waits_out_a_long_first_build_without_scanning_again(
    tmp_path: Path, autojump_clock: object
) -> None:
    # A first build's startup reconcile applies for longer than sync_timeout_s; the
    # cookie's event arrives meanwhile, so sync waits for that apply instead of running
    # a second reconcile of every file after it.
    for i in range(3):
        write(tmp_path / "memory" / "d" / f"n{i}.md", f"note {i}")
    index = FakeIndex(tmp_path)
    src = ScriptedChangeSource()
    applying = trio.Event()

    async def slow_apply(paths: set[str]) -> None:
        applying.set()
        await trio.sleep(30.0)
        await index.apply(paths)

    watcher = Watcher(tmp_path, ROOTS, apply=slow_apply, known=index.known, source=src,
                      config=WatcherConfig(reconcile_interval_s=300.0, sync_timeout_s=2.0,
                                           reconcile_before_ready=False),
                      wall=trio.current_time, run_sync=inline)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        await applying.wait()

        async def kernel() -> None:
            while not src.emit_cookies():
                await trio.sleep(0.001)

        nursery.start_soon(kernel)
        before = trio.current_time()
        await watcher.sync()
        assert trio.current_time() - before >= 25.0  # it did wait for the apply
        assert index.texts() == disk_notes(tmp_path)
        status = watcher.status()
        assert status["sync_fallbacks"] == 0
        assert status["last_reconcile"]["reason"] == "startup"
        assert len(index.batches) == 1
        nursery.cancel_scope.cancel()


async def test_sync_falls_back_to_reconcile_when_events_are_lost(
    tmp_path: Path, autojump_clock: object
) -> None:
    watcher, index, src = make(tmp_path, sync_timeout_s=2.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        src.silent = True
        write(tmp_path / "memory" / "d" / "lost.md", "lost event")
        with trio.fail_after(10):
            await watcher.sync()
        assert index.texts() == {"memory/d/lost.md": "lost event"}
        status = watcher.status()
        assert status["sync_fallbacks"] == 1
        assert status["last_reconcile"]["reason"] == "sync cookie not seen"
        assert not list((tmp_path / "memory").glob(COOKIE_PREFIX + "*"))
        nursery.cancel_scope.cancel()


async def test_sync_answers_when_the_first_root_became_a_file(
    tmp_path: Path, autojump_clock: object
) -> None:
    # The cookie can be neither written nor removed (a file where memory/ was, before the
    # watch has reported the loss): the sync falls back to a reconcile and answers.
    watcher, index, _ = make(tmp_path, sync_timeout_s=2.0)
    write(tmp_path / "digest" / "d.md", "d")
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        (tmp_path / "memory").rmdir()
        (tmp_path / "memory").write_text("not a folder")
        with trio.fail_after(10):
            await watcher.sync()
        assert index.texts() == {"digest/d.md": "d"}
        assert watcher.status()["sync_fallbacks"] == 1
        nursery.cancel_scope.cancel()


async def test_a_sync_after_its_roots_were_removed_drops_their_notes(
    tmp_path: Path, autojump_clock: object
) -> None:
    # rm -r of every root, then a sync before the watch has reported it: the cookie
    # cannot be written, and the reconcile standing in for it kept the notes of the roots
    # it could not list. They are made again first, as the watch's restart does.
    watcher, index, _ = make(tmp_path, sync_timeout_s=2.0)
    write(tmp_path / "memory" / "d" / "a.md", "a")
    write(tmp_path / "digest" / "wiki" / "b.md", "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert len(index.texts()) == 2
        for root in ROOTS:
            shutil.rmtree(tmp_path / root)
        with trio.fail_after(10):
            await watcher.sync()
        assert index.texts() == {}
        assert all((tmp_path / root).is_dir() for root in ROOTS)
        # A root moved away (the watch says so) is not made again by a sync: asserted
        # on the real watch in test_watcher_roots.py (..._moved_away_and_back_by_hand...).
        nursery.cancel_scope.cancel()


async def test_a_sync_never_writes_its_cookie_through_a_link_in_place_of_the_root(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, autojump_clock: object
) -> None:
    # memory/ moved away with a link to another folder (another agent's notes) left in its
    # place, and a sync before the watch has reported it: the cookie is not written (nor
    # removed) there, not even for a moment; the sync answers by a reconcile.
    ws = tmp_path / "ws"
    watcher, index, _ = make(ws, sync_timeout_s=2.0)
    write(ws / "digest" / "d.md", "d")
    elsewhere = tmp_path_factory.mktemp("other-agent") / "memory"
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        (ws / "memory").rename(elsewhere)
        (ws / "memory").symlink_to(elsewhere, target_is_directory=True)
        os.utime(elsewhere, ns=(1_000_000_000, 1_000_000_000))
        with trio.fail_after(10):
            await watcher.sync()
        assert watcher.status()["sync_fallbacks"] == 1
        assert os.stat(elsewhere).st_mtime_ns == 1_000_000_000  # nothing made or removed
        assert "digest/d.md" in index.texts()
        nursery.cancel_scope.cancel()


async def test_a_sync_under_way_when_the_watcher_stops_ends_saying_so(
    tmp_path: Path, autojump_clock: object
) -> None:
    # The workspace stopped (failed or closed) while a write's sync waited for its
    # cookie's batch, seen but behind an apply: the batch was never applied, and the sync
    # waited on, sync_timeout_s after sync_timeout_s, until the write's own 30 s bound (the
    # caller's call timed out first). Now it ends at once, saying why.
    index = FakeIndex(tmp_path)
    src = ScriptedChangeSource()
    applying, stopped = trio.Event(), trio.Event()

    async def slow_apply(paths: set[str]) -> None:
        applying.set()
        await trio.sleep_forever()

    watcher = Watcher(tmp_path, ROOTS, apply=slow_apply, known=index.known, source=src,
                      config=WatcherConfig(reconcile_interval_s=300.0, sync_timeout_s=2.0,
                                           reconcile_before_ready=False),
                      wall=trio.current_time, run_sync=inline)  # type: ignore[arg-type]
    write(tmp_path / "memory" / "d" / "n.md", "note")
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as workspace:
            await workspace.start(watcher.run)
            await applying.wait()

            async def call() -> None:  # a call's task: not the workspace's
                with trio.fail_after(60), pytest.raises(UnknownWorkspace,
                                                        match="stopped before"):
                    await watcher.sync()
                stopped.set()

            outer.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()  # its cookie written
            assert src.emit_cookies()
            await trio.testing.wait_all_tasks_blocked()  # and seen, behind the apply
            workspace.cancel_scope.cancel()
        before = trio.current_time()
        await stopped.wait()
        assert trio.current_time() - before < 1.0
    with pytest.raises(UnknownWorkspace, match="stopped before"):
        await watcher.sync()  # and one that comes after
