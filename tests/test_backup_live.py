"""Restores while agents use the daemon, and restores into workspaces that changed shape."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import DaemonHandle

from recalld.ipc.errors import InvalidParams, RecalldError


def _notes(root: Path, count: int) -> None:
    folder = root / "memory" / "2026-01-01"
    folder.mkdir(parents=True)
    for i in range(count):
        (folder / f"n{i}.md").write_text(f"Note {i} about the heron at pond {i}.\n")


def test_an_agent_reopening_during_a_restore_gets_the_restored_turns(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The restore closes the workspace to replace its pending turns; an agent that opens
    # it again meanwhile must get it once the files are in place, or it serves the turns
    # the restore replaced and appends new ones to the replaced (unlinked) log.
    root = tmp_path / "ws"
    _notes(root, 200)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    archive = daemon.call("backup.create", {"agents": ["w"]})["file"]  # no pending turns
    turn = {"agent_id": "w", "session_id": "s1",
            "messages": [{"role": "user", "content": "the kingfisher came back"}]}
    assert daemon.call("memory.add_turns", turn)["pending_messages"] == 1
    stop = threading.Event()
    opened: list[int] = []

    def agent() -> None:
        conn = daemon.connect()
        try:
            while not stop.is_set():
                try:
                    conn.call("workspace.open", {"agent_id": "w", "path": str(root)})
                    opened.append(1)
                except RecalldError:
                    pass
        finally:
            conn.close()

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        daemon.call("backup.restore", {"file": archive, "agents": ["w"]})
    finally:
        stop.set()
        thread.join()
    assert opened
    status = daemon.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")
    assert ws["sessions"]["pending_messages"] == 0, ws["sessions"]
    turn["messages"] = [{"role": "user", "content": "a grey wagtail today"}]
    assert daemon.call("memory.add_turns", turn)["pending_messages"] == 1
    log = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "grey wagtail" in log and "kingfisher" not in log


def test_a_workspace_whose_real_path_is_not_utf8_is_refused_and_backups_go_on(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A UTF-8 path whose symlink leads to a folder named in Latin-1: the workspace record,
    # status and backups cannot hold the resolved path. Opened anyway, it broke every
    # workspace.list, daemon.status and backup.create with an internal error.
    real = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    _notes(real, 1)
    link = tmp_path / "cafe"
    link.symlink_to(real)
    with pytest.raises(InvalidParams, match=r"caf\\xe9 has a path that is not valid UTF-8"):
        daemon.call("workspace.open", {"agent_id": "latin", "path": str(link)})
    listed = daemon.call("workspace.list")["workspaces"]
    assert "latin" not in [w["agent_id"] for w in listed]
    assert daemon.call("daemon.status")["workspaces"]
    made = daemon.call("backup.create")
    assert "latin" not in made["agents"] and made["agents"]
