"""The job journal: every job record, appended as its state changes, read back at a start.

:class:`JobJournal` owns ``<state>/jobs.journal`` (an :class:`AppendLog`): :meth:`open`
reads it back (damaged records skipped and logged), :meth:`append` adds one record (and
compacts the log once it holds many more lines than jobs are kept), :meth:`rewrite`
replaces it with the records kept. Without a path (a manager assembled by hand) it writes
nothing. The job manager (:mod:`recalld.daemon.jobs`) decides what is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.statefiles import WriteFailure
from recalld.daemon.store.applog import AppendLog
from recalld.ipc.answers import JobInfo
from recalld.ipc.errors import RecalldError

log = logging.getLogger("recalld.daemon.jobs")

#: The records of every job kept, for a compaction.
Retained = Callable[[], Sequence[JobInfo]]


class JobJournal:
    """The append log of job records (no file: every call does nothing)."""

    def __init__(self, path: Path | None, write_timeout_s: float) -> None:
        self._log = AppendLog(path) if path is not None else None
        self._write_timeout_s = write_timeout_s
        self.write_failure = WriteFailure(path)
        self._lock = trio.Lock()
        self._lines = 0
        self._open = False

    async def open(self) -> list[JsonObject]:
        """Read the journal back: the latest record of each job, oldest job first."""
        if self._log is None:
            return []
        records, report = await trio.to_thread.run_sync(self._log.open)
        self._open = True
        for bad in report.bad_lines:
            log.warning("job journal: skipped a damaged record: %s", bad)
        latest: dict[str, JsonObject] = {}
        for rec in records:
            if "job_id" in rec and "agent_id" in rec and "kind" in rec:
                latest[str(rec["job_id"])] = rec  # later records win
        return list(latest.values())

    async def append(self, record: JobInfo, retained: Retained) -> None:
        """Append ``record``. Shielded: a state change that happened is recorded. Before
        :meth:`open` nothing is written: the start rewrites the journal with every job."""
        if self._log is None or not self._open:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(self._write_timeout_s):
            async with self._lock:
                try:
                    await trio.to_thread.run_sync(self._log.append, [record])
                    self._lines += 1
                    kept = with_record(retained(), record)
                    if self._lines > 4 * len(kept) + 1000:
                        await trio.to_thread.run_sync(self._log.rewrite, kept)
                        self._lines = len(kept)
                except (RecalldError, TypeError) as exc:  # TypeError: JSON cannot hold it
                    log.exception("job journal write failed for %s", record["job_id"])
                    self.write_failure.record(
                        exc.message if isinstance(exc, RecalldError) else str(exc))
                else:
                    self.write_failure.clear()

    async def drop(self, retained: Retained) -> None:
        """Rewrite the journal with ``retained()`` only, once jobs were dropped from
        memory (they would come back at the next start). Shielded, as :meth:`append`;
        a failure is logged and recorded as its are."""
        if self._log is None or not self._open:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(self._write_timeout_s):
            async with self._lock:
                kept = retained()
                try:
                    await trio.to_thread.run_sync(self._log.rewrite, kept)
                    self._lines = len(kept)
                except RecalldError as exc:
                    log.exception("job journal rewrite failed")
                    self.write_failure.record(exc.message)

    async def rewrite(self, records: Sequence[JobInfo]) -> None:
        """Replace the journal with ``records`` (at a start, after recovery)."""
        if self._log is None:
            return
        async with self._lock:
            await trio.to_thread.run_sync(self._log.rewrite, records)
            self._lines = len(records)

    def close(self) -> None:
        if self._log is not None:
            self._open = False
            self._log.close()


def with_record(kept: Sequence[JobInfo], record: JobInfo) -> list[JobInfo]:
    """``kept`` with ``record`` in place of its job's (added last if it is not there): a
    record is appended before the job in memory shows it, and a compaction right after
    must not write the job's older state over it."""
    ids = [r["job_id"] for r in kept]
    if record["job_id"] in ids:
        return [record if r["job_id"] == record["job_id"] else r for r in kept]
    return [*kept, record]
