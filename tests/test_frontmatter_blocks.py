"""Frontmatter blocks that recalld's YAML reader does not take (YAML it does not read, a
long block, Hugo's TOML and JSON), as a daemon indexes and searches them: never a hit by
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
    # 1,900 lines of fields (a block is looked for in a note's first 2,000 lines).
    "long": "---\nname: quorvex long\n" + "".join(f"k{i}: v{i}\n" for i in range(1900)) + "---",
    # TOML (Hugo, Zola), and TOML with a key twice.
    "toml": '+++\ntitle = "quorvex toml"\nauthor = "hugo-writer"\ndate = 2024-05-01\n'
            'tags = ["a", "b"]\n[params]\nx = 1\n+++',
    "tomltwice": '+++\ntitle = "quorvex"\ntitle = "tomltwice"\n+++',
    # JSON (Hugo), an object nested in it, and one after a byte order mark with CRLF.
    "json": '{\n  "title": "quorvex json",\n  "author": "hugo-json",\n  "tags": ["a"],\n'
            '  "params": {\n    "x": 1\n  }\n}',
    "jsoncrlf": '\ufeff{\r\n"title": "quorvex crlf",\r\n"draft": false\r\n}\r',
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
        # The block and the body after it, from line 1: no hit of keys alone. A block
        # larger than the chunk cap is in no hit's text; its fields find the note.
        assert f"yak{name}" in hit["text"] and hit["end_line"] == block.count("\n") + 5, hit
        assert hit["start_line"] == (1 if len(block) < 2000 else block.count("\n") + 3), hit
        assert len(hit["text"]) <= 2000, hit
    # The TOML block's fields are read: its author names the note.
    answer = daemon.call("memory.search", {"agent_id": "fm", "query": "walk dawn",
                                           "filters": {"author": "hugo-writer"}})
    assert [r["path"] for r in answer["results"]] == ["memory/toml.md"], answer
    answer = daemon.call("memory.search", {"agent_id": "fm", "query": "walk dawn",
                                           "filters": {"author": "hugo-json"}})
    assert [r["path"] for r in answer["results"]] == ["memory/json.md"], answer
    # The recall block shows the body, without the block.
    answer = daemon.call("memory.recall", {"agent_id": "fm", "query": "quorvex",
                                           "max_results": 20})
    assert all(not item["text"].lstrip("\ufeff").startswith(("---", "+++", "{"))
               for item in answer["items"]), answer


def test_a_block_is_looked_for_in_the_first_lines_only() -> None:
    # A "block" closed past the first 2,000 lines is text, chunked as text is: a block is
    # part of its note's first chunk, and no chunk grows without bound.
    from recalld.daemon.index.chunker import chunk_markdown

    for fence in ("---", "+++"):
        fields = "".join(f"k{i} = {i}\n" if fence == "+++" else f"k{i}: {i}\n"
                         for i in range(5000))
        text = f"{fence}\n{fields}{fence}\n\n# Plan\n\nWalk the yak at dawn.\n"
        chunks = chunk_markdown("memory/big.md", text, max_chars=2000)
        assert max(len(c.text) for c in chunks) < 10_000, fence
        small = f"{fence}\n" + "".join(fields.splitlines(keepends=True)[:50]) + \
            f"{fence}\n\n# Plan\n\nWalk the yak at dawn.\n"
        first = chunk_markdown("memory/small.md", small, max_chars=2000)[0]
        assert first.start_line == 1 and "Walk the yak" in first.text, fence


# As PyYAML writes fields by default (``allow_unicode=False``): every character beyond
# ASCII escaped in double quotes; and a quote doubled in single quotes.
_ESCAPED = ('---\nname: "\\u5317\\u4EAC\\u996D\\u5E97"\ndescription: "caf\\xE9 \\U0001F375 '
            'tr\\u00E8s"\ntags:\n- "Z\\xFCrich"\n- \'o\'\'brien\'\n---\n\nA quiet table.\n')


def test_fields_written_with_escapes_find_their_note_as_they_read(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    from recalld.daemon.index.chunker import chunk_markdown

    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "dinner.md").write_text(_ESCAPED, encoding="ascii")
    daemon.call("workspace.open", {"agent_id": "fm", "path": str(root)})
    for query in ("北京", "饭店", "café", "très", "zürich", "o'brien"):
        answer = daemon.call("memory.search", {"agent_id": "fm", "query": query,
                                               "sync": True})
        assert [r["path"] for r in answer["results"]] == ["memory/dinner.md"], (query, answer)
    # A value written as it reads, also one wrapped over lines, is indexed once.
    plain = "---\nname: 北京饭店\ndescription: >\n  a quiet\n  table\n---\n\nDinner.\n"
    first = chunk_markdown("memory/plain.md", plain)[0]
    assert first.index_text == first.text


def test_a_block_of_many_long_lines_makes_no_chunk_over_the_cap(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # 300 fields of 600 characters (180 kB), the one word that names the note last of
    # them: a hit is within the cap (2,000 characters), the block's fields still find the
    # note, and no hit is of the block alone. So for a CRLF block and one after a BOM.
    fields = "".join(f"k{i}: " + f"filler{i} " * 60 + "\n" for i in range(300))
    root = tmp_path / "ws"
    notes = root / "memory"
    notes.mkdir(parents=True)
    for name, lead, end in (("lf", "", "\n"), ("crlf", "", "\r\n"), ("bom", "\ufeff", "\n")):
        text = (f"{lead}---\nname: {name}\n{fields}last: zqvtail{name}\n---\n\n# Plan\n\n"
                f"Feed the zqvbody{name} goat.\n").replace("\n", end)
        (notes / f"{name}.md").write_text(text, encoding="utf-8", newline="")
    daemon.call("workspace.open", {"agent_id": "fm", "path": str(root)})
    for name in ("lf", "crlf", "bom"):
        for query in (f"zqvtail{name}", f"zqvbody{name}", f"filler299 zqvbody{name}"):
            answer = daemon.call("memory.search", {"agent_id": "fm", "query": query,
                                                   "sync": True, "max_results": 20})
            hits = answer["results"]
            assert [r["path"] for r in hits][:1] == [f"memory/{name}.md"], (query, answer)
            assert all(len(r["text"]) <= 2000 and r["start_line"] == 306 for r in hits), hits


def test_a_note_that_is_only_a_json_object_is_text() -> None:
    # A JSON object with nothing after it is what the note says (a model may write one),
    # not a frontmatter block of no body: it is saved, read and found as text.
    from recalld.daemon.index.frontmatter import has_body, recall_block

    only = '{\n  "city": "Lisbon",\n  "flight": "TP123"\n}\n'
    assert has_body(only) and recall_block(only) == ({}, 0)
    assert recall_block(only + "\nThe trip.\n") == ({"city": "Lisbon", "flight": "TP123"}, 4)
