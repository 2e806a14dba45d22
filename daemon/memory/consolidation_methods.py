"""Wiring of consolidation into the daemon: auto_dream on cron, auto_resource, their RPCs.

:func:`install_consolidation` (one call from the assembly) adds:

- the daemon-wide :class:`CronScheduler` (service ``"scheduler"``, state file
  ``<data>/state/scheduler.json``), which submits ``auto_dream`` jobs;
- job kinds ``auto_dream`` (exclusive per workspace) and ``auto_resource`` (exclusive;
  a running one picks up work queued meanwhile);
- the workspace service ``"consolidation"``: it registers the workspace's ``dream_cron``
  (when ``dream_cron_enabled``) with the scheduler, runs the resource catalog and its
  watcher, and on close unschedules the entry (its last fired occurrence stays in the
  scheduler state, so a reopen does not fire it again);
- methods ``dream.undo {agent_id, run_id, force?}`` and ``dream.runs {agent_id, limit?}``.

Everything stops by cancellation with the supervisor or the workspace.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio

from recalld.daemon.api import CallContext, Methods, Params
from recalld.daemon.jobs import JobContext, JobManager
from recalld.daemon.memory import dream
from recalld.daemon.memory.llm import chat_client_for
from recalld.daemon.memory.resource import ResourceCatalog
from recalld.daemon.providers.chat import ChatClient
from recalld.daemon.providers.errors import ProviderConfigError
from recalld.daemon.remote.hook import one_host_at_a_time
from recalld.daemon.scheduler import CronScheduler
from recalld.daemon.supervisor import Supervisor
from recalld.daemon.workspaces import Workspace, WorkspaceService
from recalld.ipc.errors import AlreadyRunning, RecalldError, UnknownWorkspace

log = logging.getLogger(__name__)

DREAM_KIND = "auto_dream"
RESOURCE_KIND = "auto_resource"
METHODS = Methods()


@METHODS.add("dream.undo", positional=("agent_id", "run_id"))
async def dream_undo(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    run_id = p.text("run_id")
    force = p.boolean("force", False)
    p.done()
    return await dream.undo(ctx.workspace(agent_id), run_id, force=force)


@METHODS.add("dream.runs", positional=("agent_id",))
async def dream_runs(ctx: CallContext, params: dict[str, Any]) -> Any:
    p = Params(params)
    agent_id = p.agent_id()
    limit = p.integer("limit", 20, minimum=1)
    p.done()
    return {"runs": await dream.runs(ctx.workspace(agent_id), min(limit, 200))}


def _chat_or_none(ws: Workspace, services: Mapping[str, Any]) -> ChatClient | None:
    try:
        return chat_client_for(ws, services)
    except ProviderConfigError:
        return None


class Consolidation:
    """The scheduler, the job handlers and the per-workspace service, sharing state."""

    def __init__(self, supervisor: Supervisor, jobs: JobManager,
                 scheduler: CronScheduler | None = None) -> None:
        self._supervisor = supervisor
        self._jobs = jobs
        self.scheduler = scheduler or CronScheduler(
            jobs.submit, state_path=supervisor.config.state_dir / "scheduler.json")
        self.catalogs: dict[str, ResourceCatalog] = {}

    @property
    def services(self) -> Mapping[str, Any]:
        return self._supervisor.state.services

    # -- jobs --------------------------------------------------------------------------

    async def dream_job(self, job: JobContext) -> dict[str, Any]:
        ws = self._supervisor.registry.get(job.agent_id)
        async with one_host_at_a_time(ws, DREAM_KIND):
            chat = chat_client_for(ws, self.services)  # "no chat model configured" fails it
            return await dream.run_dream(
                ws, chat, trigger=str(job.params.get("trigger") or "manual"),
                progress=job.set_progress, job_id=job.job_id)

    async def resource_job(self, job: JobContext) -> dict[str, Any]:
        catalog = self.catalogs.get(job.agent_id)
        if catalog is None:
            raise UnknownWorkspace(f"workspace {job.agent_id!r} has no resource catalog")
        manual = job.params.get("trigger") != "watch"
        async with one_host_at_a_time(catalog.ws, RESOURCE_KIND):
            return await catalog.process(
                _chat_or_none(catalog.ws, self.services), retry_failed=manual,
                job_id=job.job_id, progress=job.set_progress)

    # -- per workspace -----------------------------------------------------------------

    def dream_status(self, ws: Workspace) -> dict[str, Any]:
        entry = next((e for e in self.scheduler.status()
                      if e["agent_id"] == ws.agent_id and e["kind"] == DREAM_KIND), None)
        out: dict[str, Any] = {"cron": ws.settings.dream_cron,
                               "enabled": ws.settings.dream_cron_enabled}
        if entry is not None:
            out.update(next_run=entry["next"], last_fired=entry["last_fired"], tz=entry["tz"])
        return out

    def schedule_workspace(self, ws: Workspace) -> str | None:
        """Register (or drop) ``ws``'s dream cron; the error text if it is invalid."""
        s = ws.settings
        try:
            if s.dream_cron_enabled:
                self.scheduler.schedule(ws.agent_id, DREAM_KIND, s.dream_cron)
            else:
                self.scheduler.unschedule(ws.agent_id, DREAM_KIND)
        except ValueError as exc:
            log.error("workspace %s: dream_cron not scheduled: %s", ws.agent_id, exc)
            return str(exc)
        return None

    def workspace_service(self) -> WorkspaceService:
        async def run(workspace: Workspace, *,
                      task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
            ws = workspace

            async def request_job() -> None:
                try:
                    await self._jobs.submit(ws.agent_id, RESOURCE_KIND, {"trigger": "watch"})
                except AlreadyRunning:
                    pass  # the queued or running job picks the new work up
                except RecalldError as exc:
                    log.warning("%s: auto_resource not submitted: %s", ws.agent_id, exc)

            catalog = ResourceCatalog(
                ws, request_job=request_job,
                limiter=self.services.get("cpu"),
                chat_enabled=lambda: _chat_or_none(ws, self.services) is not None)
            error = self.schedule_workspace(ws)

            def status() -> dict[str, Any]:
                out = self.dream_status(ws)
                if error:
                    out["error"] = error
                return out

            self.catalogs[ws.agent_id] = catalog
            ws.attach("resource", catalog)
            ws.add_status("dream", status)
            ws.add_status("resource", catalog.status)
            try:
                await catalog.run(task_status=task_status)
            finally:
                self.scheduler.unschedule(ws.agent_id, DREAM_KIND)
                if self.catalogs.get(ws.agent_id) is catalog:
                    del self.catalogs[ws.agent_id]

        return run


def install_consolidation(supervisor: Supervisor, jobs: JobManager,
                          scheduler: CronScheduler | None = None) -> Consolidation:
    """Plug the scheduler, job kinds, workspace service and methods into ``supervisor``
    (before it runs)."""
    c = Consolidation(supervisor, jobs, scheduler)
    # The supervisor takes daemon-wide services at construction; this appends one so the
    # assembly needs a single call. Services start in order: the job manager is before it.
    supervisor.add_service("scheduler", c.scheduler.run)
    supervisor.state.services["scheduler"] = c.scheduler
    supervisor.state.services["consolidation"] = c
    supervisor.registry.add_service("consolidation", c.workspace_service())
    supervisor.state.methods.include(METHODS)
    jobs.register(DREAM_KIND, c.dream_job, exclusive=True)
    jobs.register(RESOURCE_KIND, c.resource_job, exclusive=True)
    return c
