"""A backup of a closed workspace: while it reads the files, the workspace is held shut,
and a call that names it hears why (a backup, not a restore)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import DaemonFactory
from hooks import start_hook
from test_backup import NOTES, write_tree
from waits import CallsInThreads, wait_for

from recalld.ipc.errors import UnknownWorkspace

# The archive's writing stops until the test opens the FIFO BACKUP_PAUSE; BACKUP_REACHED
# is made once it got there.
PAUSING = (
    "from pathlib import Path",
    "from recalld.daemon import backup",
    "def pausing(fn):",
    "    def paused(*args, **kwargs):",
    "        Path(os.environ['BACKUP_REACHED']).touch()",
    "        with open(os.environ['BACKUP_PAUSE'], 'rb') as fifo:",
    "            fifo.read()",
    "        return fn(*args, **kwargs)",
    "    return paused",
    "backup.create_backup = pausing(backup.create_backup)",
)


def test_a_call_during_a_backup_of_a_closed_workspace_hears_of_the_backup(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    fifo, reached = tmp_path / "pause", tmp_path / "reached"
    os.mkfifo(fifo)
    d = daemon_factory(**start_hook(tmp_path, *PAUSING),
                       BACKUP_PAUSE=str(fifo), BACKUP_REACHED=str(reached))
    root = tmp_path / "ws"
    write_tree(root, NOTES)
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("workspace.close", {"agent_id": "w"})
    calls = CallsInThreads(d)
    calls.start("backup", "backup.create", {"agents": ["w"]})
    try:
        wait_for(reached.exists, "the backup writing the closed workspace's archive")
        with pytest.raises(UnknownWorkspace) as caught:
            d.call("memory.search", {"agent_id": "w", "query": "train"})
        assert caught.value.message == (
            "workspace 'w' is not open: a backup is reading its files (it opens once written)")
    finally:
        with open(fifo, "wb"):
            pass
        calls.join()
    assert calls.results["backup"]["agents"]["w"]["files"] >= len(NOTES)  # and resumables
    with pytest.raises(UnknownWorkspace, match=r"^workspace 'w' is not open$"):
        d.call("memory.search", {"agent_id": "w", "query": "train"})
