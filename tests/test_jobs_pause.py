"""A workspace's jobs paused while it is restored."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio
import trio.testing
from test_jobs import Gate, Recorder, running, wait_state

from recalld.daemon.jobrecords import JobContext, JobsConfig, JobStatistics
from recalld.daemon.jobs import INTERRUPTED, JobManager


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



async def test_a_stop_ends_the_running_jobs_before_it_returns_and_starts_none(
        tmp_path: Path) -> None:
    # The daemon's stop cancelled the jobs with the workspaces: a job's last writes (its
    # inbox item) raced with the close of the stores they go to.
    journal = tmp_path / "state" / "jobs.jsonl"
    ended: list[str] = []
    started = trio.Event()

    async def work(job: JobContext) -> dict[str, Any]:
        try:
            started.set()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(0)  # the last writes of a cancelled handler
                ended.append(job.job_id)
        return {}

    first = JobManager(journal_path=journal, config=JobsConfig(max_running_per_workspace=1))
    first.register("resumable", work, resumable=True)
    first.register("once", work)
    async with running(first):
        going = await first.submit("a", "resumable")
        await started.wait()
        queued = await first.submit("a", "once")
        await first.stop("the daemon stops")
        assert ended == [going]  # ended before the stop returned
        later = await first.submit("b", "resumable")
        await trio.testing.wait_all_tasks_blocked()
        assert [first.get(a, j)["state"] for a, j in
                (("a", going), ("a", queued), ("b", later))] == ["queued"] * 3

    second = JobManager(journal_path=journal)
    done = Gate()
    second.register("resumable", done, resumable=True)
    second.register("once", done)
    async with running(second):
        assert second.get("a", queued)["error"] == INTERRUPTED
        for agent, job_id in (("a", going), ("b", later)):
            done.open(job_id)
            finished = await wait_state(second, agent, job_id, "succeeded")
            assert finished["resumed"]
        assert sorted(done.started) == sorted([("a", going), ("b", later)])


async def test_the_job_counts_agree_with_each_state_published(tmp_path: Path) -> None:
    # A job stopped by a pause was published queued while the manager's statistics (and
    # daemon.status) still counted it running, until its journal record was written; a
    # job that ended likewise, succeeded or cancelled and still running.
    last: dict[str, str] = {}
    mismatches: list[tuple[dict[str, str], JobStatistics]] = []

    def publish(topic: str, payload: Mapping[str, Any]) -> None:
        if topic == "job.state":
            last[payload["job_id"]] = payload["state"]
            stats, states = manager.statistics(), list(last.values())
            if (stats["running"], stats["queued"]) != (states.count("running"),
                                                       states.count("queued")):
                mismatches.append((dict(last), stats))

    gate = Gate()
    manager = JobManager(journal_path=tmp_path / "jobs.jsonl", publish=publish,
                         config=JobsConfig(max_running_per_workspace=1))
    manager.register("work", gate)
    async with running(manager):
        first = await manager.submit("a", "work")
        second = await manager.submit("a", "work")
        await wait_state(manager, "a", first, "running")
        async with manager.paused("a", "restoring"):
            assert manager.get("a", first)["state"] == "queued"
        await wait_state(manager, "a", first, "running")
        gate.open(first)
        await wait_state(manager, "a", second, "running")
        await manager.cancel("a", second)
        assert manager.statistics()["running"] == 0
    assert last == {first: "succeeded", second: "cancelled"}
    assert not mismatches, mismatches
