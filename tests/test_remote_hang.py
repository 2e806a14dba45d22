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

from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, remote_status, write
from waits import wait_for

# A daemon started with this on its PYTHONPATH gives a database call up after
# CALL_TIMEOUT_S seconds (default: db.CALL_TIMEOUT_S, far longer than a test).
SITECUSTOMIZE = """\
import os
if os.environ.get("CALL_TIMEOUT_S"):
    from recalld.daemon.remote import db
    db.CALL_TIMEOUT_S = float(os.environ["CALL_TIMEOUT_S"])
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
