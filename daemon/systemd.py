"""The systemd side: sd_notify messages, the watchdog task and socket activation.

:func:`take_environment` reads ``NOTIFY_SOCKET``, ``WATCHDOG_USEC``/``WATCHDOG_PID`` and
``LISTEN_PID``/``LISTEN_FDS`` once at start and removes them from ``os.environ``, so no
child process or thread that spawns one later can inherit them (a child would otherwise
speak for us, or adopt our listening socket). recalld serves one socket: more than one
passed (a .socket unit with several ``ListenStream=``) is refused as a configuration
error. Everything is a no-op outside systemd.

The watchdog task (:func:`run_watchdog`) is an ordinary trio task that pets the watchdog
and sleeps half the interval: it only runs when the event loop is alive, which is exactly
what the watchdog must observe. It is not started at all when no watchdog is configured.

Before ``READY=1`` (the watchdog is not armed yet) :meth:`Notifier.tell_start` tells systemd
that a long start makes progress (``EXTEND_TIMEOUT_USEC`` and ``STATUS=``): the finishing
of a restore the daemon was killed in, a large index loaded, a replica caught up. The
start's steps count in :class:`StartProgress`; a start whose count stays still for
``START_STUCK_AFTER_S`` is no longer extended, so systemd ends it past the unit's
``TimeoutStartSec`` as a stuck one.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from recalld.ipc.paths import PathError, utf8_path

if TYPE_CHECKING:
    from recalld.daemon.events import EventBus

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3
#: The shortest wait between two watchdog pets.
MIN_WATCHDOG_PERIOD_S = 0.01
#: The longest notification systemd reads (its NOTIFY_BUFFER_MAX, PIPE_BUF): it drops a
#: longer datagram whole, with the READY=1 or STOPPING=1 in it.
MAX_NOTIFY_BYTES = 4096
_ELLIPSIS = "\u2026".encode()
#: How often a start not yet READY tells systemd it goes on; each time it extends the
#: start timeout to three times this from then.
START_EXTEND_PERIOD_S = 10.0
#: A start whose steps have not moved for this long is stuck: it is no longer extended.
START_STUCK_AFTER_S = 300.0
_VARIABLES = (
    "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
    "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES",
)


@dataclass(frozen=True, slots=True)
class SystemdEnvironment:
    """What systemd told this process, captured before the variables were cleared."""

    notify_socket: str | None = None
    watchdog_interval_s: float | None = None
    listen_fds: tuple[int, ...] = ()
    #: Why ``LISTEN_FDS`` was set but not taken: meant for another pid.
    ignored_listen: str | None = None


def take_environment(environ: MutableMapping[str, str] | None = None) -> SystemdEnvironment:
    """Read the systemd variables meant for this pid, then remove all of them.

    A ``WATCHDOG_USEC`` that is not a number is ignored, and so is one that comes without
    a ``NOTIFY_SOCKET`` (there is no one to pet). Raises :class:`PassedSocketError` when
    ``LISTEN_FDS``, meant for this pid, is not a count of open descriptors.
    """
    env = os.environ if environ is None else environ
    pid = os.getpid()
    try:
        notify = env.get("NOTIFY_SOCKET") or None
        watchdog: float | None = None
        wd_pid = env.get("WATCHDOG_PID")
        usec = _number(env.get("WATCHDOG_USEC"))
        if notify and usec and (wd_pid is None or wd_pid == str(pid)):
            watchdog = usec / 1_000_000
        fds: tuple[int, ...] = ()
        ignored = None
        listen_pid = env.get("LISTEN_PID")
        if listen_pid == str(pid) and env.get("LISTEN_FDS"):
            fds = _passed_fds(env["LISTEN_FDS"])
        elif env.get("LISTEN_FDS"):
            # Not ours to take; but a wrapper that forks rather than execs recalld leaves
            # the socket open here, in the place the daemon would bind.
            ignored = (f"LISTEN_FDS={env['LISTEN_FDS']!r} is meant for "
                       + (f"pid {listen_pid!r}" if listen_pid else "no pid (no LISTEN_PID)")
                       + f", not this process ({pid})")
    finally:
        for name in _VARIABLES:
            env.pop(name, None)
    return SystemdEnvironment(notify_socket=notify, watchdog_interval_s=watchdog,
                              listen_fds=fds, ignored_listen=ignored)


def _number(value: str | None) -> int | None:
    """``value`` as systemd writes a number (ASCII digits only), else None."""
    return int(value) if value and value.isascii() and value.isdigit() else None


def _passed_fds(listen_fds: str) -> tuple[int, ...]:
    """The descriptors ``LISTEN_FDS`` names, kept from any child we start: one, or none.

    Raises PassedSocketError when it names one that is not open, or more than one."""
    count = _number(listen_fds)
    if count is None:
        raise PassedSocketError(f"LISTEN_FDS={listen_fds!r} is not a count of descriptors")
    fds = range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count)
    for fd in fds:  # stops at the first that is not open: a huge count costs nothing
        try:
            os.set_inheritable(fd, False)
        except OSError as exc:
            raise PassedSocketError(
                f"descriptor {fd} passed by systemd (LISTEN_FDS={count}) is not open: "
                f"{exc.strerror}") from None
    if count > 1:
        # recalld serves one socket. Serving the first alone would leave clients of the
        # others queued on a socket nobody accepts on (systemd keeps listening there), so
        # it refuses, as sd_listen_fds(3) says a daemon expecting one socket should.
        raise PassedSocketError(
            f"systemd passed {count} sockets (LISTEN_FDS={count}), "
            f"{', '.join(_address(fd) for fd in fds)}; recalld serves one: the .socket "
            "unit needs exactly one ListenStream=")
    return tuple(fds)


def _address(fd: int) -> str:
    """What descriptor ``fd`` is bound to, as ``ss`` shows it, for a message."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return f"descriptor {fd} (not a socket)"
    try:
        return _shown(sock.getsockname()) if sock.family == socket.AF_UNIX else \
            f"descriptor {fd} ({sock.family.name})"
    finally:
        sock.detach()


