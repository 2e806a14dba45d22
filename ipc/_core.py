"""What the two client flavours share besides the method table: how a connect failure,
a response and a server-side close turn into typed errors, and how a daemon is auto-started.

No I/O waits here except :func:`spawn_daemon`, which only starts a process.
"""

from __future__ import annotations

import collections
import errno
import os
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from recalld.ipc import errors, folders, paths
from recalld.ipc._call import Call
from recalld.ipc.protocol import DEFAULT_MAX_FRAME_BYTES, Response
from recalld.ipc.regular_files import blocked_on_way, not_a_folder

T = TypeVar("T")

#: The client accepts answers far larger than the daemon accepts requests: a whole file read
#: or a large search answer must not break the connection.
CLIENT_MAX_FRAME_BYTES = 64 << 20
#: Requests above the daemon's limit (this by default) are refused locally: the daemon
#: would answer once and close.
MAX_REQUEST_BYTES = DEFAULT_MAX_FRAME_BYTES
#: How long an auto-started daemon may take until its socket answers.
AUTOSTART_WAIT_S = 30.0
AUTOSTART_POLL_S = 0.05
READ_CHUNK_BYTES = 1 << 16

# Variables that tell a process it was started by systemd; an auto-started daemon is not.
_SYSTEMD_VARS = ("NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_USEC",
                 "WATCHDOG_PID")


def checked_timeout(value: float, name: str) -> float:
    """``value`` (seconds, a client's ``timeout_s`` or ``connect_timeout_s``), or
    ValueError when it is not a number more than 0 (``math.inf``: no limit): a NaN, a
    negative or a zero wait would otherwise fail every call, and only once one is made."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds more than 0, not {value!r}")
    return float(value)


def checked_wait(value: float | None, name: str) -> float | None:
    """``value``, how long an events wait lasts without one (seconds; 0: only the events
    already arrived; ``math.inf`` or None: no limit), or ValueError when it is not such a
    number: a NaN or a string failed in the wait with another library's error, a negative
    one was taken for 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds, 0 or more (or None: no "
                         f"limit), not {value!r}")
    return float(value)


@dataclass(frozen=True)
class Lost:
    """Marker put in a client's event buffer when a subscribed connection dies, and why:
    the subscriber is told (:class:`~recalld.ipc.errors.ConnectionLost`) that events may
    have been missed before it reads those of the next connection."""

    why: str = "the daemon closed the connection"


@dataclass(eq=False)
class Missed:
    """Marker put in a client's event buffer where events came that it had no room for
    (``max_events``), counting them: the subscriber is told
    (:class:`~recalld.ipc.errors.EventsMissed`) before it reads the events after them.
    With ``why``, the daemon counted them (events it published where the subscription
    had a gap, see :mod:`recalld.ipc._place`), and ``why`` says what the gap was."""

    count: int = 0
    why: str | None = None


def mark_missed(events: collections.deque[T | Lost | Missed]) -> None:
    """Count one event left out at the end of ``events``: in the marker there, or in a new
    one (a full buffer still tells of the gap, as :func:`mark_lost` does)."""
    if events and isinstance(last := events[-1], Missed) and last.why is None:
        last.count += 1
    else:
        events.append(Missed(1))


def unmarked(item: T | Lost | Missed) -> T:
    """``item``, taken from a client's event buffer, unless it is a marker of a gap: then
    the error that tells the subscriber of it (ConnectionLost, or EventsMissed)."""
    if isinstance(item, Lost):
        raise errors.ConnectionLost(item.why)
    if isinstance(item, Missed):
        raise errors.EventsMissed(item.count, item.why)
    return item


def mark_lost(events: collections.deque[T | Lost | Missed], lost: Lost) -> Lost:
    """Put ``lost`` at the end of ``events`` unless a loss is already the last thing
    there: a full buffer still tells of the gap, and many losses in a row are one.
    Return the marker that tells of it."""
    if events and isinstance(last := events[-1], Lost):
        return last
    events.append(lost)
    return lost


