"""Where a workspace may lie: the checks an open, a start, a reload and a restore make
of a workspace's folder (not a system folder, the user's own, not the daemon's own
folders, not another agent's, not overlapping another workspace unless both share).

Owns nothing and starts nothing; the checks that stat or resolve block (callers run
them in worker threads).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import unicodedata
from collections.abc import Callable, Mapping
from pathlib import Path

from recalld.daemon import safepath
from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.refusals import FolderGone
from recalld.daemon.spelling import on_disk
from recalld.daemon.workspaces import shares
from recalld.ipc.errors import InvalidParams
from recalld.ipc.qwenpaw_places import held_agents, holds_refused, home_refused

#: Folders that hold the system: a workspace is never at or below one of them.
SYSTEM_TREES = tuple(Path(p) for p in (
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sys",
    "/dev", "/boot", "/run", "/var/log", "/var/spool", "/var/cache", "/var/mail"))
#: The places in the system trees that are a user's to choose: the tmpfs any user may
#: write in (``/dev/shm/<folder>``). Below them a workspace is the user's; at them the
#: place is still the system's. The user's own runtime folder (``/run/user/<uid>``, made
#: by the login manager) is one too when it is there and the user's: :func:`_own_places`.
USER_TREES = (Path("/dev/shm"),)  # noqa: S108 - not written to
RUNTIME_FOLDERS = Path("/run/user")
#: Folders whose own contents are the system's: a workspace may lie below, not at them.
SYSTEM_FOLDERS = tuple(Path(p) for p in (
    "/", "/var", "/var/lib", "/home", "/tmp", "/opt", "/srv", "/mnt", "/media", "/root"))  # noqa: S108

def _own_places() -> tuple[Path, ...]:
    """:data:`USER_TREES`, and this user's runtime folder if it exists and is theirs
    (never another uid's, never one the daemon would make: a folder missing there is the
    login manager's to make, with its own mode)."""
    runtime = RUNTIME_FOLDERS / str(os.getuid())
    try:
        mine = runtime.lstat().st_uid == os.getuid() and runtime.is_dir()
    except OSError:
        mine = False
    return (*USER_TREES, runtime) if mine else USER_TREES


def in_system_tree(path: Path) -> bool:
    """Whether ``path`` (absolute, normalised) lies in a system tree, not below one of the
    user's places in it (:func:`_own_places`)."""
    if not any(path.is_relative_to(t) for t in SYSTEM_TREES):
        return False
    return not any(path.is_relative_to(own) and path != own for own in _own_places())


def resolved(root: Path) -> Path:
    """``root`` (absolute) with its symbolic links resolved (blocking).

    InvalidParams if ``root`` as given lies in a system tree: the links there lead where
    the daemon's own process is (``/proc/self/cwd``, ``/dev/fd/3``) or into another
    process's view of the files (``/proc/<pid>/root``), so what they resolve to is no
    folder the client named. InvalidParams too if the links loop or one cannot be read
    (``/proc/1/cwd`` of another user, a failing disk), as :func:`check_root` says of a
    path it cannot stat: ``resolve`` raises RuntimeError or OSError there, which would
    fail a start or a reload, not this one workspace. A name typed composed (NFC) or
    decomposed names the folder the disk spells in the other form, as a path in a
    workspace does (:func:`recalld.daemon.spelling.on_disk`), not a second one beside it;
    the names of folders not there yet are composed, so that two forms of one folder to
    make are one place (two opens at once would otherwise each make its own)."""
    given = Path(os.path.normpath(root))
    if in_system_tree(given):
        raise InvalidParams(f"{root} is a system folder; a workspace needs a folder of "
                            "its own")
    try:
        real = root.resolve()
        if not str(real).isascii():  # a folder the disk spells composed or decomposed
            spelled = Path("/", on_disk(Path("/"), str(real).lstrip("/")))
            if spelled != real:
                real = spelled.resolve()
            real = _composed_beyond_disk(real)
        return real
    except RuntimeError:
        raise InvalidParams(f"workspace {root} is not available: "
                            f"{os.strerror(errno.ELOOP)}") from None
    except OSError as exc:
        raise InvalidParams(f"workspace {root} is not available: "
                            f"{exc.strerror or type(exc).__name__}") from None


def _composed_beyond_disk(path: Path) -> Path:
    """``path`` (absolute) with the names past the last one on disk composed (NFC):
    the one spelling of a folder still to be made (blocking)."""
    there = path
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    if there == path:
        return path
    return there / unicodedata.normalize("NFC", str(path.relative_to(there)))


def check_root(root: Path) -> None:
    """InvalidParams unless ``root`` (absolute, resolved) may be a workspace: not a system
    folder, and a directory of the user who runs the daemon if it exists, named in UTF-8
    (blocking)."""
    if not safepath.is_utf8(str(root)):
        # Reached through a symlink: its path would go into workspaces.json, status and
        # backups, none of which can hold it.
        raise InvalidParams(f"workspace {safepath.shown(str(root))} has a path that is not "
                            "valid UTF-8; rename the folder")
    if root in SYSTEM_FOLDERS or in_system_tree(root):
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
    check_not_agents_folder(root)


def check_not_agents_folder(root: Path) -> None:
    """InvalidParams if ``root`` is QwenPaw's home or the folder of its agents'
    workspaces (``~/.qwenpaw/workspaces``: folders with an ``agent.json``), as
    ``recalld import-qwenpaw`` refuses them, saying how to import each agent instead
    (blocking). A folder served before (it has its ``memory`` folder) is left alone, and
    so is one holding recalld's workspaces only (shared ones may hold each other)."""
    if (root / "memory").is_dir() or (root / "agent.json").is_file():
        return
    why = home_refused(root)
    if why is None:
        held = held_agents(root)
        if any((p / "agent.json").is_file() for p in held):
            why = holds_refused(root, held)
    if why is not None:
        raise InvalidParams(why)


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
    raise FolderGone(
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
        inside = _lies_in(root, other_root)
        if not inside and not _lies_in(other_root, root):
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


def _lies_in(path: Path, folder: Path) -> bool:
    """``path.is_relative_to(folder)`` for absolute paths, by their parts (which a path
    keeps once split): ``relative_to`` builds a path and raises for each one that is not
    in it, and an open checks every known workspace this way."""
    parts = folder.parts
    return path.parts[:len(parts)] == parts


def check_tables_apart(agent_id: str, root: Path, earlier: Mapping[str, Path],
                       config: DaemonConfig) -> None:
    """InvalidParams if ``root``, the folder of the config file's ``[workspaces.<agent_id>]``
    (resolved), is the folder of a table checked before it (``earlier``: by agent, each
    resolved), or lies in or holds one of them without the two shared with each other
    (:func:`check_overlap`): a start refuses to open one of them (or both)."""
    for other, place in earlier.items():
        if place == root:
            raise InvalidParams(f"{root} is the folder of workspace {other!r} too; a "
                                "workspace needs a folder of its own")
    check_overlap(agent_id, root, config.workspace_settings(agent_id),
                  {other: (place, True) for other, place in earlier.items()},
                  config.workspace_settings)


def unnamed_places(config: DaemonConfig) -> dict[str, Path]:
    """By agent, the folder (resolved) of each workspace ``config`` opens without a
    ``path`` of its table (``<data>/workspaces/<agent>``, the default one's too): what
    :func:`check_tables_apart` checks the tables' folders against first."""
    places = {}
    for agent_id in config.configured_agents():
        if agent_id not in config.workspace_paths:
            with contextlib.suppress(InvalidParams):  # its own opening says why
                places[agent_id] = resolved(config.workspace_path(agent_id))
    return places
