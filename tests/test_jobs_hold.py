"""A workspace's hold is journaled before it is told: a kill right after keeps its jobs."""

from __future__ import annotations

from pathlib import Path

from test_jobs import Gate, running

from recalld.daemon.jobs import JobManager
from recalld.daemon.store import applog


async def test_a_hold_is_on_disk_once_it_returns(tmp_path: Path) -> None:
    # The close of a workspace held its queued reindex, but the journal write was started
    # in the background: a daemon killed right after the close was answered read the job
    # back as queued, not held, and reported it "interrupted by daemon restart" (a
    # reindex does not resume) instead of keeping it for the workspace's next opening.
    journal = tmp_path / "jobs.jsonl"
    gate = Gate()
    first = JobManager(journal_path=journal)
    first.register("reindex", gate)
    async with running(first):
        async with first.paused("a", "the test keeps it queued"):
            job_id = await first.submit("a", "reindex")
            await first.hold("a", "its workspace closes")
            # What a kill -9 at this moment leaves: the bytes on disk, no other task run.
            records, _, _ = applog.parse(journal.read_bytes())
        latest = [r for r in records if r["job_id"] == job_id][-1]
        assert latest["state"] == "queued" and latest["held"] is True, latest
        assert first.get("a", job_id)["held"] is True

    second = JobManager(journal_path=journal)
    second.register("reindex", gate)
    async with running(second):
        again = second.get("a", job_id)
        assert again["state"] == "queued" and again["held"] is True, again
        assert second.statistics()["held"] == 1
