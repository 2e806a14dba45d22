"""Markdown as people and tools write it (setext headings, ...), as a daemon chunks and finds it."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle

from recalld.daemon.index.chunker import chunk_markdown

_PARA = "Lorem ipsum dolor sit amet consectetur adipiscing elit " * 8


def test_setext_headings_open_sections_and_name_their_hits(daemon: DaemonHandle,
                                                           tmp_path: Path) -> None:
    # A title underlined with === and a section underlined with --- (Pandoc, many READMEs):
    # headings as ``#`` ones are. A chunk never crosses one, and a hit carries its path.
    text = ("Install Guide\n=============\n\n" + "\n\n".join([_PARA] * 6)
            + "\n\nTroubleshooting\n---------------\n\n" + "\n\n".join([_PARA] * 3)
            + "\n\nThe port mwqport is busy.\n")
    lines = text.split("\n")
    under = lines.index("Troubleshooting") + 1  # 1-based line of the section's title
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-04"
    day.mkdir(parents=True)
    (day / "guide.md").write_text(text, encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "mwqport", "sync": True})
    (hit,) = answer["results"]
    assert hit["heading"] == "Install Guide > Troubleshooting"
    assert hit["start_line"] >= under and hit["text"].endswith("The port mwqport is busy.")
    # The heading path is searchable with the text below it.
    answer = daemon.call("memory.search",
                         {"agent_id": "w", "query": "troubleshooting mwqport", "max_results": 1})
    assert [r["chunk_id"] for r in answer["results"]] == [hit["chunk_id"]]
    chunks = chunk_markdown("g.md", text)
    assert all(c.end_line < under or c.start_line >= under for c in chunks)
    assert chunks[0].heading == "Install Guide" and chunks[0].metadata["starts_with_heading"]


def test_an_underline_below_what_is_no_paragraph_text_is_no_heading() -> None:
    # A --- below a list item, a quote or a table row is a rule; a === there, text.
    for above in ("- item one", "> quoted", "| a | b |", "1. first", "    indented code"):
        text = f"# Top\n\n{above}\n---\n\nafter\n"
        assert {c.heading for c in chunk_markdown("n.md", text)} == {"Top"}, above


def test_a_heading_inside_a_comment_names_no_hit(daemon: DaemonHandle, tmp_path: Path) -> None:
    # A template's sections commented out (HTML, or Obsidian's %%), one comment never
    # closed: what no renderer shows opens no section and names no hit below it; a code
    # span showing "<!--" opens no comment.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-05"
    day.mkdir(parents=True)
    (day / "standup.md").write_text(
        "# Standup\n\n<!--\n## Blockers (template)\n-->\nShipped the zqvexport button.\n\n"
        "%%\n# Old title\n%%\nNext: zqvretry logic.\n\n"
        "Writing `<!--` starts a comment.\n\n## Later\nzqvlater notes\n\n"
        "<!-- draft never closed\n## Draft\nzqvdraft text\n", encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for word, heading in (("zqvexport", "Standup"), ("zqvretry", "Standup"),
                          ("zqvlater", "Standup > Later"), ("zqvdraft", "Standup > Later")):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": word, "sync": True})
        (hit,) = answer["results"]
        assert hit["heading"] == heading, (word, hit)
        assert word in hit["text"]
    # A "```" inside a comment opens no code block: the heading after the comment is one.
    text = "# Top\n<!--\n```\n-->\n\n## After\nbody\n"
    assert [c.heading for c in chunk_markdown("n.md", text)] == ["Top", "Top > After"]


def test_a_comment_sign_in_the_frontmatter_hides_no_heading() -> None:
    # "<!--" as a value of the block is no comment of the note's body.
    text = '---\nfmt: "<!-- x"\nsep: "%%"\n---\n# A\nqq\n\n## B\nzz\n'
    assert [c.heading for c in chunk_markdown("n.md", text)] == ["A", "A > B"]


def test_a_comment_sign_in_the_frontmatter_hides_no_link(daemon: DaemonHandle,
                                                         tmp_path: Path) -> None:
    # A value holding "%%" (Obsidian's comment sign) opened a comment that hid every
    # [[link]] after it, in the block and in the body.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-08-06"
    day.mkdir(parents=True)
    (day / "plan.md").write_text('---\nsep: "%%"\nparent: "[[Roadmap]]"\n---\n'
                                 "zqvplan talks to [[Kafka]] daily.\n", encoding="utf-8")
    (day / "Kafka.md").write_text("# Kafka\nbroker notes\n", encoding="utf-8")
    (day / "Roadmap.md").write_text("# Roadmap\nq3 goals\n", encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "zqvplan", "sync": True})
    assert [r["path"] for r in answer["results"]] == ["memory/2026-08-06/plan.md"]
    shown = {e["path"] for e in answer["expanded"]}
    assert shown >= {"memory/2026-08-06/Kafka.md",
                     "memory/2026-08-06/Roadmap.md"}, answer


def test_a_setext_heading_in_a_stretch_chunked_elsewhere_names_the_sections_after_it() -> None:
    # Stretches of a note that keep ReMe's chunks are skipped here, but a heading among
    # them, setext as ATX, still names the sections after it.
    text = "# A\n\nGuide\n=====\n\nkept text\n\nnew zqv text\n"
    chunks = chunk_markdown("n.md", text, skip=frozenset(range(6)))
    assert [(c.start_line, c.heading) for c in chunks] == [(8, "Guide")]


def test_a_row_deep_in_a_large_table_is_found_by_its_column_and_names_it(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A table of 5,000 rows is many chunks; one deep in it holds only the cells' values.
    # It carries the table's header row (in its heading, so in its index text): a query
    # naming a column and a value finds it, and the hit says what its columns are.
    owners = ("Wenzel", "Ngozi", "Tuğba", "Raghav")
    rows = [f"| T-{i} | {owners[i % 4]} | {'blocked' if i % 7 else 'done'} | item {i} |"
            for i in range(5000)]
    rows[4321] = "| T-4321 | Qorvanne | on hold | budget sheet |"
    header = "| ticket | assignee | status | title |"
    text = "# Backlog\n\nSynced nightly.\n\n" + header + "\n|:--|---|--:|:-:|\n" + "\n".join(rows)
    root = tmp_path / "ws"
    (root / "digest" / "wiki").mkdir(parents=True)
    (root / "digest" / "wiki" / "backlog.md").write_text(text + "\n", encoding="utf-8")
    # Notes as long as a chunk of it hold the value too, not as an assignee: the row
    # comes first, by the column its chunk names.
    for i in range(3):
        (root / "digest" / "wiki" / f"choir{i}.md").write_text(
            f"# Choir {i}\n\nQorvanne sings bass. " + "We rehearsed the old songs. " * 70,
            encoding="utf-8")
    for i in range(100):
        (root / "digest" / "wiki" / f"note{i}.md").write_text(
            f"# Note {i}\n\nMinutes of meeting {i}: the team agreed on the plan.\n",
            encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "assignee Qorvanne",
                                           "sync": True})
    hit = answer["results"][0]
    assert hit["path"] == "digest/wiki/backlog.md", answer
    assert hit["heading"] == "Backlog > " + header
    # Its lines are the file's own: the header row is no line of the hit.
    line = text.split("\n").index(rows[4321]) + 1
    assert hit["start_line"] <= line <= hit["end_line"] and header not in hit["text"]
    shown = text.split("\n")[hit["start_line"] - 1 : hit["end_line"]]
    assert hit["text"] == "\n".join(shown)


def test_the_chunks_that_continue_a_table_carry_its_header_row_and_no_others() -> None:
    head = "id | who"
    body = "\n".join(f"{i} | p{i} with some words to fill the row" for i in range(80))
    text = f"# T\n\nintro\n{head}\n-- | :-:\n{body}\n\nafter the table\n"
    chunks = chunk_markdown("n.md", text, max_chars=300)
    assert chunks[0].heading == "T" and head in chunks[0].text
    rows = [c for c in chunks if c.start_line > 5 and "after the table" not in c.text]
    assert len(rows) > 3 and {c.heading for c in rows} == {"T > " + head}
    assert all(c.metadata["headings"] == ["T"] for c in chunks)
    assert chunks[-1].heading == "T" and chunks[-1].text == "after the table"
    # A chunk starting at the delimiter row carries it too.
    wide = "| " + "a" * 30 + " | b |"
    text = wide + "\n|---|---|\n| 1 | 2 |\n"
    assert [c.heading for c in chunk_markdown("n.md", text, max_chars=45)] == ["", wide]
    # No table: rows under no delimiter row, or under one of other cells, or a row
    # after a line without "|".
    for text in ("| a | b |\n| 1 | 2 |\n" * 40, "| a | b |\n|---|\n| 1 | 2 |\n" * 40,
                 "| a |\n|---|\nprose\n" + "| 1 |\n" * 80):
        assert {c.heading for c in chunk_markdown("n.md", text, max_chars=50)} == {""}, text


def test_a_heading_of_no_text_names_no_section(daemon: DaemonHandle, tmp_path: Path) -> None:
    # ``## `` alone, or closed by its marks only (``## ##``), as a note being written has:
    # it opens a section, but the hit's heading path holds no empty step ("Trip > ").
    root = tmp_path / "ws"
    notes = root / "memory"
    notes.mkdir(parents=True)
    for name, mark in (("bare", "## "), ("closed", "### ###"), ("tabbed", "##\t")):
        (notes / f"{name}.md").write_text(
            f"# Trip {name}\n\n{mark}\n\nThe zqvleft ferry for {name}.\n", encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "zqvleft", "sync": True,
                                           "max_results": 10})
    hits = {r["path"]: r["heading"] for r in answer["results"]}
    assert hits == {f"memory/{n}.md": f"Trip {n}" for n in ("bare", "closed", "tabbed")}, answer


def test_a_setext_heading_over_several_lines_is_one_heading(daemon: DaemonHandle,
                                                             tmp_path: Path) -> None:
    # CommonMark: every line of text above the underline is the heading's, also right
    # below an ATX heading; below a list item the underline is a rule (no heading).
    text = ("Winter release plan\nfor the north team\n===\n\n" + "\n\n".join([_PARA] * 4)
            + "\n\n## Risks\nand open questions\n---\n\nThe qzvrisk of snow.\n\n"
            + "- a list item\nrunning on\n---\n\nThe qzvlist after it.\n")
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "plan.md").write_text(text, encoding="utf-8")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    heads = {}
    for word in ("qzvrisk", "qzvlist"):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": word, "sync": True})
        (hit,) = answer["results"]
        heads[word] = hit["heading"]
    # (The underlined heading is of level 2, as ``## Risks``: it follows it, not under it.)
    section = "Winter release plan for the north team > and open questions"
    assert heads == {"qzvrisk": section, "qzvlist": section}, heads
    first = chunk_markdown("plan.md", text)[0]
    assert first.heading == "Winter release plan for the north team", first
