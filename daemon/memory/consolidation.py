"""Consolidation in the daemon: auto_dream on cron and auto_resource, as jobs.

:class:`Consolidation` (daemon-wide, built by the composition) owns:

- the job handlers of ``auto_dream`` (exclusive per workspace) and ``auto_resource``
  (exclusive; a running one picks up work queued meanwhile, and work that came too late
  for it has a job once it ended: after a failed one, once the chat provider's backoff
  is over; after one cancelled, none), registered on the job manager by
  :meth:`Consolidation.register_jobs`;
- the dream entries of the daemon-wide :class:`CronScheduler` (state file
  ``<data>/state/scheduler.json``), which submits ``auto_dream`` jobs.

:class:`ResourceService` is its per-workspace service: it registers the workspace's
``dream_cron`` (when ``dream_cron_enabled``) with the scheduler, runs the resource catalog
and its watcher, and on close unschedules the entry (its last fired occurrence stays in
the scheduler state, so a reopen does not fire it again; a workspace whose dream is
turned off, or that is closed with forget, loses it: back on, its dream starts from then,
no missed night made up for). It stops by cancellation with its workspace.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, NotRequired, TypedDict

import trio

from recalld.daemon.jobparams import choice, flag, params_of, text
from recalld.daemon.jobrecords import JobContext
from recalld.daemon.jobs import JobManager
from recalld.daemon.memory.catalog import catalog_exists, catalog_path
from recalld.daemon.memory.resource import ResourceCatalog
from recalld.daemon.memory.resource_results import (
    ResourceResult,
    ResourceStatus,
    merged_results,
)
from recalld.daemon.remote.hook import one_host_at_a_time
from recalld.daemon.scheduler import CronScheduler, load_cron
from recalld.daemon.workspaces import Workspace, workspace_of_job
from recalld.ipc.errors import AlreadyRunning, RecalldError, UnknownWorkspace

if TYPE_CHECKING:
    # A dream run (and the chat client, digest rules and tools it needs) is imported
    # when the first auto_dream job runs.
    from recalld.daemon.memory import changelog
    from recalld.daemon.memory.llm import ChatClients

log = logging.getLogger(__name__)

DREAM_KIND = "auto_dream"
RESOURCE_KIND = "auto_resource"
#: The most a dream's end waits to read its catalog for what the next run leaves out.
WAITING_READ_S = 20.0
#: The params of each kind: who asked (the cron, with its occurrence; the resource
#: watcher), and for a dream whether the notes waiting after failed tries are read too
#: (:mod:`dreamretry`). A client's submission is ``manual``, named or not.
DREAM_PARAMS = params_of(DREAM_KIND, {"trigger": choice("manual", "cron"),
                                      "occurrence": text, "retry_failed": flag})
RESOURCE_PARAMS = params_of(RESOURCE_KIND, {"trigger": choice("manual", "cron", "watch")})


class DreamStatus(TypedDict):
    """A workspace's dream schedule, as its status shows it."""

    cron: str
    enabled: bool
    next_run: NotRequired[str]
    last_fired: NotRequired[str | None]
    tz: NotRequired[str]
    error: NotRequired[str]  # why the cron is not scheduled
    #: The notes the next dream run leaves out after failed tries, and why
    #: (:mod:`dreamretry`), as the dream catalog says at the workspace's open and after
    #: each run (succeeded, failed or cancelled).
    waiting_notes: NotRequired[int]
    waiting: NotRequired[dict[str, str]]


def _shown(waiting: Mapping[str, str]) -> tuple[int, dict[str, str]]:
    """How many notes wait, and the first of them by path (as a dream's result names them)."""
    from recalld.daemon.memory import changelog

    return len(waiting), dict(sorted(waiting.items())[:changelog.WAITING_SHOWN])


