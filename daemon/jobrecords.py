"""The records the job manager keeps: a kind's rules, the manager's limits, one job's state,
and what a kind's handler sees of its job (:mod:`recalld.daemon.jobs` acts on them)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import trio

from recalld.daemon import metrics
from recalld.daemon.config_rules import valid_agent_id
from recalld.daemon.jobparams import ParamsCheck
from recalld.daemon.jsontypes import JsonObject
from recalld.ipc.answers import JobInfo, JobProgress
from recalld.ipc.errors import AlreadyRunning, InvalidParams

log = logging.getLogger(__name__)

#: A job kind's work: returns the job's result, a JSON object (a TypedDict, mostly).
Handler = Callable[["JobContext"], Awaitable[Mapping[str, object] | None]]

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
ACTIVE = frozenset({"queued", "running"})


class JobStatistics(TypedDict):
    running: int
    queued: int
    held: int  # of the queued: waiting for their workspace to open
    cpu_tokens_in_use: int


@dataclass(frozen=True, slots=True)
class JobKind:
    """A registered kind of job: its handler and how its jobs run."""

    name: str
    handler: Handler
    exclusive: bool = False  # one queued-or-running job of this kind per workspace
    cpu_heavy: bool = False  # holds a token of the shared CPU limiter while running
    # Re-run after a daemon restart instead of failing; "once": a job interrupted again
    # after it was resumed fails (work that may be what ends the daemon is not run forever).
    resumable: bool | Literal["once"] = False
    check_params: ParamsCheck | None = None  # None: params are kept as given


@dataclass(frozen=True, slots=True)
class JobsConfig:
    """The job manager's limits and timeouts."""

    max_running: int = 4
    max_running_per_workspace: int = 2
    history_per_workspace: int = 200
    progress_interval_s: float = 0.25
    cancel_grace_s: float = 5.0
    journal_write_timeout_s: float = 10.0


@dataclass(slots=True)
class JobRecord:
    """One job as the manager keeps and journals it."""

    job_id: str
    agent_id: str
    kind: str
    params: JsonObject
    submitted_at: float
    state: str = "queued"
    progress: JobProgress = field(
        default_factory=lambda: JobProgress(done=0, total=None, message=""))
    result: JsonObject | None = None
    error: str | None = None
    error_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    resumed: bool = False
    #: Waits, queued, for its workspace to open (closed, failed, or not open since a start).
    held: bool = False
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)
    last_progress_publish: float = float("-inf")
    #: Set when a run of the job ends, finished or put back in its queue.
    ran: trio.Event = field(default_factory=trio.Event)
    #: Stopped to run again later (a pause of its workspace): queued again, not cancelled.
    requeue: bool = False
    #: Why it was cancelled, when not by a client (its record's ``error``).
    cancel_reason: str | None = None
    #: Counted in its workspace's running jobs (and holding a CPU token if its kind takes
    #: one): from its admission until the state it ends in is published.
    slot: bool = False
    #: What the running handler did so far (:meth:`JobContext.keep_result`): the result
    #: of the job if it is cancelled.
    partial: JsonObject | None = None

    def as_dict(self) -> JobInfo:
        return {
            "job_id": self.job_id, "agent_id": self.agent_id, "kind": self.kind,
            "params": self.params, "state": self.state, "progress": self.progress.copy(),
            "result": self.result, "error": self.error, "error_code": self.error_code,
            "submitted_at": self.submitted_at, "started_at": self.started_at,
            "finished_at": self.finished_at, "resumed": self.resumed, "held": self.held,
        }

    def take_progress(self, progress: JobProgress, now: float, interval_s: float) -> bool:
        """Take ``progress``; whether to publish it now: at most every ``interval_s``, and
        at once when its count completes or its total changes (a new phase, maybe of
        nothing to count: else followers show the last phase's figures meanwhile)."""
        new_total = self.progress["total"] != progress["total"]
        self.progress = progress
        total = progress["total"]
        if (now - self.last_progress_publish >= interval_s or new_total
                or (total is not None and progress["done"] >= total)):
            self.last_progress_publish = now
            return True
        return False

    def ended(self, state: str, result: JsonObject | None, error: str | None,
              code: int | None, at: float) -> JobInfo:
        """This job's record once it ended so (journaled before the job shows it)."""
        return {**self.as_dict(), "state": state, "result": result, "error": error,
                "error_code": code, "finished_at": at, "held": False}

    def take_end(self, end: JobInfo) -> None:
        """Show the end :meth:`ended` gave, and count it (``recalld_jobs_total``)."""
        self.state, self.result, self.error = end["state"], end["result"], end["error"]
        self.error_code, self.finished_at, self.held = end["error_code"], end["finished_at"], False
        metrics.count("recalld_jobs_total", labels={"kind": self.kind, "state": self.state})

    @classmethod
    def from_dict(cls, rec: JsonObject) -> JobRecord:
        """A job from its journal record (JSON read back from disk); ValueError if a
        field is not of the shape the daemon writes (see :func:`recovered`)."""
        job_id, agent_id, kind = rec.get("job_id"), rec.get("agent_id"), rec.get("kind")
        params, state = rec.get("params") or {}, rec.get("state", "queued")
        if not (isinstance(job_id, str) and job_id and isinstance(kind, str) and kind
                and valid_agent_id(agent_id) and isinstance(params, dict)
                and state in STATES and isinstance(rec.get("error"), str | None)
                and isinstance(rec.get("error_code"), int | None)
                and all(isinstance(rec.get(k), int | float | None)
                        for k in ("submitted_at", "started_at", "finished_at"))):
            raise ValueError("a field is missing or not of its type")
        job = cls(job_id=job_id, agent_id=agent_id, kind=kind, params=params,
                  submitted_at=float(rec.get("submitted_at") or 0.0))
        job.state = state
        progress = rec.get("progress")
        if isinstance(progress, Mapping):
            done, total = progress.get("done"), progress.get("total")
            job.progress = JobProgress(done=done if isinstance(done, int) else 0,
                                    total=total if isinstance(total, int) else None,
                                    message=str(progress.get("message") or ""))
        job.result = rec.get("result")
        job.error = rec.get("error")
        job.error_code = rec.get("error_code")
        job.started_at = rec.get("started_at")
        job.finished_at = rec.get("finished_at")
        job.resumed = bool(rec.get("resumed", False))
        job.held = bool(rec.get("held", False))
        if job.state not in ACTIVE:
            job.done.set()
        return job


