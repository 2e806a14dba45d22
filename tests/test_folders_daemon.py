"""Folders below the watched roots, whatever their names, as a daemon's watch sees them:
created with notes in them at once, moved in, moved out, put where a note was."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import DaemonHandle


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
        (outside / "a.md").write_text(f"movedin{i} here\n")
        (outside / "deep.er" / "b.md").write_text(f"nested{i} here\n")
        shutil.move(str(outside), str(root / "memory" / name))
        assert found(daemon, f"movedin{i}") == [f"memory/{name}/a.md"]
        assert found(daemon, f"nested{i}") == [f"memory/{name}/deep.er/b.md"]

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
    assert found(daemon, "movedin0") == [] and found(daemon, "nested0") == []
    assert found(daemon, "movedin1") == ["memory/v1.2 notes/a.md"]
