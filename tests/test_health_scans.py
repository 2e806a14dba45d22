"""Health's disk scans beside the watcher, in process: the watcher's own scans taken
instead of a second one, a scan someone waits for never queued behind background work,
files the watcher missed found and shown, and a scan's freshness measured on trio's clock."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from recalld.daemon import maintenance
from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index.records import note_stamp
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.maintenance import Health, verify
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import Change, ScriptedChangeSource
from recalld.daemon.workspaces import Workspace


def indexed_workspace(tmp_path: Path, note: str, source: ScriptedChangeSource,
                      config: WatcherConfig) -> tuple[Workspace, WorkspaceIndex,
                                                      trio.CapacityLimiter]:
    """A workspace with one note at ``memory/2026-07-01/<note>`` and its (unstarted) index,
    watched through ``source``."""
    root = tmp_path / "ws"
    (root / "memory" / "2026-07-01").mkdir(parents=True)
    (root / "memory" / "2026-07-01" / note).write_text("# Seen\n\nindexed at start\n")
    ws = Workspace("w", root, WorkspaceSettings())
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    cpu = trio.CapacityLimiter(2)
    index = WorkspaceIndex(ws, cfg, cpu=cpu)
    index.watcher = Watcher(root, ["memory", "digest"], apply=index.apply_paths,
                            known=lambda: index.state.known(), source=source,
                            config=config, limiter=cpu, stamp=note_stamp)
    return ws, index, cpu


async def test_health_started_after_the_startup_reconcile_scans_at_once(
        tmp_path: Path) -> None:
    # Other workspace services can start between the index and health; when the index's
    # startup reconcile has ended by then, health scans itself instead of waiting for it.
    ws, index, cpu = indexed_workspace(tmp_path, "a.md", ScriptedChangeSource(),
                                       WatcherConfig(reconcile_interval_s=3600.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)  # returns after its startup reconcile
        health = Health(ws, index, cpu)
        await nursery.start(health.run)
        with trio.fail_after(10):  # far below the fallback wait for a reconcile
            await health.first_scan.wait()
        assert health.status()["state"] == "clean"
        assert health.status()["files_on_disk"] == 1
        nursery.cancel_scope.cancel()


async def test_a_health_scan_someone_waits_for_takes_no_background_token(
        tmp_path: Path) -> None:
    # A restore and index.verify wait for the scan's answer: it must not queue behind
    # other workspaces' background work; the periodic scan does wait for a token.
    ws, index, cpu = indexed_workspace(tmp_path, "a.md", ScriptedChangeSource(),
                                       WatcherConfig(reconcile_interval_s=3600.0))
    background = trio.CapacityLimiter(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        health = Health(ws, index, cpu, background=background)
        release = trio.Event()

        async def hold_background(task_status: trio.TaskStatus[None]) -> None:
            async with background:  # all background work taken elsewhere
                task_status.started()
                await release.wait()

        await nursery.start(hold_background)
        with trio.fail_after(60):
            await health.scan()
        assert health.status()["files_on_disk"] == 1
        scanned_at = health.scanned_at
        periodic_done = trio.Event()

        async def periodic() -> None:
            await health.scan(unattended=True)
            periodic_done.set()

        nursery.start_soon(periodic)
        with trio.fail_after(60):  # the periodic scan queues for the token
            while background.statistics().tasks_waiting != 1:
                await trio.sleep(0.01)
        assert not periodic_done.is_set() and health.scanned_at == scanned_at
        release.set()
        with trio.fail_after(60):
            await periodic_done.wait()
        nursery.cancel_scope.cancel()


async def test_health_says_pending_for_a_file_the_watcher_missed(tmp_path: Path) -> None:
    source = ScriptedChangeSource()
    # No periodic reconcile and no quick restart during the test: what it sees stays put.
    ws, index, cpu = indexed_workspace(
        tmp_path, "seen.md", source,
        WatcherConfig(reconcile_interval_s=3600.0, restart_backoff_initial_s=3600.0))
    root = ws.root
    async with trio.open_nursery() as nursery:
        # Health first, so that it takes the view of the watcher's startup reconcile
        # (which index.run finishes before it reports started).
        health = Health(ws, index, cpu)
        await nursery.start(health.run)
        assert health.status()["state"] == "pending"  # until the first scan is done
        await nursery.start(index.run)
        assert health.first_scan.is_set()
        assert health.status()["state"] == "clean"

        source.silent = True  # the kernel dropped the events (inotify overflow)
        (root / "memory" / "2026-07-01" / "missed.md").write_text("# Missed\n\nunseen\n")
        await health.scan()
        status: dict[str, Any] = health.status()
        assert status["state"] == "pending"
        assert status["unindexed_paths"] == ["memory/2026-07-01/missed.md"]
        assert status["files_on_disk"] == 2 and status["files_indexed"] == 1
        report = await verify(ws, index, cpu)
        assert report["ok"] is False
        assert report["not_indexed"] == {"count": 1, "paths": ["memory/2026-07-01/missed.md"]}

        # Same size and mtime but other bytes: the status-change time, which nothing
        # sets back, tells (the stat differs).
        seen = root / "memory" / "2026-07-01" / "seen.md"
        st = seen.stat()
        seen.write_text("# Seen\n\nINDEXED AT START\n")
        os.utime(seen, ns=(st.st_atime_ns, st.st_mtime_ns))
        report = await verify(ws, index, cpu)
        assert report["stat_differs"]["paths"] == ["memory/2026-07-01/seen.md"]

        await index.watcher.reconcile("test")  # what the periodic rescan does
        assert health.status()["state"] == "clean"  # re-checked without a new scan
        assert health.status()["unindexed"] == 0

        index.persist_error = {"time": 1.0, "error": "disk full", "disk_full": True}
        degraded = health.status()
        assert degraded["state"] == "degraded"
        assert degraded["last_errors"][-1]["error"] == "disk full"
        index.persist_error = None

        source.fail(OSError("inotify instance vanished"))
        with trio.fail_after(10):
            while True:
                now = health.status()
                watcher_errors = [e for e in now["last_errors"] if e["what"] == "watcher"]
                if watcher_errors and watcher_errors[0]["time"] is not None:
                    break
                await trio.sleep(0.05)
        assert now["state"] == "degraded" and now["watcher"] == "failed"
        assert any("watcher failed" in r for r in now["reasons"])
        assert "inotify instance vanished" in watcher_errors[0]["error"]
        nursery.cancel_scope.cancel()


async def test_a_wall_clock_set_back_does_not_keep_an_old_health_scan_fresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Health skips its own scan right after one (the watcher's): measured on the wall
    # clock, a clock set back an hour kept the last scan "fresh" for that hour, and
    # files the watcher missed were not seen meanwhile.
    source = ScriptedChangeSource()
    ws, index, cpu = indexed_workspace(tmp_path, "seen.md", source,
                                       WatcherConfig(reconcile_interval_s=3600.0))
    async with trio.open_nursery() as nursery:
        health = Health(ws, index, cpu)
        await nursery.start(health.run)
        await nursery.start(index.run)
        assert health.first_scan.is_set() and health.status()["state"] == "clean"
        real = time.time
        monkeypatch.setattr(maintenance, "time", SimpleNamespace(
            time=lambda: real() - 3600.0, monotonic=time.monotonic))
        monkeypatch.setattr(maintenance, "HEALTH_MIN_RESCAN_S", 0.0)
        source.silent = True  # the events of this note are lost
        (ws.root / "memory" / "2026-07-01" / "missed.md").write_text("# Missed\n\nunseen\n")
        source.silent = False
        seen = ws.root / "memory" / "2026-07-01" / "seen.md"
        seen.write_text("# Seen\n\nedited\n")
        assert source.emit([(Change.modified, seen)])  # an index change wakes health
        with trio.fail_after(30):
            while health.status()["unindexed_paths"] != ["memory/2026-07-01/missed.md"]:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


async def test_the_watcher_s_periodic_reconciles_stand_for_health_s_own_scans(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    # Health scanned the disk HEALTH_SCAN_INTERVAL_S after its own last scan, whatever the
    # watcher's periodic reconcile (as often) had scanned meanwhile: out of step, both
    # walked an idle workspace's folders every period. The clock stands still unless
    # jumped, so a scan running in a worker thread takes no time.
    period = maintenance.HEALTH_SCAN_INTERVAL_S
    ws, index, cpu = indexed_workspace(tmp_path, "a.md", ScriptedChangeSource(),
                                       WatcherConfig(reconcile_interval_s=period))
    own: list[float] = []
    reconciled: list[float] = []
    scanned = trio.Event()

    def seen(_disk: object, _known: object) -> None:
        nonlocal scanned
        reconciled.append(trio.current_time())
        scanned.set()
        scanned = trio.Event()

    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)  # its periodic reconciles: one period apart
        start = trio.current_time()
        index.watcher.scan_listeners.append(seen)
        mock_clock.jump(period / 2)  # health starts out of step with the watcher
        health = Health(ws, index, cpu)
        scan = health.scan
        own_done = trio.Event()

        async def counted(*, unattended: bool = False) -> None:
            own.append(trio.current_time())
            await scan(unattended=unattended)
            own_done.set()

        health.scan = counted  # type: ignore[method-assign]
        await nursery.start(health.run)
        with trio.fail_after(60):
            await own_done.wait()  # its first scan is its own, the startup one unseen
        assert own == [start + period / 2]
        meta = ws.root / ws.settings.metadata_dir
        for n in range(1, 4):  # three periods: the watcher scans, health need not
            waiting = scanned
            measured = health.derived_bytes or 0
            (meta / f"grown-{n}").write_bytes(b"x" * 100_000)
            mock_clock.jump(start + n * period - trio.current_time())
            with trio.fail_after(60):
                await waiting.wait()
            assert reconciled[-1] == start + n * period
            # ... and health measures what the index takes on disk beside it, once a
            # period (its own scan measured it half a period ago).
            limit = time.monotonic() + 60
            while n > 1 and (health.derived_bytes or 0) < measured + 100_000:
                assert time.monotonic() < limit, "derived_bytes not measured again"
                await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(period / 2 + 1)  # a period after health's own last scan
            await trio.testing.wait_all_tasks_blocked()
            assert own == [start + period / 2], f"health scanned again after {n} periods"
        nursery.cancel_scope.cancel()


async def test_health_scans_itself_a_period_after_the_last_scan_of_anyone(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    # A watcher that reconciles less often than health scans leaves the periodic scans to
    # health; a reconcile meanwhile (a requested one) still moves health's next one on.
    period = maintenance.HEALTH_SCAN_INTERVAL_S
    ws, index, cpu = indexed_workspace(tmp_path, "a.md", ScriptedChangeSource(),
                                       WatcherConfig(reconcile_interval_s=10 * period))
    own: list[float] = []
    done = [trio.Event()]
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        start = trio.current_time()
        health = Health(ws, index, cpu)
        scan = health.scan

        async def counted(*, unattended: bool = False) -> None:
            own.append(trio.current_time())
            await scan(unattended=unattended)
            done[-1].set()
            done.append(trio.Event())

        health.scan = counted  # type: ignore[method-assign]
        await nursery.start(health.run)
        with trio.fail_after(60):
            await done[0].wait()
        mock_clock.jump(period / 2)
        await index.watcher.reconcile("requested")
        mock_clock.jump(period / 2 + 1)  # a period after health's own scan
        await trio.testing.wait_all_tasks_blocked()
        assert own == [start]
        mock_clock.jump(period / 2 - 1)  # a period after the reconcile's
        with trio.fail_after(60):
            await done[1].wait()
        assert own == [start, start + 1.5 * period]
        nursery.cancel_scope.cancel()