class Consolidation:
    """The dream schedule and the consolidation job handlers, daemon-wide."""

    def __init__(self, jobs: JobManager, scheduler: CronScheduler,
                 get_workspace: Callable[[str], Workspace],
                 wait_changed: Callable[[], Awaitable[None]]) -> None:
        self._jobs = jobs
        #: Until the workspaces change (:func:`workspace_of_job`).
        self._wait_changed = wait_changed
        self.scheduler = scheduler
        self._get_workspace = get_workspace
        self.catalogs: dict[str, ResourceCatalog] = {}
        #: Per workspace, the waiting notes of its last dream (see ``DreamStatus``).
        self.waiting: dict[str, tuple[int, dict[str, str]]] = {}
        #: Per workspace, its auto_resource job that has looked for work for the last
        #: time (it is ending, or has ended).
        self._looked_last: dict[str, str] = {}
        #: Per open workspace, how its auto_resource job is requested in the background
        #: (True: after a failed one, once the chat provider's backoff is over).
        self.request_soon: dict[str, Callable[[bool], None]] = {}

    def register_jobs(self) -> None:
        """Add the ``auto_dream`` and ``auto_resource`` kinds to the job manager."""
        # A dream cut short by a restart goes on at the start (the notes it finished are
        # in its catalog); cut short again, it waits for the next occurrence.
        self._jobs.register(DREAM_KIND, self.dream_job, exclusive=True, resumable="once",
                            check_params=DREAM_PARAMS)
        self._jobs.register(RESOURCE_KIND, self.resource_job, exclusive=True,
                            check_params=RESOURCE_PARAMS)

    # -- jobs --------------------------------------------------------------------------

    async def dream_job(self, job: JobContext) -> changelog.RunSummary:
        from recalld.daemon.memory import dream, dreamruns
        from recalld.daemon.memory.fileops import fileops_for

        ws = (await workspace_of_job(self._get_workspace, job.agent_id,
                                     self._wait_changed) if job.resumed
              else self._get_workspace(job.agent_id))
        if job.params.get("trigger") == "cron":
            await self._retry_failed_resources(job.agent_id)
        async with one_host_at_a_time(ws, DREAM_KIND) as shared:
            chat = ws.services.chat.client()  # "no chat model configured" fails it
            with dreamruns.dreaming(ws.root):
                async with fileops_for(ws).lock:  # before the run reads the catalog
                    await dreamruns.finish_undos(ws, shared)
                try:
                    return await dream.run_dream(
                        ws, chat, trigger=str(job.params.get("trigger") or "manual"),
                        progress=job.set_progress, job_id=job.job_id, shared=shared,
                        retry_failed=job.params.get("retry_failed") is True,
                        keep=job.keep_result)
                finally:
                    # What the next run leaves out, as this one (succeeded, failed or
                    # cancelled) left the catalog: what its status warns of.
                    with trio.CancelScope(shield=True), trio.move_on_after(WAITING_READ_S):
                        waiting = await self._read_waiting(ws)
                        self.waiting[ws.agent_id] = _shown(waiting or {})

    async def load_waiting(self, ws: Workspace) -> None:
        """Keep, for ``ws``'s status, the notes its next dream leaves out after failed
        tries, as its dream catalog says (a daemon started since its last dream)."""
        waiting = await self._read_waiting(ws)
        if waiting:  # a dream that ended meanwhile said it first
            self.waiting.setdefault(ws.agent_id, _shown(waiting))

    async def _read_waiting(self, ws: Workspace) -> dict[str, str] | None:
        """``{path: why}`` of the notes the next dream of ``ws`` leaves out after failed
        tries, as its dream catalog says; None if it has none or it cannot be read."""
        if not catalog_exists(catalog_path(ws.root, ws.settings.metadata_dir, "dream")):
            return None  # never dreamed: the dream's modules are not loaded for nothing
        from recalld.daemon.memory import dreamnotes

        try:
            return await trio.to_thread.run_sync(dreamnotes.waiting_notes, ws)
        except (RecalldError, OSError) as exc:  # the next dream says it, and repairs it
            log.warning("%s: the dream catalog was not read: %s", ws.agent_id, exc)
            return None

    async def resource_job(self, job: JobContext) -> ResourceResult:
        catalog = self.catalogs.get(job.agent_id)
        if catalog is None:
            raise UnknownWorkspace(f"workspace {job.agent_id!r} has no resource catalog")
        manual = job.params.get("trigger") != "watch"
        result: ResourceResult | None = None
        seen: set[tuple[str, object]] = set()  # the work there was at each start of a pass
        while True:
            seen |= _work_of(catalog)
            try:
                async with one_host_at_a_time(catalog.ws, RESOURCE_KIND):
                    more = await catalog.process(
                        catalog.ws.services.chat.client_or_none(),
                        retry_failed=manual and result is None, job_id=job.job_id,
                        progress=job.set_progress)
            except Exception:
                # Failed: it takes up nothing more. Work that came after it began its pass
                # (refused a job of its own: this one ran) has a job once this one ended,
                # after the provider's backoff (``request_job``); a cancelled job (by a
                # user, or to run again later) requests none.
                self._looked_last[job.agent_id] = job.job_id
                if not _work_of(catalog) <= seen and job.agent_id in self.request_soon:
                    self.request_soon[job.agent_id](False)
                raise
            result = more if result is None else merged_results(result, more)
            # A file cataloged after the job last looked for work (while it wrote its
            # inbox item, say) was refused a job of its own: one runs. It is this one's.
            # From this look on, the job takes up nothing more while the job manager
            # journals its end: a file cataloged then has its job once this one ended
            # (``request_job``).
            if not catalog.work(chat_enabled=False):
                self._looked_last[job.agent_id] = job.job_id
                return result

    async def _retry_failed_resources(self, agent_id: str) -> None:
        """Have the resource files the chat model failed on tried again: once a night,
        with the dream (the jobs the watcher starts leave them, so that a model that stays
        down is not asked again at every new file)."""
        catalog = self.catalogs.get(agent_id)
        if catalog is None or not catalog.counts().get("failed"):
            return
        try:
            await self._jobs.submit(agent_id, RESOURCE_KIND, {"trigger": "cron"})
        except AlreadyRunning:
            pass  # one is queued or running: failed files wait for the next night
        except RecalldError as exc:
            log.warning("%s: auto_resource not submitted: %s", agent_id, exc)

    # -- per workspace -----------------------------------------------------------------

    def dream_status(self, ws: Workspace) -> DreamStatus:
        entry = self.scheduler.entry_status(ws.agent_id, DREAM_KIND)
        out: DreamStatus = {"cron": ws.settings.dream_cron,
                            "enabled": ws.settings.dream_cron_enabled}
        if entry is not None:
            out["next_run"] = entry["next"]
            out["last_fired"] = entry["last_fired"]
            out["tz"] = entry["tz"]
        if ws.agent_id in self.waiting:
            out["waiting_notes"], out["waiting"] = self.waiting[ws.agent_id]
        return out

    def schedule_workspace(self, ws: Workspace) -> str | None:
        """Register (or drop) ``ws``'s dream cron; the error text if it is invalid."""
        s = ws.settings
        try:
            if s.dream_cron_enabled:
                self.scheduler.schedule(ws.agent_id, DREAM_KIND, s.dream_cron)
            else:  # its history goes: turned on again, it starts from then
                self.scheduler.schedule(ws.agent_id, DREAM_KIND, s.dream_cron, enabled=False)
        except ValueError as exc:
            log.error("workspace %s: dream_cron not scheduled: %s", ws.agent_id, exc)
            return str(exc)
        return None

    def resource_service(self, ws: Workspace, chat: ChatClients, cpu: trio.CapacityLimiter,
                         background: trio.CapacityLimiter | None = None) -> ResourceService:
        """The per-workspace service of ``ws`` (not started)."""

        def retry_wait_s() -> float:
            client = chat.client_or_none()
            return client.line.retry_wait_s() if client is not None else 0.0

        async def request_job(after_failure: bool = False) -> None:
            while after_failure:  # not while the provider is known unavailable
                if (wait_s := retry_wait_s()) <= 0:
                    break
                await trio.sleep(wait_s)
            while True:
                try:
                    await self._jobs.submit(ws.agent_id, RESOURCE_KIND, {"trigger": "watch"})
                except AlreadyRunning as exc:
                    running = exc.data.get("job_id") if isinstance(exc.data, dict) else None
                    if running is None or running != self._looked_last.get(ws.agent_id):
                        return  # the queued or running job picks the new work up
                    try:  # it looks for work no more: its end is a moment away
                        ended = await self._jobs.wait(ws.agent_id, str(running))
                    except RecalldError as err:
                        log.warning("%s: auto_resource not submitted: %s", ws.agent_id, err)
                        return
                    if ended["state"] == "cancelled":
                        return  # by a user: the next change or start asks again
                    if ended["state"] == "failed" and ws.agent_id in self.request_soon:
                        self.request_soon[ws.agent_id](True)  # not at once: it waits
                        return
                    continue
                except RecalldError as exc:
                    log.warning("%s: auto_resource not submitted: %s", ws.agent_id, exc)
                return

        catalog = ResourceCatalog(
            ws, request_job=request_job, limiter=cpu, background=background,
            chat_enabled=lambda: chat.client_or_none() is not None)
        return ResourceService(self, ws, catalog, request_job)


