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

import errno
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import trio

from recalld.daemon import safepath
from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.config_rules import AGENT_ID_RULE, valid_agent_id
from recalld.daemon.datadirs import remove_unfinished_below
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.lock import AlreadyServing, FileLock
from recalld.daemon.store import confine
from recalld.ipc.answers import WorkspaceInfo
from recalld.ipc.errors import (
    AlreadyRunning,
    DiskFull,
    InvalidParams,
    RecalldError,
    UnknownWorkspace,
)

if TYPE_CHECKING:
    from recalld.daemon.services import WorkspaceServices

log = logging.getLogger(__name__)

SHARED_WITH_EVERYONE = "*"
#: Folders that hold the system: a workspace is never at or below one of them.
SYSTEM_TREES = tuple(Path(p) for p in (
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sys",
    "/dev", "/boot", "/run", "/var/log", "/var/spool", "/var/cache", "/var/mail"))
#: Folders whose own contents are the system's: a workspace may lie below, not at them.
SYSTEM_FOLDERS = tuple(Path(p) for p in (
    "/", "/var", "/var/lib", "/home", "/tmp", "/opt", "/srv", "/mnt", "/media", "/root"))  # noqa: S108
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


def resolved(root: Path) -> Path:
    """``root`` with its symbolic links resolved (blocking). InvalidParams if they loop,
    as :func:`check_root` says of a path it cannot stat: Python 3.11's ``resolve`` raises
    RuntimeError there, which would fail a start or a reload, not this one workspace."""
    try:
        return root.resolve()
    except RuntimeError:
        raise InvalidParams(f"workspace {root} is not available: "
                            f"{os.strerror(errno.ELOOP)}") from None


