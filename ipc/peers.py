"""Who is at the other end of a Unix socket: the credentials of a connected peer, and the
process that listens on a socket path, named for a message (a socket unit's listener is
systemd, whichever daemon it starts)."""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """The process, user and group of a connected client."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket | trio.socket.SocketType) -> PeerCredentials:
    """SO_PEERCRED of a connected Unix socket (stdlib or trio socket)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)


def peer_named(sock: socket.socket) -> str:
    """Who listens at the other end of ``sock``, a connected Unix socket, for a message:
    ``pid N (name)`` of the process that made the listening socket (for a socket unit's,
    systemd), or an empty string when the kernel does not say."""
    try:
        pid = peer_credentials(sock).pid
    except OSError:
        return ""
    if pid <= 0:
        return ""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f"pid {pid} ({f.read().strip()})"
    except OSError:
        return f"pid {pid}"


def listener_of(path: Path) -> str:
    """:func:`peer_named` of what listens on the socket file ``path``; empty when nothing
    does (or the kernel does not say)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK
                       | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(os.fsencode(path))
        except OSError:  # nothing listens, or its backlog is full: no peer to ask
            return ""
        return peer_named(probe)
