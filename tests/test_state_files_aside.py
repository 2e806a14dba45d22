"""The daemon's own state files set aside at a start because they did not verify: named
in status, with what to do for that file, until the copy is removed."""

from __future__ import annotations

from conftest import DaemonFactory
from test_cli import recalld


def test_a_scheduler_record_set_aside_is_shown_until_its_copy_is_removed(
        daemon_factory: DaemonFactory) -> None:
    d = daemon_factory()
    assert d.stop() == 0
    state = d.data_dir / "state"
    (state / "scheduler.json").write_bytes(b'{"version": 2, "entries": {"x/au')  # torn
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    (aside,) = state.glob("scheduler.json.corrupt-*")
    assert d2.call("daemon.status")["queues"]["state_files"]["set_aside"] == [str(aside)]
    shown = recalld("status", env=d2.env).stdout
    assert f"{aside} is a copy of a state file that did not verify" in shown
    # What fits this file: no workspaces to open again, unlike workspaces.json.
    assert "the scheduler started afresh" in shown
    assert "workspace open" not in shown.split(str(aside), 1)[1].split("\n\n", 1)[0]
    aside.unlink()
    assert d2.call("daemon.status")["queues"]["state_files"]["set_aside"] == []
    assert str(aside) not in recalld("status", env=d2.env).stdout


def test_a_workspace_record_set_aside_is_shown_until_its_copy_is_removed(
        daemon_factory: DaemonFactory) -> None:
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "kept"})
    assert d.stop() == 0
    record = d.data_dir / "state" / "workspaces.json"
    record.write_bytes(record.read_bytes().replace(b'"kept"', b'"kepT"', 1))
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    aside = record.with_name("workspaces.json.corrupt")
    assert d2.call("daemon.status")["queues"]["state_files"]["set_aside"] == [str(aside)]
    assert "recalld workspace open AGENT --path PATH" in recalld("status", env=d2.env).stdout
    aside.unlink()
    assert d2.call("daemon.status")["queues"]["state_files"]["set_aside"] == []
