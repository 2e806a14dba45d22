"""A folder in a workspace too deep to be named by one path (past PATH_MAX): the scans
pass it by with a warning; the rest of the workspace is indexed and served."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

NOTE = "memory/2026-03-03/kept.md"


def _deep_folder(top: Path, depth_bytes: int = 5000) -> None:
    """Folders nested under ``top`` past ``depth_bytes`` (made one level at a time)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        made = 0
        while made < depth_bytes:
            name = "d" * 200
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
            made += len(name) + 1
        note = os.open("deep.md", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(note, b"# Deep\nunreachable ocelot\n")
        os.close(note)
    finally:
        os.close(fd)


def test_a_folder_past_the_path_limit_is_passed_by(daemon_factory: Any, tmp_path: Path,
                                                   ) -> None:
    root = tmp_path / "ws"
    (root / "memory" / "2026-03-03").mkdir(parents=True)
    (root / NOTE).write_text("# Kept\nthe heron nests by the lake\n")
    _deep_folder(root / "memory")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"}, timeout=60.0)
    hits = d.call("memory.search", {"agent_id": "w", "query": "heron"})["results"]
    assert [h["path"] for h in hits] == [NOTE]
    # The disk is listed again by a verify (and a reconcile after a restore): passed by.
    verify = d.call("index.verify", {"agent_id": "w"}, timeout=60.0)
    assert verify["ok"] is True, verify
    (root / "memory" / "2026-03-03" / "more.md").write_text("# More\nkestrel at dawn\n")
    d.call("index.sync", {"agent_id": "w"}, timeout=60.0)
    assert d.call("memory.search", {"agent_id": "w", "query": "kestrel"})["results"]
    assert "reconcile skips" in d.log() and "File name too long" in d.log()
