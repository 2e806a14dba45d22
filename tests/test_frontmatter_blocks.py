"""Frontmatter blocks that recalld's YAML reader does not take (YAML it does not read, a
very long block, Hugo's TOML), as a daemon indexes and searches them: never a hit by
themselves, always part of their note's first body chunk."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle

_BODY = "\n\n# Plan\n\nWalk the {animal} at dawn.\n"
_BLOCKS = {
    # A key twice, an anchor, nesting two deep: YAML that the reader refuses.
    "twice": "---\nname: quorvex twice\nname: again\n---",
    "anchor": "---\nname: anchored\nbase: &base quorvex anchor\n---",
    "deep": "---\nname: deep\nouter:\n  inner:\n    leaf: quorvex deep\n---",
    # Over 2,000 lines of fields.
    "long": "---\nname: quorvex long\n" + "".join(f"k{i}: v{i}\n" for i in range(2100)) + "---",
    # TOML (Hugo, Zola), and TOML with a key twice.
    "toml": '+++\ntitle = "quorvex toml"\nauthor = "hugo-writer"\ndate = 2024-05-01\n'
            'tags = ["a", "b"]\n[params]\nx = 1\n+++',
    "tomltwice": '+++\ntitle = "quorvex"\ntitle = "tomltwice"\n+++',
}


def test_a_block_the_reader_cannot_take_joins_the_first_body_chunk(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    notes = root / "memory"
    notes.mkdir(parents=True)
    for name, block in _BLOCKS.items():
        (notes / f"{name}.md").write_text(block + _BODY.format(animal=f"yak{name}"),
                                          encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "fm", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "fm", "query": "quorvex", "sync": True,
                                           "max_results": 20})
    hits = {r["path"]: r for r in answer["results"]}
    assert set(hits) == {f"memory/{name}.md" for name in _BLOCKS}, answer
    for name, block in _BLOCKS.items():
        hit = hits[f"memory/{name}.md"]
        # The block and the body after it, from line 1: no hit of keys alone.
        assert hit["start_line"] == 1 and f"yak{name}" in hit["text"], hit
        assert hit["end_line"] == block.count("\n") + 5, hit
    # The TOML block's fields are read: its author names the note.
    answer = daemon.call("memory.search", {"agent_id": "fm", "query": "walk dawn",
                                           "filters": {"author": "hugo-writer"}})
    assert [r["path"] for r in answer["results"]] == ["memory/toml.md"], answer
    # The recall block shows the body, without the block.
    answer = daemon.call("memory.recall", {"agent_id": "fm", "query": "quorvex",
                                           "max_results": 20})
    assert all(not item["text"].startswith(("---", "+++")) for item in answer["items"]), answer