def checked_max_events(value: int) -> int:
    """``value``, how many events a client keeps unread (``max_events``), or ValueError
    when it is not a whole number, 0 or more: else taken, and either every event dropped
    or a TypeError at some later call."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_events must be a whole number, 0 or more, not {value!r}")
    return value


def not_running(socket_path: Path) -> errors.DaemonNotRunning:
    """The error for no daemon at ``socket_path``, with the command that starts one there:
    ``recalld serve`` finds the socket as a client does, unless the client was given
    another (``--socket``). A daemon that holds the socket's lock but has not noted there
    that it listens is starting; one that has runs, but lost its socket file: a start
    would be refused, so the error says that instead."""
    lock = socket_path.with_name(socket_path.name + ".lock")
    holder = lock_holder(lock)
    if holder is not None:
        pid = f" (pid {holder})" if holder > 0 else ""
        if not _says_listening(lock, holder):
            # It claims its socket before it imports its modules (seconds on a busy
            # machine) and notes in the lock file when it listens: it is starting.
            return errors.DaemonNotRunning(
                f"recalld{pid} is starting and does not answer on {socket_path} yet; "
                "try again in a moment")
        return errors.DaemonNotRunning(
            f"a daemon{pid} holds the lock of {socket_path} but does not answer there: its "
            "socket file was removed or replaced while it ran (stop it, then start it again)")
    other = _not_a_socket(socket_path)
    if other is not None:  # a daemon would refuse it too: no command to start one there
        return errors.DaemonNotRunning(
            f"cannot connect to {socket_path}: it is {other}, not a socket (--socket, "
            "RECALLD_SOCKET and socket_path name the socket file itself"
            + ("; recalld makes its socket there, never through a link)"
               if other.startswith("a symbolic link") else ")"))
    try:
        found = paths.socket_path(running=False)
    except paths.PathError:
        found = None
    serve = ("recalld serve" if found == socket_path
             else f"recalld serve --socket {shlex.quote(str(socket_path))}")
    return errors.DaemonNotRunning(f"daemon not running at {socket_path} (start it with: {serve})")


def starting_elsewhere(socket_path: Path) -> bool:
    """Whether another process (a daemon still starting) holds the lock of
    ``socket_path`` and has not yet noted there that it listens."""
    lock = socket_path.with_name(socket_path.name + ".lock")
    holder = lock_holder(lock)
    return holder not in (None, os.getpid()) and not _says_listening(lock, holder or 0)


def held_fix(socket_path: Path) -> str | None:
    """What to do when a daemon holds the lock of ``socket_path`` but does not answer on
    it (starting, or its socket file was removed or replaced while it ran), where a start
    would be refused; None when no daemon holds it."""
    holder = lock_holder(socket_path.with_name(socket_path.name + ".lock"))
    if holder is None:
        return None
    stop = f"kill {holder}" if holder > 0 else "stop it"
    return (f"{stop} (or systemctl --user stop recalld.socket recalld.service), then start "
            "it again: recalld serve; one that is only starting answers in a moment")


def _not_a_socket(path: Path) -> str | None:
    """What is at ``path`` when it is there and not a socket (a folder, a file, a symbolic
    link: the daemon makes its socket only where nothing is, or a socket, and never
    through a link), else None."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            return "a symbolic link"
        return f"a symbolic link to {target}" + ("" if path.exists() else
                                                  ", which leads to nothing")
    return None if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else "a file"


def _says_listening(lock_file: Path, holder: int) -> bool:
    """Whether the socket's lock file says its daemon, pid ``holder`` (0: not visible
    here), listens (the line after the pid; the daemon's ``lock.LISTENING``). A file
    naming another pid is what a daemon killed before it could empty it left: the one
    that has just locked it has not written its own pid yet, and is starting."""
    try:
        lines = lock_file.read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return True  # unknown: not said to be starting
    if holder > 0 and lines[:1] != [str(holder)]:
        return False
    return "listening" in lines[1:]


