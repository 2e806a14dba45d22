"""Notes with more than one name (hard links): a change made through any of the names,
inside the watched folders or outside them, is searchable under every name right after
``index.sync``."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import DaemonHandle


def _paths(daemon: DaemonHandle, word: str) -> list[str]:
    hits = daemon.call("memory.search", {"agent_id": "w", "query": word,
                                         "max_results": 10})["results"]
    return sorted(h["path"] for h in hits)


def test_a_change_through_one_name_of_a_note_reaches_its_other_names(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    day = root / "memory" / "2026-11-04"
    day.mkdir(parents=True)
    (day / "first.md").write_text("# Ferry\nthe ferry leaves at nine\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})
    os.link(day / "first.md", day / "second.md")  # after the scan: known by its event
    (root / "memory" / "2026-11-05").mkdir()
    os.link(day / "first.md", root / "memory" / "2026-11-05" / "third.md")
    daemon.call("index.sync", {"agent_id": "w"})
    names = ["memory/2026-11-04/first.md", "memory/2026-11-04/second.md",
             "memory/2026-11-05/third.md"]
    assert _paths(daemon, "ferry") == names

    # Written in place through one name: the others hold the same bytes.
    with open(day / "second.md", "w") as note:
        note.write("# Ferry\nthe ferry leaves at ten now\n")
    daemon.call("index.sync", {"agent_id": "w"})
    assert _paths(daemon, "ten") == names
    assert _paths(daemon, "nine") == []

    # A name outside the watched folders (no event comes from there).
    outside = root / "drafts.md"
    os.link(day / "first.md", outside)
    with open(outside, "w") as note:
        note.write("# Ferry\nthe ferry is cancelled\n")
    daemon.call("index.sync", {"agent_id": "w"})
    assert _paths(daemon, "cancelled") == names
    assert _paths(daemon, "ten") == []
    verify = daemon.call("index.verify", {"agent_id": "w"})
    assert verify["ok"] is True, verify
