"""The data directories and their lock: made private, owned by one daemon, tidied.

:func:`owning_data_dir` is what the supervisor holds for the daemon's lifetime: the data
and state directories created private (an existing one is never chmod-ed), the
data-directory lock taken (a second daemon exits at once), the temp files a killed
daemon left behind removed, and the state files an older recalld left readable made
private.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from recalld.daemon.config import DaemonConfig
from recalld.daemon.lock import PLACE_ERRNOS, FileLock, data_dir_lock
from recalld.daemon.safepath import why_failed
from recalld.daemon.store import confine
from recalld.daemon.store.errors import StorageError, translate_os_error
from recalld.daemon.store.fsio import (
    PRIVATE_MODE,
    REAL,
    mkdir_private,
    remove_temp_files,
    temp_prefix,
)
from recalld.daemon.store.leftovers import file_times_now, remove_left_over
from recalld.daemon.store.tempnames import remove_dead_temps

log = logging.getLogger(__name__)

class NotPrivate(Exception):
    """A directory recalld keeps its data in is someone else's or open to other users."""


def make_private_dir(path: Path, *, shared_ok: bool = False) -> bool:
    """Create ``path`` (and parents) with the leaf at mode 0700, or accept an existing
    directory of ours; returns whether it is private.

    An existing directory is never chmod-ed: ``data_dir`` may name any folder (``$HOME``),
    and tightening it would change what the user or other programs rely on. One that
    someone else owns is refused (NotPrivate); one other users may enter is refused too,
    unless ``shared_ok`` (the caller then keeps its files in private subfolders).
    """
    if mkdir_private(path):
        return True
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotPrivate(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise NotPrivate(f"{path} belongs to uid {st.st_uid}, not to the user recalld runs "
                         "as; choose a data_dir of your own")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 and not shared_ok:
        raise NotPrivate(
            f"{path} is open to other users (mode {mode:o}): they could read what recalld "
            f"keeps there. recalld does not change the mode of a folder it did not create: "
            f"make it private yourself (chmod 700 {path}) or remove it so that recalld "
            "creates it (mode 700)")
    return not mode & 0o077


def prepare_data_dirs(cfg: DaemonConfig) -> None:
    """The data and state directories, private, and recalld's own folders in the data
    directory (``workspaces/``, ``backups/``) created private too. A data directory other
    users may enter (``data_dir = "~"``) keeps its mode: the state folder must then be
    private, and a WARNING names those of the others that are not."""
    shared = not make_private_dir(cfg.data_dir, shared_ok=True)
    make_private_dir(cfg.state_dir)
    opened = [d for d in (cfg.data_dir / "workspaces", cfg.data_dir / "backups")
              if not make_private_dir(d, shared_ok=True)]
    if not shared:
        return
    log.warning("the data directory %s is open to other users; its mode is left alone and "
                "recalld keeps its files in private folders in it%s", cfg.data_dir,
                "" if not opened else "; these are open to other users too, make them "
                "private (chmod 700): " + ", ".join(map(str, opened)))


class DataDirUnusable(Exception):
    """The data directory or its state folder cannot be created, or its lock file opened:
    exit status 2 when only the person can mend it (``permanent``: a parent that is a
    file, no permission, a read-only disk), else 1 (a full disk, an I/O error)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.permanent = errno in PLACE_ERRNOS


@contextlib.contextmanager
def owning_data_dir(cfg: DaemonConfig) -> Iterator[FileLock]:
    """The data directories prepared (:func:`prepare_data_dirs`) and this process their
    one writer (``state/daemon.lock``, which it yields) for the block; AlreadyServing when
    another daemon is, DataDirUnusable when the file system refuses either."""
    lock = data_dir_lock(cfg.state_dir, cfg.data_dir)
    try:
        prepare_data_dirs(cfg)
        lock.acquire()
    except OSError as exc:
        raise DataDirUnusable(why_failed(exc), exc.errno) from None
    try:
        remove_unfinished(cfg)
        make_state_files_private(cfg.state_dir)
        yield lock
    finally:
        lock.release()


def remove_unfinished(cfg: DaemonConfig) -> None:
    """Remove what a daemon killed while it wrote them left behind under temp names: a
    backup's unfinished archive (as large as the memory), a state file's (only the lock's
    owner writes there), the config file's that a restore writes (dated: another daemon
    may read the same config file). In ``backups/`` only those no writer holds
    (:func:`tempnames.remove_dead_temps`): another daemon may be writing an archive
    there, to the place a client named."""
    config = cfg.config_path
    removed = remove_left_over(config.parent, file_times_now(), prefix=temp_prefix(config.name))
    if removed:
        log.info("removed %d unfinished file(s) in %s: %s", len(removed), config.parent,
                 ", ".join(removed))
    for folder in (cfg.state_dir, cfg.data_dir / "backups"):
        try:
            removed = (remove_temp_files(REAL, folder) if folder == cfg.state_dir
                       else remove_dead_temps(folder, "."))
        except StorageError as exc:  # only tidying: the daemon starts all the same
            log.warning("could not tidy %s: %s", folder, exc.message)
            continue
        if removed:
            log.info("removed %d unfinished file(s) in %s: %s", len(removed), folder,
                     ", ".join(removed))


def make_state_files_private(state_dir: Path) -> None:
    """Make every file below the state folder the owner's only (``PRIVATE_MODE``): an
    older recalld left some readable by others (``workspaces.json`` holds model keys),
    and a file read at each start but written only on a change would stay so for good.
    Links are not followed, and only regular files of ours are changed; a file that
    cannot be changed is named in a WARNING (the daemon starts all the same)."""
    made, failed = [], []
    for folder, _, names in os.walk(state_dir):
        for name in names:
            path = Path(folder) / name
            try:
                if _make_private(path):
                    made.append(str(path.relative_to(state_dir)))
            except OSError as exc:
                failed.append(f"{path}: {exc.strerror}")
    if made:
        log.info("made %d state file(s) in %s private (mode %o), left open to others by "
                 "an earlier recalld: %s", len(made), state_dir, PRIVATE_MODE,
                 ", ".join(made))
    if failed:
        log.warning("could not make these state files private: %s", "; ".join(failed))


def _make_private(path: Path) -> bool:
    """Whether ``path``, a regular file of ours others may read or write, was made
    private (a link, a FIFO, a device or another user's file is left alone)."""
    def loose(st: os.stat_result) -> bool:
        return (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
                and bool(st.st_mode & 0o077))

    try:
        if not loose(os.lstat(path)):  # only a file to change is opened (not a device)
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT):  # swapped for a link, or gone
            return False
        raise
    try:
        st = os.fstat(fd)  # the file opened, not whatever took its name meanwhile
        if not loose(st):
            return False
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & PRIVATE_MODE)
        return True
    finally:
        os.close(fd)


def remove_unfinished_below(label: str, folders: tuple[Path, ...]) -> None:
    """Remove the temp files of writes a kill cut short (a change log's, a catalog's, a
    dialog log's) anywhere below ``folders`` (a workspace's metadata and session folders,
    which the watcher's scans pass by), those last changed before now only; ``label``
    names the workspace in the log (blocking). A link in place of one of ``folders``
    raises LinkOnTheWay: the workspace is not served through it."""
    before = file_times_now()
    for folder in folders:
        try:
            removed = remove_left_over(folder, before)
        except confine.WritesElsewhere as exc:  # nothing removed there, nor anywhere else
            raise translate_os_error(exc, folder) from None
        if removed:
            log.info("workspace %s: removed %d unfinished file(s) in %s: %s",
                     label, len(removed), folder, ", ".join(removed))