class Notifier:
    """Sends sd_notify datagrams; silently does nothing when there is no NOTIFY_SOCKET.

    Sends never block: a full receive queue drops the message (and logs it), because a
    wedged service manager must not wedge the daemon.
    """

    def __init__(self, notify_socket: str | None) -> None:
        self._address: str | bytes | None = None
        self._sock: socket.socket | None = None
        self._failing = False
        if not notify_socket:
            return
        if notify_socket.startswith("@"):
            self._address = b"\0" + notify_socket[1:].encode()  # abstract namespace
        elif notify_socket.startswith("/"):
            self._address = notify_socket
        else:
            log.warning("ignoring unsupported NOTIFY_SOCKET %r", notify_socket)
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines as one datagram; True if it was sent."""
        if self._sock is None or self._address is None:
            return False
        payload = _datagram(assignments)
        try:
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            # Said once until a send works again: a manager gone for good would otherwise
            # have every watchdog ping logged.
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(level, "sd_notify %s failed: %s", assignments[0].split("=")[0], exc)
            self._failing = True
            return False
        if self._failing:
            log.info("sd_notify works again")
            self._failing = False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={_one_line(status)}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={_one_line(status)}")

    async def keep_status(self, events: EventBus, line: Callable[[], str]) -> None:
        """Say ``line()`` in ``STATUS=`` (what ``systemctl status`` shows) each time a
        workspace opens, closes or fails; it waits on those events."""
        while True:
            sub = events.subscribe(["workspace.*"])
            try:
                async for _ in sub.receive:
                    self.status(line())
            finally:
                sub.close()
            self.status(line())  # dropped after a burst: the state now, and listen again

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str = "stopping", *, extend_s: float | None = None) -> bool:
        """STOPPING=1; with ``extend_s``, systemd's stop timeout is extended to at least
        that long from now (``EXTEND_TIMEOUT_USEC``): a stop the configuration lets take
        longer than the unit's ``TimeoutStopSec`` is not cut off by SIGKILL."""
        extend = () if extend_s is None else (f"EXTEND_TIMEOUT_USEC={int(extend_s * 1e6)}",)
        return self.notify("STOPPING=1", f"STATUS={_one_line(status)}", *extend)

    async def tell_start(self, progress: StartProgress, scope: trio.CancelScope) -> None:
        """Until ``scope`` is cancelled (at ``READY=1`` or a stop): every
        ``START_EXTEND_PERIOD_S``, while the start has made a step in the last
        ``START_STUCK_AFTER_S``, extend systemd's start timeout (``EXTEND_TIMEOUT_USEC``,
        three periods) and say what it does (``STATUS=``). A start that made none is left
        to the timeout; the log and STATUS= say where it stands."""
        if self.enabled:
            with scope:
                await _tell_start(self, progress)

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _datagram(assignments: tuple[str, ...]) -> bytes:
    """``assignments`` as one datagram systemd reads whole: a ``STATUS=`` text that would
    make it longer than ``MAX_NOTIFY_BYTES`` (a status naming many failed workspaces) is
    cut at a character boundary and ends with an ellipsis."""
    lines = [a.encode("utf-8", errors="replace") for a in assignments]
    over = sum(map(len, lines)) + len(lines) - 1 - MAX_NOTIFY_BYTES
    for i, line in enumerate(lines):
        if over > 0 and line.startswith(b"STATUS="):
            keep = max(len(b"STATUS="), len(line) - over - len(_ELLIPSIS))
            lines[i] = line[:keep].decode("utf-8", errors="ignore").encode() + _ELLIPSIS
            break
    return b"\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class StartProgress:
    """What the start does now and how many steps it has made: a stage (a service
    started, a workspace opened), and the phases and counts of a long one (it is a
    :class:`~recalld.daemon.backup.ProgressSink`, fed from worker threads: a lost
    increment between two threads still moves the count)."""

    def __init__(self) -> None:
        self.stage = "starting"
        self.phase_name: str | None = None
        self.done = 0
        self.total: int | None = None
        #: Moves with every step: what :meth:`Notifier.tell_start` watches.
        self.steps = 0

    def step(self, stage: str) -> None:
        self.stage, self.phase_name, self.done, self.total = stage, None, 0, None
        self.steps += 1

    def phase(self, name: str, total: int | None = None,
              bytes_total: int | None = None) -> None:
        self.phase_name, self.done, self.total = name, 0, total
        self.steps += 1

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        self.done += n
        self.steps += 1

    def line(self) -> str:
        if self.phase_name is None:
            return self.stage
        count = f" {self.done}/{self.total}" if self.total else \
            f" {self.done}" if self.done else ""
        return f"{self.stage}: {self.phase_name}{count}"


