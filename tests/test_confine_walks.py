"""What an open workspace's start looks at below its folder without a state file's checks
(the removal of a killed write's temp files, the count of set-aside turns, the owner
named in its lock file) goes through its folders' handles and waits on nothing: a link in
place of one of its folders leads nothing into another folder, and a FIFO where a file
is expected holds neither the start nor a status call."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from waits import workspace_status

from recalld.ipc import errors

TEMP = ".dialog.jsonl.tmp-0123456789ab"  # named as an interrupted publish of the daemon's
QUARANTINE = "mem_metadata/sessions/pending.quarantine.jsonl"


def test_a_link_in_place_of_the_session_folder_removes_nothing_elsewhere(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Another folder (another agent's sessions, say) with temp files older than bob's
    # open: bob's start removed them through its linked mem_session/, and served on.
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "deeper").mkdir(parents=True)
    for temp in (elsewhere / TEMP, elsewhere / "deeper" / TEMP):
        temp.write_text("a write under way there\n")
    bob = tmp_path / "bob"
    bob.mkdir()
    (bob / "mem_session").symlink_to(elsewhere)
    d = daemon_factory(None)
    with pytest.raises(errors.PathOutsideWorkspace, match="mem_session is a symbolic link"):
        d.call("workspace.open", {"agent_id": "bob", "path": str(bob)})
    assert (elsewhere / TEMP).exists() and (elsewhere / "deeper" / TEMP).exists()
    ws = next(w for w in d.call("workspace.list")["workspaces"] if w["agent_id"] == "bob")
    assert ws["state"] == "failed" and "mem_session is a symbolic link" in ws["error"], ws
    # Put back, bob opens.
    (bob / "mem_session").unlink()
    (bob / "mem_session").mkdir()
    assert d.call("workspace.open", {"agent_id": "bob"})["state"] == "ready"
    assert "Traceback" not in d.log()


def test_a_fifo_or_a_link_in_place_of_the_quarantine_file_holds_nothing(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A FIFO named like the file of set-aside turns held bob's sessions store as it
    # counted them, and with it bob's start, every call waiting for it (a status among
    # them) and the daemon's stop; a link there counted another file's lines.
    bob, carol = tmp_path / "bob", tmp_path / "carol"
    for root in (bob, carol):
        (root / "mem_metadata" / "sessions").mkdir(parents=True)
    os.mkfifo(bob / QUARANTINE)
    (tmp_path / "elsewhere.jsonl").write_text('{"a": 1}\n{"b": 2}\n')
    (carol / QUARANTINE).symlink_to(tmp_path / "elsewhere.jsonl")
    d = daemon_factory("".join(f'[workspaces.{a}]\npath = "{tmp_path / a}"\n'
                               for a in ("bob", "carol")))
    for agent in ("bob", "carol"):
        sessions = workspace_status(d, agent)["sessions"]
        assert sessions["quarantined_records"] == 0, sessions
        assert f"{tmp_path / agent / QUARANTINE}: not a regular file" in d.log()
    assert d.call("memory.add_turns", {"agent_id": "bob", "session_id": "s", "messages": [
        {"role": "user", "content": "the heron came back"}]})["pending_messages"] == 1
    assert d.stop() == 0


def test_damaged_turns_are_set_aside_in_a_file_not_in_a_fifo(
        daemon_factory: Any, tmp_path: Path) -> None:
    # The damaged pieces of the pending-turns log were appended to a FIFO in place of the
    # quarantine file: lost once it closed, and past a pipe's buffer the start held.
    bob = tmp_path / "bob"
    (bob / "mem_metadata" / "sessions").mkdir(parents=True)
    garbage = b"".join(b"%06d not a record of the log, a line of damage\n" % i
                       for i in range(2000))
    (bob / "mem_metadata" / "sessions" / "pending.jsonl").write_bytes(garbage)
    os.mkfifo(bob / QUARANTINE)
    d = daemon_factory(f'[workspaces.bob]\npath = "{bob}"\n')
    sessions = workspace_status(d, "bob")["sessions"]
    assert sessions["quarantined_records"] == 1, sessions  # one garbled piece
    (line,) = (bob / QUARANTINE).read_bytes().splitlines()
    piece = orjson.loads(line.split(b" ", 1)[1])  # after its checksum
    assert base64.b64decode(piece["raw_b64"]) == garbage
    aside = [p.name for p in (bob / "mem_metadata" / "sessions").iterdir()
             if p.name.startswith("pending.quarantine.jsonl.corrupt-")]
    assert len(aside) == 1 and (bob / QUARANTINE).is_file(), aside
    assert d.stop() == 0
