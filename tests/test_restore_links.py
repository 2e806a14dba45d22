"""A link put in place of a workspace folder while a restore writes its files: no file
lands where the link leads."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DaemonFactory
from hooks import start_hook

from recalld.ipc.errors import PathOutsideWorkspace

# Start hook: just before the restore writes the member named SWAP_MEMBER (its target checked),
# SWAP_FOLDER is moved to SWAP_AWAY and a link to SWAP_TO takes its place, as another
# program could at that moment.
SWAPPING = "\n".join([
    "import os",
    "from recalld.daemon import backup_restore",
    "stage = backup_restore._stage",
    "def swapped(zf, member, *args, **kwargs):",
    "    folder = os.environ['SWAP_FOLDER']",
    "    if member == os.environ['SWAP_MEMBER'] and not os.path.islink(folder):",
    "        os.rename(folder, os.environ['SWAP_AWAY'])",
    "        os.symlink(os.environ['SWAP_TO'], folder)",
    "    return stage(zf, member, *args, **kwargs)",
    "backup_restore._stage = swapped"])


@pytest.mark.parametrize("swapped", ["memory/2026-01-01", "memory"])
def test_a_link_swapped_in_while_a_restore_writes_is_not_followed(
        daemon_factory: DaemonFactory, tmp_path: Path, swapped: str) -> None:
    # Each target was checked for links by its path and then written by its path: a
    # folder swapped for a link in between had the file written where the link led
    # (another agent's memory, a system folder).
    root, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    (root / "memory" / "2026-01-01").mkdir(parents=True)
    (root / "memory" / "2026-01-01" / "a.md").write_text("The heron fished at dawn.\n")
    d = daemon_factory(**start_hook(tmp_path, SWAPPING), SWAP_FOLDER=str(root / swapped),
                       SWAP_AWAY=str(tmp_path / "moved"), SWAP_TO=str(outside),
                       SWAP_MEMBER="agents/w/memory/2026-01-01/a.md")
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    with pytest.raises(PathOutsideWorkspace, match="symbolic link"):
        d.call("backup.restore", {"file": archive, "agents": ["w"]})
    assert sorted(p.name for p in outside.rglob("*")) == []
    moved = tmp_path / "moved"  # the folder as it was, a temp file left beside at most
    kept = "a.md" if swapped != "memory" else "2026-01-01/a.md"
    assert (moved / kept).read_text() == "The heron fished at dawn.\n"
