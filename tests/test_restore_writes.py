"""Calls that write to a workspace while a backup restore replaces its files: each waits
for the restore and lands on the restored files, none is refused or lost."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import pytest
from clirun import run_recalld
from conftest import DaemonFactory
from hooks import start_hook
from waits import CallsInThreads, wait_for

# The restore stops at PAUSE_AT (once it first planned the files, after its snapshot is
# recorded, or once it closed the workspace and is about to write its files) until the
# test opens the FIFO RESTORE_PAUSE (the names ops_methods calls them by are patched).
PAUSING = (
    "from recalld.daemon.rpc import ops_methods",
    "def pausing(fn):",
    "    def paused(*args, **kwargs):",
    "        with open(os.environ['RESTORE_PAUSE'], 'rb') as fifo:",
    "            fifo.read()",
    "        return fn(*args, **kwargs)",
    "    return paused",
    "if os.environ['PAUSE_AT'] == 'snapshot':",
    "    ops_methods.prune_snapshots = pausing(ops_methods.prune_snapshots)",
    "elif os.environ['PAUSE_AT'] == 'planned':",
    "    plan, calls = ops_methods.plan_restore, []",
    "    def planned(*args, **kwargs):",
    "        done = plan(*args, **kwargs)",
    "        calls.append(1)",
    "        return pausing(lambda: done)() if len(calls) == 1 else done",
    "    ops_methods.plan_restore = planned",
    "else:",
    "    ops_methods.apply_restore = pausing(ops_methods.apply_restore)",
)

WRITES: dict[str, tuple[str, dict[str, Any]]] = {
    "note": ("memory.add_note", {"agent_id": "w", "content": "during the restore: the ruff"}),
    "turns": ("memory.add_turns", {"agent_id": "w", "session_id": "s2", "messages": [
        {"role": "user", "content": "during the restore: a dunlin on the mudflat"}]}),
    "topic": ("memory.topic_write", {
        "agent_id": "w", "path": "waders.md", "name": "waders", "description": "shore birds",
        "type": "user", "body": "The whimbrel passes in May."}),
    "ack": ("inbox.ack", {"agent_id": "w", "ids": ["no-such-item"]}),
    # Not a write of notes, but it commits a generation of the index the restore replaces.
    "compact": ("index.compact", {"agent_id": "w"}),
}


@pytest.mark.parametrize("pause_at", ["snapshot", "closed"])
def test_writes_during_a_restore_wait_for_it_and_are_kept(
        daemon_factory: DaemonFactory, tmp_path: Path, pause_at: str) -> None:
    # After the snapshot, turns were acknowledged and then replaced with the backup's
    # pending log (in neither); once the restore closed the workspace, every write was
    # refused with "a restore is replacing its files".
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    d = daemon_factory(**start_hook(tmp_path, *PAUSING),
                       RESTORE_PAUSE=str(fifo), PAUSE_AT=pause_at)
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "a.md").write_text("The heron stood in the reeds.\n")
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
        {"role": "user", "content": "backed up: a curlew"}]})  # the restore closes it
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    calls = CallsInThreads(d)
    results = calls.results
    calls.start("restore", "backup.restore", {"file": archive, "agents": ["w"]})
    if pause_at == "snapshot":
        wait_for((d.data_dir / "backups" / "rollback.json").exists, "the snapshot recorded")
    else:
        wait_for(lambda: [w["state"] for w in d.call("workspace.list")["workspaces"]
                          if w["agent_id"] == "w"] == ["closed"],
                 "the workspace closed by the restore")
    try:
        for key, write in WRITES.items():
            calls.start(key, *write)
        # The restore, the writes and the status call of the check in flight.
        wait_for(calls.answered_or_waiting(2 + len(WRITES)), "the writes answered or waiting")
        assert not results, results  # neither refused nor acknowledged before the end
    finally:
        with open(fifo, "wb"):
            pass
        calls.join()
    assert all(isinstance(r, dict) for r in results.values()), results
    assert results["turns"]["added_messages"] == 1
    assert results["compact"]["agent_id"] == "w"
    pending = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "a dunlin" in pending and "a curlew" in pending
    with zipfile.ZipFile(results["restore"]["snapshot"]) as zf:
        assert not any(b"dunlin" in zf.read(n) for n in zf.namelist())
    note = (root / results["note"]["path"]).read_text()
    assert "the ruff" in note
    assert "whimbrel" in (root / results["topic"]["path"]).read_text()
    # Written through the workspace open after the restore: searchable at the answer.
    found = d.call("memory.search", {"agent_id": "w", "query": "whimbrel"})["results"]
    assert [r["path"] for r in found] == [results["topic"]["path"]]


def test_a_note_written_as_a_restore_plans_is_in_its_snapshot_and_not_kept(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A note acknowledged after the restore planned its files and before the daemon's
    # writes waited for it went into the snapshot but was not removed: the restored
    # workspace held a note its backup lacks (and a job's node written so stayed too).
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    d = daemon_factory(**start_hook(tmp_path, *PAUSING),
                       RESTORE_PAUSE=str(fifo), PAUSE_AT="planned")
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "a.md").write_text("Der Reiher stand im Schilf.\n")
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    calls = CallsInThreads(d)
    calls.start("restore", "backup.restore", {"file": archive, "agents": ["w"]})
    try:
        # Opened once the restore waits at its pause: it goes on when this is closed.
        with open(fifo, "wb"):
            late = d.call("memory.add_note", {"agent_id": "w", "content": "Ein Kiebitz ruft."})
    finally:
        calls.join()
    result = calls.results["restore"]
    assert result["restored"][0]["removed"] == 1, result
    assert not (root / late["path"]).exists()
    with zipfile.ZipFile(result["snapshot"]) as zf:
        assert "Kiebitz" in zf.read(f"agents/w/{late['path']}").decode()
    assert d.call("memory.search", {"agent_id": "w", "query": "Kiebitz"})["results"] == []
    rolled = d.call("backup.rollback")
    assert "Kiebitz" in (root / late["path"]).read_text(), rolled


def test_status_says_a_workspace_is_being_restored(daemon_factory: DaemonFactory,
                                                   tmp_path: Path) -> None:
    # While a restore replaced its files, the workspace was listed as closed, as if
    # someone had closed it, and `recalld status` said no more than "not open (closed)".
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    d = daemon_factory(**start_hook(tmp_path, *PAUSING),
                       RESTORE_PAUSE=str(fifo), PAUSE_AT="closed")
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "a.md").write_text("Der Reiher stand im Schilf.\n")
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
        {"role": "user", "content": "ein Brachvogel"}]})  # so the restore closes it
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    calls = CallsInThreads(d)
    calls.start("restore", "backup.restore", {"file": archive, "agents": ["w"]})
    try:
        # Opened once the restore waits at its pause, with the workspace closed.
        with open(fifo, "wb"):
            listed = [w for w in d.call("workspace.list")["workspaces"] if w["agent_id"] == "w"]
            assert [(w["state"], w.get("why")) for w in listed] == [
                ("closed", "a restore is replacing its files")], listed
            shown = run_recalld(["--socket", str(d.socket_path), "status"], env=d.env).stdout
            assert "now: a restore is replacing its files" in shown, shown
    finally:
        calls.join()
    assert calls.results["restore"]["restored"][0]["agent_id"] == "w"
    listed = [w for w in d.call("workspace.list")["workspaces"] if w["agent_id"] == "w"]
    assert [(w["state"], w.get("why")) for w in listed] == [("ready", None)], listed
