"""A shared workspace's server that hangs: connections stay up (the kernel still
acknowledges), nothing answers. Its processes are stopped with SIGSTOP, as a hung disk or
a paused virtual machine would leave them. The replica must count it as offline after
its call deadline, and a stop of the daemon must not wait on the call in flight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, remote_status, write
from waits import wait_for

# A daemon started with this on its PYTHONPATH gives a database call up after
# CALL_TIMEOUT_S seconds (default: db.CALL_TIMEOUT_S, far longer than a test), and a
# note's chunk rows after PREPARE_TIMEOUT_S (db.PREPARE_TIMEOUT_S).
SITECUSTOMIZE = """\
import os
if os.environ.get("CALL_TIMEOUT_S"):
    from recalld.daemon.remote import db
    db.CALL_TIMEOUT_S = float(os.environ["CALL_TIMEOUT_S"])
if os.environ.get("SEARCH_TIMEOUT_S"):
    from recalld.daemon.remote import db
    db.SEARCH_TIMEOUT_S = float(os.environ["SEARCH_TIMEOUT_S"])
if os.environ.get("PREPARE_TIMEOUT_S"):
    from recalld.daemon.remote import db
    db.PREPARE_TIMEOUT_S = float(os.environ["PREPARE_TIMEOUT_S"])
if os.environ.get("MAX_NOTE_BYTES"):  # before any module takes the value in
    from recalld.daemon.index import prepare
    prepare.MAX_NOTE_BYTES = int(os.environ["MAX_NOTE_BYTES"])
"""


@contextmanager
def frozen(pg: PgServer) -> Iterator[None]:
    """The server's processes stopped (SIGSTOP) for the block."""
    master = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(master)], capture_output=True,
                              text=True, check=True).stdout.split()
    pids = [master, *map(int, children)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_a_hung_server_is_offline_and_holds_no_stop(daemon_factory: DaemonFactory,
                                                    pg_server: PgServer,  # noqa: F811
                                                    tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    name = "h" + uuid.uuid4().hex[:12]
    quick = daemon_factory(config(pg_server.dsn, name, "quick"), PYTHONPATH=str(hooks),
                           CALL_TIMEOUT_S="1")
    slow_cfg = config(pg_server.dsn, name, "slow")
    slow = daemon_factory(slow_cfg)  # the default deadline
    for d in (quick, slow):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")

    with frozen(pg_server):
        write(quick, "memory/2026-12-08/frozen.md", "# Frozen\nwritten while it hangs\n")
        write(slow, "memory/2026-12-08/stopped.md", "# Stopped\nwritten before a stop\n")
        # The upload waits on the server until the deadline, then the server is offline.
        wait_for(lambda: remote_status(quick)["state"] == "offline", what="offline",
                 deadline_s=30)
        assert remote_status(quick)["outbox"] == 1
        # A stop does not wait for the upload in flight (nor its deadline).
        wait_for(lambda: remote_status(slow)["outbox"] == 1, what="queued")
        began = time.monotonic()
        assert slow.stop(timeout=30) == 0
        assert time.monotonic() - began < 10

    slow = daemon_factory(slow_cfg, RECALLD_DATA_DIR=str(slow.data_dir))
    for d in (quick, slow):
        wait_for(lambda d=d: (lambda s: s["state"] == "online" and s["outbox"] == 0)(
            remote_status(d)), what="uploaded after the thaw")
    root = quick.data_dir / "workspaces" / "default"
    wait_for(lambda: (root / "memory/2026-12-08/stopped.md").exists(), what="note on quick")


def test_a_search_in_a_hung_server_is_answered_locally_soon(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        tmp_path: Path) -> None:
    # The replica's calls may wait their long deadline; an agent's search must not: the
    # local index answers it after the search deadline, and the next ones at once.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    d = daemon_factory(config(pg_server.dsn, "s" + uuid.uuid4().hex[:12], "srv",
                              ', search_mode = "server"'),
                       PYTHONPATH=str(hooks), CALL_TIMEOUT_S="120", SEARCH_TIMEOUT_S="1")
    write(d, "memory/2026-12-09/kiln.md", "# Kiln\nthe kiln reaches 1280 degrees\n")

    def search() -> dict[str, Any]:
        out: dict[str, Any] = d.call("memory.search", {"agent_id": "default",
                                                       "query": "kiln degrees"})
        return out

    wait_for(lambda: search()["search_mode"] == "server" and search()["results"],
             what="searched in the server")
    with frozen(pg_server):
        began = time.monotonic()
        first = search()
        second = search()
        took = time.monotonic() - began
        assert remote_status(d)["state"] == "online"  # its own calls still wait
    assert first["search_mode"] == second["search_mode"] == "local", (first, second)
    assert [r["path"] for r in second["results"]] == ["memory/2026-12-09/kiln.md"]
    assert "did not answer within 1 s" in first["server_error"], first
    assert "searching locally for a while" in second["server_error"], second
    assert took < 60, took  # not the replica's 120 s deadline
