"""A restore the daemon is SIGKILLed in: the next start finishes it from the archive, or
puts the state from before back when the archive is gone, and says which; never a
workspace of files from both."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import DaemonFactory, DaemonHandle
from hooks import start_hook
from test_cli import recalld
from waits import wait_for

from recalld.ipc.errors import RecalldError

# The daemon kills itself (SIGKILL) at the KILL_AT-th call of KILL_STEP of the restore's
# file work: _stage (a file written under its temp name), in_folder (a rename into place,
# a folder's fsync, a removal), unlink_at (a file the backup lacks removed).
KILLING = (
    "import signal",
    "from recalld.daemon import backup_restore",
    "step, at, calls = os.environ['KILL_STEP'], int(os.environ['KILL_AT']), []",
    "real = getattr(backup_restore, step)",
    "def counted(*args, **kwargs):",
    "    calls.append(1)",
    "    if len(calls) == at:",
    "        os.kill(os.getpid(), signal.SIGKILL)",
    "    return real(*args, **kwargs)",
    "setattr(backup_restore, step, counted)",
)


def killing(daemon_factory: DaemonFactory, step: str, at: int, **env: str) -> DaemonHandle:
    """A daemon that kills itself at the ``at``-th call of ``step``."""
    return daemon_factory(**start_hook(daemon_factory.tmp_path, *KILLING),
                          KILL_STEP=step, KILL_AT=str(at), **env)


def notes(root: Path) -> dict[str, str]:
    """Every file of the notes folder (temp files included) and its SHA-256."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "memory").rglob("*")) if p.is_file()}


def killed_restore(daemon_factory: DaemonFactory, tmp_path: Path, step: str, at: int,
                   ) -> tuple[DaemonHandle, Path, str, dict[str, str], dict[str, str]]:
    """A workspace of 200 notes backed up, then changed (half edited, 90 added, in
    another script), and a restore of it killed at ``step``: the daemon, the workspace,
    the archive, the notes as backed up and as they were before the restore."""
    d = killing(daemon_factory, step, at)
    root = tmp_path / "ws"
    (root / "memory" / "deep").mkdir(parents=True)
    for i in range(200):
        folder = "memory/deep" if i % 3 else "memory"
        (root / folder / f"n{i}.md").write_text(f"Le héron {i} attend au bord.\n")
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
        {"role": "user", "content": "backed up: a curlew"}]})
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    backed_up = notes(root)
    for i in range(0, 200, 2):
        folder = "memory/deep" if i % 3 else "memory"
        (root / folder / f"n{i}.md").write_text(f"Цапля {i} ждёт у воды.\n")
    for i in range(90):
        (root / "memory" / f"новая-{i}.md").write_text(f"Новая заметка {i}.\n")
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
        {"role": "user", "content": "since: a dunlin"}]})
    d.call("index.sync", {"agent_id": "w"})
    before = notes(root)
    with pytest.raises((RecalldError, OSError, EOFError)):
        d.call("backup.restore", {"file": archive, "agents": ["w"]})
    d.proc.wait(timeout=60)
    assert notes(root) not in (backed_up, before)  # killed halfway: files of both
    return d, root, archive, backed_up, before


def check_whole(d: DaemonHandle, root: Path, expected: dict[str, str], outcome: str) -> None:
    """Once restarted: the notes are ``expected`` (no temp file left), status and the
    log say ``outcome``, and the index matches the files."""
    assert notes(root) == expected
    recovery = d.call("daemon.status")["restore_recovery"]
    assert recovery["outcome"] == outcome and "w" in recovery["agents"]
    assert f"was {outcome.replace('_', ' ')}" in d.log()
    wait_for(lambda: d.call("index.verify", {"agent_id": "w"})["ok"], "the index verified")


