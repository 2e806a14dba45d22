"""Fault and path containment seen from outside: a real daemon, a real socket, real files.

A workspace that cannot open at start is ``failed`` with its reason while the daemon serves
the others.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import DaemonFactory

from recalld.ipc.client import Client

SCRIPT = Path(sys.executable).parent / "recalld"


def recalld(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)


def test_a_workspace_that_cannot_open_at_start_fails_alone(daemon_factory: DaemonFactory,
                                                           tmp_path: Path) -> None:
    # A path on a "disk" that is not there: its parent is a plain file, so nothing can be
    # created below it (as on an unmounted mount point made read-only).
    (tmp_path / "unmounted").write_text("not a directory\n", encoding="utf-8")
    gone = tmp_path / "unmounted" / "ws"
    lockdir = tmp_path / "lockdir"
    (lockdir / "mem_metadata" / "recalld.lock").mkdir(parents=True)
    indexfile = tmp_path / "indexfile"
    (indexfile / "mem_metadata").mkdir(parents=True)
    (indexfile / "mem_metadata" / "index").write_text("garbage\n", encoding="utf-8")
    good = tmp_path / "good"
    (good / "memory").mkdir(parents=True)
    (good / "memory" / "facts.md").write_text(
        "# Facts\n\nThe quokka ledger is kept in the blue binder.\n", encoding="utf-8")
    config = "".join(f'[workspaces.{name}]\npath = "{path}"\n\n' for name, path in (
        ("gone", gone), ("lockdir", lockdir), ("indexfile", indexfile), ("good", good)))

    daemon = daemon_factory(config)  # waits until it answers: it did not exit
    status = daemon.call("daemon.status")
    states = {w["agent_id"]: w for w in status["workspaces"]}
    assert states["good"]["state"] == "ready"
    assert states["default"]["state"] == "ready"
    for name in ("gone", "lockdir", "indexfile"):
        assert states[name]["state"] == "failed", states[name]
        assert states[name]["error"], states[name]
    with Client(daemon.socket_path) as c:
        hits = c.search("good", "quokka ledger", sync=True).results
    assert any("blue binder" in h.text for h in hits)

    shown = recalld("status", env=daemon.env)
    assert shown.returncode == 0, shown.stderr
    for name in ("gone", "lockdir", "indexfile"):
        line = next(x for x in shown.stdout.splitlines() if name in x)
        assert "failed" in line, shown.stdout
    doctor = recalld("doctor", "--json", env=daemon.env)
    checks = json.loads(doctor.stdout)["checks"]
    failing = {c["name"] for c in checks if c["status"] == "fail"}
    assert {"workspace gone", "workspace lockdir", "workspace indexfile"} <= failing, checks
    assert daemon.stop() == 0
