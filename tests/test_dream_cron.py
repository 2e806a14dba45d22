"""The dream cron as the daemon wires it: workspace settings -> scheduler -> job manager.

Fake wall clock tied to trio's MockClock (autojump): the real CronScheduler, the real
JobManager and the consolidation wiring; only the auto_dream handler is replaced by one
that records when it ran.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio
from test_scheduler import inline

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.jobrecords import JobContext
from recalld.daemon.jobs import JobManager
from recalld.daemon.memory.consolidation import DREAM_KIND, Consolidation
from recalld.daemon.scheduler import CronScheduler
from recalld.daemon.wallclock import FakeWallClock
from recalld.daemon.workspaces import Workspace


class Harness:
    def __init__(self, tmp_path: Path, wall: FakeWallClock, seed: int) -> None:
        cfg = DaemonConfig(socket_path=tmp_path / "s.sock", data_dir=tmp_path / "data",
                           config_path=tmp_path / "config.toml")
        self.wall = wall
        self.jobs = JobManager(agent_exists=lambda agent: True)
        self.scheduler = CronScheduler(self.jobs.submit, state_path=cfg.state_dir
                                       / "scheduler.json", wall=wall,
                                       rng=random.Random(seed), run_sync=inline)
        self.consolidation = Consolidation(self.jobs, self.scheduler, self.no_workspace,
                                           trio.sleep_forever)
        self.consolidation.register_jobs()
        self.ran: list[tuple[str, dict[str, Any], datetime]] = []
        self.jobs.register(DREAM_KIND, self.record, exclusive=True)

    @staticmethod
    def no_workspace(agent_id: str) -> Workspace:
        raise AssertionError(f"the recorded dream handler needs no workspace ({agent_id})")

    async def record(self, job: JobContext) -> dict[str, Any]:
        self.ran.append((job.agent_id, dict(job.params), self.wall.now()))
        return {}

    def workspace(self, tmp_path: Path, agent: str, **settings: Any) -> Workspace:
        return Workspace(agent, tmp_path / agent, WorkspaceSettings(**settings))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Harness]:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.jobs.run)
            await nursery.start(self.scheduler.run)
            yield self
            nursery.cancel_scope.cancel()


async def sleep_until(wall: FakeWallClock, until: datetime) -> None:
    await trio.sleep((until - wall.now()).total_seconds())


@pytest.fixture(autouse=True)
def utc_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")


@pytest.mark.parametrize("seed", [1, 7, 42])
async def test_dream_fires_once_per_occurrence_with_jitter(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, seed: int) -> None:
    wall = FakeWallClock(datetime(2026, 11, 29, 22, 0, tzinfo=UTC))
    h = Harness(tmp_path, wall, seed)
    ws = h.workspace(tmp_path, "w1")  # defaults: "0 23 * * *", enabled
    off = h.workspace(tmp_path, "w2", dream_cron_enabled=False)
    bad = h.workspace(tmp_path, "w3", dream_cron="61 * * * *")
    async with h.running():
        assert h.consolidation.schedule_workspace(ws) is None
        assert h.consolidation.schedule_workspace(off) is None
        assert "invalid cron" in (h.consolidation.schedule_workspace(bad) or "")
        status = h.consolidation.dream_status(ws)
        assert status["next_run"] == "2026-11-29T23:00:00+00:00"
        assert "next_run" not in h.consolidation.dream_status(off)
        await sleep_until(wall, datetime(2026, 11, 30, 23, 2, tzinfo=UTC))
        await trio.testing.wait_all_tasks_blocked()
    assert [a for a, _, _ in h.ran] == ["w1", "w1"]
    for (_, params, at), day in zip(h.ran, (29, 30), strict=True):
        occurrence = datetime(2026, 11, day, 23, 0, tzinfo=UTC)
        assert params["trigger"] == "cron"
        assert datetime.fromisoformat(params["occurrence"]) == occurrence
        assert occurrence <= at <= occurrence + timedelta(seconds=60)

    # A restart (new scheduler, same state file) does not fire the same night again.
    h2 = Harness(tmp_path, wall, seed + 1)
    async with h2.running():
        h2.consolidation.schedule_workspace(ws)
        await sleep_until(wall, datetime(2026, 11, 30, 23, 50, tzinfo=UTC))
        await trio.testing.wait_all_tasks_blocked()
        assert h2.ran == []
        await sleep_until(wall, datetime(2026, 12, 1, 23, 2, tzinfo=UTC))
        await trio.testing.wait_all_tasks_blocked()
    assert len(h2.ran) == 1
    assert h2.ran[0][1]["occurrence"] == "2026-12-01T23:00:00+00:00"


async def test_unscheduled_on_close_and_still_running_dream_is_not_doubled(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    wall = FakeWallClock(datetime(2026, 11, 29, 22, 0, tzinfo=UTC))
    h = Harness(tmp_path, wall, 5)
    ws = h.workspace(tmp_path, "w1", dream_cron="0 * * * *")
    release = trio.Event()

    async def slow(job: JobContext) -> dict[str, Any]:
        h.ran.append((job.agent_id, dict(job.params), wall.now()))
        await release.wait()
        return {}

    h.jobs.register(DREAM_KIND, slow, exclusive=True)
    async with h.running():
        h.consolidation.schedule_workspace(ws)
        # 23:00 starts a dream that is still running at 00:00: that occurrence is skipped.
        await sleep_until(wall, datetime(2026, 11, 30, 0, 5, tzinfo=UTC))
        assert len(h.ran) == 1
        release.set()
        await sleep_until(wall, datetime(2026, 11, 30, 1, 5, tzinfo=UTC))
        assert len(h.ran) == 2
        h.scheduler.unschedule(ws.agent_id, DREAM_KIND)  # what closing the workspace does
        await sleep_until(wall, datetime(2026, 11, 30, 5, 5, tzinfo=UTC))
    assert len(h.ran) == 2


@pytest.mark.parametrize("how", ["disabled", "forgotten"])
async def test_a_dream_turned_off_or_forgotten_does_not_catch_up_when_back(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, how: str) -> None:
    # Disabled (dream_cron_enabled = false) or its workspace closed with forget, then on
    # again days later: its entry starts from then, as a new one does; the nights it was
    # off are not made up for at once (a reopen after a plain close or a restart is).
    wall = FakeWallClock(datetime(2026, 11, 29, 22, 0, tzinfo=UTC))
    h = Harness(tmp_path, wall, 3)
    on = h.workspace(tmp_path, "w.1")
    async with h.running():
        h.consolidation.schedule_workspace(on)
        await sleep_until(wall, datetime(2026, 11, 29, 22, 30, tzinfo=UTC))
        if how == "disabled":
            h.consolidation.schedule_workspace(
                h.workspace(tmp_path, "w.1", dream_cron_enabled=False))
        else:
            h.scheduler.unschedule(on.agent_id, DREAM_KIND)  # what its close does
            await h.scheduler.forget(on.agent_id)
        await sleep_until(wall, datetime(2026, 12, 2, 12, 0, tzinfo=UTC))
        await trio.testing.wait_all_tasks_blocked()
    assert h.ran == []
    h2 = Harness(tmp_path, wall, 4)  # and across a restart while it was off
    async with h2.running():
        h2.consolidation.schedule_workspace(on)
        await sleep_until(wall, datetime(2026, 12, 2, 22, 59, tzinfo=UTC))
        await trio.testing.wait_all_tasks_blocked()
        assert h2.ran == []
        await sleep_until(wall, datetime(2026, 12, 2, 23, 2, tzinfo=UTC))
        await trio.testing.wait_all_tasks_blocked()
    assert [params["occurrence"] for _, params, _ in h2.ran] == ["2026-12-02T23:00:00+00:00"]
