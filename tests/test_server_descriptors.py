"""The RPC server near the daemon's open file limit, over real sockets (RELIABILITY 18):
clients cannot take the descriptors the daemon's own work needs, and running out of them
(refusing clients past the reserve, or EMFILE on accept: its backoff is checked in
test_server_in_process.py) is survived."""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING

import orjson
from waits import wait_for

from recalld.ipc import errors

if TYPE_CHECKING:
    from conftest import DaemonFactory, DaemonHandle, RawConnection

LOW_FD_LAUNCHER = (
    sys.executable, "-c",
    "import os, resource, sys;"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48));"
    "os.execv(sys.executable, [sys.executable, '-m', 'recalld.daemon.main', *sys.argv[1:]])",
)


def _ping_ok(d: DaemonHandle) -> bool:
    try:
        return bool(d.call("daemon.ping")["pong"])
    except (errors.RecalldError, OSError, EOFError):
        return False


def _out_of_room(conn: RawConnection) -> bool:
    """Whether the daemon gives no more descriptors to clients: it refused one for that,
    or (as it did) ran out of them accepting."""
    stats = conn.call("daemon.status")["queues"]["server"]
    return bool(stats["rejected_overloaded_total"] or stats["accept_errors_total"])


def _connect_many(d: DaemonHandle, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(d.socket_path))
        held.append(s)
    return held


def test_clients_holding_every_descriptor_they_can_leave_the_daemon_its_work(
        daemon_factory: DaemonFactory) -> None:
    # Idle clients took every descriptor up to the limit: the daemon's own writes then
    # failed (a note was answered "internal error", so was index.sync, even the import
    # of a module a method needed), while the connections stayed open for idle_timeout_s.
    d = daemon_factory(launcher=LOW_FD_LAUNCHER)
    with d.connect() as conn:
        held = _connect_many(d, 80)  # more than the limit leaves
        try:
            wait_for(lambda: _out_of_room(conn), what="the daemon to stop taking clients")
            added = conn.call("memory.add_note", {
                "agent_id": "default", "content": "the spare key hangs behind the blue door"})
            assert added["path"], added
            conn.call("index.sync", {"agent_id": "default"})
            found = conn.call("memory.search", {"agent_id": "default", "query": "spare key"})
            assert any("blue door" in hit["text"] for hit in found["results"]), found
            # Those refused were told why, at once (the others wait in the backlog).
            told = []
            for s in held:
                s.setblocking(False)
                try:
                    told.append(orjson.loads(s.recv(4096).splitlines()[0]))
                except BlockingIOError:
                    pass
            assert told and all(
                t["error"]["code"] == errors.OVERLOADED and "open file limit" in
                t["error"]["message"] for t in told), told
        finally:
            for s in held:
                s.close()
    wait_for(lambda: _ping_ok(d), what="the daemon to take clients again")
    assert d.proc.poll() is None

