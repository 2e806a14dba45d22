"""Creating the listening Unix socket safely (RELIABILITY 13-14).

- The socket's directory is created 0700; an existing one must already be a private
  (0700-like) directory of ours and is never chmod-ed: one that others can enter, that
  someone else owns, or a symlink is refused.
- The socket is bound under a temporary name inside that private directory, set to 0600,
  and only then renamed to its public name: the public path never exists with any other
  mode, so there is no chmod window. (Binding under ``umask(0o177)`` would do the same,
  but the umask is process-wide and threads started earlier could create files while it
  is lowered.)
- ``<socket>.lock`` (flock) makes the check-and-replace of a stale socket race-free
  between two starting daemons, and marks which daemon owns the path.
- A socket file left by a killed daemon (connect refused) is unlinked and replaced; one
  that answers is some other live listener's, which :class:`AlreadyServing` names by
  pid (a socket unit's is systemd's).
- On close, the socket file is removed only if it is still the one we bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from recalld.daemon.lock import LISTENING, PLACE_ERRNOS, AlreadyServing, FileLock
from recalld.daemon.safepath import why_not_made
from recalld.daemon.store.fsio import mkdir_private
from recalld.ipc.peers import peer_named

log = logging.getLogger(__name__)

BACKLOG = socket.SOMAXCONN
AF_UNIX_PATH_MAX = 107


class SocketSetupError(Exception):
    """The socket cannot be created (the file system refused its lock or its bind);
    ``permanent`` when only the person can mend it (``lock.PLACE_ERRNOS``)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.permanent = errno in PLACE_ERRNOS


class SocketPlaceRefused(SocketSetupError):
    """The configured socket path names a place recalld refuses to serve from (a
    directory open to other users or someone else's, a symlink, a path too long, a
    foreign file in the way): a configuration error, which a restart cannot mend."""


def prepare_socket_dir(directory: Path) -> None:
    """Create ``directory`` with mode 0700, or accept an existing one only if it is a
    private directory of ours; raise SocketPlaceRefused otherwise.

    An existing directory is never chmod-ed: the socket path may name any folder (the
    current one, ``$HOME``, ``/tmp``), and tightening it would change what the user or
    other programs rely on.
    """
    try:
        mkdir_private(directory)
        st = os.lstat(directory)
    except OSError as exc:  # a file on its way, a folder we may not write in
        raise SocketSetupError(f"cannot create {directory}: {why_not_made(directory, exc)}",
                               exc.errno) from None
    if stat.S_ISLNK(st.st_mode):
        raise SocketPlaceRefused(
            f"{directory} is a symbolic link: recalld does not follow one to the socket's "
            f"directory (another user could point it elsewhere); use the real path "
            f"({os.path.realpath(directory)}) in the socket path")
    if not stat.S_ISDIR(st.st_mode):
        raise SocketPlaceRefused(f"{directory} is not a directory")
    if st.st_uid != os.getuid():
        raise SocketPlaceRefused(f"{directory} belongs to uid {st.st_uid}, not to us")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise SocketPlaceRefused(
            f"{directory} is not private (mode {mode:o}): other users could reach the "
            "socket; choose a socket path in a directory only you can use (mode 700), "
            "or one recalld may create")


def remove_if_stale(path: Path) -> None:
    """Unlink a socket file nobody listens on; AlreadyServing if somebody does."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SocketPlaceRefused(
            f"{path} is a symbolic link: recalld makes its socket at the socket path "
            "itself, never through a link; not touching it")
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPlaceRefused(f"{path} exists and is not a socket; not touching it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        log.info("removing stale socket %s", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except FileNotFoundError:
        return
    except BlockingIOError:
        who = ""  # backlog full: very much alive
    else:
        who = peer_named(probe)
    finally:
        probe.close()
    # The socket's lock is ours, so no recalld that bound this path holds it: a socket
    # unit's (systemd listens there until it stops), another program's, or a recalld
    # started with the socket passed to it.
    raise AlreadyServing(
        f"something else already listens on {path}" + (f": {who}" if who else "")
        + "; stop it (a socket unit: systemctl --user stop recalld.socket), or serve on "
        "another socket (--socket)")


def socket_answers(path: Path) -> bool:
    """Whether a daemon listens on the socket file ``path`` (one whose backlog is full
    does)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except BlockingIOError:
        return True
    except OSError:  # no file, nobody listening, not a socket, not ours to reach
        return False
    finally:
        probe.close()
    return True


@dataclass
class BoundSocket:
    """A listening socket we bound, with the lock that guards its path."""

    sock: socket.socket
    path: Path
    lock: FileLock
    inode: tuple[int, int]

    def close(self) -> None:
        """Close the socket, unlink its file if it is still ours, release the lock."""
        self.sock.close()
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self.inode:
                os.unlink(self.path)
        except OSError:
            pass
        self.lock.release()


def _staging(path: Path) -> Path:
    """The name beside ``path`` bound before the rename: ``.NAME.PID``, cut to the bytes
    a socket path may have, so any path that fits can be served (the lock, held
    meanwhile, keeps the name to one daemon)."""
    room = AF_UNIX_PATH_MAX - len(os.fsencode(path.parent)) - 1
    name = os.fsdecode(os.fsencode(f".{path.name}.{os.getpid()}")[:room])
    return path.with_name(name if name not in (path.name, ".", "..") else "~" + name[1:])


#: Socket locks taken by :func:`claim_socket` for the :func:`bind_listener` to come.
_claimed: dict[Path, FileLock] = {}


def claim_socket(path: Path) -> None:
    """Take the lock of the socket ``path`` now, for :func:`bind_listener` later in this
    process: a daemon still starting (importing its modules) already holds it, so a
    client that finds no socket yet says the daemon is starting, and a second daemon on
    the socket exits at once (AlreadyServing). SocketSetupError as bind_listener."""
    if path not in _claimed:
        _claimed[path] = _take_lock(path)


def _take_lock(path: Path) -> FileLock:
    if len(os.fsencode(path)) > AF_UNIX_PATH_MAX:
        raise SocketPlaceRefused(f"socket path is longer than {AF_UNIX_PATH_MAX} bytes: {path}")
    prepare_socket_dir(path.parent)
    lock = FileLock(path.with_name(path.name + ".lock"), f"socket {path}")
    try:
        lock.acquire()
    except OSError as exc:  # a folder we may not write in, something else in the way
        raise SocketSetupError(f"cannot open {lock.path}: {exc.strerror}", exc.errno) from None
    return lock


def bind_listener(path: Path) -> BoundSocket:
    """Bind and listen on ``path`` (see the module docstring for the safety rules), with
    the lock :func:`claim_socket` took if it did."""
    lock = _claimed.pop(path, None) or _take_lock(path)
    try:
        remove_if_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        staging = _staging(path)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging)
            sock.bind(str(staging))
            os.chmod(staging, 0o600)
            # rename() does not replace a socket somebody bound meanwhile without the
            # lock: check once more, as late as possible.
            if os.path.lexists(path):
                raise AlreadyServing(f"another recalld is already serving {path}")
            os.rename(staging, path)
            sock.listen(BACKLOG)
            sock.setblocking(False)
            st = os.lstat(path)
        except BaseException as exc:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(staging)
            if isinstance(exc, OSError):
                raise SocketSetupError(f"cannot bind {path}: {exc.strerror or exc}",
                                       exc.errno) from None
            raise
    except BaseException:
        lock.release()
        raise
    lock.note(LISTENING)
    return BoundSocket(sock=sock, path=path, lock=lock, inode=(st.st_dev, st.st_ino))
