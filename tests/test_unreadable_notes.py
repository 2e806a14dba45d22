"""A real daemon and a note its owner made unreadable (`chmod 000`): it counts as no note,
so it leaves the index, and nothing says the index is behind the disk (status, verify)
while it stays so; once readable again, it is indexed again."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_watcher_roots import _reads_everything
from waits import wait_value, workspace_status

OPEN = "memory/2026-07-01/open.md"
LOCKED = "memory/2026-07-01/locked.md"


def _launcher() -> list[str] | None:
    """A daemon's command line under which it cannot read a file of mode 000: a process
    that can (root) starts it without the privileges that read everything; None when
    there is no way to here."""
    daemon = [sys.executable, "-m", "recalld.daemon.main"]
    if not _reads_everything():
        return daemon
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    drop = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}", *daemon]


def _paths(d: Any, query: str) -> list[str]:
    hits = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": 10,
                                    "sync": True}, timeout=60.0)["results"]
    return sorted(h["path"] for h in hits)


@pytest.mark.skipif(_launcher() is None, reason="no daemon here that cannot read mode 000")
@pytest.mark.timeout(120)
def test_a_note_made_unreadable_leaves_the_index_and_nothing_waits_for_it(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / OPEN).parent.mkdir(parents=True)
    (root / OPEN).write_text("# Open\n\nthe heron nests by the lake\n", encoding="utf-8")
    (root / LOCKED).write_text("# Locked\n\nthe heron keeps a secret\n", encoding="utf-8")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n', launcher=_launcher())
    assert _paths(d, "heron") == [LOCKED, OPEN]
    (root / LOCKED).chmod(0)
    try:
        assert _paths(d, "heron") == [OPEN]
        # Every scan passes it by as the read does: verify finds nothing to catch up on,
        # and health (which verify has scan again) is clean, not pending for ever.
        before = time.time()
        verify = d.call("index.verify", {"agent_id": "w"}, timeout=60.0)
        assert verify["ok"] is True and verify["files_on_disk"] == 1, verify
        health = wait_value(lambda: (workspace_status(d, "w") or {})["health"],
                            lambda h: (h["scanned_at"] or 0) >= before, "a health scan")
        assert health["state"] == "clean", health
    finally:
        (root / LOCKED).chmod(0o644)
    # Readable again (the chmod is an event): indexed again.
    assert _paths(d, "heron") == [LOCKED, OPEN]
    verify = d.call("index.verify", {"agent_id": "w"}, timeout=60.0)
    assert verify["ok"] is True and verify["files_on_disk"] == 2, verify
