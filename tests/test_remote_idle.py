"""A shared workspace whose server stays unreachable for long, with nothing to send: the
replica stops trying every few seconds (an idle daemon should not keep waking), and tries
within its short wait when something needs the server (a local change, a server search).

The daemons run with a hook that makes the waits fixed (``SHORT_WAIT_S`` before a long
outage or with changes waiting, ``IDLE_WAIT_S`` after it), an outage long at once, and
records each connection attempt in ``CONNECTS`` (read at each use: a test daemon may be
forked from a server started with another's environment); no server listens on the DSN's
port.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

from conftest import DaemonFactory, DaemonHandle
from test_remote import config, remote_status, write
from waits import wait_for

SITECUSTOMIZE = """\
import os
if os.environ.get("CONNECTS"):
    from recalld.daemon.remote import db, replica

    class Fixed:
        def __init__(self, name):
            self.name = name

        def backoff_s(self, attempt, rng):
            return float(os.environ[self.name])

    replica.RECONNECT = Fixed("SHORT_WAIT_S")
    replica.IDLE_RECONNECT = Fixed("IDLE_WAIT_S")
    replica.LONG_OUTAGE_S = 0.0
    connect = db.connect

    def counted(*args, **kwargs):
        with open(os.environ["CONNECTS"], "a") as f:
            f.write("attempt\\n")
        return connect(*args, **kwargs)

    db.connect = counted
"""


def dead_dsn() -> str:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def attempts(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def search(d: DaemonHandle, query: str) -> dict[str, Any]:
    out: dict[str, Any] = d.call("memory.search", {"agent_id": "default", "query": query,
                                                   "sync": True})
    return out


def test_a_long_outage_with_nothing_to_send_stops_waking_until_needed(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    dsn = dead_dsn()
    name = "i" + uuid.uuid4().hex[:12]
    idle_log, busy_log = tmp_path / "idle.log", tmp_path / "busy.log"
    idle = daemon_factory(config(dsn, name, "idle", ', search_mode = "server"'),
                          PYTHONPATH=str(hooks), CONNECTS=str(idle_log),
                          SHORT_WAIT_S="0.05", IDLE_WAIT_S="3600")
    # "busy" has a change waiting to go up, so it tries every SHORT_WAIT_S: the test's clock.
    busy = daemon_factory(config(dsn, name, "busy"), PYTHONPATH=str(hooks),
                          CONNECTS=str(busy_log), SHORT_WAIT_S="0.05", IDLE_WAIT_S="3600")
    write(busy, "memory/2026-12-10/queued.md", "# Queued\nwaits for the server\n")
    wait_for(lambda: remote_status(busy)["outbox"] == 1, what="busy's change queued")
    wait_for(lambda: remote_status(idle)["state"] == "offline", what="offline")

    # While the busy daemon tries again and again, the idle one waits.
    before = attempts(idle_log)
    ticks = attempts(busy_log)
    wait_for(lambda: attempts(busy_log) >= ticks + 20, what="the busy daemon's attempts")
    assert attempts(idle_log) == before

    # A search in the server, answered locally meanwhile, tries the server after the short wait.
    answer = search(idle, "anything")
    assert answer["search_mode"] == "local", answer
    wait_for(lambda: attempts(idle_log) > before, what="an attempt for the search")
    after_search = attempts(idle_log)
    ticks = attempts(busy_log)
    wait_for(lambda: attempts(busy_log) >= ticks + 20, what="the busy daemon's attempts")
    assert attempts(idle_log) == after_search

    # A local change tries after the short wait, and while it waits to go up the waits stay short.
    write(idle, "memory/2026-12-10/kettle.md", "# Kettle\nthe kettle whistles at dawn\n")
    wait_for(lambda: remote_status(idle)["outbox"] == 1, what="queued")
    wait_for(lambda: attempts(idle_log) >= after_search + 5, what="attempts while queued")
    assert remote_status(idle)["state"] == "offline"
