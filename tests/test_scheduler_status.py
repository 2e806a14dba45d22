"""What status says of a scheduled entry while an occurrence waits its random delay: the
occurrence it is about to run, not the next night's (a night that looks skipped)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trio
import trio.testing
from test_scheduler import Jobs, advance_wall, inline, running

from recalld.daemon.scheduler import CronScheduler, SchedulerConfig
from recalld.daemon.wallclock import FakeWallClock


class LongestDelay(random.Random):
    """Every delay drawn is the longest allowed."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _scheduler(wall: FakeWallClock, tmp_path: Path) -> tuple[CronScheduler, Jobs]:
    jobs = Jobs(wall)
    scheduler = CronScheduler(jobs.submit, state_path=tmp_path / "scheduler.json", wall=wall,
                              rng=LongestDelay(), run_sync=inline,
                              config=SchedulerConfig(jitter_max_s=3600.0))
    scheduler.schedule("a", "auto_dream", "30 2 * * *", tz="Europe/Berlin")
    return scheduler, jobs


async def test_next_is_the_occurrence_waiting_its_delay(tmp_path: Path,
                                                        autojump_clock: object) -> None:
    # 02:30 on Berlin's spring-forward day is 03:00 CEST (01:00 UTC); the delay is an hour.
    wall = FakeWallClock(datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    scheduler, jobs = _scheduler(wall, tmp_path)
    tonight = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    async with running(scheduler):
        await advance_wall(wall, tonight + timedelta(minutes=30))
        assert jobs.calls == []
        assert datetime.fromisoformat(scheduler.status()[0]["next"]) == tonight
        await advance_wall(wall, tonight + timedelta(hours=1, minutes=1))
        assert jobs.occurrences() == [tonight]
        assert datetime.fromisoformat(scheduler.status()[0]["next"]) == datetime(
            2026, 3, 30, 0, 30, tzinfo=UTC)


async def test_next_after_a_restart_is_the_missed_occurrence_run_once(
        tmp_path: Path, autojump_clock: object) -> None:
    wall = FakeWallClock(datetime(2026, 3, 20, 12, 0, tzinfo=UTC))
    scheduler, _ = _scheduler(wall, tmp_path)
    async with running(scheduler):
        await trio.testing.wait_all_tasks_blocked()
    # Down for three nights: the last of them runs once, and status names it meanwhile.
    wall.jump(timedelta(days=3))
    scheduler, jobs = _scheduler(wall, tmp_path)
    async with running(scheduler):
        await trio.testing.wait_all_tasks_blocked()
        missed = datetime(2026, 3, 23, 1, 30, tzinfo=UTC)
        assert datetime.fromisoformat(scheduler.status()[0]["next"]) == missed
        await trio.sleep(3601)
        assert jobs.occurrences() == [missed]