async def _tell_start(notifier: Notifier, progress: StartProgress) -> None:
    period, stuck_after = START_EXTEND_PERIOD_S, START_STUCK_AFTER_S
    seen, moved = progress.steps, trio.current_time()
    said_stuck = False
    while True:  # at once too: a unit's TimeoutStartSec may be shorter than a period
        now = trio.current_time()
        if progress.steps != seen:
            seen, moved, said_stuck = progress.steps, now, False
        if now - moved < stuck_after:
            notifier.notify(f"EXTEND_TIMEOUT_USEC={int(3 * period * 1e6)}",
                            f"STATUS={_one_line(progress.line())}")
        else:
            if not said_stuck:
                log.error("the start has made no progress for %.0f s (%s): systemd is no "
                          "longer asked to wait for it", now - moved, progress.line())
                said_stuck = True
            notifier.status(f"no progress for {now - moved:.0f} s: {progress.line()}")
        await trio.sleep(period)


async def run_watchdog(
    notifier: Notifier,
    interval_s: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Pet the watchdog every ``interval_s / 2`` for as long as the event loop runs.

    Never more often than every ``MIN_WATCHDOG_PERIOD_S``: a tiny ``WatchdogSec=`` cannot
    be met anyway, and must not turn the task into a busy loop. Cancellation ends it;
    systemd then notices the silence only if the process lingers.
    """
    task_status.started()
    period = max(interval_s / 2, MIN_WATCHDOG_PERIOD_S)
    while True:
        notifier.watchdog()
        await trio.sleep(period)


class PassedSocketError(ValueError):
    """systemd passed something other than a listening Unix stream socket (a
    misconfigured .socket unit): the daemon exits as on a configuration error."""


def adopt_listener(fds: tuple[int, ...]) -> socket.socket | None:
    """The first passed fd as a listening AF_UNIX stream socket, or None without one.

    Raises PassedSocketError when systemd passed something else.
    """
    if not fds:
        return None
    try:
        sock = socket.socket(fileno=fds[0])
    except OSError as exc:  # not a socket at all, or no such descriptor
        raise PassedSocketError(f"descriptor {fds[0]} passed by systemd is not a socket: "
                                f"{exc.strerror}") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise PassedSocketError("the socket passed by systemd is not a Unix stream socket "
                                "(the .socket unit needs ListenStream= with a path)")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise PassedSocketError("the socket passed by systemd is not listening")
    name = sock.getsockname()
    if not isinstance(name, str) or not name:
        # An abstract name (ListenStream=@name) comes as bytes: no client finds it, and
        # no file mode keeps other users from it.
        sock.detach()
        raise PassedSocketError(f"the socket passed by systemd, {_shown(name)}, is not a "
                                "socket file (the .socket unit needs ListenStream= with a "
                                "path)")
    try:  # the rule a configured socket_path follows: status names where it serves
        utf8_path(Path(name), "the socket passed by systemd")
    except PathError as exc:
        sock.detach()
        raise PassedSocketError(str(exc)) from None
    sock.setblocking(False)
    return sock


def _shown(name: str | bytes) -> str:
    """A socket's name as ``ss`` shows it: an abstract one as ``@name``."""
    if isinstance(name, bytes):
        return "@" + name[1:].decode("utf-8", errors="backslashreplace")
    return repr(name)
