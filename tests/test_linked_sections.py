"""A hit's link to a section of a note (``[[Node#Part]]``, nested, with an alias) brings
that section's chunk beside the hit, in ``memory.search`` and ``memory.recall``: headings
matched as Obsidian matches them, the whole note's chunk when the section is gone."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle

NODE = """---
name: node
---
# Node

Intro paragraph about the node itself, a general overview.

## Part One

Alpha section body: apples and oranges.

## Part  Two

### Deep Inner

Beta section body: the number is 4242.

## Último Paso

Gamma section body: the final step.
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_link_to_a_section_brings_that_section(daemon: DaemonHandle, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "digest/wiki/Node.md", NODE)
    links = {
        "nested": "[[Node#part two#DEEP inner|the number]]",  # case, nesting, an alias
        "spaced": "[[Node#Part Two]]",  # one space for two; its first chunk says nothing
        "accent": "[[node#ÚLTIMO   paso]]",
        "gone": "[[Node#Renamed Since]]",  # no such heading: the whole note's chunk
        "plain": "[[Node]] and later [[Node#Part One]]",  # the link naming a section
    }
    for word, link in links.items():
        write(root, f"memory/2026-12-05/{word}.md", f"# {word}\n\n{word}word, see {link}\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})

    def linked(word: str) -> tuple[int, str]:
        answer = daemon.call("memory.search", {"agent_id": "w", "query": f"{word}word"})
        (item,) = answer["expanded"]
        assert item["path"] == "digest/wiki/Node.md"
        assert item["via"] == f"memory/2026-12-05/{word}.md"
        return item["start_line"], item["text"].splitlines()[-1]

    assert linked("nested") == (14, "Beta section body: the number is 4242.")
    assert linked("spaced") == (14, "Beta section body: the number is 4242.")
    assert linked("accent") == (18, "Gamma section body: the final step.")
    assert linked("gone") == (4, "Intro paragraph about the node itself, a general overview.")
    assert linked("plain") == (8, "Alpha section body: apples and oranges.")

    # Two hits naming two sections of one note: the note comes once, with the section
    # the hit it comes by names (read before fusion ranks the hits, not after).
    both = daemon.call("memory.search", {"agent_id": "w", "query": "plainword accentword"})
    (item,) = both["expanded"]
    assert (item["via"], item["start_line"]) in {("memory/2026-12-05/plain.md", 8),
                                                  ("memory/2026-12-05/accent.md", 18)}
    # The recall block an agent puts before its reply shows the section too.
    text = daemon.call("memory.recall", {"agent_id": "w", "query": "nestedword"})["rendered"]
    assert "number is 4242" in text and "Intro paragraph" not in text


def test_a_linked_note_shows_its_first_chunk_saying_more_than_headings(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Notes that open with a title and a subheading: the chunk of those headings alone
    # (after the frontmatter, or with none) tells nothing, the next chunk stands for them.
    root = tmp_path / "ws"
    write(root, "digest/wiki/keyed.md",
          "---\nname: keyed\n---\n# Keyed\n\n## First Part\n\nThe keyed body text.\n")
    write(root, "digest/wiki/plain.md", "# Plain\n## Overview\nThe plain body text.\n")
    write(root, "digest/wiki/titles.md", "# Only\n\n## Headings\n")
    write(root, "memory/2026-12-05/hub.md",
          "# Hub\n\nhubword, see [[keyed]], [[plain]] and [[titles]]\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "hubword"})
    shown = {e["path"]: (e["start_line"], e["text"].splitlines()[-1])
             for e in answer["expanded"]}
    assert shown == {"digest/wiki/keyed.md": (6, "The keyed body text."),
                     "digest/wiki/plain.md": (2, "The plain body text."),
                     # Nothing but headings: the first of them still stands.
                     "digest/wiki/titles.md": (1, "# Only")}
    text = daemon.call("memory.recall", {"agent_id": "w", "query": "hubword"})["rendered"]
    assert "The keyed body text." in text and "The plain body text." in text


def test_a_linked_note_is_shown_without_its_json_or_toml_block(daemon: DaemonHandle,
                                                               tmp_path: Path) -> None:
    # Hugo's JSON and TOML frontmatter, as a YAML block: left out of the linked note shown.
    root = tmp_path / "ws"
    blocks = {"Jnode": '{\n  "title": "jnode",\n  "draft": false\n}',
              "Tnode": '+++\ntitle = "tnode"\n+++'}
    for name, block in blocks.items():
        write(root, f"digest/wiki/{name}.md", f"{block}\n\nThe {name} body says hello.\n")
        write(root, f"memory/2026-12-05/{name}-ref.md", f"# {name}\n\n{name}word, see [[{name}]]\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})
    for name, block in blocks.items():
        answer = daemon.call("memory.search", {"agent_id": "w", "query": f"{name}word"})
        assert len(answer["expanded"]) == 1, (name, answer)
        (item,) = answer["expanded"]
        assert item["path"] == f"digest/wiki/{name}.md", answer
        # (From the blank line after the block, as after a YAML one.)
        assert (item["start_line"], item["text"]) == (block.count("\n") + 2,
                                                      f"\nThe {name} body says hello."), item


def test_the_chunk_standing_for_a_linked_note_follows_each_edit_of_it(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # Searched again and again between edits (the chunk standing for a note is kept from
    # one search to the next): every edit of the note, or of the section its link names,
    # shows at the next search; a note left with nothing to show is no neighbour.
    root = tmp_path / "ws"
    node = "digest/wiki/Knoten.md"
    write(root, "memory/2026-12-06/a.md", "# a\n\nerstwort, siehe [[Knoten]]\n")
    write(root, "memory/2026-12-06/b.md", "# b\n\nzweitwort, siehe [[Knoten#Teil]]\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})

    def shown(query: str) -> list[str]:
        answer = daemon.call("memory.search", {"agent_id": "w", "query": query})
        return [e["text"].splitlines()[-1] for e in answer["expanded"]]

    versions = [
        ("---\nname: k\n---\n# Knoten\n\nÜberblick eins.\n\n## Teil\n\nTeil eins.\n",
         ["Überblick eins."], ["Teil eins."]),
        ("# Knoten\n\n## Unter\n\nÜberblick zwei, länger.\n\n## Teil\n\nTeil zwei, länger.\n",
         ["Überblick zwei, länger."], ["Teil zwei, länger."]),
        ("# Knoten\n\nÜberblick drei.\n\n## Anders\n\nNicht mehr der Teil.\n",
         ["Überblick drei."], ["Überblick drei."]),  # the section is gone: the whole note
        ("---\nname: k\nnur: schlüssel\n---\n", [], []),  # nothing but keys
        ("# Knoten\n\n## Teil\n\nTeil vier, wieder da.\n",
         ["Teil vier, wieder da."], ["Teil vier, wieder da."]),
    ]
    for text, whole, part in versions:
        write(root, node, text)
        daemon.call("index.sync", {"agent_id": "w"})
        for _ in range(2):
            assert shown("erstwort") == whole, text
            assert shown("zweitwort") == part, text