def lock_holder(lock_file: Path) -> int | None:
    """The pid of the process holding a ``flock`` on ``lock_file`` (0 if it is not
    visible here), else None. The daemon locks ``<socket>.lock`` while it serves. Read
    from /proc/locks: testing the lock by taking it could make a daemon starting at that
    moment fail."""
    try:
        st = lock_file.stat()
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()  # 1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF
        if fields[1:2] == ["FLOCK"] and fields[5:6] == [where] and fields[4].isdigit():
            return int(fields[4])
    return None


def connect_error(socket_path: Path, exc: OSError) -> errors.DaemonNotRunning:
    """The typed error for a failed connect; the message says what to do."""
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError) or exc.errno in (
        errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK,
    ):
        return not_running(socket_path)
    if isinstance(exc, PermissionError):
        return errors.DaemonNotRunning(
            f"cannot connect to {socket_path}: permission denied "
            "(the socket belongs to another user, or its directory is not yours)"
        )
    return errors.DaemonNotRunning(f"cannot connect to {socket_path}: {exc.strerror or exc}")


def request_limit() -> int:
    """The largest request the daemon accepts: ``[daemon] max_request_bytes`` of the
    config file, found as the socket is, else the daemon's default."""
    return paths.max_request_bytes() or MAX_REQUEST_BYTES


def check_request_size(frame: bytes, limit: int = MAX_REQUEST_BYTES) -> None:
    """RequestTooLarge if the daemon would refuse ``frame``: it counts the JSON, not the
    newline that ends it."""
    size = len(frame) - frame.endswith(b"\n")
    if size > limit:
        raise errors.RequestTooLarge(
            f"request of {size} bytes exceeds the limit of {limit} ([daemon] max_request_bytes)"
        )


def finish(call: Call[T], response: Response) -> T:
    """The typed result of ``call``, or the typed error the daemon sent."""
    if response.error is not None:
        raise errors.error_from_wire(response.error)
    try:
        return call.parse(response.result)
    except (TypeError, ValueError, KeyError) as exc:
        raise errors.InternalError(
            f"{call.method}: unexpected result from the daemon: {exc}"
        ) from None


def lost(fatal: Response | None,
         message: str = "the daemon closed the connection before answering",
         ) -> errors.RecalldError:
    """The error for calls cut off by a close; a null-id error sent just before wins."""
    if fatal is not None and fatal.error is not None:
        return errors.error_from_wire(fatal.error)
    return errors.ConnectionLost(message)


def autostart_logs() -> tuple[Path, Path]:
    """Where an auto-started daemon logs (rotated) and where its stderr goes (what it says
    before logging is set up, e.g. a configuration error): under the daemon's state dir."""
    state = paths.data_dir() / "state"
    return state / "recalld.log", state / "recalld-start.log"


def daemon_command(socket_path: Path, log_file: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "recalld.ipc", "serve", "--socket", str(socket_path)]
    return cmd + (["--log-file", str(log_file)] if log_file is not None else [])


