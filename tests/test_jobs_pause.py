"""A workspace's jobs paused while it is restored."""

from __future__ import annotations

import trio
import trio.testing
from test_jobs import Gate, Recorder, running, wait_state

from recalld.daemon.jobs import JobManager


async def test_a_pause_stops_running_jobs_and_runs_them_again_after_it(
        autojump_clock: object) -> None:
    rec = Recorder()
    gate = Gate()
    manager = JobManager(publish=rec)
    manager.register("work", gate)
    async with running(manager):
        first = await manager.submit("a", "work")
        other = await manager.submit("b", "work")
        await wait_state(manager, "a", first, "running")
        async with manager.paused("a", "restoring"):
            # Stopped before the pause is in force, not cancelled: queued again.
            assert manager.get("a", first)["state"] == "queued"
            later = await manager.submit("a", "work")
            await trio.testing.wait_all_tasks_blocked()
            assert manager.get("a", later)["state"] == "queued"
            assert manager.get("b", other)["state"] == "running"  # others go on
        await wait_state(manager, "a", later, "running")
        started = [j for agent, j in gate.started if agent == "a"]
        assert started[0] == first and sorted(started[1:]) == sorted([first, later])
        gate.open(first)
        gate.open(later)
        await wait_state(manager, "a", later, "succeeded")
        assert rec.states(first) == ["queued", "running", "queued", "running", "succeeded"]

