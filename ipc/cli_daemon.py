"""``recalld stop``: stop the daemon that serves the socket, and wait until it is gone.

The daemon is found by its socket: the process holding the socket's lock (a daemon still
starting holds it too), else the pid the daemon gives in ``daemon.status`` (a socket
systemd passed has no lock; its peer credentials would name systemd). It gets SIGTERM
(a clean stop: in-flight calls finish within ``graceful_timeout_s``, state is saved) and
the command waits on a pidfd until the process has ended, at most ``--timeout`` seconds.
A daemon run by systemd is left to systemd: the socket unit would start it again at the
next connection.

Exit status: 0 stopped, 1 it did not stop in time (or cannot be signalled), 3 no daemon
runs on the socket.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import threading
from pathlib import Path
from typing import TextIO

from recalld.ipc import _core, errors
from recalld.ipc.cli_ops import Subparsers, add_command
from recalld.ipc.client import Client
from recalld.ipc.render import print_json
from recalld.ipc.types import visible

EXIT_OK, EXIT_ERROR = 0, 1
#: How long ``recalld stop`` waits by default: the daemon's stop takes up to twice
#: ``graceful_timeout_s`` (10 s by default) and its last saves.
DEFAULT_STOP_WAIT_S = 60.0
#: What ``--timeout`` means for ``recalld stop`` (the other commands wait 30 s for an answer).
TIMEOUT_HELP = (f"seconds to wait until the daemon has ended (default "
                f"{DEFAULT_STOP_WAIT_S:.0f})")
SYSTEMD_UNIT = "recalld.service"


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    add_command(sub, common, "stop", "stop the daemon and wait until it has ended "
                f"(--timeout, default {DEFAULT_STOP_WAIT_S:.0f} s)")


def daemon_pid(client: Client) -> int | None:
    """The pid of the daemon serving (or starting on) the client's socket, or None. The
    lock's holder first (a daemon still starting holds it), else what the daemon says
    (not the socket's peer: a socket systemd passed names systemd)."""
    socket_path = client.socket_path
    holder = _core.lock_holder(socket_path.with_name(socket_path.name + ".lock"))
    if holder:
        return holder
    try:
        pid = client.call("daemon.status").get("pid")
    except errors.DaemonNotRunning:
        return None
    return pid if isinstance(pid, int) and pid > 1 else None


def systemd_unit(pid: int) -> str | None:
    """The systemd unit ``pid`` runs in if it is recalld's service, else None."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.rstrip().endswith("/" + SYSTEMD_UNIT):
            return SYSTEMD_UNIT
    return None


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether process ``pid`` ended within ``timeout_s`` (waited on a pidfd: no polling;
    a wait longer than the clock can count, ``--timeout 1e300``, is as long as it can)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], min(timeout_s, threading.TIMEOUT_MAX))
        return bool(ready)
    finally:
        os.close(fd)


def _stop(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    socket_path = client.socket_path
    pid = daemon_pid(client)
    if pid is None:
        raise _core.not_running(socket_path)
    unit = systemd_unit(pid)
    if unit is not None:
        raise OSError(
            f"recalld (pid {pid}) runs as the systemd unit {unit}, whose socket would start "
            f"it again: stop it with: systemctl --user stop recalld.socket {unit}")
    timeout_s: float = getattr(ns, "timeout", DEFAULT_STOP_WAIT_S)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it ended meanwhile
    except PermissionError:
        raise OSError(f"cannot signal recalld (pid {pid}): permission denied") from None
    if not wait_gone(pid, timeout_s):
        raise TimeoutError(f"recalld (pid {pid}) has not stopped within {timeout_s:g} s; "
                           "it goes on stopping (its log says why it takes long)")
    if as_json:
        print_json(out, {"stopped": True, "pid": pid, "socket": str(socket_path)})
    else:
        out.write(f"stopped recalld (pid {pid}) on {visible(str(socket_path))}\n")
    return EXIT_OK


HANDLERS = {"stop": _stop}
