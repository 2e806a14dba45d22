"""A workspace folder moved away while the daemon serves it: health, ``recalld status``
and ``recalld doctor`` name the folder as missing and the fix that helps, and the
workspace is clean again once the folder is back. A real daemon, real folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clirun import run_recalld
from conftest import DaemonFactory
from waits import wait_value

NOTE = "memory/2026-03-04/trip.md"


def _health(d: Any) -> dict[str, Any]:
    status = d.call("daemon.status", timeout=30.0)
    return dict(next(w for w in status["workspaces"] if w["agent_id"] == "w")["health"])


def test_a_folder_moved_away_is_named_with_its_fix_and_served_again_once_back(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The folder moved away while open showed as damaged index files ("changed on disk:
    # missing") and a failing save, whose fixes (free disk space, recalld compact) do not
    # help: compact fails the same way, and nothing said the folder was gone.
    root = tmp_path / "ws"
    (root / NOTE).parent.mkdir(parents=True)
    (root / NOTE).write_text("# Trip\nthe ferry to Hiddensee leaves at nine\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"}, timeout=60.0)
    wait_value(lambda: _health(d), lambda h: h["state"] == "clean", "health clean")

    root.rename(tmp_path / "moved")
    health = wait_value(lambda: _health(d), lambda h: h["state"] == "degraded",
                        "health degraded")
    reasons = health["reasons"]
    assert reasons[0].startswith("the workspace folder is missing"), reasons
    assert not any(r.startswith(("index file ", "saving the index fails")) for r in reasons)
    for command in ("status", "doctor"):
        shown = run_recalld([command], env=d.env, timeout=60).stdout
        assert "index degraded: the workspace folder is missing" in shown, (command, shown)
        fix = shown.split("index degraded: the workspace folder is missing", 1)[1]
        fix = fix.splitlines()[1]
        assert "put the folder back" in fix and "recalld workspace close w" in fix, fix
        assert "compact" not in fix and "free disk" not in fix, fix

    (tmp_path / "moved").rename(root)
    (root / "memory" / "2026-03-05").mkdir()
    (root / "memory" / "2026-03-05" / "back.md").write_text("# Back\nplover\n")

    def synced() -> dict[str, Any]:
        d.call("index.sync", {"agent_id": "w"}, timeout=60.0)
        return _health(d)
    wait_value(synced, lambda h: h["state"] == "clean", "health clean once the folder is back")
    assert d.call("memory.search", {"agent_id": "w", "query": "plover"})["results"]
