"""A workspace nobody searched for ``idle_trim_s`` lets go of the pages of its mapped
index files (a real daemon, its ``/proc/<pid>/smaps``): the pages searches faulted in
leave the daemon's resident memory, and the next search maps back what it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from waits import wait_for, workspace_status

NOTES = 400


def mapped_kb(pid: int, metadata: Path) -> int:
    """Resident KB of the daemon's mappings of files under ``metadata``."""
    total, inside = 0, False
    prefix = str(metadata.resolve())
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line
                fields = line.split(None, 5)
                inside = len(fields) == 6 and fields[5].startswith(prefix)
            elif inside and head == "Rss:":
                total += int(line.split()[1])
    return total


def index_status(d: Any) -> dict[str, Any]:
    ws = workspace_status(d, "w")
    assert ws is not None, "workspace w is not open"
    index: dict[str, Any] = ws["index"]
    return index


def search(d: Any, query: str) -> list[str]:
    answer = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": 5})
    return [r["path"] for r in answer["results"]]


def test_an_unsearched_workspace_lets_go_of_its_mapped_pages(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    words = ["harbour", "lantern", "meadow", "orchard", "quarry", "saddle", "thimble"]
    for i in range(NOTES):
        note = root / "memory" / f"2026-03-{i % 28 + 1:02d}" / f"n{i}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        body = " ".join(f"{words[(i + j) % len(words)]}{j % 13}" for j in range(120))
        note.write_text(f"# Note {i}\nEntry {i}: token{i} {body}\n", encoding="utf-8")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n'
                       '[daemon]\npersist_delay_s = 0.05\nidle_trim_s = 1.5\n')
    d.call("index.sync", {"agent_id": "w"})
    # Served from the committed files: the commit maps them.
    wait_for(lambda: index_status(d).get("last_commit") and
             not index_status(d)["uncommitted_changes"], "the first build committed")
    trims = wait_for(lambda: index_status(d)["idle_trims"] or None,
                     "the idle trim after the build")
    # Searches fault in pages of the mapped files; unused for idle_trim_s, they go.
    for i in range(0, NOTES, 7):
        assert search(d, f"token{i}") == [f"memory/2026-03-{i % 28 + 1:02d}/n{i}.md"]
    metadata = root / "mem_metadata"
    touched = mapped_kb(d.pid, metadata)
    assert touched > 0, "the searches read no mapped page"
    wait_for(lambda: index_status(d)["idle_trims"] > trims, "the idle trim after searches")
    assert mapped_kb(d.pid, metadata) <= touched // 2
    # The next search reads its pages back and finds what it found before.
    assert search(d, "token21") == ["memory/2026-03-22/n21.md"]
    wait_for(lambda: index_status(d)["idle_trims"] > trims + 1, "another trim once idle")
