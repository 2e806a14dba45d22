"""When a session's pending turns go to auto_memory: the flush triggers of one workspace.

Owns the decision to submit an ``auto_memory`` job for a session, whatever asks for it:

- ``memory.add_turns`` after every ``auto_memory_interval`` user turns, or with ``flush``
  (:meth:`SessionFlusher.covered`, then :meth:`SessionFlusher.submit`);
- the session idle for ``auto_memory_idle_s`` (0: off): one trio deadline per workspace,
  the earliest of its sessions' last activity plus the idle time; the task sleeps until
  then or until a new turn moves it, so an idle daemon does no work;
- the daemon's graceful stop (:meth:`SessionFlusher.flush_for_stop`, called by the
  supervisor before the workspaces close): a job is submitted (and journaled) for every
  session with turns no job covers, then awaited up to the stop deadline; a job still
  queued or running when the daemon stops is resumed after the restart.

A job that fails (the chat model unreachable, a broken answer) leaves its turns pending;
while the idle flush is on, the session is looked at again ``auto_memory_idle_s`` after
each submission (and after a flush found its turns covered by a job submitted before a
restart or a reopening of the workspace) and, if its turns still wait with no job under
way, submitted again (trigger ``retry``), the wait doubling up to an hour while the
failures go on. After ``MAX_FAILED_RUNS`` failed runs in a row (a model that always
answers what cannot be saved would be paid every hour for ever) the retries stop: the
turns stay pending, ``health`` says so, and a new turn, a flush, or a restart or reopening
of the workspace (a new chat model, say) submits them again. A run that failed because
the provider was unavailable (no answer: the connection refused or dropped, a timeout,
408, 429 or a 5xx, the circuit breaker open) does not count: nothing was paid for, and an
outage longer than the retries took (hours) would otherwise leave every session of every
agent pending for good once it is over; such sessions are tried again every
``auto_memory_idle_s`` (an hour at most; nothing was paid, so the wait does not double),
never while the provider holds calls back (its breaker open, its Retry-After running: the
run would be refused unsent, one more failed job in the journal) but as soon as a call
may go out (the breaker's half-open probe is then a session's run), and at once when the
provider answers any call again, whichever workspace made it
(:meth:`SessionFlusher.provider_back`): their turns are written within seconds of the
outage's end, not up to an hour after it.

Turns found on disk when the workspace opens (a crash between a turn's acknowledgement
and its note, a session idle while the daemon was down) count as idle since the time
recorded with the session's last turn, so a session idle for ``auto_memory_idle_s``
already is written at once; one with no time recorded, or one ahead of the clock (set
back since), counts as active at the opening. A session whose run was owed before the
opening (its ``auto_memory_interval`` user turns reached with no job queued: killed in
between; or a job queued for its turns that failed leaving them pending, not one
cancelled) is submitted at the opening, once, whatever the idle setting.
Without a chat model nothing is submitted: the turns stay on disk and
:meth:`SessionFlusher.waiting` says how many wait and why (``health``).

Run by each open workspace (``WorkspaceServices.capture``); it stops by cancellation
and needs no cleanup.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from recalld.daemon.jobparams import choice, count, params_of
from recalld.daemon.jobrecords import ACTIVE
from recalld.daemon.jobs import JobManager
from recalld.daemon.memory.fileops import check_date
from recalld.daemon.memory.sessions import Added, SessionStore
from recalld.daemon.memory.turns import check_session_id
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import PROVIDER_UNAVAILABLE, NotFound, RecalldError

log = logging.getLogger(__name__)

#: The longest wait between two retries of a session whose auto_memory jobs fail.
RETRY_CAP_S = 3600.0
#: Failed runs in a row after which a session's turns are not retried (a few hours of
#: retries at the default idle time) until a new turn or a flush submits them.
MAX_FAILED_RUNS = 6
#: What asks for an auto_memory job (its ``trigger`` param and change log field).
TRIGGERS = ("interval", "flush", "idle", "stop", "retry")
#: The params an ``auto_memory`` job takes (``jobs.submit`` and :meth:`SessionFlusher.submit`).
AUTO_MEMORY_PARAMS = params_of("auto_memory", {
    "session_id": lambda _name, value: check_session_id(value),
    "upto": count,
    "date": lambda _name, value: check_date(value, dt.date.today),
    "trigger": choice(*TRIGGERS),
}, required=("session_id",))


@dataclass(frozen=True, slots=True)
class Waiting:
    """Pending turns of one workspace and why they wait."""

    messages: int
    sessions: int
    reason: str


class SessionFlusher:
    """Submits auto_memory jobs for one workspace's sessions."""

    def __init__(self, ws: Workspace, store: SessionStore, jobs: JobManager,
                 has_chat_model: Callable[[], bool],
                 retry_wait_s: Callable[[], float] = lambda: 0.0) -> None:
        self.ws = ws
        self.store = store
        self.jobs = jobs
        self._has_chat_model = has_chat_model
        #: Seconds before a retry should be queued (the chat provider's breaker open, its
        #: Retry-After running, its half-open probe already another retry's): a job
        #: submitted meanwhile would be refused unsent (ChatLine.retry_wait_s).
        self._retry_wait_s = retry_wait_s
        #: trio time of each session's last turn, for sessions an idle flush may concern.
        self._active: dict[str, float] = {}
        #: Sessions with a job submitted: when to look whether their turns still wait,
        #: how many jobs in a row were submitted for them, and how many of those failed
        #: in a way that counts towards MAX_FAILED_RUNS (not the provider unavailable).
        self._retry: dict[str, tuple[float, int, int]] = {}
        #: Sessions whose retries stopped after MAX_FAILED_RUNS failed runs in a row.
        self._stopped: set[str] = set()
        self._wake = trio.Event()
        #: auto_memory jobs the idle flush submitted (status ``idle_flushes``).
        self.idle_flushes = 0
        #: Idle checks that found the session's turns covered by a job already queued or
        #: running (one resumed after a restart, say): nothing was submitted.
        self.idle_covered = 0

    # -- the decision ----------------------------------------------------------------

    def _job_state(self, job_id: str | None) -> str | None:
        if job_id is None:
            return None
        try:
            return self.jobs.get(self.ws.agent_id, job_id)["state"]
        except NotFound:
            return None

    def job_active(self, job_id: str | None) -> bool:
        return self._job_state(job_id) in ACTIVE

    def covered(self, added: Added) -> bool:
        """True if a queued or running job already covers every pending turn."""
        return added.upto <= added.submitted and self.job_active(added.last_job_id)

    async def submit(self, session_id: str, upto: int, request_id: str | None = None,
                     answer: Callable[[str], dict[str, object]] | None = None,
                     trigger: str = "flush") -> str:
        """Queue auto_memory for ``session_id`` up to ``upto`` and record it; ``trigger``
        (interval, flush, idle, stop, retry) goes into the job's params and its change log."""
        job_id = await self.jobs.submit(self.ws.agent_id, "auto_memory",
                                        {"session_id": session_id, "upto": upto,
                                         "trigger": trigger})
        await self.store.mark_submitted(session_id, upto, job_id, request_id,
                                        answer(job_id) if answer is not None else {})
        self._stopped.discard(session_id)
        idle_s = self._idle_s()
        if math.isinf(idle_s):  # no timed flush at all, no retry either
            self._retry.pop(session_id, None)
        else:
            _, before, counted = self._retry.get(session_id, (0.0, 0, 0))
            attempts, counted = (before + 1, counted) if trigger == "retry" else (1, 0)
            self._retry[session_id] = (
                trio.current_time() + min(idle_s * 2 ** (attempts - 1), RETRY_CAP_S),
                attempts, counted)
            self._wake.set()
        return job_id

    async def flush(self, session_id: str, trigger: str = "flush") -> str | None:
        """Submit the session's pending turns unless a job covers them; the job id."""
        return (await self._flush(session_id, trigger))[0]

    async def _flush(self, session_id: str, trigger: str) -> tuple[str | None, bool]:
        """:meth:`flush`, and whether it submitted a job (False: none pending, or the
        job that covers them)."""
        async with self.store.lock:
            added = self.store.info(session_id)
            if added.pending_messages == 0 and added.pending_turns == 0:
                return None, False
            if self.covered(added):
                self.watch(session_id)
                return added.last_job_id, False
            return await self.submit(session_id, added.upto, trigger=trigger), True

    def watch(self, session_id: str) -> None:
        """The session's turns are covered by a job this flusher did not submit (one
        resumed after a restart, or queued before the workspace was reopened): look again
        ``auto_memory_idle_s`` from now, so that they are submitted again if it fails."""
        idle_s = self._idle_s()
        if session_id not in self._retry and not math.isinf(idle_s):
            self._retry[session_id] = (trio.current_time() + idle_s, 1, 0)
            self._wake.set()

    def provider_back(self) -> None:
        """The chat provider answers again after it was unavailable: the sessions whose
        last job failed for want of it are retried now, their delay back at its start
        (and those whose job is under way looked at again, not an hour later)."""
        now = trio.current_time()
        woken = False
        for session_id, (due, _, counted) in list(self._retry.items()):
            job_id = self.store.info(session_id).last_job_id
            if due > now and (self.job_active(job_id) or self._unanswered(job_id)):
                self._retry[session_id] = (now, 0, counted)
                woken = True
        if woken:
            self._wake.set()

    def touched(self, session_id: str) -> None:
        """A turn was added: the session's idle time starts again."""
        self._active[session_id] = trio.current_time()
        self._wake.set()

    # -- idle and stop ---------------------------------------------------------------

    def _idle_s(self) -> float:
        idle = self.ws.settings.auto_memory_idle_s
        return idle if idle > 0 else math.inf

    async def _flush_quietly(self, session_id: str, why: str) -> tuple[str | None, bool]:
        try:
            return await self._flush(session_id, why)
        except RecalldError as exc:  # the workspace is closing, the journal is gone...
            log.warning("%s flush of %s/%s failed: %s", why, self.ws.agent_id, session_id,
                        exc.message)
            return None, False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush sessions idle for ``auto_memory_idle_s`` until cancelled."""
        now, wall = trio.current_time(), time.time()
        owed: list[tuple[str, str]] = []
        for session_id in self.store.sessions_pending():
            self._active[session_id] = now - self._idle_before(session_id, wall)
            if (trigger := self._owed(session_id)) is not None:
                owed.append((session_id, trigger))
        task_status.started()
        await self._submit_owed(owed)
        while True:
            self._wake = trio.Event()
            idle_s = self._idle_s()
            due_at = min(min(self._active.values(), default=math.inf) + idle_s,
                         min((due for due, _, _ in self._retry.values()), default=math.inf))
            with trio.move_on_at(due_at):
                await self._wake.wait()
            now = trio.current_time()
            for session_id, last in list(self._active.items()):
                if last + idle_s > now:
                    continue
                del self._active[session_id]
                if not self._has_chat_model():
                    continue
                job_id, submitted = await self._flush_quietly(session_id, "idle")
                if submitted:
                    self.idle_flushes += 1
                elif job_id is not None:
                    self.idle_covered += 1
            await self._retry_failed(trio.current_time())

    def _owed(self, session_id: str) -> str | None:
        """The trigger of the run that session ``session_id``, found pending at the
        opening, was owed before it and has no job for: ``interval`` (its user turns
        reached ``auto_memory_interval``, the daemon stopped before the job was queued),
        ``retry`` (a job was queued for its turns and failed leaving them pending); None
        if no run was owed (the turns wait for their triggers, as those of a job someone
        cancelled do)."""
        added = self.store.info(session_id)
        state = self._job_state(added.last_job_id)
        if state in ACTIVE:
            return None
        interval = self.ws.settings.auto_memory_interval
        if (interval is not None and interval > 0 and added.since_submit >= interval
                and not self.store.half_said(session_id)):
            return "interval"
        # Only a run that failed is owed again: one cancelled (or dropped with its
        # workspace's forget) was stopped by someone, and its turns wait for a trigger.
        return ("retry" if state == "failed" and added.since_submit < added.pending_turns
                else None)

    async def _submit_owed(self, owed: list[tuple[str, str]]) -> None:
        """Queue the runs owed at the opening, once each (one job per session, run at the
        job queue's pace): without them the turns would wait for a new turn or the idle
        flush, which may be off or hours away, and a session that ended gets neither."""
        for session_id, trigger in owed:
            if not self._has_chat_model():
                return  # they wait, and ``waiting`` says why
            _, submitted = await self._flush_quietly(session_id, trigger)
            if submitted:
                self._active.pop(session_id, None)

    def _idle_before(self, session_id: str, wall: float) -> float:
        """How long the session found pending at the opening had been idle by its last
        turn's recorded time, at Unix time ``wall``: 0 where none was recorded or it lies
        ahead (the clock was set back since; idle from now on, not for ever after)."""
        last = self.store.last_turn_at(session_id)
        return 0.0 if last is None else max(wall - last, 0.0)

    async def _retry_failed(self, now: float) -> None:
        """Submit again the sessions whose job ended with their turns still waiting."""
        for session_id, (due, attempts, counted) in list(self._retry.items()):
            if due > now:
                continue
            added = self.store.info(session_id)
            if not self._has_chat_model() or added.pending_messages == 0:
                del self._retry[session_id]  # all written (or nothing can write them)
                continue
            if self.job_active(added.last_job_id):
                self._retry[session_id] = (now + self._idle_s(), attempts, counted)
                continue
            if (held := self._retry_wait_s()) > 0:
                # The provider is known unavailable: a run now would be refused without
                # being sent, one more failed job in the journal. Look again once it may
                # be called (the breaker's probe, the Retry-After over), or once another
                # session's run has had the probe.
                self._retry[session_id] = (now + max(min(self._idle_s(), RETRY_CAP_S), held),
                                           attempts, counted)
                continue
            if self._unanswered(added.last_job_id):
                attempts = 0  # nothing was paid: the next look is not put off further
            else:
                counted += 1
            if counted >= MAX_FAILED_RUNS:
                del self._retry[session_id]
                self._stopped.add(session_id)
                log.warning("auto_memory of %s/%s failed %d times in a row; not retried "
                            "until a new turn or a flush", self.ws.agent_id, session_id,
                            counted)
            else:
                log.info("auto_memory of %s/%s: the last job left %d message(s) "
                         "pending; submitting again", self.ws.agent_id, session_id,
                         added.pending_messages)
                self._retry[session_id] = (due, attempts, counted)  # what submit carries on
                await self._flush_quietly(session_id, "retry")
                if session_id in self._retry and self._retry[session_id][0] <= now:
                    del self._retry[session_id]  # the flush failed: not again and again

    def _unanswered(self, job_id: str | None) -> bool:
        """Whether job ``job_id`` failed because the provider was unavailable (its error
        transient: nothing answered), which does not count towards MAX_FAILED_RUNS."""
        if job_id is None:
            return False
        try:
            job = self.jobs.get(self.ws.agent_id, job_id)
        except NotFound:
            return False
        result = job["result"]
        return (job["state"] == "failed" and job["error_code"] == PROVIDER_UNAVAILABLE
                and isinstance(result, dict) and result.get("transient") is True)

    async def flush_for_stop(self, deadline_s: float) -> None:
        """Queue auto_memory for every session with turns no job covers, then wait for
        those jobs up to ``deadline_s``; what does not finish runs after the restart."""
        if not self._has_chat_model():
            return
        job_ids: list[str] = []
        for session_id in self.store.sessions_pending():
            job_id, _ = await self._flush_quietly(session_id, "stop")
            if job_id is not None:
                job_ids.append(job_id)
        with trio.move_on_after(deadline_s):
            for job_id in job_ids:
                await self.jobs.wait(self.ws.agent_id, job_id)

    # -- status ----------------------------------------------------------------------

    def waiting(self) -> Waiting | None:
        """How many messages wait for auto_memory and why; None if none wait."""
        sessions = self.store.sessions_pending()
        if not sessions:
            return None
        messages = sum(self.store.info(s).pending_messages for s in sessions)
        # A job covers a session's turns up to its submission; turns added after it wait
        # for their own trigger, and both are said (not "running" for turns none covers).
        uncovered = [s for s in sessions if not self.covered(self.store.info(s))]
        if not self._has_chat_model():
            reason = "no chat model configured"
        elif not uncovered:
            reason = "auto_memory job queued or running"
        else:
            reason = self._uncovered_reason(uncovered)
            if any(self.job_active(self.store.info(s).last_job_id) for s in sessions):
                reason = (f"auto_memory job queued or running; turns of {len(uncovered)} "
                          f"session(s) no job covers: {reason}")
        return Waiting(messages=messages, sessions=len(sessions), reason=reason)

    def _uncovered_reason(self, sessions: list[str]) -> str:
        """Why turns of ``sessions``, which no job covers, wait: a retry due, or the
        triggers that will write them."""
        if retried := [s for s in sessions if s in self._retry]:
            due = min(self._retry[s][0] for s in retried) - trio.current_time()
            return (f"the last auto_memory job left them pending "
                    f"({self._last_error(retried) or 'not finished'}); "
                    f"next try in {max(due, 0):.0f} s")
        if stopped := [s for s in sessions if s in self._stopped]:
            return (f"the last auto_memory job left them pending "
                    f"({self._last_error(stopped) or 'not finished'}); not tried again "
                    f"after {MAX_FAILED_RUNS} failed runs in a row: a new turn, a flush or "
                    "a restart submits them")
        idle = self.ws.settings.auto_memory_idle_s
        interval = self.ws.settings.auto_memory_interval
        triggers = ([f"{interval} user turns"] if interval else []) + (
            [f"{idle:g} s idle"] if idle > 0 else []) + ["a flush"]
        reason = "waiting for " + " or ".join(triggers)
        if failure := self._last_error(sessions):  # and nothing will retry it
            reason = f"the last auto_memory job left them pending ({failure}); {reason}"
        return reason

    def _last_error(self, sessions: list[str]) -> str | None:
        """How the latest to end of the failed last jobs of ``sessions`` failed, if one
        did (the sessions' order says nothing of when their jobs ran)."""
        latest: tuple[float, str] | None = None
        for session_id in sessions:
            job_id = self.store.info(session_id).last_job_id
            try:
                job = self.jobs.get(self.ws.agent_id, job_id) if job_id else None
            except NotFound:
                continue
            if job is not None and job["state"] in ("failed", "cancelled"):
                error = job.get("error")
                ended = job.get("finished_at")
                at = float(ended) if isinstance(ended, int | float) else 0.0
                if latest is None or at >= latest[0]:
                    latest = (at, f"{job['state']}: {error}" if error else str(job["state"]))
        return latest[1] if latest is not None else None

    def waiting_reason(self) -> str | None:
        """One line for ``health``: what waits for auto_memory and why; None if nothing."""
        waiting = self.waiting()
        if waiting is None:
            return None
        return (f"{waiting.messages} conversation message(s) of {waiting.sessions} "
                f"session(s) wait for auto_memory: {waiting.reason}")

    def status(self) -> dict[str, object]:
        waiting = self.waiting()
        return {
            "idle_s": self.ws.settings.auto_memory_idle_s,
            "idle_flushes": self.idle_flushes,
            "idle_covered": self.idle_covered,
            "retries_stopped": len(self._stopped & set(self.store.sessions_pending())),
            "waiting_messages": waiting.messages if waiting else 0,
            "waiting_sessions": waiting.sessions if waiting else 0,
            "reason": waiting.reason if waiting else None,
        }