def check_root(root: Path) -> None:
    """InvalidParams unless ``root`` (absolute, resolved) may be a workspace: not a system
    folder, and a directory of the user who runs the daemon if it exists, named in UTF-8
    (blocking)."""
    if not safepath.is_utf8(str(root)):
        # Reached through a symlink: its path would go into workspaces.json, status and
        # backups, none of which can hold it.
        raise InvalidParams(f"workspace {safepath.shown(str(root))} has a path that is not "
                            "valid UTF-8; rename the folder")
    if root in SYSTEM_FOLDERS or any(root.is_relative_to(t) for t in SYSTEM_TREES):
        raise InvalidParams(f"{root} is a system folder; a workspace needs a folder of "
                            "its own")
    try:
        st = os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return  # to be created by the daemon (if it can): its own
    except OSError as exc:
        raise InvalidParams(f"workspace {root} is not available: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidParams(f"workspace {root} is not a directory")
    if st.st_uid != os.getuid():
        raise InvalidParams(f"workspace {root} belongs to uid {st.st_uid}, not to the "
                            "user recalld runs as")


def check_still_there(root: Path) -> None:
    """InvalidParams if the folder of a workspace served before is missing or empty
    (blocking): on a disk not mounted, or moved away. Made again empty, it would take the
    notes written meanwhile where the disk, once mounted, hides them, and the folder moved
    back would land inside it. What else is wrong with it :func:`check_root` tells."""
    try:
        with os.scandir(root) as entries:
            if next(entries, None) is not None:
                return
        what = "is empty"
    except FileNotFoundError:
        what = "is missing"
    except OSError:
        return
    raise InvalidParams(
        f"its folder {root} {what} (on a disk not mounted? moved?), so it was not opened "
        "as an empty workspace: put the folder back and open the workspace again (opened "
        "while the folder is still missing, it starts afresh, empty), or close it with "
        "forget")


def check_daemon_folders(root: Path, config: DaemonConfig) -> None:
    """InvalidParams if ``root`` (absolute, resolved) is, lies in or holds one of the
    daemon's own folders, whose files its readers would then serve to the agent: the
    state folder (every workspace's record, model keys handed over included, and every
    agent's jobs) and the backups (every agent's memory); or holds the configuration
    file or the socket (blocking: resolves the folders)."""
    for folder in (config.state_dir, config.data_dir / "backups"):
        folder = folder.resolve()
        if root.is_relative_to(folder) or folder.is_relative_to(root):
            where = "lies inside" if root.is_relative_to(folder) else "holds"
            raise InvalidParams(f"{root} {where} recalld's own folder {folder}; a "
                                "workspace needs a folder of its own")
    # The socket and its lock, among the notes, would be replaced by a restore of them.
    for own, what in ((config.config_path, "configuration file"), (config.socket_path, "socket")):
        if (own := own.resolve()).is_relative_to(root):
            raise InvalidParams(f"{root} holds recalld's {what} {own}; a workspace needs a "
                                "folder of its own")


def check_not_anothers(agent_id: str, given: Path, root: Path,
                       places: Mapping[str, Path]) -> None:
    """InvalidParams when ``given`` leads through a link to ``root``, the very folder
    another agent's workspace is configured or recorded at (``places``: each other agent's
    folder): that folder is the other agent's, whichever of the two opens first (at a
    start they open together)."""
    for other, place in places.items():
        if other != agent_id and place == root:
            how, fix = (("through ..", "open it at a path of its own")
                        if ".." in given.parts else  # named so, not led by a link
                        ("through a link", "put its own folder back in place of the "
                         "link, or open it at another path"))
            raise InvalidParams(f"the folder of workspace {agent_id!r}, {given}, leads "
                                f"{how} to {root}, the folder of workspace {other!r}: "
                                f"{fix}")


#: Another workspace as :func:`check_overlap` sees it: its folder and whether it is open.
Place = tuple[Path, bool]


def check_overlap(agent_id: str, root: Path, settings: WorkspaceSettings,
                  others: Mapping[str, Place],
                  settings_of: Callable[[str], WorkspaceSettings | None]) -> None:
    """InvalidParams if ``root`` (absolute, resolved), the folder of ``agent_id``'s
    workspace with ``settings``, is, lies in or holds one of ``others`` (by agent; the
    settings of one that does come from ``settings_of``, None if unknown). One
    workspace may hold another only if each is shared with the other's agent: the outer
    one's owner reads every file of the inner one as its own (its pending turns and
    conversations too), the inner one the outer one's files below it. Whichever of the
    two opens first (at a start both are only recorded), the answer is the same."""
    for other_id, (other_root, is_open) in others.items():
        if other_id == agent_id:
            continue
        if other_root == root:
            if is_open:
                raise InvalidParams(f"{root} is already open for agent {other_id!r}")
            raise InvalidParams(f"{root} is the recorded workspace of agent "
                                f"{other_id!r} (closing it with forget frees it)")
        inside = root.is_relative_to(other_root)
        if not inside and not other_root.is_relative_to(root):
            continue
        other_settings = settings_of(other_id)
        if (other_settings is not None and shares(other_id, other_settings, agent_id)
                and shares(agent_id, settings, other_id)):
            continue
        raise InvalidParams(
            f"{root} lies {'inside' if inside else 'around'} the workspace of agent "
            f"{other_id!r} ({other_root}); one workspace may hold another only if each is "
            f"shared with the other's agent ({agent_id!r} in the shared_with of "
            f"{other_id!r}, and {other_id!r} in its own); choose a folder of its own")


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
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(message + " (free space, then open it again)")
    if exc.errno in PATH_ERRNOS:
        return InvalidParams(message)
    return RecalldError(message)


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
        #: Never opened: its path or settings were refused (``error`` says why).
        self.refused = False
        #: Its search stage started while it still opens (``services.SEARCH_STAGE``):
        #: searches may be answered before it is ``ready``.
        self.search_ready = False
        #: Its services all started (:meth:`run` reported it started): a failure from now
        #: on is the running workspace's, not its opening's.
        self.served = False
        self._services: WorkspaceServices | None = None
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

    def _create_directories(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for d in self.directories():
                d.mkdir(parents=True, exist_ok=True)
            st = os.stat(self.root)
            self._root_id = (st.st_dev, st.st_ino)
            st = os.lstat(self._meta_path)
            self._meta_id = (st.st_dev, st.st_ino)
        except OSError as exc:
            raise _open_error(f"cannot create workspace directories under {self.root}",
                              exc) from None

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
        if self.refused:
            info["refused"] = True
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
        try:
            await trio.to_thread.run_sync(self._create_directories)
            try:
                await trio.to_thread.run_sync(lock.acquire)
            except AlreadyServing as exc:
                raise AlreadyRunning(f"{exc}; one recalld serves a workspace at a time"
                                     ) from None
            except OSError as exc:
                raise _open_error(f"cannot lock workspace {self.root}", exc) from None
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

    def refuse(self, error: str) -> None:
        """Mark a workspace that never started as refused (``failed`` with ``error``):
        nothing runs in it, so closing it has nothing to wait for."""
        self.state = "failed"
        self.error = error
        self.refused = True
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

