"""A workspace: which agent ids and folders may be one, and one open workspace.

:func:`check_agent_id`, :func:`check_root` and :func:`check_daemon_folders` refuse an agent
id or a folder that cannot be a workspace. A :class:`Workspace` is hosted by the registry
(:mod:`recalld.daemon.registry`); it opens its own nursery and hands it to the registry's
:data:`WorkspaceStarter` (``recalld.daemon.services.start_workspace``), which builds the
workspace's typed service record and starts its services in order with ``nursery.start``,
so a workspace is ``ready`` only once all of them can serve.

While open, a workspace holds an exclusive ``flock`` on ``<metadata_dir>/recalld.lock``, so
a second daemon (another data directory) cannot serve the same directory at once.

Closing a workspace cancels its nursery and waits for the services to finish their
shielded cleanup.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import trio

from recalld.daemon import safepath
from recalld.daemon.config import WorkspaceSettings
from recalld.daemon.config_rules import AGENT_ID_RULE, valid_agent_id
from recalld.daemon.datadirs import remove_unfinished_below
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.lock import AlreadyServing, FileLock
from recalld.daemon.refusals import RefusedFor
from recalld.daemon.store import confine
from recalld.daemon.store.fsio import NOTE_DIR_MODE, PRIVATE_DIR_MODE
from recalld.daemon.writefailures import WriteFailures
from recalld.ipc.answers import WorkspaceInfo
from recalld.ipc.errors import (
    AlreadyRunning,
    DiskFull,
    InvalidParams,
    RecalldError,
    UnknownWorkspace,
)
from recalld.ipc.folders import make_dirs

if TYPE_CHECKING:
    from recalld.daemon.services import WorkspaceServices

log = logging.getLogger(__name__)

SHARED_WITH_EVERYONE = "*"
LOCK_NAME = "recalld.lock"  # under the workspace's metadata_dir, held while it is open

State = Literal["opening", "ready", "closing", "closed", "failed"]
#: The services that report under their own key of a workspace's status (the open
#: sections of :class:`recalld.ipc.answers.WorkspaceInfo`).
StatusName = Literal["index", "health", "vectors", "sessions", "capture", "inbox", "dream",
                     "resource", "chat", "remote"]


def check_agent_id(agent_id: object) -> str:
    """A valid agent id, or InvalidParams."""
    if not valid_agent_id(agent_id):
        raise InvalidParams(f"agent_id must be {AGENT_ID_RULE}")
    return agent_id


def shares(owner: str, settings: WorkspaceSettings, agent_id: str) -> bool:
    """Whether agent ``agent_id`` may search and read the workspace of ``owner`` that has
    ``settings``: its owner, or one they open it to (``shared_with``, ``memory_isolation
    = false``)."""
    return (agent_id == owner or not settings.memory_isolation
            or agent_id in settings.shared_with or SHARED_WITH_EVERYONE in settings.shared_with)


#: Builds a workspace's services and starts them in ``nursery`` (in order, each with
#: ``nursery.start``); returns once every one of them can serve.
WorkspaceStarter = Callable[["Workspace", trio.Nursery], Awaitable[None]]
#: A service's part of the workspace's status (a TypedDict, mostly).
StatusProvider = Callable[[], Mapping[str, object]]


#: What an OSError opening a workspace says about the path it was given (the caller
#: chose a path that cannot hold one: exit status 2); any other (a full disk, no
#: descriptors left, an I/O error) is a failure of the machine, not of the request.
PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR,
                         errno.EISDIR, errno.EEXIST, errno.ELOOP, errno.ENAMETOOLONG,
                         errno.EROFS})


def _open_error(what: str, exc: OSError) -> RecalldError:
    """The error for ``exc`` while opening a workspace, by what it says: DiskFull,
    InvalidParams (the path), else a failure."""
    message = f"{what}: {exc.strerror or exc}"
    data = {"errno": errno.errorcode.get(exc.errno or 0, "EIO")}  # which fix helps
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(message + " (free space, then open it again)", data)
    if exc.errno in PATH_ERRNOS:
        return InvalidParams(message, data)
    return RecalldError(message, data)


def _folders_error(root: Path, exc: OSError) -> RecalldError:
    """:func:`_open_error` for ``exc`` while making ``root``'s folders, naming the path it
    failed on, and what stands where a folder goes (a file, a link to nothing), which
    opening the workspace again cannot mend until it is moved away."""
    what = f"cannot create workspace directories under {root}"
    if not isinstance(exc.filename, str):
        return _open_error(what, exc)
    failed = Path(exc.filename)
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        for place in (*reversed(failed.parents), failed):
            try:
                if stat.S_ISDIR(os.stat(place).st_mode):
                    continue
            except FileNotFoundError:
                if not os.path.lexists(place):
                    break  # made by the next open (someone removed it meanwhile)
            except OSError:
                break
            return InvalidParams(f"{what}: {place} is in the way: it is not a folder, and "
                                 "one goes there; move it away, then open the workspace "
                                 "again")
    return _open_error(f"{what}: {failed}", exc)


class Workspace:
    """One open workspace: its root, settings, state and the services running for it."""

    def __init__(self, agent_id: str, root: Path, settings: WorkspaceSettings,
                 on_change: Callable[[], object] | None = None) -> None:
        self.agent_id = agent_id
        self.root = root
        self.settings = settings
        #: Called at each :meth:`changed` (the registry's own wake-up).
        self._on_change = on_change
        self._changed = trio.Event()
        self._state: State = "opening"
        self.opened_at = time.time()
        self.error: str | None = None
        #: The errno name its opening failed with, when the file system refused it.
        self.error_errno: str | None = None
        #: Never opened: its path or settings were refused (``error`` says why).
        self.refused = False
        self.refused_for: RefusedFor = "place"  # why (:mod:`recalld.daemon.refusals`)
        #: Its search stage started while it still opens (``services.SEARCH_STAGE``):
        #: searches may be answered before it is ``ready``.
        self.search_ready = False
        #: Its services all started (:meth:`run` reported it started): a failure from now
        #: on is the running workspace's, not its opening's.
        self.served = False
        self._services: WorkspaceServices | None = None
        #: Its note writes failing now, by cause (its health says so until one succeeds).
        self.writes = WriteFailures()
        self._status: dict[StatusName, StatusProvider] = {}
        self._cancel_scope: trio.CancelScope | None = None
        self._finished = trio.Event()
        self._stopped = trio.Event()  # :meth:`stop`
        self._root_id: tuple[int, int] | None = None  # (st_dev, st_ino) of its folder
        self._meta_id: tuple[int, int] | None = None  # ... and of its metadata_dir
        # Its metadata_dir (fixed while open: it holds the lock), as looked at on every use.
        self._meta_path = os.fspath(root / settings.metadata_dir)

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        self.changed()

    def changed(self) -> None:
        """The workspace moved on: its state changed, or one of its services started.
        Wakes :meth:`wait_changed`."""
        self._changed.set()
        self._changed = trio.Event()
        if self._on_change is not None:
            self._on_change()

    async def wait_changed(self) -> None:
        """Until the workspace next moves on (:meth:`changed`)."""
        await self._changed.wait()

    def shares_with(self, agent_id: str) -> bool:
        """Whether agent ``agent_id`` may search and read this workspace (:func:`shares`)."""
        return shares(self.agent_id, self.settings, agent_id)

    # -- services -------------------------------------------------------------------
    @property
    def services(self) -> WorkspaceServices:
        """This workspace's services (UnknownWorkspace before they are built)."""
        if self._services is None:
            raise UnknownWorkspace(f"workspace {self.agent_id!r} has no services yet "
                                   f"({self.state})")
        return self._services

    def provide(self, services: WorkspaceServices) -> None:
        """Install the service record built for this workspace (once, before starting)."""
        if self._services is not None:
            raise RuntimeError(f"workspace {self.agent_id!r} already has its services")
        self._services = services

    def add_status(self, name: StatusName, provider: StatusProvider) -> None:
        """``provider()`` is merged into :meth:`status` under key ``name``."""
        self._status[name] = provider

    # -- paths ----------------------------------------------------------------------
    def directories(self) -> list[Path]:
        s = self.settings
        return [
            self.root / s.daily_dir,
            self.root / s.digest_dir,
            self.root / s.session_dir,
            self.root / s.resource_dir,
            self.root / s.metadata_dir,
        ]

    def _create_directories(self, made: list[Path], *, locked: bool) -> None:
        """Before the lock is held: the workspace folder and its metadata folder, where
        the lock goes; once it is (``locked``), the others. Each folder made is added to
        ``made`` (:meth:`_unmake` removes them if the open fails)."""
        # Made as an editor makes a folder (0755 less the umask); the metadata folder, of
        # recalld's own files, private. Not by the umask alone: under 000 others could
        # move a folder of derived state away and put a forged one in its place.
        meta = self.root / self.settings.metadata_dir
        try:
            if locked:
                for d in self.directories():
                    if d != meta:
                        make_dirs(d, NOTE_DIR_MODE, made)
                return
            make_dirs(self.root, NOTE_DIR_MODE, made)
            make_dirs(meta, PRIVATE_DIR_MODE, made)
            st = os.stat(self.root)
            self._root_id = (st.st_dev, st.st_ino)
            st = os.lstat(self._meta_path)
            self._meta_id = (st.st_dev, st.st_ino)
        except OSError as exc:
            raise _folders_error(self.root, exc) from None

    def _unmake(self, made: list[Path], lock: FileLock) -> None:
        """Remove the folders an open that failed made (``made``), last made first, and
        the lock file in a metadata folder it made: it leaves the workspace as it found
        it. Called with the lock still held, so that no other daemon takes the file
        meanwhile; folders something was put in since are left."""
        if lock.held and lock.path.parent in made:
            with contextlib.suppress(OSError):
                os.unlink(lock.path)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    # -- lifecycle ------------------------------------------------------------------
    def describe(self) -> WorkspaceInfo:
        """The workspace, with every service's status by name (``workspace.list``)."""
        info: WorkspaceInfo = {
            "agent_id": self.agent_id,
            "path": str(self.root),
            "state": self.state,
            "opened_at": self.opened_at,
        }
        if self.error is not None:
            info["error"] = self.error
        if self.error_errno is not None and self.state == "failed":
            info["error_errno"] = self.error_errno
        if self.refused:
            info["refused"] = True
            info["refused_for"] = self.refused_for
        for name, status in self.status().items():
            info[name] = status
        return info

    def status(self) -> dict[StatusName, JsonObject]:
        out: dict[StatusName, JsonObject] = {}
        for name, provider in self._status.items():
            try:
                out[name] = dict(provider())
            except Exception:  # a broken status provider must not break daemon.status
                log.exception("status of %s/%s failed", self.agent_id, name)
                out[name] = {"error": "status unavailable"}
        return out

    async def run(
        self,
        start: WorkspaceStarter,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Create the directories, lock the workspace, start its services with ``start``,
        serve until cancelled."""
        # One daemon per workspace directory: a second one (another data dir, or the same
        # path opened under two agent ids) would write the same derived state.
        lock = FileLock(self.root / self.settings.metadata_dir / LOCK_NAME,
                        f"workspace {self.root}")
        # Its services write by path; from here on, through handles (:mod:`confine`).
        confine.guard(self.root)
        made: list[Path] = []  # the folders this open made, while it may still fail
        try:
            try:
                await trio.to_thread.run_sync(partial(self._create_directories, made,
                                                      locked=False))
                await self._lock(lock)
                # The folders of notes only once it is ours: a second daemon refused
                # makes none, and a folder in the way leaves none behind.
                await trio.to_thread.run_sync(partial(self._create_directories, made,
                                                      locked=True))
            except BaseException as exc:
                data = exc.data if isinstance(exc, RecalldError) else None
                self.error_errno = data.get("errno") if isinstance(data, dict) else None
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self._unmake, made, lock)
                raise
            # Run with the lock held, before any service writes; those of the watched
            # folders go with the scans.
            await trio.to_thread.run_sync(remove_unfinished_below, self.agent_id, (
                self.root / self.settings.metadata_dir, self.root / self.settings.session_dir))
            with trio.CancelScope() as scope:
                self._cancel_scope = scope
                async with trio.open_nursery() as nursery:
                    await start(self, nursery)
                    if not self._stopped.is_set():  # stopped while it opened: failed
                        self.state = "ready"
                    log.info("workspace %s: every service started", self.agent_id)
                    self.served = True
                    task_status.started()
                    # Its services read and write by path: once a link took its folder's
                    # place (:meth:`root_leads`) they would serve and change another
                    # folder's files, another agent's memory among them; so they would
                    # once a reload stopped sharing it with a workspace it holds or lies in.
                    await self._stopped.wait()
                    nursery.cancel_scope.cancel()
            if self._stopped.is_set():
                raise RecalldError(self.error or "the workspace stopped")
        finally:
            lock.release()
            confine.release(self.root)
            if self.state != "failed":
                self.state = "closed"
            self._finished.set()

    async def _lock(self, lock: FileLock) -> None:
        """Take the workspace's lock: AlreadyRunning if another daemon holds it."""
        try:
            await trio.to_thread.run_sync(lock.acquire)
        except AlreadyServing as exc:
            raise AlreadyRunning(f"{exc}; one recalld serves a workspace at a time"
                                 ) from None
        except OSError as exc:
            what = f"cannot lock workspace {self.root}"
            if str(lock.path) not in (exc.strerror or ""):
                # Which file: "Is a directory; remove it" alone named the workspace.
                what += f": {lock.path}"
            raise _open_error(what, exc) from None

    def leads_elsewhere(self) -> tuple[Path, str] | None:
        """The folder and where it now leads, when a link took the place of the
        workspace folder (or of a folder on its path) or of its ``metadata_dir`` (where
        its services keep their state) since it opened; None while each is where it was,
        or gone. Two ``stat`` calls while both are the ones it opened (a use of the
        workspace asks)."""
        try:
            st = os.stat(self.root)
        except OSError:
            return None  # missing (moved away, a disk not mounted), not elsewhere
        if (st.st_dev, st.st_ino) != self._root_id:
            elsewhere = safepath.leads_elsewhere(self.root)
            if elsewhere is not None:
                return self.root, elsewhere
        try:
            st = os.lstat(self._meta_path)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) == self._meta_id:
            return None
        elsewhere = safepath.leads_elsewhere(self._meta_path)
        return None if elsewhere is None else (Path(self._meta_path), elsewhere)

    def root_leads(self, folder: Path, elsewhere: str) -> None:
        """The workspace folder (or its ``metadata_dir``), ``folder``, now leads to
        ``elsewhere``: the workspace stops, with ``error`` saying so at once."""
        self.stop(f"its folder {folder} now leads to {elsewhere}: a link took its "
                  "place (or that of a folder on its path), and the workspace stopped "
                  "rather than read or write that folder's files; put its folder back "
                  "and open it again")

    def stop(self, error: str) -> None:
        """The workspace stops serving, ``failed`` with ``error`` at once; its services
        end and its task reports the failure (the registry holds its jobs)."""
        self.state = "failed"
        self.error = error
        self._stopped.set()

    def refuse(self, error: str, cause: RefusedFor = "place") -> None:
        """Mark a workspace that never started as refused (``failed`` with ``error``):
        nothing runs in it, so closing it has nothing to wait for."""
        self.state = "failed"
        self.error = error
        self.refused = True
        self.refused_for = cause
        self._finished.set()

    def request_close(self) -> None:
        self.state = "closing"
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    async def wait_closed(self) -> None:
        await self._finished.wait()


def describe_failure(exc: BaseException) -> str:
    """Why a workspace failed, in a line (each error of a group, ``; ``-separated)."""
    if isinstance(exc, RecalldError):
        return exc.message
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_failure(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


#: How long a job resumed at the daemon's start waits for its workspace to open.
RESUMED_JOB_WAIT_S = 30.0


async def workspace_of_job(get_workspace: Callable[[str], Workspace], agent_id: str,
                           wait_changed: Callable[[], Awaitable[object]],
                           timeout_s: float = RESUMED_JOB_WAIT_S) -> Workspace:
    """The workspace, waiting a little for it: a job resumed at daemon start may run
    before its workspace has finished opening. Asked again each time the workspaces
    change (``wait_changed``: :meth:`WorkspaceRegistry.wait_changed`), for ``timeout_s``
    at most; then UnknownWorkspace says why it is not there."""
    with trio.move_on_after(timeout_s):
        while True:
            try:
                return get_workspace(agent_id)
            except UnknownWorkspace:
                await wait_changed()
    return get_workspace(agent_id)  # raises UnknownWorkspace with the reason