class Spawned:
    """An auto-started daemon, watched through a pidfd (it is not our child: the launcher
    that started it has exited). :meth:`exited` says whether it has ended, whatever its
    reason; None when the system cannot say (no pidfd), and the start log is read instead.
    Close it when done."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._gone = False
        if pid is None:
            return
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:  # ended, and reaped, already
            self._gone = True
        except (OSError, AttributeError):  # a kernel before 5.3
            self.pid = None

    def exited(self) -> bool | None:
        if not self._gone and self._fd is not None:
            import select  # here: only an autostart waits on a process

            # A pidfd reads as ready once the process has ended (reaped or not).
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            self._gone = bool(poller.poll(0))
        return True if self._gone else None if self._fd is None else False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def spawn_daemon(socket_path: Path) -> Spawned:
    """Start ``recalld serve`` in the background, detached from this process, logging to
    :func:`autostart_logs`; the started daemon, to watch while waiting for its socket.

    A short-lived launcher starts the daemon in a new session and exits at once, so the
    daemon is not our child: nothing to reap, and it outlives this process. The launcher
    prints the daemon's pid.
    """
    import subprocess  # here: only an autostart spawns anything

    env = {k: v for k, v in os.environ.items() if k not in _SYSTEMD_VARS}
    log_file, start_log = autostart_logs()
    try:
        # The data folder too, if it is new: the daemon never tightens one that exists.
        folders.make_dirs_private(start_log.parent)
        start_log.unlink(missing_ok=True)  # what the last start said is not this one's
    except OSError as exc:  # a file or a broken link in the way: the daemon's refusal too
        blocked = blocked_on_way(start_log.parent)
        why = not_a_folder(blocked) if blocked is not None else exc.strerror or str(exc)
        raise errors.DaemonNotRunning(
            f"cannot start a daemon for {socket_path}: cannot make {start_log.parent}: "
            f"{why}; move what is in the way, or name another data directory "
            "(RECALLD_DATA_DIR, [daemon] data_dir)") from None
    # The start log says what the daemon said before its log was set up (its config,
    # paths): only its owner may read it, whatever the umask.
    launcher = (
        "import os, subprocess, sys\n"
        "err = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,"
        " 0o600)\n"
        "os.fchmod(err, 0o600)\n"
        "p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=err, stderr=err,"
        " start_new_session=True, close_fds=True)\n"
        "print(p.pid)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", launcher, str(start_log), *daemon_command(socket_path, log_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, check=False, timeout=AUTOSTART_WAIT_S,
    )
    said = ran.stdout.strip()
    return Spawned(int(said) if said.isdigit() else None)


def _start_said() -> list[str]:
    try:
        text = autostart_logs()[1].read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return text.strip().splitlines()


def autostart_failed(socket_path: Path, exited: bool = False) -> errors.DaemonNotRunning:
    """The error when an auto-started daemon did not answer in time, or ended before it
    did: what it said, where."""
    log_file, start_log = autostart_logs()
    said = _start_said()
    last = f": {said[-1]}" if said else ""
    what = "it exited" if exited else "it did not answer"
    return errors.DaemonNotRunning(
        f"started a daemon for {socket_path}, but {what}{last} "
        f"(its log: {log_file}, {start_log})")


def autostart_gave_up(socket_path: Path, deadline_passed: bool,
                      exited: bool | None = None) -> errors.DaemonNotRunning | None:
    """The error to raise now while waiting for an auto-started daemon, if any: at the
    deadline, or at once when the daemon started had ended before the last connect
    (``exited``: waiting cannot help, whatever made it stop). Where that cannot be known
    (None), a refused configuration in its start log says it."""
    if exited is None:
        exited = any("configuration error" in line for line in _start_said())
    if exited and not deadline_passed and _starting(socket_path):
        # Several clients starting a daemon at once: the daemon one of them started holds
        # the socket's lock while it loads, and every other one exits at once, refused.
        # The one starting answers in a moment: wait for it.
        return None
    if deadline_passed or exited:
        return autostart_failed(socket_path, exited)
    return None


def _starting(socket_path: Path) -> bool:
    """Whether a daemon holds the lock of ``socket_path`` and is starting: it has not yet
    noted there that it listens, or has since the last connect (its socket is there).
    One that listens without a socket file (removed while it ran) is not."""
    lock = socket_path.with_name(socket_path.name + ".lock")
    if (holder := lock_holder(lock)) is None:
        return False
    try:
        bound = stat.S_ISSOCK(socket_path.lstat().st_mode)
    except OSError:
        bound = False
    return bound or not _says_listening(lock, holder)
