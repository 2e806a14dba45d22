"""How one run of a job ends: what its handler gave, or what it raised, in the terms the
job's record keeps (:meth:`recalld.daemon.jobs.JobManager._execute` records it)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from recalld.daemon.errors import wire_error
from recalld.daemon.jobrecords import JobContext, JobKind, JobRecord, Progress
from recalld.daemon.jsontypes import JsonObject
from recalld.ipc.errors import JOB_FAILED, RecalldError

log = logging.getLogger("recalld.daemon.jobs")


@dataclass(frozen=True, slots=True)
class JobEnd:
    """How a job ended: its state, and its result or error."""

    state: str  # succeeded | failed
    result: JsonObject | None = None
    error: str | None = None
    code: int | None = None


async def run_handler(job: JobRecord, spec: JobKind, progress: Progress) -> JobEnd:
    """Run ``spec``'s handler for ``job``; how it ended. A RecalldError keeps its wire
    message and code, and its data as the failed job's result (what the job did before
    it failed: a dream's run summary); anything else is logged and fails the job
    generically.
    Cancellation propagates (the caller decides what a cancelled job becomes)."""
    try:
        result = await spec.handler(JobContext(job, progress))
    except RecalldError as exc:
        wire = wire_error(exc)
        return JobEnd("failed", result=_done_before(wire.data), error=wire.message,
                      code=wire.code)
    except Exception as exc:
        log.exception("job %s (%s) of %s failed", job.job_id, job.kind, job.agent_id)
        return JobEnd("failed", error=f"{type(exc).__name__}: {exc}", code=JOB_FAILED)
    return JobEnd("succeeded", result=dict(result or {}))


def _done_before(data: object) -> JsonObject | None:
    """A failed job's result: its error's data, an object as it is, any other value
    under ``data``."""
    if data is None:
        return None
    return dict(data) if isinstance(data, Mapping) else {"data": data}
