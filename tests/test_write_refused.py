"""Note writes the file system refuses (read-only, no permission), as a client and an
operator meet them: a real daemon whose notes folder is made a read-only mount of its
own (a bind mount: root only, else skipped)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import DaemonFactory, DaemonHandle
from test_cli import recalld

from recalld.ipc.errors import FILE_SYSTEM_REFUSED, FileSystemRefused

Mount = Callable[[Path, str], None]


@pytest.fixture
def bind_mount() -> Iterator[Mount]:
    """``bind_mount(folder, "ro"|"rw")``: ``folder`` made a mount of its own, read-only or
    writable; each unmounted afterwards (skips where mounting is not allowed)."""
    made: list[Path] = []

    def mount(folder: Path, how: str) -> None:
        if folder not in made:
            done = subprocess.run(["mount", "--bind", str(folder), str(folder)],
                                  capture_output=True, check=False)
            if done.returncode != 0:
                pytest.skip("cannot bind-mount a folder here (needs root)")
            made.append(folder)
        done = subprocess.run(["mount", "-o", f"remount,bind,{how}", str(folder)],
                              capture_output=True, check=False)
        assert done.returncode == 0, done.stderr

    yield mount
    for folder in reversed(made):
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_note_a_read_only_file_system_refuses_is_not_an_internal_error(
        daemon_factory: DaemonFactory, bind_mount: Mount, tmp_path: Path) -> None:
    # It came back as -32603 "I/O error on ...": a fault of the daemon, to the client,
    # where the file system had refused the write and remounting it is the fix.
    d = daemon_factory()
    ws = tmp_path / "ws"
    d.call("workspace.open", {"agent_id": "plover", "path": str(ws)})
    d.call("memory.add_note", {"agent_id": "plover", "content": "plovers run and stop"})
    bind_mount(ws / "memory", "ro")
    with pytest.raises(FileSystemRefused) as refused:
        d.call("memory.add_note", {"agent_id": "plover", "content": "ржанка бежит и замирает"})
    assert refused.value.code == FILE_SYSTEM_REFUSED == -32013
    assert refused.value.data["errno"] == "EROFS", refused.value.data
    assert refused.value.data["path"] == "agent-notes.md", refused.value.data
    assert "Read-only file system" in refused.value.message, refused.value.message
    assert str(tmp_path) not in refused.value.message
    cli = recalld("note", "--agent", "plover", "鸻 stops and runs", env=d.env)
    assert cli.returncode == 1 and cli.stderr.endswith("(code -32013)\n"), cli
    assert d.stop() == 0


def _write_errors(d: DaemonHandle, agent: str) -> list[dict[str, object]]:
    status = d.call("daemon.status")
    health = next(w["health"] for w in status["workspaces"] if w["agent_id"] == agent)
    return list(health["write_errors"])


def test_a_write_on_another_file_system_leaves_a_refused_one_shown(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A day's folder that is a file system of its own, read-only: its notes refused,
    # then a topic written in the digest folder (another file system) took the failure
    # off status, though the day's notes kept failing.
    d = daemon_factory()
    ws = tmp_path / "ws"
    d.call("workspace.open", {"agent_id": "dunlin", "path": str(ws)})
    first = d.call("memory.add_note", {"agent_id": "dunlin", "content": "dunlins wheel"})
    day = ws / first["path"].rpartition("/")[0]
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(day)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a file system here (needs root)")
    try:
        with pytest.raises(FileSystemRefused):
            d.call("memory.add_note", {"agent_id": "dunlin", "content": "чернозобик кружит"})
        [failing] = _write_errors(d, "dunlin")
        assert failing["errno"] == "EROFS", failing
        d.call("memory.topic_write", {"agent_id": "dunlin", "path": "digest/dunlin.md",
                                      "name": "Dunlin", "description": "a small wader",
                                      "type": "reference", "body": "黑腹滨鹬 flocks"})
        assert [f["errno"] for f in _write_errors(d, "dunlin")] == ["EROFS"]
    finally:
        subprocess.run(["umount", "-l", str(day)], check=False)
    d.call("memory.add_note", {"agent_id": "dunlin", "content": "the dunlins are back"})
    assert _write_errors(d, "dunlin") == []
    assert d.stop() == 0


def test_a_note_refused_for_lack_of_permission_says_which(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # An immutable day folder (chattr +i) refuses even root: EPERM, not an internal error.
    d = daemon_factory()
    ws = tmp_path / "ws"
    d.call("workspace.open", {"agent_id": "avocet", "path": str(ws)})
    first = d.call("memory.add_note", {"agent_id": "avocet", "content": "avocets sweep"})
    day = ws / first["path"].rpartition("/")[0]
    if subprocess.run(["chattr", "+i", str(day)], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("cannot make a folder immutable here")
    try:
        with pytest.raises(FileSystemRefused) as refused:
            d.call("memory.add_note", {"agent_id": "avocet", "content": "säbelschnäbler"})
        assert refused.value.data["errno"] == "EPERM", refused.value.data
        assert "Operation not permitted" in refused.value.message, refused.value.message
        [failing] = _write_errors(d, "avocet")
        assert failing["errno"] == "EPERM", failing
    finally:
        subprocess.run(["chattr", "-i", str(day)], check=False)
    d.call("memory.add_note", {"agent_id": "avocet", "content": "the avocets are back"})
    assert _write_errors(d, "avocet") == []
    assert d.stop() == 0


def test_status_says_a_workspace_turned_read_only_before_a_note_is_refused(
        daemon_factory: DaemonFactory, bind_mount: Mount, tmp_path: Path) -> None:
    # A file system remounted read-only under an open workspace (errors=remount-ro, say)
    # left status OK until a note was refused; after a restart, until one was tried.
    d = daemon_factory()
    ws = tmp_path / "ws"
    d.call("workspace.open", {"agent_id": "stint", "path": str(ws)})
    bind_mount(ws, "ro")
    [shut] = [disk for disk in d.call("daemon.status")["disks"] if disk["level"] != "ok"]
    assert shut["path"] == str(ws) and shut["read_only"] and shut["level"] == "fail", shut
    shown = recalld("status", env=d.env).stdout
    [line] = [ln for ln in shown.splitlines() if "read-only" in ln]
    assert line == f"  [FAIL] the file system of {ws} (workspace stint) is read-only", line
    assert f"fix: remount the file system of {ws} read-write" in shown, shown
    bind_mount(ws, "rw")
    assert not any(disk["read_only"] for disk in d.call("daemon.status")["disks"])
    assert d.stop() == 0


def test_status_says_a_notes_folder_mounted_read_only_apart(
        daemon_factory: DaemonFactory, bind_mount: Mount, tmp_path: Path) -> None:
    # The workspace's folder writable, its notes folder a read-only mount of its own:
    # status measured the workspace's folder only, and said OK.
    d = daemon_factory()
    ws = tmp_path / "ws"
    d.call("workspace.open", {"agent_id": "ruff", "path": str(ws)})
    bind_mount(ws / "memory", "ro")
    [shut] = [disk for disk in d.call("daemon.status")["disks"] if disk["read_only"]]
    assert shut["path"] == str(ws / "memory") and shut["holds"] == ["workspace ruff"], shut
    assert d.stop() == 0
