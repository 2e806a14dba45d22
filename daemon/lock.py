"""One writer per data directory: an exclusive ``flock`` held for the daemon's lifetime.

The lock file (``<data>/state/daemon.lock``) records the owner's pid so a second daemon
can say who is in the way, and, once it listens, its socket (:func:`socket_note`).
``flock`` locks die with the process, so a killed daemon never leaves a stale lock
behind; what the file says is informative only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from types import TracebackType

from recalld.daemon.store import confine


class AlreadyServing(Exception):
    """Another daemon owns the data directory or the socket (exit status 3)."""


#: What the file system answers about a place (the data directory, the socket's folder,
#: their lock files) that only the person can mend: a file where a folder goes, a
#: folder or a FIFO where a lock file goes, no permission, a read-only file system, a
#: link loop, a name too long. A start refused for one of them exits 2 (systemd's
#: RestartPreventExitStatus does not retry it); others (a full disk, EIO, too many
#: open files) exit 1, and a restart may succeed.
PLACE_ERRNOS = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                          errno.EROFS, errno.ELOOP, errno.ENAMETOOLONG, errno.EEXIST,
                          errno.EINVAL})


#: What the socket's lock file says after its pid once the daemon listens (a client that
#: finds the lock held without it knows the daemon is still starting).
LISTENING = "listening"

#: What starts the line of the data directory's lock file that names the socket its
#: daemon serves on (``socket="<path>"``, the path as a JSON string): clients that cannot
#: read the config file naming that socket look for the daemon there
#: (recalld.ipc.paths, which reads it).
SOCKET_NOTE = "socket="


def socket_note(path: Path) -> str:
    """The line :data:`SOCKET_NOTE` starts, for the socket at ``path`` (ASCII, one line)."""
    return SOCKET_NOTE + json.dumps(os.fsdecode(path))


def read_owner_pid(path: Path) -> int | None:
    """The pid written into a lock file, if it holds one (a FIFO or device in its place
    holds none, and is not waited on; nor is a link followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _owner_pid(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def _owner_pid(fd: int) -> int | None:
    """The pid at the start of the open lock file ``fd``."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii", errors="replace")
    except OSError:
        return None
    first = text.split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else None


class FileLock:
    """A non-blocking exclusive ``flock`` on ``path``; :meth:`acquire` raises AlreadyServing.

    ``what`` names the protected resource in the error message.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        try:  # never through a link: the pid would truncate whatever file it names
            with confine.at(self.path) as (folder, name):
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
                             | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        except confine.WritesElsewhere:  # a link on the way: it says where
            raise
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise OSError(errno.ELOOP, f"{self.path} is a symbolic link; remove it",
                          str(self.path)) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device in its place
                raise OSError(errno.EINVAL, "not a regular file; remove it", str(self.path))
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # From the file it locked, not by its name: whatever took the name since
            # (a link elsewhere, a FIFO) is neither read nor waited on.
            pid = _owner_pid(fd)
            os.close(fd)
            owner = f" (pid {pid})" if pid is not None else ""
            raise AlreadyServing(f"recalld is already running for {self.what}{owner}") from None
        except BaseException:
            os.close(fd)
            raise
        # Record our pid only once we own the lock, so the file never names a loser. The
        # pid only informs: on a full disk (the file is emptied at every release, so its
        # pid needs a new block) the lock is held without it, rather than refused with the
        # descriptor, and so the lock, left open.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def note(self, word: str) -> None:
        """Add ``word`` as a line after the pid (informative, like the pid)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.pwrite(self._fd, f"{word}\n".encode("ascii"), os.fstat(self._fd).st_size)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def data_dir_lock(state_dir: Path, data_dir: Path) -> FileLock:
    """The lock that makes this process the only writer of ``data_dir``."""
    return FileLock(state_dir / "daemon.lock", str(data_dir))