@pytest.mark.parametrize(("step", "at"), [
    ("_stage", 40),  # files written under temp names, none in place yet
    ("in_folder", 30),  # some renamed into place
    ("in_folder", 140),  # renamed, folders being synced
    ("unlink_at", 45),  # half of the files the backup lacks removed
])
def test_a_restore_killed_partway_is_finished_at_the_next_start(
        daemon_factory: DaemonFactory, tmp_path: Path, step: str, at: int) -> None:
    # The workspace held files of the archive and of before, and nothing said so.
    d, root, _, backed_up, _ = killed_restore(daemon_factory, tmp_path, step, at)
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    check_whole(d2, root, backed_up, "finished")
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "a curlew" in pending and "a dunlin" not in pending
    # The rollback point stays: it takes the whole restore back.
    d2.call("backup.rollback")
    assert "a dunlin" in (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    d2.stop()
    d3 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert "restore_recovery" not in d3.call("daemon.status")  # once only


def test_a_restore_killed_partway_without_its_archive_is_rolled_back(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d, root, archive, _, before = killed_restore(daemon_factory, tmp_path, "in_folder", 60)
    Path(archive).unlink()
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    check_whole(d2, root, before, "rolled_back")
    assert d2.call("backup.list")["rollback"] is None  # already rolled back
    checks = json.loads(recalld("doctor", "--json", env=d2.env).stdout)["checks"]
    said = [c for c in checks if c["name"] == "restore"]
    assert [c["status"] for c in said] == ["warn"]
    assert "put back the state from before" in said[0]["detail"]


def test_a_rollback_killed_partway_is_finished_with_the_config_file_it_removes(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A rollback of a restore that put the only config file in place removes that file
    # as it ends: finished at the next start, it has to as well.
    theirs = "[workspace_defaults]\nauto_memory_interval = 3\n"
    d1 = daemon_factory(theirs)
    (tmp_path / "src" / "memory").mkdir(parents=True)
    for i in range(60):
        (tmp_path / "src" / "memory" / f"n{i}.md").write_text(f"Der Reiher {i}.\n")
    d1.call("workspace.open", {"agent_id": "w", "path": str(tmp_path / "src")})
    archive = d1.call("backup.create", {"include_secrets": True})["file"]
    d2 = daemon_factory(None)
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    for i in range(60):
        (root / "memory" / f"n{i}.md").write_text(f"鷺 {i}\n")
    d2.call("workspace.open", {"agent_id": "w", "path": str(root)})
    before = notes(root)
    d2.call("backup.restore", {"file": archive})
    assert d2.config_path.read_text() == theirs
    d2.stop()
    env = {k: d2.env[k] for k in ("XDG_DATA_HOME", "XDG_CONFIG_HOME")}
    d3 = killing(daemon_factory, "in_folder", 20, **env)
    with pytest.raises((RecalldError, OSError, EOFError)):
        d3.call("backup.rollback")
    d3.proc.wait(timeout=60)
    assert notes(root) != before
    d4 = daemon_factory(**env)
    check_whole(d4, root, before, "finished")
    assert d4.call("daemon.status")["restore_recovery"]["interrupted"] == "rollback"
    assert not d4.config_path.exists()
    assert d4.call("backup.list")["rollback"] is None


def test_a_restore_killed_with_neither_archive_nor_snapshot_is_said_unresolved(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d, _, archive, _, _ = killed_restore(daemon_factory, tmp_path, "in_folder", 60)
    for made in (Path(archive), *(d.data_dir / "backups").glob("pre-restore-*.zip")):
        made.unlink()
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    recovery = d2.call("daemon.status")["restore_recovery"]
    assert recovery["outcome"] == "unresolved" and recovery["rollback_error"]
    checks = json.loads(recalld("doctor", "--json", env=d2.env).stdout)["checks"]
    assert [c["status"] for c in checks if c["name"] == "restore"] == ["fail"]
    d2.stop()
    kept = (d2.data_dir / "backups" / "restore-unresolved.json").read_bytes()
    # Said at every start (it was said once, then forgotten) until it is resolved: by
    # a restore of those workspaces that ends, or by the operator removing its record.
    for end in ("a restore", "the record removed"):
        d3 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
        recovery = d3.call("daemon.status")["restore_recovery"]
        assert recovery["outcome"] == "unresolved" and recovery["agents"] == ["w"]
        record = d3.data_dir / "backups" / "restore-unresolved.json"
        assert str(record) in recovery["acknowledge"]
        checks = json.loads(recalld("doctor", "--json", env=d3.env).stdout)["checks"]
        said = [c for c in checks if c["name"] == "restore"]
        assert [c["status"] for c in said] == ["fail"] and str(record) in said[0]["fix"]
        shown = recalld("status", env=d3.env).stdout
        assert "[FAIL] the restore of w from" in shown and str(record) in shown
        if end == "a restore":
            made = d3.call("backup.create", {"agents": ["w"]})["file"]
            d3.call("backup.restore", {"file": made, "agents": ["w"], "snapshot": False})
            assert "restore_recovery" not in d3.call("daemon.status")
            d3.stop()
            d4 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
            assert "restore_recovery" not in d4.call("daemon.status")
            d4.stop()
            record.write_bytes(kept)  # unresolved again, for the other way
        else:
            record.unlink()
            assert "restore_recovery" not in d3.call("daemon.status")  # at once
            d3.stop()
    d5 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert "restore_recovery" not in d5.call("daemon.status")
