"""The watcher's start: the incremental startup reconcile, a start held until the workspace
may watch, and scans that tell when they have found many notes.

Under the autojump clock, with a scripted change source.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from watcher_harness import ROOTS, FakeIndex, disk_notes, eventually, inline, make, write

from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import ScriptedChangeSource
from recalld.ipc.errors import UnknownWorkspace


async def test_startup_reconcile_is_incremental(tmp_path: Path, autojump_clock: object) -> None:
    for i in range(5):
        write(tmp_path / "memory" / "2026-07-01" / f"n{i}.md", f"note {i}")
    write(tmp_path / "memory" / "2026-07-01" / ".hidden.md", "hidden")
    write(tmp_path / "memory" / "2026-07-01" / "n0.md~", "backup")
    write(tmp_path / "memory" / "mem_metadata" / "x.md", "derived")
    watcher, index, _ = make(tmp_path)
    # A previous run indexed n0..n3; n3 changed since, n4 is new, gone.md was deleted.
    await index.apply({f"memory/2026-07-01/n{i}.md" for i in range(4)})
    index.docs["memory/gone.md"] = (1, 1, "old")
    write(tmp_path / "memory" / "2026-07-01" / "n3.md", "note 3, edited while down")
    index.batches.clear()

    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert (tmp_path / "digest").is_dir()  # created when missing
        assert index.applied_paths() == {
            "memory/2026-07-01/n3.md", "memory/2026-07-01/n4.md", "memory/gone.md"}
        assert index.texts() == disk_notes(tmp_path)
        status = watcher.status()
        assert status["state"] == "watching"
        assert status["last_reconcile"]["reason"] == "startup"
        assert status["last_reconcile"]["found"] == {"added": 1, "changed": 1, "deleted": 1}
        nursery.cancel_scope.cancel()


async def test_a_held_watcher_starts_at_once_and_watches_after_its_hold(
    tmp_path: Path, autojump_clock: object,
) -> None:
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    index = FakeIndex(tmp_path)
    hold = trio.Event()
    source = ScriptedChangeSource()
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=source,
                      config=WatcherConfig(reconcile_before_ready=False),
                      wall=trio.current_time, run_sync=inline, hold=hold.wait)
    # The startup scan comes after the watch is set up: a change made between the two is
    # seen by the scan, none is lost.
    watched_at_scan: list[bool] = []
    watcher.scan_reached = (1, lambda: watched_at_scan.append(source.running.is_set()))
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        # Started with the startup reconcile owed; no watch, no scan, no apply yet, and a
        # sync waits for the watch.
        status = watcher.status()
        assert status["rescan_owed"] == "startup" and status["state"] == "starting", status
        write(tmp_path / "memory" / "2026-07-01" / "n1.md", "note 1, written while held")
        await trio.testing.wait_all_tasks_blocked()
        assert index.batches == [] and watcher.status()["last_reconcile"] is None
        synced = trio.Event()

        async def sync() -> None:
            await watcher.sync()
            synced.set()

        nursery.start_soon(sync)
        await trio.testing.wait_all_tasks_blocked()
        assert not synced.is_set() and index.batches == []
        hold.set()
        await eventually(lambda: watcher.status()["last_reconcile"] is not None)
        status = watcher.status()
        assert status["state"] == "watching" and status["rescan_owed"] is None, status
        assert status["last_reconcile"]["reason"] == "startup"
        assert status["last_reconcile"]["found"] == {"added": 2, "changed": 0, "deleted": 0}
        assert index.texts() == disk_notes(tmp_path)
        assert watched_at_scan and all(watched_at_scan), watched_at_scan
        # (The scripted source delivers no cookie: the sync ends by its own reconcile.)
        with trio.fail_after(60):
            await synced.wait()
        nursery.cancel_scope.cancel()


async def test_a_sync_of_a_watcher_stopped_during_its_hold_fails(
    tmp_path: Path, autojump_clock: object,
) -> None:
    # The workspace failed or closed during the daemon's start: a search that syncs
    # gets an error, not a wait for a watch that never comes.
    index = FakeIndex(tmp_path)
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=ScriptedChangeSource(),
                      config=WatcherConfig(reconcile_before_ready=False),
                      wall=trio.current_time, run_sync=inline, hold=trio.sleep_forever)
    failed: list[BaseException] = []

    async def sync() -> None:
        try:
            await watcher.sync()
        except UnknownWorkspace as exc:
            failed.append(exc)

    async with trio.open_nursery() as outer:
        outer.start_soon(sync)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(watcher.run)
                await trio.testing.wait_all_tasks_blocked()
                assert not failed
                scope.cancel()
        with trio.fail_after(60):
            while not failed:
                await trio.sleep(1)
    assert "stopped before it was watched" in str(failed[0])


def test_a_scan_tells_when_it_has_found_many_notes(tmp_path: Path) -> None:
    for i in range(7):
        write(tmp_path / "memory" / f"2026-07-0{i % 3 + 1}" / f"n{i}.md", f"note {i}")
    write(tmp_path / "memory" / "2026-07-01" / ".hidden.md", "hidden")
    write(tmp_path / "memory" / "2026-07-01" / "n0.md~", "backup")
    watcher, _, _ = make(tmp_path)
    found: list[int] = []
    # Called from the scan itself (a worker thread in the daemon), once per scan, as the
    # scan's listing reaches that many notes, not after it.
    reached = (5, lambda: found.append(len(found)))
    assert len(watcher.scan(reached)) == 7 and found == [0]
    assert len(watcher.scan(reached)) == 7 and found == [0, 1]
    assert len(watcher.scan((8, lambda: found.append(-1)))) == 7 and found == [0, 1]  # never


async def test_only_a_reconcile_scan_tells_it_found_many_notes(
    tmp_path: Path, autojump_clock: object,
) -> None:
    for i in range(7):
        write(tmp_path / "memory" / f"2026-07-0{i % 3 + 1}" / f"n{i}.md", f"note {i}")
    watcher, _, _ = make(tmp_path)
    found: list[str] = []
    watcher.scan_reached = (5, lambda: found.append("reached"))
    assert len(watcher.scan()) == 7 and found == []  # health's, verify's, a rebuild's
    await watcher.reconcile()
    assert found == ["reached"]
