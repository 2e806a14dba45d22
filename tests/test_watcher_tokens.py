"""The watcher's reconciles and the daemon's background CPU tokens: unattended scans wait
for one, outside the apply lock; a reconcile someone waits for, or a rescan owed under
the apply lock, takes none.

Under the autojump clock, with a scripted change source.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from watcher_harness import ROOTS, FakeIndex, disk_notes, eventually, inline, make, write
from watchfiles import Change

from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import ReconcileResult, WatcherConfig
from recalld.daemon.watchsource import ScriptedChangeSource


async def test_reconcile_scans_wait_for_a_background_token(
    tmp_path: Path, autojump_clock: object
) -> None:
    # The daemon gives work nobody waits for all but one CPU token (services.background):
    # a reconcile's scan takes one of those first, so it never holds a search's token.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    watcher, index, _ = make(tmp_path, background=background, reconcile_before_ready=False)
    async with trio.open_nursery() as nursery:
        async with background:
            await nursery.start(watcher.run)
            await trio.sleep(60)
            assert index.applied_paths() == set()  # the startup scan waits for the token
        await eventually(lambda: index.applied_paths() == {"memory/2026-07-01/n0.md"})
        nursery.cancel_scope.cancel()


async def test_a_reconcile_someone_waits_for_takes_no_background_token(
    tmp_path: Path, autojump_clock: object
) -> None:
    # A sync's fallback, a restore or a rebuild reconciles for a caller that waits: it must
    # not queue behind other workspaces' background work.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    watcher, index, _ = make(tmp_path, background=background, reconcile_before_ready=False)
    async with background:
        with trio.fail_after(60):  # virtual time: fails at once if it waits for the token
            result = await watcher.reconcile("after restore")
    assert result.added == 1
    assert index.applied_paths() == {"memory/2026-07-01/n0.md"}


async def test_an_unattended_reconcile_waits_for_its_token_outside_the_apply_lock(
    tmp_path: Path, autojump_clock: object
) -> None:
    # A periodic reconcile waiting for a background token must not hold the apply lock
    # meanwhile: a reconcile someone waits for (and every edit's flush) goes first.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    watcher, index, _ = make(tmp_path, background=background, reconcile_before_ready=False)
    release = trio.Event()
    periodic: list[ReconcileResult] = []

    async def hold_background(task_status: trio.TaskStatus[None]) -> None:
        async with background:  # other workspaces' background work
            task_status.started()
            await release.wait()

    async def run_periodic() -> None:
        periodic.append(await watcher.reconcile("periodic", unattended=True))

    async with trio.open_nursery() as nursery:
        await nursery.start(hold_background)
        nursery.start_soon(run_periodic)
        await eventually(lambda: background.statistics().tasks_waiting == 1)
        with trio.fail_after(60):  # virtual time: fails at once if it waits for the token
            result = await watcher.reconcile("after restore")
        assert result.added == 1 and not periodic
        release.set()
        await eventually(lambda: len(periodic) == 1)
    assert periodic[0].reason == "periodic" and periodic[0].added == 0
    assert index.applied_paths() == {"memory/2026-07-01/n0.md"}


async def test_a_rescan_owed_under_the_apply_lock_does_not_wait_for_a_token(
    tmp_path: Path, autojump_clock: object
) -> None:
    # An edit's flush waits for the apply lock (held by a reconcile someone waits for);
    # a periodic reconcile takes the one background token and waits for the lock behind
    # it; then the pending set overflows, so the flush, once it has the lock, owes a
    # rescan. Waiting for the token there would wait for the periodic reconcile, which
    # waits for the lock: the rescan scans without one instead, and both end.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    index, src = FakeIndex(tmp_path), ScriptedChangeSource()
    applying, release = trio.Event(), trio.Event()

    async def apply(paths: set[str]) -> None:
        if "memory/2026-07-01/held.md" in paths:
            applying.set()
            await release.wait()
        await index.apply(paths)

    config = WatcherConfig(max_pending=2, reconcile_before_ready=False,
                           reconcile_interval_s=1e6)
    watcher = Watcher(tmp_path, ROOTS, apply=apply, known=index.known, source=src,
                      config=config, wall=trio.current_time, background=background,
                      run_sync=inline)
    periodic: list[ReconcileResult] = []

    async def run_periodic() -> None:
        periodic.append(await watcher.reconcile("periodic", unattended=True))

    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        await eventually(lambda: index.applied_paths() == {"memory/2026-07-01/n0.md"})
        write(tmp_path / "memory" / "2026-07-01" / "held.md", "held")
        nursery.start_soon(watcher.reconcile, "after restore")
        with trio.fail_after(60):
            await applying.wait()
        edit = write(tmp_path / "memory" / "2026-07-01" / "e0.md", "edit 0")
        src.emit([(Change.added, edit)])
        await trio.testing.wait_all_tasks_blocked()  # the flush on the apply lock
        nursery.start_soon(run_periodic)
        await eventually(lambda: background.statistics().borrowed_tokens == 1)
        more = [write(tmp_path / "memory" / "2026-07-01" / f"e{i}.md", f"edit {i}")
                for i in range(1, 4)]
        src.emit([(Change.added, p) for p in more])  # over max_pending: a rescan is owed
        release.set()
        with trio.fail_after(60):  # virtual time: a wait for ever fails at once
            await eventually(lambda: len(periodic) == 1)
        assert index.texts() == disk_notes(tmp_path)  # the edits and held.md applied
        nursery.cancel_scope.cancel()
