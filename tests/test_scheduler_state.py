"""The scheduler's state file (the time each entry last fired) under damage and across
the version that added its checksum, under a fake wall clock tied to trio's MockClock."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from test_scheduler import advance_wall, nightly, running, utc

from recalld.daemon.wallclock import FakeWallClock


async def test_a_bit_flipped_in_the_state_file_runs_no_occurrence_twice(
        tmp_path: Path, autojump_clock: object) -> None:
    """A flipped bit that still parses (the hour fired, 23, read as 22) is caught by the
    file's checksum: the file is set aside and the finished occurrence not run again."""
    wall = FakeWallClock(utc(2026, 7, 2, 22, 30))
    scheduler, jobs = nightly(wall, tmp_path)
    async with running(scheduler):
        await advance_wall(wall, utc(2026, 7, 2, 23, 5))
    assert jobs.occurrences() == [utc(2026, 7, 2, 23)]
    path = tmp_path / "state" / "scheduler.json"
    data = path.read_bytes()
    assert data.count(b"T23:") == 1, data
    path.write_bytes(data.replace(b"T23:", b"T22:"))  # '3' ^ 0x01 == '2'
    again, more = nightly(wall, tmp_path)
    async with running(again):
        await trio.sleep(60)
    assert more.calls == []
    assert list(path.parent.glob("scheduler.json.corrupt-*"))



async def test_a_state_file_of_the_version_before_checksums_is_read(
        tmp_path: Path, autojump_clock: object) -> None:
    # Written by the version before: read as it is, so the missed run is caught up.
    wall = FakeWallClock(utc(2026, 7, 2, 23, 30))
    path = tmp_path / "state" / "scheduler.json"
    path.parent.mkdir()
    fired = {"last_fired": utc(2026, 7, 1, 23).isoformat(), "cron": "0 23 * * *", "tz": "UTC"}
    path.write_text(json.dumps({"version": 1, "entries": {"a/auto_dream": fired}}))
    scheduler, jobs = nightly(wall, tmp_path)
    async with running(scheduler):
        await trio.sleep(120)
    assert jobs.occurrences() == [utc(2026, 7, 2, 23)]
    assert not list(path.parent.glob("scheduler.json.corrupt-*"))
