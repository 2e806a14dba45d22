"""Links by name between notes, as a daemon resolves them: in whatever order a first build
applies the notes, and when the note linked to is written after the one linking to it."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle

from recalld.daemon.index.passes import POOL_MIN_FILES


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def links_of(d: DaemonHandle, word: str) -> list[str]:
    hits = d.call("memory.search", {"agent_id": "w", "query": word, "sync": True})["results"]
    assert hits, word
    links: list[str] = hits[0]["links"]
    return links


def note(i: int) -> str:
    return f"memory/2026-08-{1 + i % 28:02d}/n{i:04d}.md"


def test_links_by_name_resolve_whatever_the_order(daemon: DaemonHandle,
                                                  tmp_path: Path) -> None:
    # A first build large enough for the worker processes, in several batches: every
    # 40th note links by name (another case) to a note far from it, before or after it.
    root = tmp_path / "ws"
    n = POOL_MIN_FILES + 88
    for i in range(n):
        body = f"# n{i}\nword{i} and some text\n"
        if i % 40 == 0:
            body += f"see [[N{n - 1 - i:04d}]]\n"
        write(root, note(i), body)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})
    for i in range(0, n, 40):
        assert links_of(daemon, f"word{i}") == [note(n - 1 - i)], i

    # Written later than the note that names it: the edge appears with the note.
    write(root, "digest/wiki/plan.md", "# Plan\nplanword, see [[Later Idea#Part|idea]]\n")
    assert links_of(daemon, "planword") == []
    write(root, "digest/personal/later idea.md", "# Later idea\nideaword\n")
    assert links_of(daemon, "planword") == ["digest/personal/later idea.md"]
    assert links_of(daemon, "ideaword") == ["digest/wiki/plan.md"]
