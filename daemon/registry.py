"""The workspace registry: which agent workspaces are open, and their services.

:class:`WorkspaceRegistry` is a service run by the supervisor. Its nursery hosts one
task per open :class:`~recalld.daemon.workspaces.Workspace`, which starts its services
with the registry's :data:`~recalld.daemon.workspaces.WorkspaceStarter` and is ``ready``
only once all of them can serve (see :mod:`recalld.daemon.workspaces`).

Every workspace that opened is recorded in ``<data>/state/workspaces.json``
(:mod:`recalld.daemon.recordbook`) with its path and overrides, so the supervisor reopens
it after a restart; ``close(..., forget=True)`` drops the record.

Closing a workspace first stops its running jobs (they wait, queued, until it opens
again), then cancels its nursery and waits for the services to finish their shielded
cleanup. Cancelling the registry closes every workspace (the daemon's stop has stopped
the jobs before). A service that crashes, or a link in place of its folder (found at a use, or by a
read or write below it: :func:`confine.told`), marks its workspace ``failed`` (visible in
``daemon.status``) without taking the daemon down, and stops its running jobs at once (held,
queued, as a close holds them); ``workspace.open`` on a failed workspace starts it again once its
services stopped (they hold its lock), and lets them run.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from recalld.daemon import memtrim, reload_sharing, remembered
from recalld.daemon.config import DaemonConfig, workspace_settings_from_params
from recalld.daemon.errors import remade_error
from recalld.daemon.events import EventBus
from recalld.daemon.keyedlocks import KeyedLocks
from recalld.daemon.recordbook import RecordBook
from recalld.daemon.registry_places import KnownPlaces
from recalld.daemon.remembered import check_owner
from recalld.daemon.store import confine
from recalld.daemon.workspace_places import (
    check_daemon_folders,
    check_not_anothers,
    check_root,
    check_still_there,
    resolved,
)
from recalld.daemon.workspaces import Workspace, WorkspaceStarter, check_agent_id, describe_failure
from recalld.daemon.writegate import WriteGates
from recalld.ipc.agent_ids import workspace_table
from recalld.ipc.errors import InvalidParams, RecalldError, UnknownWorkspace
from recalld.ipc.paths import expand_param

if TYPE_CHECKING:
    from recalld.daemon.jobs import JobManager
    from recalld.daemon.refusals import RefusedFor

# The registry and its workspaces log under one name: recalld.daemon.workspaces.
log = logging.getLogger("recalld.daemon.workspaces")


class WorkspaceRegistry(KnownPlaces):
    """Opens, lists and closes workspaces; a service that runs in the supervisor."""

    def __init__(self, get_config: Callable[[], DaemonConfig], events: EventBus,
                 start: WorkspaceStarter, remembered_path: Path | None = None,
                 jobs: JobManager | None = None) -> None:
        self._get_config = get_config
        #: Holds a closed workspace's jobs until it opens again (:meth:`JobManager.hold`).
        self._jobs = jobs
        self._records = RecordBook(remembered_path)
        self.write_failure = self._records.write_failure
        self._events = events
        self._start = start
        self._workspaces: dict[str, Workspace] = {}
        self._left_behind: dict[str, str] = {}
        #: By open agent: the settings a reload changed that wait for its next open, and
        #: the place the configuration gave it and the daemon settings it took when it
        #: opened (reload_sharing.Opened).
        self.waiting: dict[str, builtins.list[str]] = {}
        self._opened: dict[str, reload_sharing.Opened] = {}
        #: By agent: the lock its opens and closes take, while one holds or waits for it
        #: (weak: a close naming an agent that has no workspace, or one closed long ago,
        #: leaves nothing behind; memory grows with the workspaces, not with the ids seen).
        self._locks = KeyedLocks()
        #: Agents whose files a restore is replacing, or a backup reading while they are
        #: closed: opening them waits (:meth:`held`). By agent, the event set when they
        #: are free and why they are held.
        self._held: dict[str, tuple[trio.Event, str]] = {}
        #: Writes to each agent's workspace, which a restore holds (:mod:`writegate`).
        self.writes = WriteGates()
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Until a workspace is added, dropped, changes state or starts a service (what
        may answer :meth:`get` differently): a waiter asks again, with no timer."""
        await self._changed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the workspaces until cancelled; cancellation closes all of them."""
        await self._records.load()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                for ws in self._workspaces.values():
                    ws.state = "closing"

    def get(self, agent_id: str) -> Workspace:
        """The open (ready) workspace of ``agent_id``, or UnknownWorkspace."""
        ws = self._workspaces.get(agent_id)
        if ws is None:
            if (held := self._held.get(agent_id)) is not None:
                raise UnknownWorkspace(f"workspace {agent_id!r} is not open: {held[1]}")
            raise UnknownWorkspace(f"workspace {agent_id!r} is not open")
        if ws.state == "failed" and ws.error:
            # Why, and what to do: the same as status says.
            raise UnknownWorkspace(f"workspace {agent_id!r} failed: {ws.error} (recalld "
                                   "status says what to do)")
        if ws.state != "ready":
            raise UnknownWorkspace(f"workspace {agent_id!r} is {ws.state}")
        # Looked at whenever the workspace is used (a call names it, a job starts), not on
        # a timer: its services read and write by path, and a link put in its folder's
        # place would lead them into another folder, another agent's memory among them.
        moved = ws.leads_elsewhere()
        if moved is not None:
            ws.root_leads(*moved)
            self._hold_jobs(ws)
            raise UnknownWorkspace(f"workspace {agent_id!r} failed: {ws.error}")
        return ws

    def look_at_roots(self) -> None:
        """Stop each open workspace whose folder now leads elsewhere (as :meth:`get`
        does at each use): status tells the truth without a call naming it first."""
        for agent_id, ws in list(self._workspaces.items()):
            if ws.state == "ready":
                with contextlib.suppress(UnknownWorkspace):
                    self.get(agent_id)

    def find(self, agent_id: str) -> Workspace | None:
        """The workspace of ``agent_id`` in whatever state (opening, ready, closing,
        failed, closed but not yet dropped), None if there is none."""
        return self._workspaces.get(agent_id)

    def searchable(self, agent_id: str) -> Workspace:
        """The workspace of ``agent_id`` if it answers searches: ready, or still opening
        with its search stage started; else UnknownWorkspace as :meth:`get`."""
        ws = self._workspaces.get(agent_id)
        if ws is not None and ws.state == "opening" and ws.search_ready:
            return ws
        return self.get(agent_id)

    def serving(self, agent_id: str) -> Workspace | None:
        """The workspace :meth:`searchable` would give, None where it would refuse,
        without looking at its folder: for deciding how to run a call, which then asks
        :meth:`searchable` (one look at the folder per call, not two)."""
        ws = self._workspaces.get(agent_id)
        if ws is not None and (ws.state == "ready" or (ws.state == "opening"
                                                       and ws.search_ready)):
            return ws
        return None

    async def reloaded(self, old: DaemonConfig, new: DaemonConfig) -> builtins.list[str]:
        """Apply a reload to the open workspaces (:func:`reload_sharing.reloaded`); stop
        those that now hold or lie in another's folder, the two not shared with each
        other: a start would refuse both (:func:`check_overlap`)."""
        moved = await self.moved_by(new)
        changed = reload_sharing.reloaded(self.list(), old, new, self._records.config_at, moved)
        for ws in self.list():
            if ws.state not in ("opening", "ready"):
                continue
            self.waiting[ws.agent_id] = reload_sharing.waiting(
                ws, new, self._records.config_at, self._opened.get(ws.agent_id), moved)
            try:
                self._check_overlap(ws.agent_id, ws.root, ws.settings)
            except InvalidParams as exc:
                ws.stop(f"{exc.message} (the reloaded configuration shares them so no "
                        "more, so it stopped; once it does again, reload, then: recalld "
                        f"workspace open {ws.agent_id})")
        return changed

    def drop_unopened(self, configured: Collection[str]) -> builtins.list[str]:
        """Drop the workspaces that never opened (refused, or failed while they opened)
        and that neither ``configured`` names nor the record reopens: nothing opens them
        again, so a reload that took them out of the file leaves no failure to show (a
        start would show none). Returns their agent ids."""
        dropped = [agent_id for agent_id, ws in self._workspaces.items()
                   if ws.state == "failed" and not ws.served and agent_id not in configured
                   and agent_id not in self._records.entries]
        for agent_id in dropped:
            del self._workspaces[agent_id]
            self._opened.pop(agent_id, None)
        if dropped:
            self._pulse()
        return dropped

    def exists(self, agent_id: str) -> bool:
        """True if ``agent_id`` has a workspace here, in any state."""
        return agent_id in self._workspaces

    def folder_of(self, agent_id: str) -> Path | None:
        """The folder of ``agent_id``'s workspace here, in any state (None: none)."""
        ws = self._workspaces.get(agent_id)
        return None if ws is None else ws.root

    def list(self) -> list[Workspace]:
        return sorted(self._workspaces.values(), key=lambda w: w.agent_id)

    def held_now(self) -> dict[str, str]:
        """The workspaces :meth:`held` now (not open meanwhile), by agent id: why."""
        return {agent_id: why for agent_id, (_, why) in self._held.items()}

    def remembered(self) -> dict[str, remembered.Remembered]:
        """Every recorded workspace (open or not), by agent id."""
        return dict(self._records.entries)

    async def note_left_out(self, agent_id: str, keys: builtins.list[str]) -> None:
        """:meth:`RecordBook.note_left_out`."""
        await self._records.note_left_out(agent_id, keys)

    def left_out(self, agent_id: str) -> builtins.list[str]:
        """The secrets of ``agent_id``'s overrides a restore could not put back."""
        return self._records.left_out(agent_id)

    def _lock(self, agent_id: str) -> trio.Lock:
        return self._locks.of(agent_id)

    @contextlib.asynccontextmanager
    async def held(self, agent_id: str,
                   why: str = "a restore is replacing its files") -> AsyncIterator[None]:
        """While a restore replaces ``agent_id``'s files (or a backup reads those of a
        closed workspace: ``why`` says which, to a call that names it meanwhile):
        :meth:`open` of it waits until they are in place. Opened meanwhile, it would
        serve the pending turns and inbox the restore replaces, and go on appending to
        the replaced files."""
        while (busy := self._held.get(agent_id)) is not None:
            await busy[0].wait()
        done = trio.Event()
        self._held[agent_id] = (done, why)
        try:
            yield
        finally:
            del self._held[agent_id]
            done.set()

    async def open(
        self,
        agent_id: str,
        path: Path | None = None,
        overrides: Mapping[str, object] | None = None,
        *,
        again: bool = False,
        name: str | None = None,
    ) -> Workspace:
        """Open ``agent_id``'s workspace (idempotent at the same path); while a restore
        replaces its files (:meth:`held`), once they are in place. ``again``: opened
        again by a start, refused if it is recorded at that path and its folder is
        missing or empty (:func:`check_still_there`). ``name``: the agent's name that
        ``agent_id`` was made of, recorded with the workspace (:func:`check_owner`).

        Raises InvalidParams if it is open at another path, the config file puts it at
        another, another agent holds the path or another name the workspace. If
        cancelled while services start, the half-open workspace is closed.
        """
        check_agent_id(agent_id)
        while True:
            while (busy := self._held.get(agent_id)) is not None:
                await busy[0].wait()
            ws = await self._open_unless_held(agent_id, path, overrides, again, name)
            if ws is not None:
                return ws

    async def _open_unless_held(self, agent_id: str, path: Path | None,
                                overrides: Mapping[str, object] | None,
                                again: bool = False, name: str | None = None,
                                ) -> Workspace | None:
        """:meth:`open`, or None if a restore took hold of the workspace meanwhile."""
        config = self._get_config()
        root = expand_param(str(path), "path") if path is not None else self.home(agent_id)
        if not root.is_absolute():
            raise InvalidParams("workspace path must be absolute")
        # Resolving symlinks stats every component: on a slow or hung mount that takes
        # long, so not on the event loop.
        given_root, root = root, await trio.to_thread.run_sync(resolved, root)
        if given_root != root:
            check_not_anothers(agent_id, given_root, root, self._places())
        recorded = self._records.entries.get(agent_id)
        if again and recorded is not None and recorded["path"] == str(root):
            await trio.to_thread.run_sync(check_still_there, root)
        async with self._lock(agent_id):
            if agent_id in self._held:
                return None
            record = self._records.entries.get(agent_id)
            check_owner(record, agent_id, name)
            if record is not None and name and "name" not in record:
                record["name"] = name  # recorded before names were: the first one claims it
                await self._records.save()
            given = overrides
            if overrides is None:
                # Without settings, a workspace recorded at this path opens as recorded
                # (``config: {}`` asks for the config file's settings alone).
                overrides = self._records.config_at(agent_id, root)
            current = self._workspaces.get(agent_id)
            if current is not None and current.state in ("opening", "ready"):
                if current.root != root:
                    raise InvalidParams(
                        f"workspace {agent_id!r} is already open at {current.root}"
                    )
                if not self._records.hands_back(agent_id, overrides):
                    # Served unchanged, but a given setting that is unknown or mistyped is
                    # refused as it would be at a first open.
                    workspace_settings_from_params(config.workspace_settings(agent_id), given)
                    return current
                # The overrides bring back secrets a restore left out (an agent's model
                # key): serve the workspace with them from now on.
                log.info("workspace %s: reopening with the secrets a restore left out",
                         agent_id)
                await self._close(current)
                del self._workspaces[agent_id]
                self._pulse()
            if path is not None and agent_id in config.configured_agents():
                # Served elsewhere, it would move back to its configured place at the next
                # start, its notes written meanwhile left behind unserved.
                place = await trio.to_thread.run_sync(
                    resolved, config.workspace_path(agent_id))
                if place != root:
                    raise InvalidParams(
                        f"the config file puts workspace {agent_id!r} at {place}: open it "
                        "without a path, or change its "
                        f"{workspace_table(agent_id)} path and reload")
            if current is not None:  # failed: its services may still hold its lock
                await current.wait_closed()
            await trio.to_thread.run_sync(check_root, root)
            await self._check_default_place(agent_id, root)
            settings = workspace_settings_from_params(
                config.workspace_settings(agent_id), overrides
            )
            self._check_overlap(agent_id, root, settings)
            self._check_replicas(agent_id, settings)
            await trio.to_thread.run_sync(check_daemon_folders, root, config)
            if self._nursery is None:
                raise RecalldError("the workspace registry is not running")
            # Settings as the configuration in force says, and checked again, with no
            # wait before it is registered: a reload that ran meanwhile gave the open
            # workspaces their sharing, not this one yet; another agent's open that ran
            # meanwhile (each holds only its own agent's lock) sees this one, or this one
            # sees it, so the two never nest.
            in_force = self._get_config()
            settings = workspace_settings_from_params(
                in_force.workspace_settings(agent_id), overrides)
            self._check_overlap(agent_id, root, settings)
            self._check_replicas(agent_id, settings)
            ws = Workspace(agent_id, root, settings, on_change=self._pulse)
            self._workspaces[agent_id] = ws
            if current is not None:
                # The one replaced (failed, or closed to take restored secrets) is freed
                # at once, as a close frees it (see :meth:`close`), not at the next full
                # collection: an idle daemon may not run one for hours.
                del current
                await trio.to_thread.run_sync(memtrim.collect)
            self.waiting.pop(agent_id, None)
            self._opened[agent_id] = reload_sharing.opened(agent_id, config, in_force)
            self._pulse()
            try:
                await self._nursery.start(self._host, ws)
            except BaseException as exc:
                ws.state = "failed"
                ws.error = describe_failure(exc)
                if not isinstance(exc, Exception):
                    raise
                if isinstance(exc, RecalldError):
                    raise
                failed = f"workspace {agent_id!r} failed to open: {ws.error}"
                mapped = remade_error(exc, failed)  # one service's error: its own code
                if mapped is None:
                    log.exception("workspace %s failed to open", agent_id)
                raise mapped or RecalldError(failed) from None
            if self._jobs is not None:
                self._jobs.release(agent_id)  # held since it closed
            await self.moved(agent_id, root)
            await self._records.remember(agent_id, root, overrides, name)
        self._events.publish("workspace.opened", {"agent_id": agent_id, "path": str(root)})
        return ws

    def record_refused(self, agent_id: str, root: Path, error: str, cause: RefusedFor) -> None:
        """Show a configured or recorded workspace whose opening was refused before it
        started (its path, its settings) as ``failed`` with ``error``, like one whose
        services failed; ``workspace.open`` tries again, ``close`` drops it."""
        current = self._workspaces.get(agent_id)
        if current is not None and current.state != "closed" and not current.refused:
            return  # it started opening: its own state and error say what happened
        settings = self._get_config().workspace_settings(agent_id)
        recorded = self._records.config_at(agent_id, root)
        if recorded:
            # The settings it was refused with, when they go together at all.
            with contextlib.suppress(RecalldError):
                settings = workspace_settings_from_params(settings, recorded)
        ws = Workspace(agent_id, root, settings, on_change=self._pulse)
        ws.refuse(error, cause)
        self._workspaces[agent_id] = ws
        self._pulse()

    async def _host(self, ws: Workspace, *, task_status: trio.TaskStatus[None]) -> None:
        """Run one workspace; a crash is contained and recorded, never propagated."""
        token = trio.lowlevel.current_trio_token()

        def link_met(exc: confine.WritesElsewhere) -> None:  # in any thread
            token.run_sync_soon(self._link_met, ws, exc)
        try:
            with confine.told(ws.root, link_met):
                await ws.run(self._start, task_status=task_status)
        except Exception as exc:
            ws.state = "failed"
            ws.error = describe_failure(exc)
            if not ws.served:
                raise  # nursery.start re-raises it to the caller of open()
            if isinstance(exc, RecalldError):  # it says what happened: no traceback
                log.error("workspace %s failed: %s", ws.agent_id, ws.error)
            else:
                log.exception("workspace %s failed", ws.agent_id)
            self._hold_jobs(ws)
            self._events.publish("workspace.failed", {"agent_id": ws.agent_id, "error": ws.error})

    def _link_met(self, ws: Workspace, exc: confine.WritesElsewhere) -> None:
        """A read or write below ``ws``'s folder met a link in place of a folder: it stops
        at once, as a use finding it would, rather than retry what cannot succeed."""
        if ws.state not in ("opening", "ready"):
            return
        moved = ws.leads_elsewhere()  # its folder or metadata_dir: say so as a use does
        if moved is not None:
            ws.root_leads(*moved)
        else:
            ws.stop(f"{exc.strerror}, then open it again (the workspace stopped rather "
                    "than read or write another folder's files)")

    def _hold_jobs(self, ws: Workspace) -> None:
        """``ws`` stopped serving: its running jobs stop at once, and its jobs wait,
        queued, until it opens again (:meth:`JobManager.hold_nowait`)."""
        if self._jobs is not None:
            self._jobs.hold_nowait(ws.agent_id, "its workspace failed")

    async def close(self, agent_id: str, *, forget: bool = False) -> bool:
        """Close ``agent_id``'s workspace and wait until its services stopped; with
        ``forget`` also drop its record (it is not reopened after a restart). A recorded
        workspace that is not open can be forgotten. Returns whether one was closed."""
        async with self._lock(agent_id):
            ws = self._workspaces.get(agent_id)
            known = forget and agent_id in self._records.entries
            if (ws is None or ws.state == "closed") and not known:
                if forget and agent_id in self._get_config().configured_agents():
                    # Nothing to forget: the configuration opens it at every start.
                    raise UnknownWorkspace(
                        f"workspace {agent_id!r} is not open and not recorded: the "
                        "configuration names it, so it opens at the next start or reload "
                        "(take it out of the config file to keep it closed)")
                raise UnknownWorkspace(f"workspace {agent_id!r} is neither open nor recorded"
                                       if forget else f"workspace {agent_id!r} is not open")
            closed = False
            if ws is not None:
                if ws.state != "closed":
                    await self._close(ws)
                    closed = True
                    # Published while the workspace is still known, so that the agents
                    # it is shared with hear of it as they heard of its opening.
                    self._events.publish("workspace.closed", {"agent_id": agent_id})
                del self._workspaces[agent_id]
                self.waiting.pop(agent_id, None)
                self._opened.pop(agent_id, None)
                self._pulse()
            # Jobs before the record: killed between, it stays recorded, with its own jobs.
            if forget and self._jobs is not None:  # held for a reopen that never comes
                await self._jobs.forget(agent_id, f"workspace {agent_id!r} was closed "
                                        "with forget before the job could run")
            if known:
                await self._records.forget(agent_id)
        if closed:
            # What it held (its index state, the private copies of its mapped files and
            # their descriptors) lies in reference cycles among its services, which only
            # a full collection frees, and an idle daemon may not run one for hours.
            del ws
            await trio.to_thread.run_sync(memtrim.collect)
        return closed

    async def _close(self, ws: Workspace) -> None:
        """Close ``ws`` once its running jobs stopped (they would write to a folder no
        longer served): they wait, queued, until it opens again."""
        if self._jobs is not None:
            await self._jobs.hold(ws.agent_id, "its workspace closes")
        ws.request_close()
        await ws.wait_closed()

