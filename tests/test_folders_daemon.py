"""Folders below the watched roots, whatever their names, as a daemon's watch sees them:
created with notes in them at once, moved in, moved out, put where a note was."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonHandle
from markers import marker

from recalld.ipc import errors


def found(d: DaemonHandle, word: str) -> list[str]:
    hits = d.call("memory.search", {"agent_id": "w", "query": word, "sync": True})
    return [h["path"] for h in hits["results"]]


def test_folders_of_any_name_are_indexed_as_they_come_and_go(daemon: DaemonHandle,
                                                           tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})

    # Moved in with its notes: names with a dot, spaces, a note's suffix.
    for i, name in enumerate(("proj.v2", "v1.2 notes", "archive.md")):
        outside = tmp_path / f"out{i}" / name
        (outside / "deep.er").mkdir(parents=True)
        (outside / "a.md").write_text(f"{marker(i, 'movedin')} here\n")
        (outside / "deep.er" / "b.md").write_text(f"{marker(i, 'nested')} here\n")
        shutil.move(str(outside), str(root / "memory" / name))
        assert found(daemon, marker(i, "movedin")) == [f"memory/{name}/a.md"]
        assert found(daemon, marker(i, "nested")) == [f"memory/{name}/deep.er/b.md"]

    # Created, and written into before the watch of it can exist.
    made = root / "digest" / "wiki" / "Node.js"
    made.mkdir(parents=True)
    (made / "loop.md").write_text("eventloop phases\n")
    assert found(daemon, "eventloop") == ["digest/wiki/Node.js/loop.md"]

    # A folder put where a note was, under the note's name.
    note = root / "memory" / "2026-07-01" / "plan.md"
    note.parent.mkdir()
    note.write_text("oldplan text\n")
    assert found(daemon, "oldplan") == ["memory/2026-07-01/plan.md"]
    note.unlink()
    note.mkdir()
    (note / "step.md").write_text("newstep text\n")
    assert found(daemon, "oldplan") == []
    assert found(daemon, "newstep") == ["memory/2026-07-01/plan.md/step.md"]

    # Moved out: its notes go with it.
    os.rename(root / "memory" / "proj.v2", tmp_path / "gone.v2")
    assert found(daemon, marker(0, "movedin")) == [] and found(daemon, marker(0, "nested")) == []
    assert found(daemon, marker(1, "movedin")) == ["memory/v1.2 notes/a.md"]


def test_temp_files_of_writes_a_kill_cut_short_are_removed_at_the_next_open(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A daemon killed between writing a note's temp file and renaming it into place
    # left the hidden temp file (as large as the note) there for good.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-03-04"
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    day.mkdir(parents=True)
    left = [day / ".grebe.md.tmp-0a1b2c3d4e5f", root / "digest" / ".x.md.tmp-99887766aabb"]
    kept = [day / ".grebe.md.swp", day / ".notes.tmp-draft"]  # an editor's, a person's
    for path in left + kept:
        path.write_text("the great crested grebe dives\n")
    assert d.stop() == 0
    d = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    # Written after the workspace opened: a write under way, never taken for a leftover.
    live = day / ".live.md.tmp-5566778899aa"
    live.write_text("being written\n")
    d.call("index.verify", {"agent_id": "w"})  # a scan of the disk after that write
    assert [p for p in left + kept + [live] if p.exists()] == [*kept, live]


def test_a_workspace_folder_moved_away_is_not_made_again_where_it_was(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Moved away while open, the workspace's next index save made its folder again at the
    # old place, empty but for that index: moving the folder back then put it inside the
    # new one, and a restart served the empty one. A note written meanwhile failed with
    # "internal error: I/O error on memory: No such file or directory".
    root, away = tmp_path / "ws", tmp_path / "ws-away"
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    note = daemon.call("memory.add_note", {"agent_id": "w",
                                           "content": "a heron stands in the reeds"})["path"]
    daemon.call("index.sync", {"agent_id": "w"})
    root.rename(away)
    missing = r"the workspace folder (/.*/)?ws is missing \(moved away"
    with pytest.raises(errors.NotFound, match=missing):
        daemon.call("memory.add_note", {"agent_id": "w", "content": "the heron flew"})
    with pytest.raises(errors.NotFound, match=missing):
        daemon.call("index.compact", {"agent_id": "w"})
    assert not root.exists()
    away.rename(root)
    assert daemon.call("index.compact", {"agent_id": "w"})["generation"] >= 1
    daemon.call("memory.add_note", {"agent_id": "w", "content": "the heron flew off"})
    assert found(daemon, "heron") == [note]
    assert "the heron flew off" in (root / note).read_text(encoding="utf-8")
