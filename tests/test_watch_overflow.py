"""The kernel's inotify queue overflowing under a daemon that cannot read it: the watcher
counts the overflow in status, and its rescan finds every note written meanwhile."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonHandle
from waits import wait_status

from recalld.daemon import inotify

pytestmark = pytest.mark.skipif(not inotify.available(), reason="inotify is Linux-only")


def _watcher(status: dict[str, Any]) -> dict[str, Any]:
    (ws,) = [w for w in status["workspaces"] if w["agent_id"] == "w"]
    watcher: dict[str, Any] = ws["index"]["watcher"]
    return watcher


def test_a_queue_overflow_is_counted_and_rescanned(daemon: DaemonHandle,
                                                   tmp_path: Path) -> None:
    root = tmp_path / "ws"
    day = root / "memory" / "2026-11-12"
    day.mkdir(parents=True)
    (day / "seed.md").write_text("# Seed\nsown early\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    os.kill(daemon.pid, signal.SIGSTOP)  # it reads no event: the queue fills up
    try:
        (day / "storm.md").write_text("# Storm\nwritten while the queue was full\n")
        other = day / "seed.md"
        for i in range(queued // 2 + 1000):  # alternating names: none coalesces
            os.utime(day / "storm.md", ns=(i, i))
            os.utime(other, ns=(i, i))
        (day / "late.md").write_text("# Late\nits event was dropped\n")
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    wait_status(daemon, lambda s: _watcher(s)["overflows"] == 1, "the overflow counted",
                deadline_s=30.0)
    daemon.call("index.sync", {"agent_id": "w"})
    for word, path in (("storm", "memory/2026-11-12/storm.md"),
                       ("dropped", "memory/2026-11-12/late.md")):
        hits = daemon.call("memory.search", {"agent_id": "w", "query": word})["results"]
        assert [h["path"] for h in hits] == [path]
    verify = daemon.call("index.verify", {"agent_id": "w"})
    assert verify["ok"] is True, verify
