"""What a restore leaves in the workspace's files: notes come back with a note's mode,
state files private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from conftest import DaemonHandle
from test_backup import tree, write_tree

NOTES = {
    f"memory/2026-03-0{i}/n{i}.md": f"# Note {i}\nThe avocet sweeps the shallows, {i}.\n"
    for i in range(1, 7)
}
NOTES["digest/waders/avocet.md"] = "Avocets nest on open mud near the water.\n"


def _umask() -> int:
    """The process's umask (the daemon inherits it), read without changing it."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("Umask:")), 8)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_restored_notes_get_a_notes_mode_and_state_files_stay_private(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Every restored file was written 0600: a note its user had made readable (0644, or
    # 0640 for a group) became private, and a note made anew was too.
    root = tmp_path / "ws"
    write_tree(root, NOTES)
    grouped, private, plain, new = (
        "memory/2026-03-01/n1.md", "memory/2026-03-02/n2.md", "memory/2026-03-03/n3.md",
        "memory/2026-03-04/n4.md")
    os.chmod(root / grouped, 0o640)
    os.chmod(root / private, 0o600)
    os.chmod(root / plain, 0o644)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
        {"role": "user", "content": "the stilt has long pink legs"}]})
    made = daemon.call("backup.create", {"agents": ["w"]})
    daemon.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": [
        {"role": "user", "content": "after the backup: a redshank calls"}]})
    for rel in (grouped, private, plain):
        (root / rel).write_text("# changed since the backup\n")
    (root / new).unlink()
    (root / "digest" / "waders" / "avocet.md").unlink()

    daemon.call("backup.restore", {"file": made["file"], "agents": ["w"]})
    note_mode = 0o644 & ~_umask()
    assert _mode(root / grouped) == 0o640 & ~_umask()
    assert _mode(root / private) == 0o600
    assert _mode(root / plain) == note_mode
    assert _mode(root / new) == note_mode
    assert _mode(root / "digest" / "waders" / "avocet.md") == note_mode
    states = [p for p in (root / "mem_metadata").rglob("*") if p.is_file()
              and p.relative_to(root / "mem_metadata").parts[0] in ("sessions", "inbox")]
    assert states, "the backup holds state files"
    assert {p.name: _mode(p) for p in states} == {p.name: 0o600 for p in states}
    assert tree(root)[grouped] == NOTES[grouped].encode()