def check_submit(kinds: Mapping[str, JobKind], kind: str, params: Mapping[str, object] | None,
                 check_agent: Callable[[], None], others: Iterable[JobRecord]) -> JsonObject:
    """The params of a job of ``kind`` to submit, as its kind's check gives them; raises
    InvalidParams (unknown kind, params refused), what ``check_agent`` raises, and
    AlreadyRunning (an exclusive kind already queued or running among ``others``)."""
    spec = kinds.get(kind)
    if spec is None:
        raise InvalidParams(f"unknown job kind {kind!r} (known: {', '.join(sorted(kinds))})")
    check_agent()
    checked = (spec.check_params(params or {}) if spec.check_params is not None
               else dict(params or {}))
    if spec.exclusive:
        for other in others:
            if other.kind == kind and other.state in ACTIVE:
                raise AlreadyRunning(
                    # No article before the kind: "a auto_dream job" read wrong.
                    f"{kind} is already {other.state} for workspace {other.agent_id!r} "
                    f"(job {other.job_id}); wait for it or cancel it",
                    {"job_id": other.job_id, "state": other.state})
    return checked


def recovered(records: Iterable[JsonObject]) -> Iterator[JobRecord]:
    """The jobs of the journal's ``records`` (each line verified by its checksum); one of
    another shape (a field of another type, an agent id no method accepts, a state no
    job has: written by hand, or by another program) is passed by with a log line: it
    stopped the start (a restart loop under systemd), or reached clients as it was."""
    for rec in records:
        try:
            yield JobRecord.from_dict(rec)
        except ValueError as exc:
            log.warning("job journal: passing by the record of job %r: %s",
                        rec.get("job_id"), exc)


def take_up(job: JobRecord, kinds: Mapping[str, JobKind]) -> Literal["queue", "interrupted",
                                                                      "done"]:
    """What a start does with ``job`` read back from the journal: one held for its
    workspace is queued again, whatever its kind (it did not run); one queued or running
    when the daemon died is queued again (``resumed``) if its kind is resumable (a kind
    resumable "once" only if it was not resumed already), else it was interrupted; any
    other (finished, or of a kind no longer known) is left as it is."""
    if job.state == "queued" and job.held and job.kind in kinds:
        return "queue"
    if job.state not in ACTIVE:
        return "done"
    job.held = False
    spec = kinds.get(job.kind)
    if spec is not None and spec.resumable and not (spec.resumable == "once" and job.resumed):
        job.state, job.resumed, job.started_at = "queued", True, None
        return "queue"
    return "interrupted"


def cpu_borrower(job: JobRecord) -> tuple[str, str]:
    """Who holds ``job``'s token of the daemon-wide CPU limiter."""
    return ("recalld.job", job.job_id)


def mark_held(jobs: Iterable[JobRecord], held: bool) -> list[JobRecord]:
    """Record on each unfinished job of ``jobs`` (one workspace's) whether it is held (a
    restart keeps a job journaled held until its workspace opens; the running ones are
    journaled once they are queued again); the queued ones changed, to journal."""
    changed = []
    for job in jobs:
        if job.state in ACTIVE and job.held != held:
            job.held = held
            if job.state == "queued":
                changed.append(job)
    return changed

#: Records a running job's progress: ``(job, done, total, message)``.
Progress = Callable[[JobRecord, int, int | None, str], None]


class JobContext:
    """What a handler sees of its job. Cancelling ``cancel_scope`` cancels this job only."""

    def __init__(self, job: JobRecord, progress: Progress) -> None:
        self._job = job
        self._progress = progress
        self.job_id = job.job_id
        self.agent_id = job.agent_id
        self.kind = job.kind
        self.params: Mapping[str, object] = job.params
        self.resumed = job.resumed
        self.cancel_scope = job.scope

    def set_progress(self, done: int, total: int | None = None, message: str = "") -> None:
        self._progress(self._job, done, total, message)

    def keep_result(self, result: Mapping[str, object]) -> None:
        """Keep ``result``, what the handler did so far, as the job's result should it be
        cancelled (a handler that returns or raises gives its own)."""
        self._job.partial = dict(result)
