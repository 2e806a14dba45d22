"""Cron scheduling under a fake wall clock tied to trio's MockClock."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import trio

from recalld.daemon.scheduler import CronSchedule, CronScheduler, SchedulerConfig
from recalld.daemon.wallclock import FakeWallClock
from recalld.ipc.errors import AlreadyRunning

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


class Jobs:
    """Records submissions with the wall time they happened at."""

    def __init__(self, wall: FakeWallClock) -> None:
        self.wall = wall
        self.calls: list[tuple[str, str, dict[str, Any], datetime]] = []
        self.refuse = False

    async def submit(self, agent_id: str, kind: str, params: dict[str, Any]) -> str:
        if self.refuse:
            raise AlreadyRunning("busy")
        self.calls.append((agent_id, kind, params, self.wall.now()))
        return f"job{len(self.calls)}"

    def occurrences(self) -> list[datetime]:
        return [datetime.fromisoformat(p["occurrence"]) for _, _, p, _ in self.calls]


@asynccontextmanager
async def running(scheduler: CronScheduler) -> AsyncIterator[CronScheduler]:
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        yield scheduler
        nursery.cancel_scope.cancel()


async def advance_wall(wall: FakeWallClock, until: datetime) -> None:
    await trio.sleep((until - wall.now()).total_seconds())


def make(wall: FakeWallClock, tmp_path: Path | None = None, seed: int = 1,
         ) -> tuple[CronScheduler, Jobs]:
    jobs = Jobs(wall)
    state = tmp_path / "state" / "scheduler.json" if tmp_path is not None else None
    return CronScheduler(jobs.submit, state_path=state, wall=wall, rng=random.Random(seed),
                         run_sync=inline), jobs


def nightly(wall: FakeWallClock, tmp_path: Path | None = None, seed: int = 1,
            ) -> tuple[CronScheduler, Jobs]:
    """:func:`make`'s scheduler with agent ``a``'s dream at 23:00 UTC every night."""
    scheduler, jobs = make(wall, tmp_path, seed)
    scheduler.schedule("a", "auto_dream", "0 23 * * *", tz="UTC")
    return scheduler, jobs


async def inline(fn: Callable[..., Any], *args: Any) -> Any:
    # The autojump clock jumps while a real thread runs: keep state I/O in this thread.
    await trio.lowlevel.checkpoint()
    return fn(*args)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# -- the occurrence series ------------------------------------------------------------------


def series(expr: str, tz: ZoneInfo, start: datetime, n: int) -> list[datetime]:
    it = CronSchedule(expr, tz).occurrences(start)
    return [next(it).astimezone(tz) for _ in range(n)]


def test_spring_forward_fires_skipped_times_once_at_the_jump() -> None:
    got = series("30 2 * * *", BERLIN, utc(2026, 3, 27, 12), 3)
    assert [t.isoformat() for t in got] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]
    # Four local times inside the gap collapse into one firing.
    got = series("*/15 2 * * *", BERLIN, utc(2026, 3, 29, 0), 2)
    assert [t.isoformat() for t in got] == [
        "2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"]
    got = series("30 2 * * *", NEW_YORK, utc(2026, 3, 7, 12), 3)
    assert [t.isoformat() for t in got] == [
        "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00", "2026-03-10T02:30:00-04:00"]


def test_fall_back_fires_repeated_times_once() -> None:
    got = series("30 2 * * *", BERLIN, utc(2026, 10, 24, 12), 2)
    assert [t.isoformat() for t in got] == [
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    got = series("0 * * * *", BERLIN, utc(2026, 10, 24, 23, 30), 3)
    assert [t.isoformat() for t in got] == [
        "2026-10-25T02:00:00+02:00", "2026-10-25T03:00:00+01:00", "2026-10-25T04:00:00+01:00"]
    sched = CronSchedule("0 * * * *", BERLIN)
    # In the repeated hour the last occurrence is still the first pass's.
    assert sched.latest_at_or_before(utc(2026, 10, 25, 1, 30)) == utc(2026, 10, 25, 0)


@pytest.mark.parametrize("expr", ["*/7 * * * *", "30 2 * * *", "0 9 * * 1-5"])
def test_the_next_occurrence_remembered_is_the_one_computed(expr: str) -> None:
    # One schedule asked again and again, forwards and back (as status asks it on every
    # call), answers as a new schedule asked once each time; across both DST changes.
    rng = random.Random(expr)
    asked = CronSchedule(expr, BERLIN)
    at = utc(2026, 3, 28, 22)
    for _ in range(300):
        at += timedelta(minutes=rng.choice([-90, -3, 0, 1, 7, 45, 600]))
        assert asked.next_after(at) == CronSchedule(expr, BERLIN).next_after(at), at
    at = utc(2026, 10, 24, 22)
    for _ in range(100):
        at += timedelta(minutes=rng.choice([-30, 1, 13, 59]))
        assert asked.next_after(at) == CronSchedule(expr, BERLIN).next_after(at), at
    # Berlin times of the repeated hour (fold 1: the second pass), asked after one of
    # the first pass with an earlier wall clock: they compare by instant, not by clock.
    for minute in range(0, 60, 4):
        for fold in (1, 0, 1):
            local = datetime(2026, 10, 25, 2, minute, tzinfo=BERLIN, fold=fold)
            assert asked.next_after(local) == CronSchedule(expr, BERLIN).next_after(local), (
                local, fold)


def test_the_next_occurrence_is_computed_once_until_it_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Status asks for every entry's next run on every call: between two occurrences the
    # remembered answer serves, croniter runs again only once the occurrence is reached.
    import croniter as croniter_package

    sched = CronSchedule("0 23 * * *", BERLIN)
    made: list[object] = []
    real = croniter_package.croniter

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(croniter_package, "croniter", counting)
    at = utc(2026, 7, 1, 12)
    first = sched.next_after(at)
    for minutes in range(1, 500, 7):
        assert sched.next_after(at + timedelta(minutes=minutes)) == first
    assert len(made) == 1
    assert sched.next_after(first) == first + timedelta(days=1) and len(made) == 2


# R: croniter draws another minute at each reading, so "R 23 * * *" fired 81 times in 5 days.
@pytest.mark.parametrize("expr", ["bad", "61 * * * *", "0 0 30 2 *", "R 23 * * *",
                                  "0 r(0-5) * * *", "R/10 * * * *"])
def test_bad_expressions_are_refused(expr: str) -> None:
    with pytest.raises(ValueError):
        CronSchedule(expr, "UTC")


# -- the service ------------------------------------------------------------------------------


async def test_fires_once_per_occurrence_with_jitter(autojump_clock: object) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 12))
    scheduler, jobs = make(wall)
    scheduler.schedule("alice", "auto_dream", "0 23 * * *", tz="UTC", params={"x": 1})
    async with running(scheduler):
        await advance_wall(wall, utc(2026, 7, 4, 22))
    assert jobs.occurrences() == [utc(2026, 7, 1, 23), utc(2026, 7, 2, 23), utc(2026, 7, 3, 23)]
    for agent, kind, params, at in jobs.calls:
        assert (agent, kind, params["x"], params["trigger"]) == ("alice", "auto_dream", 1, "cron")
        delay = (at - datetime.fromisoformat(params["occurrence"])).total_seconds()
        assert 0.0 <= delay <= 60.0
    # Idle wakeups stay near one an hour, plus a few near each of the 3 targets.
    hours = (utc(2026, 7, 4, 22) - utc(2026, 7, 1, 12)).total_seconds() / 3600
    assert scheduler.wakeups <= hours + 3 * 8


async def test_jitter_spreads_within_bounds_over_seeds(autojump_clock: object) -> None:
    delays = []
    for seed in range(40):
        wall = FakeWallClock(utc(2026, 7, 1, 22, 59))
        scheduler, jobs = nightly(wall, seed=seed)
        async with running(scheduler):
            await advance_wall(wall, utc(2026, 7, 1, 23, 2))
        assert len(jobs.calls) == 1
        delays.append((jobs.calls[0][3] - utc(2026, 7, 1, 23)).total_seconds())
    assert all(0.0 <= d <= 60.0 for d in delays)
    assert max(delays) - min(delays) > 30.0  # really random, not a constant delay


async def test_a_new_jitter_applies_to_the_next_occurrences(autojump_clock: object) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 22, 59))
    scheduler, jobs = make(wall, seed=3)
    scheduler.schedule("a", "auto_dream", "0 * * * *", tz="UTC")
    async with running(scheduler):
        await advance_wall(wall, utc(2026, 7, 1, 23, 30))
        scheduler.set_jitter(0.0)  # a reload: on the minute from now on
        await advance_wall(wall, utc(2026, 7, 2, 2, 30))
        scheduler.set_jitter(600.0)
        await advance_wall(wall, utc(2026, 7, 2, 3, 30))
    delays = [(at - datetime.fromisoformat(p["occurrence"])).total_seconds()
              for _, _, p, at in jobs.calls]
    assert len(delays) == 5
    assert 0.0 < delays[0] <= 60.0
    assert delays[1:4] == [0.0, 0.0, 0.0]
    assert 60.0 < delays[4] <= 600.0  # seed 3 draws past the old bound


def by_kind(jobs: Jobs, kind: str) -> list[datetime]:
    return [o for (_, k, _, _), o in zip(jobs.calls, jobs.occurrences(), strict=True)
            if k == kind]


def within(times: list[datetime], lo: datetime, hi: datetime) -> list[datetime]:
    return [t for t in times if lo <= t <= hi]


async def test_spring_forward_in_the_running_service(autojump_clock: object) -> None:
    wall = FakeWallClock(utc(2026, 3, 27, 12))
    scheduler, jobs = make(wall)
    scheduler.schedule("a", "auto_dream", "30 2 * * *", tz=BERLIN)
    scheduler.schedule("a", "hourly", "0 * * * *", tz=BERLIN)
    async with running(scheduler):
        await advance_wall(wall, utc(2026, 3, 30, 12))
    assert [d.astimezone(BERLIN).isoformat() for d in by_kind(jobs, "auto_dream")] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]
    hourly = by_kind(jobs, "hourly")
    assert len(hourly) == len(set(hourly))
    # Local 01:00 CET, then 03:00 CEST (02:00 does not exist and adds nothing), 04:00 CEST.
    assert within(hourly, utc(2026, 3, 29, 0), utc(2026, 3, 29, 2)) == [
        utc(2026, 3, 29, 0), utc(2026, 3, 29, 1), utc(2026, 3, 29, 2)]


async def test_fall_back_in_the_running_service(autojump_clock: object) -> None:
    wall = FakeWallClock(utc(2026, 10, 24, 12))
    scheduler, jobs = make(wall)
    scheduler.schedule("a", "auto_dream", "30 2 * * *", tz=BERLIN)
    scheduler.schedule("a", "hourly", "0 * * * *", tz=BERLIN)
    async with running(scheduler):
        await advance_wall(wall, utc(2026, 10, 26, 12))
    assert [d.astimezone(BERLIN).isoformat() for d in by_kind(jobs, "auto_dream")] == [
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    hourly = by_kind(jobs, "hourly")
    assert len(hourly) == len(set(hourly))
    # 02:00 CEST fires; 02:00 CET (its second pass, 01:00 UTC) does not; 03:00 CET does.
    assert within(hourly, utc(2026, 10, 25, 0), utc(2026, 10, 25, 2)) == [
        utc(2026, 10, 25, 0), utc(2026, 10, 25, 2)]


async def test_wall_clock_jumps(autojump_clock: object) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 20))
    scheduler, jobs = nightly(wall)
    async with running(scheduler):
        await trio.sleep(60)
        # Forward over the occurrence (NTP step or suspend): it runs once, late.
        wall.jump(timedelta(hours=5))
        await trio.sleep(3 * 3600)
        assert jobs.occurrences() == [utc(2026, 7, 1, 23)]
        # Back to before the occurrence: it does not run again.
        wall.jump(timedelta(hours=-8))
        await advance_wall(wall, utc(2026, 7, 2, 22))
        assert jobs.occurrences() == [utc(2026, 7, 1, 23)]
        await advance_wall(wall, utc(2026, 7, 2, 23, 5))
        assert jobs.occurrences() == [utc(2026, 7, 1, 23), utc(2026, 7, 2, 23)]
        # A jump over three occurrences runs only the latest one.
        wall.jump(timedelta(days=3))
        await trio.sleep(3600 + 120)
        assert jobs.occurrences()[2:] == [utc(2026, 7, 5, 23)]
    late = (jobs.calls[0][3] - utc(2026, 7, 1, 23)).total_seconds()
    assert late <= 2 * 3600 + 60 + 3600  # noticed within one bounded sleep step


async def test_a_clock_set_back_shows_and_keeps_the_occurrences_it_already_fired(
    autojump_clock: object,
) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 22))
    scheduler, jobs = nightly(wall)
    async with running(scheduler):
        await advance_wall(wall, utc(2026, 7, 2, 0))
        # Back 25 hours (a clock read in the wrong zone): the night of July 1 is skipped
        # once more, and status says so; status said the night of June 30.
        wall.jump(timedelta(hours=-25))
        assert scheduler.status()[0]["next"] == utc(2026, 7, 2, 23).isoformat()
        await advance_wall(wall, utc(2026, 7, 2, 23, 5))
    assert jobs.occurrences() == [utc(2026, 7, 1, 23), utc(2026, 7, 2, 23)]


@pytest.mark.parametrize("restart", [False, True])
async def test_an_occurrence_fired_by_a_clock_years_ahead_does_not_silence_the_entry(
    tmp_path: Path, autojump_clock: object, restart: bool,
) -> None:
    """A machine that ran years ahead (a dead RTC battery, a wrong manual setting) fired
    its night; set right, its entry kept waiting for that night to come again, while
    status showed the next night as due."""
    wall = FakeWallClock(utc(2036, 3, 1, 22))
    first, jobs1 = nightly(wall, tmp_path)
    async with running(first):
        await advance_wall(wall, utc(2036, 3, 1, 23, 5))
        assert jobs1.occurrences() == [utc(2036, 3, 1, 23)]
        if not restart:
            wall.jump(utc(2026, 7, 1, 12) - wall.now())
            await advance_wall(wall, utc(2026, 7, 1, 23, 5))
    if restart:
        wall.jump(utc(2026, 7, 1, 12) - wall.now())
        second, jobs2 = nightly(wall, tmp_path)
        async with running(second):
            await trio.sleep(60)
            # Not a catch-up of the nights "missed" up to the wrong clock's night.
            assert jobs2.calls == []
            assert second.status()[0]["next"] == utc(2026, 7, 1, 23).isoformat()
            await advance_wall(wall, utc(2026, 7, 1, 23, 5))
        jobs1.calls += jobs2.calls
    assert jobs1.occurrences() == [utc(2036, 3, 1, 23), utc(2026, 7, 1, 23)]


async def test_a_start_before_the_network_time_repeats_no_night(
    tmp_path: Path, autojump_clock: object,
) -> None:
    # A machine with no clock of its own starts in 1970, and the network time comes a few
    # minutes later: the night fired before the reboot does not fire again.
    wall = FakeWallClock(utc(2026, 7, 1, 22))
    first, jobs1 = nightly(wall, tmp_path)
    async with running(first):
        await advance_wall(wall, utc(2026, 7, 1, 23, 5))
    wall.jump(utc(1970, 1, 1, 0, 0) - wall.now())
    second, jobs2 = nightly(wall, tmp_path)
    async with running(second):
        await trio.sleep(300)
        wall.jump(utc(2026, 7, 2, 8) - wall.now())
        await advance_wall(wall, utc(2026, 7, 2, 23, 5))
    assert jobs1.occurrences() + jobs2.occurrences() == [utc(2026, 7, 1, 23),
                                                         utc(2026, 7, 2, 23)]


async def test_restart_does_not_repeat_and_catches_up_once(
    tmp_path: Path, autojump_clock: object
) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 22))
    first, jobs1 = nightly(wall, tmp_path)
    async with running(first):
        await advance_wall(wall, utc(2026, 7, 1, 23, 5))
    assert jobs1.occurrences() == [utc(2026, 7, 1, 23)]

    # Restarted right after: the finished occurrence is not run again.
    second, jobs2 = nightly(wall, tmp_path)
    async with running(second):
        await advance_wall(wall, utc(2026, 7, 2, 22))
    assert jobs2.calls == []

    # Down across three occurrences: one catch-up run at start, then the normal series.
    wall.jump(timedelta(days=3))
    third, jobs3 = nightly(wall, tmp_path)
    async with running(third):
        await trio.sleep(120)
        assert jobs3.occurrences() == [utc(2026, 7, 4, 23)]
        await advance_wall(wall, utc(2026, 7, 5, 23, 5))
    assert jobs3.occurrences() == [utc(2026, 7, 4, 23), utc(2026, 7, 5, 23)]
    assert not list((tmp_path / "state").glob("*.tmp*"))


async def test_a_zone_named_otherwise_after_a_restart_keeps_the_missed_night(
    tmp_path: Path, autojump_clock: object
) -> None:
    # TZ=UTC in one run, Etc/UTC in the next (the same zone): the last occurrence was
    # dropped, so the night missed while the daemon was down never fired.
    wall = FakeWallClock(utc(2026, 7, 1, 22))
    first, jobs1 = make(wall, tmp_path)
    first.schedule("a", "auto_dream", "0 23 * * *", tz="Etc/UTC")
    async with running(first):
        await advance_wall(wall, utc(2026, 7, 1, 23, 5))
    assert jobs1.occurrences() == [utc(2026, 7, 1, 23)]
    wall.jump(timedelta(days=1))  # down over the night of July 2
    second, jobs2 = nightly(wall, tmp_path)
    async with running(second):
        await trio.sleep(120)
        assert jobs2.occurrences() == [utc(2026, 7, 2, 23)]  # once, at the start
    # Another zone: its occurrences after the last one fire, none again, none missed.
    third, jobs3 = make(wall, tmp_path)
    third.schedule("a", "auto_dream", "0 23 * * *", tz=NEW_YORK)
    async with running(third):
        await advance_wall(wall, utc(2026, 7, 4, 12))
    assert jobs3.occurrences() == [datetime(2026, 7, 2, 23, tzinfo=NEW_YORK),
                                   datetime(2026, 7, 3, 23, tzinfo=NEW_YORK)]


async def test_restart_during_the_jitter_delay_fires_once(
    tmp_path: Path, autojump_clock: object
) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 22, 50))
    first, jobs1 = nightly(wall, tmp_path)
    async with running(first):
        # Seed 1 draws a delay of about 8 s: stop one second into it.
        await advance_wall(wall, utc(2026, 7, 1, 23, 0, 1))
    second, jobs2 = nightly(wall, tmp_path, seed=7)
    async with running(second):
        await advance_wall(wall, utc(2026, 7, 2, 12))
    assert jobs1.calls == []  # cut short inside its delay: not recorded as fired
    assert (jobs1.occurrences() + jobs2.occurrences()) == [utc(2026, 7, 1, 23)]


async def test_new_entries_do_not_catch_up_and_disable_forgets(
    tmp_path: Path, autojump_clock: object
) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 23, 30))  # just after today's occurrence
    scheduler, jobs = make(wall, tmp_path)
    async with running(scheduler):
        scheduler.schedule("a", "auto_dream", "0 23 * * *", tz="UTC")  # while running
        await trio.sleep(3600)
        assert jobs.calls == []
        scheduler.schedule("a", "auto_dream", "0 23 * * *", enabled=False)
        await advance_wall(wall, utc(2026, 7, 3, 12))
        assert jobs.calls == []
        scheduler.schedule("a", "auto_dream", "0 23 * * *", tz="UTC")
        await advance_wall(wall, utc(2026, 7, 3, 23, 5))
        assert jobs.occurrences() == [utc(2026, 7, 3, 23)]
        status = scheduler.status()
        assert status[0]["next"] == utc(2026, 7, 4, 23).isoformat()


async def test_busy_job_counts_as_fired(autojump_clock: object) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 22))
    scheduler, jobs = nightly(wall)
    jobs.refuse = True  # the previous dream is still running
    async with running(scheduler):
        await advance_wall(wall, utc(2026, 7, 2, 12))
        jobs.refuse = False
        await advance_wall(wall, utc(2026, 7, 2, 23, 5))
    assert jobs.occurrences() == [utc(2026, 7, 2, 23)]


async def test_state_file_garbage_starts_afresh(tmp_path: Path, autojump_clock: object) -> None:
    wall = FakeWallClock(utc(2026, 7, 1, 23, 30))
    path = tmp_path / "state" / "scheduler.json"
    path.parent.mkdir()
    path.write_bytes(b"\x00{not json")
    scheduler, jobs = nightly(wall, tmp_path)
    async with running(scheduler):
        await trio.sleep(60)
    assert jobs.calls == []  # no catch-up from a state it cannot read
    assert b"auto_dream" in path.read_bytes()


@pytest.mark.parametrize("shape", ["folder", "fifo"])
async def test_a_state_file_that_is_no_file_is_set_aside(tmp_path: Path, shape: str,
                                                         autojump_clock: object) -> None:
    """A folder or FIFO where the state file goes: no save could ever replace it, so it
    is moved aside at the start and the state is saved again."""
    wall = FakeWallClock(utc(2026, 7, 1, 23, 30))
    path = tmp_path / "state" / "scheduler.json"
    path.parent.mkdir()
    if shape == "folder":
        (path / "inner").mkdir(parents=True)
    else:
        os.mkfifo(path)
    scheduler, _ = nightly(wall, tmp_path)
    async with running(scheduler):
        await trio.sleep(60)
    assert path.is_file() and b"auto_dream" in path.read_bytes()
    (aside,) = path.parent.glob("scheduler.json.corrupt-*")
    assert aside.is_dir() if shape == "folder" else aside.is_fifo()
    assert scheduler.write_failure.failed is None


def test_config_defaults() -> None:
    cfg = SchedulerConfig()
    assert cfg.jitter_max_s == 60.0
    assert cfg.max_step_s <= 3600.0


def test_local_zone_follows_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    assert CronSchedule("0 23 * * *").tz == NEW_YORK
    monkeypatch.setenv("TZ", ":Europe/Berlin")
    assert CronSchedule("0 23 * * *").tz == BERLIN

