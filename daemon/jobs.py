"""Jobs: reindex, auto_memory, auto_dream, auto_resource and later kinds, daemon-wide.

Owns every job record (keyed by agent_id and job_id), the per-workspace FIFO queues and
the dispatcher; the job journal (:mod:`recalld.daemon.jobjournal`) records them.
``JobManager.run`` replays the journal (a job held for its closed or failed workspace is
held again, whatever its kind: it did not run; one that was queued or running when the
daemon died is resumed if its kind is resumable (a kind resumable "once" only if it was
not resumed already), else reported failed "interrupted by daemon restart": never
silently lost; with ``hold_recovered`` the workspaces of the jobs left are held until
each opens, so that none runs for a workspace that cannot), then dispatches: workspaces
take turns (round robin), each workspace's jobs start in submission order, at most
``max_running`` jobs run at once and ``max_running_per_workspace`` per workspace, and
CPU-heavy kinds also hold a token of a daemon-wide CapacityLimiter, so one agent's
reindex never starves the others. Every job runs in its own cancel scope under the
manager's nursery; ``cancel`` cancels that scope only. A graceful stop calls ``stop``
first (the running jobs end their cancelled handlers while their workspaces still serve,
and are journaled queued again); the manager then stops by cancellation. Either way the
next start resumes the jobs left queued or running, or reports them interrupted.

State changes and throttled progress go to ``publish(topic, payload)`` with topics
``job.state`` and ``job.progress`` (the daemon's event bus plugs in there), each state
journaled before it is told (but running, told at its admission: queued on a restart).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Literal

import trio

from recalld.daemon.jobends import run_handler
from recalld.daemon.jobjournal import JobJournal
from recalld.daemon.jobparams import ParamsCheck
from recalld.daemon.jobrecords import (
    ACTIVE,
    Handler,
    JobKind,
    JobRecord,
    JobsConfig,
    JobStatistics,
    check_submit,
    cpu_borrower,
    mark_held,
    recovered,
    take_up,
)
from recalld.daemon.jsontypes import JsonObject, json_safe
from recalld.daemon.store import confine
from recalld.ipc.answers import JobInfo, JobProgress
from recalld.ipc.errors import JOB_FAILED, NotFound, UnknownWorkspace
from recalld.ipc.textcut import cut_text

log = logging.getLogger(__name__)

Publish = Callable[[str, Mapping[str, object]], object]
INTERRUPTED = "interrupted by daemon restart"


class JobManager:
    """Every workspace's jobs; one instance per daemon."""

    def __init__(
        self,
        *,
        journal_path: Path | None = None,
        publish: Publish | None = None,
        cpu_limiter: trio.CapacityLimiter | None = None,
        config: JobsConfig | None = None,
        agent_exists: Callable[[str], bool] | None = None,
        folder_of: Callable[[str], Path | None] | None = None,
        wall: Callable[[], float] = time.time,
        hold_recovered: bool = False,
    ) -> None:
        self._config = config or JobsConfig()
        self._publish_cb = publish
        self._cpu = cpu_limiter if cpu_limiter is not None else trio.CapacityLimiter(1)
        self._agent_exists = agent_exists
        self._folder_of = folder_of
        self._wall = wall
        self._hold_recovered = hold_recovered
        self._nursery: trio.Nursery | None = None
        self._kinds: dict[str, JobKind] = {}
        self._jobs: dict[str, dict[str, JobRecord]] = {}  # agent -> job_id -> job, oldest first
        self._queues: dict[str, deque[JobRecord]] = {}
        self._turns: deque[str] = deque()  # agents with queued jobs, next turn first
        self._running: dict[str, int] = {}
        self._paused: dict[str, int] = {}  # agent -> how many pauses hold its jobs back
        self._held: set[str] = set()  # agents whose workspace closed (one pause each)
        self._changed = trio.Event()
        self._stopping = False  # the daemon stops: no job starts (:meth:`stop`)
        self._cpu_waiter = False
        self._journal_log = JobJournal(journal_path, self._config.journal_write_timeout_s)
        self.write_failure = self._journal_log.write_failure

    def register(self, kind: str, handler: Handler, *, exclusive: bool = False,
                 cpu_heavy: bool = False, resumable: bool | Literal["once"] = False,
                 check_params: ParamsCheck | None = None) -> None:
        self._kinds[kind] = JobKind(kind, handler, exclusive, cpu_heavy, resumable,
                                    check_params)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._kinds)

    # -- queries -------------------------------------------------------------------------------

    def _check_agent(self, agent_id: str) -> None:
        if self._agent_exists is not None and not self._agent_exists(agent_id):
            raise UnknownWorkspace(f"workspace {agent_id!r} is not open")

    def _check_known(self, agent_id: str) -> None:
        """As :meth:`_check_agent`, but an agent with jobs here passes: those of a closed
        workspace (held for it, or its history) are seen and cancelled while it is away."""
        if agent_id not in self._jobs:
            self._check_agent(agent_id)

    def _find(self, agent_id: str, job_id: str) -> JobRecord:
        self._check_known(agent_id)
        job = self._jobs.get(agent_id, {}).get(job_id)
        if job is None:
            shown = job_id if len(job_id) <= 64 else cut_text(job_id, 64) + "…"  # echo no megabytes
            raise NotFound(f"no job {shown!r} in workspace {agent_id!r}")
        return job

    def active_count(self, agent_id: str) -> int:
        """Jobs of ``agent_id``'s workspace queued or running."""
        return sum(j.state in ACTIVE for j in self._jobs.get(agent_id, {}).values())

    def get(self, agent_id: str, job_id: str) -> JobInfo:
        return self._find(agent_id, job_id).as_dict()

    def list(self, agent_id: str | None = None) -> builtins.list[JobInfo]:
        if agent_id is not None:
            self._check_known(agent_id)
        agents = [agent_id] if agent_id is not None else sorted(self._jobs)
        return [j.as_dict() for a in agents for j in self._jobs.get(a, {}).values()]

    def statistics(self) -> JobStatistics:
        return {
            "running": sum(self._running.values()),
            "queued": sum(len(q) for q in self._queues.values()),
            "held": sum(j.held for q in self._queues.values() for j in q),
            "cpu_tokens_in_use": self._cpu.borrowed_tokens,
        }

    # -- submit / cancel -----------------------------------------------------------------------

    async def submit(self, agent_id: str, kind: str,
                     params: Mapping[str, object] | None = None) -> str:
        """Queue a job and return its id once its record is journaled.

        Raises InvalidParams (unknown kind, params the kind's check refuses),
        UnknownWorkspace, AlreadyRunning (an exclusive kind already queued or running in
        this workspace).
        """
        checked = check_submit(self._kinds, kind, params, lambda: self._check_agent(agent_id),
                               self._jobs.get(agent_id, {}).values())
        job = JobRecord(job_id=secrets.token_hex(8), agent_id=agent_id, kind=kind,
                        params=checked, submitted_at=self._wall(),
                        held=agent_id in self._held)
        self._add(job)
        await self._record(job, "back")
        return job.job_id

    async def wait(self, agent_id: str, job_id: str) -> JobInfo:
        """Wait until the job has finished (its end journaled) and return its record
        (NotFound if unknown).
        Cancelling the wait leaves the job alone."""
        job = self._find(agent_id, job_id)
        if job.state in ACTIVE:
            await job.done.wait()
        return job.as_dict()

    async def cancel(self, agent_id: str, job_id: str) -> JobInfo:
        """Cancel a job and return its record; waits up to ``cancel_grace_s`` for a running
        job to stop. Cancelling a finished job changes nothing."""
        job = self._find(agent_id, job_id)
        await self._cancel(job)
        return job.as_dict()

    async def _cancel(self, job: JobRecord) -> None:
        if job.state == "queued" and job in self._queues.get(job.agent_id, ()):
            self._queues[job.agent_id].remove(job)
            await self._finish(job, "cancelled", error=job.cancel_reason)
        elif job.state in ACTIVE:
            job.scope.cancel()
            with trio.move_on_after(self._config.cancel_grace_s):
                await job.done.wait()

    async def forget(self, agent_id: str, reason: str) -> None:
        """``agent_id``'s workspace is forgotten: its jobs queued (held since it closed) or
        running (resumed, waiting for it to open) are cancelled, ``reason`` their error
        (published); then its finished jobs go, from memory and the journal: an agent
        that opens a workspace under this id later is not shown what they were given
        and produced."""
        for job in [j for j in self._jobs.get(agent_id, {}).values() if j.state in ACTIVE]:
            job.cancel_reason = reason
            await self._cancel(job)
        self.release(agent_id)  # after: none of them starts meanwhile
        for job in [j for j in self._jobs.get(agent_id, {}).values() if j.state not in ACTIVE]:
            await job.done.wait()  # its end journaled: not appended after the drop
        jobs = self._jobs.pop(agent_id, {})
        left = {k: j for k, j in jobs.items() if j.state in ACTIVE}  # did not stop in time
        if left:
            self._jobs[agent_id] = left
        if not self._queues.get(agent_id, True):
            del self._queues[agent_id]
        if len(left) < len(jobs):
            await self._journal_log.drop(self._retained)

    @contextlib.asynccontextmanager
    async def paused(self, agent_id: str, reason: str) -> AsyncIterator[None]:
        """Start none of ``agent_id``'s jobs inside, and stop its running ones first: they
        go back to the front of its queue and run again afterwards, on what is then on
        disk (as after a restart). Jobs submitted meanwhile wait. ``reason`` is logged
        should a job not stop in time."""
        self._paused[agent_id] = self._paused.get(agent_id, 0) + 1
        try:
            await self._stop_running(agent_id, reason)
            yield
        finally:
            self._unpause(agent_id)

    async def hold(self, agent_id: str, reason: str) -> None:
        """As :meth:`paused`, until :meth:`release`: ``agent_id``'s workspace closes, and
        its jobs wait (journaled queued, so also across a restart) until it opens again.
        Holding a held workspace adds nothing. Its queued jobs are journaled held before
        this returns (shielded): a restart right after keeps them, whatever their kind."""
        for job in self._hold(agent_id):
            await self._record(job)
        await self._stop_running(agent_id, reason)

    def hold_nowait(self, agent_id: str, reason: str) -> None:
        """As :meth:`hold`, without waiting for the running jobs to end their handlers:
        ``agent_id``'s workspace stopped serving (it failed), and what they would go on
        to do to its folder must not happen (once a link took the folder's place, it
        would be done to another folder). They are queued again once they have ended.
        The queued ones are journaled held in the background, each published once it is."""
        self._record_held_soon(self._hold(agent_id))
        if self._cut_running(agent_id):
            log.info("workspace %s: its running jobs stop (%s)", agent_id, reason)

    def _hold(self, agent_id: str) -> builtins.list[JobRecord]:
        """Hold ``agent_id``'s jobs; those queued whose record changed (to journal)."""
        if agent_id in self._held:
            return []
        self._held.add(agent_id)
        self._paused[agent_id] = self._paused.get(agent_id, 0) + 1
        return mark_held(self._jobs.get(agent_id, {}).values(), True)

    def release(self, agent_id: str) -> None:
        """``agent_id``'s workspace opened: its held jobs run (if nothing else pauses it).
        Journaled in the background: a restart before that holds them until it opens."""
        if agent_id in self._held:
            self._held.discard(agent_id)
            self._record_held_soon(mark_held(self._jobs.get(agent_id, {}).values(), False))
            self._unpause(agent_id)

    async def _record(self, job: JobRecord,
                      queue_at: Literal["back", "front"] | None = None) -> None:
        """Journal ``job``'s record, then publish it: what is told is on disk. ``queue_at``:
        queued then too (none starts unjournaled); ended instead if cancelled meanwhile."""
        record = job.as_dict()
        await self._journal_log.append(record, self._retained)
        if queue_at is not None and job.scope.cancel_called:
            await self._finish(job, "cancelled", error=job.cancel_reason)
            return
        if queue_at is not None:
            self._enqueue(job, front=queue_at == "front")
        self._publish("job.state", record)

    def _record_held_soon(self, jobs: builtins.list[JobRecord]) -> None:
        for job in jobs:
            if self._nursery is None:  # before run: its start journals all
                self._publish("job.state", job.as_dict())
            else:
                self._nursery.start_soon(self._record, job)

    def _unpause(self, agent_id: str) -> None:
        self._paused[agent_id] -= 1
        if not self._paused[agent_id]:
            del self._paused[agent_id]
        self._changed.set()

    async def stop(self, reason: str) -> None:
        """Start no job from now on and stop the running ones (``cancel_grace_s`` at most):
        each ends as its handler does when cancelled (what it wrote is saved, its inbox
        told) and is journaled queued again, so the next start resumes it if its kind is
        resumable, else reports it interrupted. The daemon's stop calls this before the
        workspaces close, so that jobs end while their workspaces still serve them."""
        self._stopping = True
        await self._stop_running(None, reason)

    async def _stop_running(self, agent_id: str | None, reason: str) -> None:
        """Stop the running jobs of ``agent_id`` (None: of every workspace)."""
        running = self._cut_running(agent_id)
        with trio.move_on_after(self._config.cancel_grace_s) as waited:
            for job in running:
                await job.ran.wait()
        if waited.cancelled_caught:
            log.warning("%s: a job did not stop within %.0f s (%s)",
                        "every workspace" if agent_id is None else f"workspace {agent_id}",
                        self._config.cancel_grace_s, reason)

    def _cut_running(self, agent_id: str | None) -> builtins.list[JobRecord]:
        """Cancel the running jobs of ``agent_id`` (None: of every workspace) so that
        they are queued again once their handlers end; those jobs."""
        agents = list(self._jobs) if agent_id is None else [agent_id]
        # Running, or started and not yet running: holding a slot (none while journaled queued).
        running = [j for a in agents for j in self._jobs.get(a, {}).values()
                   if j.state in ACTIVE and j.slot and j not in self._queues.get(a, ())]
        for job in running:
            job.requeue = True
            job.scope.cancel()
        return running

    # -- internals -----------------------------------------------------------------------------

    def _add(self, job: JobRecord) -> None:
        jobs = self._jobs.setdefault(job.agent_id, {})
        jobs[job.job_id] = job
        finished = [j for j in jobs.values() if j.state not in ACTIVE]
        for old in finished[: max(0, len(finished) - self._config.history_per_workspace)]:
            del jobs[old.job_id]

    def _enqueue(self, job: JobRecord, *, front: bool = False) -> None:
        queue = self._queues.setdefault(job.agent_id, deque())
        (queue.appendleft if front else queue.append)(job)
        if job.agent_id not in self._turns:
            (self._turns.appendleft if front else self._turns.append)(job.agent_id)
        self._changed.set()

    def _publish(self, topic: str, payload: Mapping[str, object]) -> None:
        if self._publish_cb is None:
            return
        try:
            self._publish_cb(topic, payload)
        except Exception:
            log.exception("publishing %s failed", topic)

    def _progress(self, job: JobRecord, done: int, total: int | None, message: str) -> None:
        if job.take_progress(JobProgress(done=done, total=total, message=json_safe(message)),
                             trio.current_time(), self._config.progress_interval_s):
            self._publish("job.progress", {"job_id": job.job_id, "agent_id": job.agent_id,
                                           "kind": job.kind, "progress": job.progress.copy()})

    def _retained(self) -> builtins.list[JobInfo]:
        return [j.as_dict() for jobs in self._jobs.values() for j in jobs.values()]

    async def _finish(self, job: JobRecord, state: str, *, result: JsonObject | None = None,
                      error: str | None = None, code: int | None = None) -> None:
        """End ``job``: journaled before it is seen (``jobs.get``, events, waits), so a job told
        ended is never interrupted or run again by a restart (its end as JSON can hold it)."""
        end = job.ended(state, json_safe(result), json_safe(error), code, self._wall())
        try:
            await self._journal_log.append(end, self._retained)
        finally:  # done once on disk: a forget waits for it before it drops the job
            self._free_slot(job)  # kept meanwhile: the counts agree with what is told
            job.take_end(end)
            self._publish("job.state", job.as_dict())
            job.done.set()

    def _start_eligible(self, nursery: trio.Nursery) -> None:
        """Admit queued jobs: the agent at the front of ``_turns`` goes first; an agent that
        starts a job moves to the back; one that must wait keeps its place."""
        cfg = self._config
        if self._stopping:
            return
        admitted = True
        while admitted:
            admitted = False
            for agent in list(self._turns):
                if sum(self._running.values()) >= cfg.max_running:
                    return
                queue = self._queues.get(agent)
                if not queue:
                    self._turns.remove(agent)  # back in rotation when it queues again
                    continue
                if (self._running.get(agent, 0) >= cfg.max_running_per_workspace
                        or agent in self._paused):
                    continue
                job = queue[0]  # strict FIFO within a workspace
                if self._kinds[job.kind].cpu_heavy and not self._take_cpu(job, nursery):
                    continue
                queue.popleft()
                self._turns.remove(agent)
                if queue:
                    self._turns.append(agent)
                self._running[agent] = self._running.get(agent, 0) + 1
                job.slot, job.ran = True, trio.Event()
                job.state, job.started_at = "running", self._wall()
                self._publish("job.state", job.as_dict())
                nursery.start_soon(self._run_job, job, name=f"job {job.kind} {job.job_id}")
                admitted = True
                break  # the order changed: start again from the front

    def _take_cpu(self, job: JobRecord, nursery: trio.Nursery) -> bool:
        # Tokens are taken here, in turn order, not by the job tasks (whose start order
        # trio does not promise), so the shared limiter sees workspaces round robin.
        try:
            self._cpu.acquire_on_behalf_of_nowait(cpu_borrower(job))
        except trio.WouldBlock:
            if not self._cpu_waiter:
                self._cpu_waiter = True
                nursery.start_soon(self._wait_for_cpu)
            return False
        return True

    async def _wait_for_cpu(self) -> None:
        """Wake the dispatcher once a CPU token is free (others may share the limiter)."""
        try:
            await self._cpu.acquire_on_behalf_of(self)
            self._cpu.release_on_behalf_of(self)
        finally:
            self._cpu_waiter = False
            self._changed.set()

    async def _run_job(self, job: JobRecord) -> None:
        spec, ran = self._kinds[job.kind], job.ran  # this run's (a requeued job runs again)
        try:
            with job.scope:
                await self._execute(job, spec)
            if job.state in ACTIVE and job.requeue:  # stopped by a pause: runs after it
                self._free_slot(job)
                job.state, job.started_at, job.requeue = "queued", None, False
                job.partial = None  # the next run starts afresh
                job.scope = trio.CancelScope()
                await self._record(job, "front")
            elif job.state in ACTIVE:  # our own scope was cancelled: cancel() asked for it
                await self._finish(job, "cancelled", result=job.partial,
                                   error=job.cancel_reason)
        finally:
            ran.set()
            if job.ran is ran:  # not admitted again meanwhile: the slot is this run's
                self._free_slot(job)

    def _free_slot(self, job: JobRecord) -> None:
        """``job`` runs no more: its running slot (and CPU token) go, before the state it
        ends in is published, so that the counts of ``statistics`` agree with it."""
        if job.slot:
            job.slot = False
            if self._kinds[job.kind].cpu_heavy:
                self._cpu.release_on_behalf_of(cpu_borrower(job))
            self._running[job.agent_id] -= 1
            if not self._running[job.agent_id]:  # kept for no agent that ran a job once
                del self._running[job.agent_id]
            self._changed.set()

    async def _execute(self, job: JobRecord, spec: JobKind) -> None:
        await self._journal_log.append(job.as_dict(), self._retained)  # running (module doc)
        # Its workspace folder stays guarded until the handler has ended: a workspace that
        # failed (a link took the place of a folder of it) gives up its own guard while
        # the job, cut short, still saves what it did on its way out.
        folder = None if self._folder_of is None else self._folder_of(job.agent_id)
        with confine.guarded(folder):
            end = await run_handler(job, spec, self._progress)
        await self._finish(job, end.state, result=end.result, error=end.error, code=end.code)

    async def _recover(self) -> None:
        """Held, resumed or interrupted: each unfinished job of the journal (module doc)."""
        interrupted: list[JobRecord] = []
        for job in recovered(await self._journal_log.open()):
            self._add(job)
            fate = take_up(job, self._kinds)
            if fate == "queue":
                self._enqueue(job)
            elif fate == "interrupted":
                interrupted.append(job)
        for job in interrupted:
            await self._finish(job, "failed", error=INTERRUPTED, code=JOB_FAILED)
        for agent_id, queue in self._queues.items():
            if self._hold_recovered or any(job.held for job in queue):
                self._record_held_soon(self._hold(agent_id))  # journaled: the rewrite
        await self._journal_log.rewrite(self._retained())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover the journal, then dispatch until cancelled (see the module docstring)."""
        try:
            await self._recover()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    self._start_eligible(nursery)
                    await self._changed.wait()
                    self._changed = trio.Event()
        finally:
            self._nursery = None
            self._journal_log.close()