def _work_of(catalog: ResourceCatalog) -> set[tuple[str, object]]:
    """The work ``catalog`` has for a job: each file's path and digest."""
    return {(p, catalog.records[p].get("digest")) for p in catalog.work(chat_enabled=False)}


class ResourceService:
    """One workspace's dream schedule entry and resource catalog (with its watcher)."""

    def __init__(self, consolidation: Consolidation, ws: Workspace,
                 catalog: ResourceCatalog,
                 request_job: Callable[[bool], Awaitable[None]]) -> None:
        self._consolidation = consolidation
        self._request_job = request_job
        self.ws = ws
        self.catalog = catalog
        self.schedule_error: str | None = None

    def dream_status(self) -> DreamStatus:
        out = self._consolidation.dream_status(self.ws)
        if self.schedule_error:
            out["error"] = self.schedule_error
        return out

    def status(self) -> ResourceStatus:
        return self.catalog.status()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Schedule the dream cron, then run the catalog until cancelled; unschedule."""
        c = self._consolidation
        agent_id = self.ws.agent_id
        if self.ws.settings.dream_cron_enabled:
            await load_cron()
        self.schedule_error = c.schedule_workspace(self.ws)
        c.catalogs[agent_id] = self.catalog
        # What waits is this folder's, from its catalog: never what an earlier workspace
        # of the agent (closed, maybe forgotten, maybe at another folder) left here.
        c.waiting.pop(agent_id, None)
        await c.load_waiting(self.ws)
        try:
            async with trio.open_nursery() as nursery:

                def request_soon(after_failure: bool) -> None:
                    nursery.start_soon(self._request_job, after_failure)

                c.request_soon[agent_id] = request_soon
                await self.catalog.run(task_status=task_status)
                nursery.cancel_scope.cancel()
        finally:
            c.scheduler.unschedule(agent_id, DREAM_KIND)
            if c.catalogs.get(agent_id) is self.catalog:
                del c.catalogs[agent_id]
                c.waiting.pop(agent_id, None)
                c.request_soon.pop(agent_id, None)
