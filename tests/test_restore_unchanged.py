"""A restore onto a workspace that holds most of the backup already: the files whose
bytes match are left as they are (only their modification time set back), the others
written."""

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


def test_files_holding_the_backups_bytes_are_not_written_again(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Every file was written under a temp name, fsynced and renamed into place, the ones
    # that already held the backup's bytes too: a restore onto a workspace that changed
    # in a few notes took as long as one onto an empty folder.
    root = tmp_path / "ws"
    write_tree(root, NOTES)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    made = daemon.call("backup.create", {"agents": ["w"]})
    backed_up = tree(root)
    before = {rel: (root / rel).stat() for rel in NOTES}
    touched, same_size, edited, removed, fifo = (
        "memory/2026-03-01/n1.md", "memory/2026-03-02/n2.md", "memory/2026-03-03/n3.md",
        "memory/2026-03-04/n4.md", "memory/2026-03-05/n5.md")
    os.utime(root / touched, ns=(10**18, 10**18))  # its bytes as backed up, not its time
    (root / same_size).write_text(NOTES[same_size].replace("avocet", "Avocet"))
    (root / edited).write_text("# Note 3\nrewritten since\n")
    (root / removed).unlink()
    (root / fifo).unlink()
    os.mkfifo(root / fifo)  # read by no check: the restore must not wait on it

    # The dry run says what the restore then does: it told of every file as written (all
    # but the removed one replacing an existing one), the unchanged ones too.
    (plan,) = daemon.call("backup.restore", {"file": made["file"], "agents": ["w"],
                                             "dry_run": True})["plans"]
    assert tree(root) != backed_up
    result = daemon.call("backup.restore", {"file": made["file"], "agents": ["w"]})
    done = result["restored"][0]
    assert (plan["write"], plan["unchanged"]) == (done["written"], done["unchanged"])
    assert plan["overwrite"] == 3  # the removed one is new; the FIFO is replaced
    assert tree(root) == backed_up
    assert stat.S_ISREG((root / fifo).lstat().st_mode)
    # The four that differed were written; the rest (the other notes, the state files
    # nothing changed) were left in place, the same files.
    assert done["written"] == 4
    assert done["written"] + done["unchanged"] == made["agents"]["w"]["files"]
    for rel, st in before.items():
        now = (root / rel).stat()
        if rel in (same_size, edited):  # written anew beside the file it replaced
            assert now.st_ino != st.st_ino, rel
        elif rel not in (removed, fifo):  # (a file removed since may have its number again)
            assert now.st_ino == st.st_ino, rel
        assert now.st_mtime_ns == st.st_mtime_ns, rel  # as backed up, the touched one too
    # The index serves the restored bytes (the call answers once it caught up).
    found = daemon.call("memory.search", {"agent_id": "w", "query": "avocet shallows 2"})
    assert same_size in [r["path"] for r in found["results"]]
    assert "Avocet" not in (root / same_size).read_text()
