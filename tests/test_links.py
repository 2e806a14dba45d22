"""Wikilink and typed-edge extraction, target normalization, the link graph."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from recalld.daemon.index.chunker import chunk_markdown
from recalld.daemon.index.links import (
    Link,
    LinkGraph,
    extract_links,
    normalize_target,
    pick_note,
)
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.state import IndexState

# What a resolver finds (``IndexState.resolve``): bare names and the paths of notes there,
# also as paths from the root (``./foo`` read from ``digest/wiki/``).
FILES = {"foo": "digest/wiki/foo.md", "Bar Baz": "digest/personal/Bar Baz.md",
         "digest/wiki/foo": "digest/wiki/foo.md", "/digest/wiki/foo": "digest/wiki/foo.md"}


def found(target: str, src: str) -> str | None:
    return FILES.get(target)

NOTE = """# Trip
We met at [[foo]] and later [[Bar Baz|the bar]].
See [[digest/wiki/foo#History]] and [[digest/procedure/deploy.md]].
parent:: [[digest/wiki/travel]]
- related:: [[foo]], [[ghost]]
`[[in code span]]`
```
[[in fence]]
```
Self link [[memory/2026-07-23/trip]] is dropped.
"""


def test_extract_links_kinds_lines_and_targets() -> None:
    links = extract_links("memory/2026-07-23/trip.md", NOTE, found)
    got = [(lk.dst, lk.kind, lk.line, lk.heading, lk.alias, lk.resolved) for lk in links]
    assert got == [
        ("digest/wiki/foo.md", "link", 2, "", "", True),
        ("digest/personal/Bar Baz.md", "link", 2, "", "the bar", True),
        ("digest/wiki/foo.md", "link", 3, "History", "", True),
        ("digest/procedure/deploy.md", "link", 3, "", "", False),
        ("digest/wiki/travel.md", "parent", 4, "", "", False),
        ("digest/wiki/foo.md", "related", 5, "", "", True),
        ("ghost", "related", 5, "", "", False),
    ]
    assert all(lk.src == "memory/2026-07-23/trip.md" for lk in links)


def test_normalize_target() -> None:
    # A path no note is known at waits as that note's path; a file that is no note keeps
    # its own suffix.
    assert normalize_target("digest/wiki/foo") == ("digest/wiki/foo.md", False)
    # One from the root waits as such: no other note whose path ends so takes it.
    assert normalize_target("/digest/./wiki/foo.md") == ("/digest/wiki/foo.md", False)
    assert normalize_target("digest/wiki/foo", found) == ("digest/wiki/foo.md", True)
    assert normalize_target("resource/a.txt") == ("resource/a.txt", False)
    assert normalize_target("Kafka.md") == ("Kafka.md", False)
    assert normalize_target("../outside") == ("../outside", False)
    assert normalize_target("foo", found) == ("digest/wiki/foo.md", True)
    assert normalize_target("foo") == ("foo", False)
    assert normalize_target("  ") == ("", False)
    # Relative to the linking note's folder, as Obsidian reads ./ and ../.
    assert normalize_target("./kafka", None, "memory/d/a.md") == ("/memory/d/kafka.md", False)
    assert normalize_target("../e/plan", found, "memory/d/a.md") == ("/memory/e/plan.md", False)
    assert normalize_target("./foo", found, "digest/wiki/a.md") == ("digest/wiki/foo.md", True)
    assert normalize_target("../../../up", None, "memory/d/a.md") == ("../../../up", False)
    # A folder names no note: not the note of the folder's name beside it.
    for folder in ("./", "../", "./.", "../..", "./x/"):
        assert normalize_target(folder, found, "digest/wiki/foo/a.md") == (folder, False)


def test_of_notes_alike_a_link_names_the_one_written() -> None:
    # The path from the root before one that only ends with it, at a folder's edge; of
    # names alike but for case, the one written, whichever was applied last.
    cased = ["memory/n/kafka.md", "memory/n/Kafka.md"]
    assert pick_note("Memory/N/kafka", cased) == "memory/n/kafka.md"
    assert pick_note("memory/n/Kafka.MD", cased) == "memory/n/Kafka.md"
    assert pick_note("KAFKA", cased) == "memory/n/Kafka.md"
    assert pick_note("notes/x", ["digest/notes/x.md", "notes/x.md", "a/notes/X.md"]) == "notes/x.md"
    assert pick_note("wiki/foo", ["digest/awiki/foo.md"]) is None
    assert pick_note("foo", []) is None
    # None of the case written: the one beside the linking note, else the shortest
    # path, else the first in code point order; whatever order they came in.
    many = ["zz/KAFKA.md", "b/kafka.md", "a/Kafka.md", "memory/d/kafka.md"]
    for paths in (many, many[::-1]):
        assert pick_note("kAfKa", paths, "memory/d/n.md") == "memory/d/kafka.md"
        assert pick_note("kAfKa", paths, "memory/e/n.md") == "a/Kafka.md"
        assert pick_note("kafka", paths, "memory/e/n.md") == "b/kafka.md"


def test_no_links_and_odd_brackets() -> None:
    assert extract_links("a.md", "plain text\n[[]]\n[[unclosed\n[single]\n") == []


def test_a_link_in_a_table_cell_escapes_its_pipe() -> None:
    text = ("| when | what |\n| --- | --- |\n| Monday | [[foo\\|the foo]] |\n"
            "| Tuesday | [[Bar Baz#Menu \\| the menu]], [[digest/wiki/travel\\|trip]] |\n")
    links = extract_links("memory/2026-07-23/week.md", text, found)
    assert [(lk.dst, lk.line, lk.heading, lk.alias, lk.resolved) for lk in links] == [
        ("digest/wiki/foo.md", 3, "", "the foo", True),
        ("digest/personal/Bar Baz.md", 4, "Menu", "the menu", True),
        ("digest/wiki/travel.md", 4, "", "trip", False),
    ]


def test_a_hash_in_a_note_s_own_name_is_no_heading() -> None:
    # The dream cites a source named "meeting #3.md" so; a heading never ends in ".md".
    text = ("## Sources\n\n- [[memory/2026-11-20/meeting #3.md]]\n"
            "- [[memory/2026-11-20/plan#Steps|the steps]] and [[C# notes#Tips.MD]]\n")
    links = extract_links("digest/wiki/c.md", text)
    assert [(lk.dst, lk.heading, lk.kind) for lk in links] == [
        ("memory/2026-11-20/meeting #3.md", "", "source"),
        ("memory/2026-11-20/plan.md", "Steps", "source"),
        ("C# notes#Tips.MD", "", "source"),
    ]


def test_code_spans_of_several_backticks_hide_their_links() -> None:
    text = ("see ``code [[x]] here`` and [[a]]\n"
            "``a `b` [[y]] c`` then [[b]]\n"
            "`` [[c]] ` unclosed is no span\n"
            "`one ``[[z]]`` two` [[d]]\n")
    assert [(lk.dst, lk.line) for lk in extract_links("n.md", text)] == [
        ("a", 1), ("b", 2), ("c", 3), ("d", 4)]


def test_comments_hide_their_links_as_renderers_do() -> None:
    # Read left to right with code spans: a comment in a span is none, a comment ends at
    # its first close, even one a backtick stands before; ``<!-->`` closes itself; a fence
    # in a comment opens no block; an HTML comment opened inside a line and never closed
    # is text, one opening a line (an HTML block) runs to the end, as an Obsidian one does.
    text = ("`<!--` [[a]] `%%`\n"
            "<!-- `--> [[b]]` -->[[c]]\n"
            "<!-->[[d]] <!--->[[e]] %%%%[[f]]\n"
            "%% ```\n[[no]]\n%% [[g]]\n"
            "```\n<!-- [[in fence]]\n```\n"
            "[<!-- -->[no]] [[h]]<!--\n"
            "-->\n"
            "text <!-- never closed [[i]]\n")
    assert [(lk.dst, lk.line) for lk in extract_links("n.md", text)] == [
        ("a", 1), ("b", 2), ("c", 2), ("d", 3), ("e", 3), ("f", 3), ("g", 6), ("h", 10),
        ("i", 12)]
    assert extract_links("n.md", "[[a]]\n  <!-- [[b]]\n\n[[c]] -- >\n") == [
        Link("n.md", "a", "link", 1, resolved=False)]
    assert extract_links("n.md", "[[a]] %% [[b]]\n\n## Related\n[[c]]\n") == [
        Link("n.md", "a", "link", 1, resolved=False)]


def test_an_escaped_bracket_opens_no_link() -> None:
    text = "\\[[a]] \\\\[[b]] \\\\\\[[c]] [\\[[d]] \\[[[e]] \\![[f]]\n"
    assert [lk.dst for lk in extract_links("n.md", text)] == ["b", "e", "f"]


def test_embeds_of_notes_count_and_attachments_do_not() -> None:
    links = extract_links("a.md", "![[photo.png]] ![[digest/wiki/foo]] [[v2.3 notes]]\n")
    assert [(lk.dst, lk.resolved) for lk in links] == [
        ("digest/wiki/foo.md", False), ("v2.3 notes", False)
    ]


def _graph() -> LinkGraph:
    g = LinkGraph()
    g.add_file("a.md", [Link("a.md", "b.md", "link", 1), Link("a.md", "c.md", "parent", 2)])
    g.add_file("b.md", [Link("b.md", "d.md", "link", 1)])
    g.add_file("e.md", [Link("e.md", "a.md", "link", 3)])
    return g


def test_graph_neighbours_both_directions() -> None:
    g = _graph()
    assert g.neighbours("a.md") == {"b.md": 1, "c.md": 1, "e.md": 1}
    assert g.neighbours("a.md", depth=2) == {"b.md": 1, "c.md": 1, "e.md": 1, "d.md": 2}
    assert g.neighbours("d.md") == {"b.md": 1}
    assert g.neighbours("zzz.md") == {}
    assert [lk.src for lk in g.incoming("a.md")] == ["e.md"]
    assert len(g) == 4


def test_graph_replace_and_remove_file() -> None:
    g = _graph()
    g.add_file("a.md", [Link("a.md", "d.md", "link", 9)])
    assert g.neighbours("a.md") == {"d.md": 1, "e.md": 1}
    assert "a.md" not in g.neighbours("b.md")
    g.remove_file("a.md")
    # Edges into a.md from e.md stay: e.md still links to it.
    assert g.neighbours("a.md") == {"e.md": 1}
    assert g.neighbours("d.md") == {"b.md": 1}
    g.remove_file("b.md")
    g.remove_file("e.md")
    assert len(g) == 0 and g.neighbours("a.md") == {}


def test_graph_records_round_trip_through_json() -> None:
    g = _graph()
    records = json.loads(json.dumps(g.to_records()))
    back = LinkGraph.from_records(records)
    assert back.to_records() == g.to_records()
    assert back.neighbours("a.md", 2) == g.neighbours("a.md", 2)


def test_extracted_links_feed_the_graph() -> None:
    g = LinkGraph()
    g.add_file("memory/2026-07-23/trip.md", extract_links("memory/2026-07-23/trip.md", NOTE,
                                                          found))
    assert "memory/2026-07-23/trip.md" in g.neighbours("digest/wiki/foo.md")


def test_links_cross_the_process_boundary_whole() -> None:
    # Worker processes send links pickled (Link.__reduce__): every field comes back.
    links = [Link("a.md", "b.md", "parent", 7, heading="H", alias="B", resolved=False),
             Link("a.md", "c", "link", 1)]
    back = pickle.loads(pickle.dumps(links, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == links
    assert [type(lk) for lk in back] == [Link, Link]


# Pieces of notes where links, code and headings meet: brackets split by code spans,
# fences, typed keys, section headings.
_NOTE = st.lists(st.sampled_from([
    "[[", "]]", "[", "]", "`", "``", "```", "~~~", "\n", " ", "#", "## Related\n",
    "parent:: ", "a", "b.md", "c/d", "|alias", "#head", "![[", "img.png", "x",
    "<!--", "-->", "%%", "\\",
]), max_size=40).map("".join)


# The same without ``[[`` as a piece (two brackets still meet at random), with code spans
# beside brackets: the notes the skip is for.
_NOTE_WITHOUT_LINKS = st.lists(st.sampled_from([
    "[", "]", "]]", "`", "``", "```", "`x`", "[`", "`[", "\n", " ", "## Related\n",
    "parent:: ", "a", "|alias", "~~~", "x", "<!--", "-->", "%%", "\\",
]), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_NOTE, _NOTE_WITHOUT_LINKS))
def test_notes_the_walk_skips_lose_nothing(text: str) -> None:
    # A last line holding a bracket before one backtick (no code span, no link, no
    # fence) makes extract_links walk every line: the links are the same either way.
    assert extract_links("n.md", text) == extract_links("n.md", text + "\n[`")


_BLOCKS = [
    "", "\ufeff", "---\ntags: [a]\nsep: \"%%\"\n---\n", "\ufeff---\nk: `[[x]]`\n---\n",
    "---\nk: v\nk: w\n---\n", "+++\ntitle = \"t\"\n+++\n", "{\"title\": \"[[j]]\"}\n",
    "---\nno block\n",
]
_BODIES = ["# H\n\nsee [[a]]\n", "<!-- [[hidden]] -->\n## Related\n[[b|B]]\n",
           "%% c %%\n```\n[[code]]\n```\n[[c]]\n", "text only\n"]


def test_a_note_prepared_is_chunked_and_linked_as_alone(tmp_path: Path) -> None:
    # Preparing reads the frontmatter block once for the chunks and the links: both are
    # what each gives reading the note by itself.
    rels = []
    for i, block in enumerate(_BLOCKS):
        for j, body in enumerate(_BODIES):
            rels.append(f"n{i}-{j}.md")
            (tmp_path / rels[-1]).write_text(block + body, encoding="utf-8")
    for prepared in prepare_files(tmp_path, rels, max_chars=2000, digests={}).files:
        text = (tmp_path / prepared.path).read_text(encoding="utf-8")
        assert prepared.chunks == chunk_markdown(prepared.path, text, max_chars=2000)
        assert prepared.links == extract_links(prepared.path, text)


def test_what_workers_send_reduces_to_every_field_in_order(tmp_path: Path) -> None:
    # Link, Chunk and Prepared pickle as constructor calls (__reduce__): a field added to
    # one of them must be in its call too, or it would come back as its default.
    note = tmp_path / "memory" / "2026-07-01" / "n.md"
    note.parent.mkdir(parents=True)
    note.write_text("# Day\n\nsee [[other|Other]] and `code`\n", encoding="utf-8")
    (prepared,) = prepare_files(tmp_path, ["memory/2026-07-01/n.md"], max_chars=2000,
                                digests={}).files
    assert prepared.chunks and prepared.links
    for obj in (prepared, prepared.chunks[0], prepared.links[0]):
        call, args = obj.__reduce__()
        assert call is type(obj)
        assert args == tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))  # type: ignore[arg-type]
        assert pickle.loads(pickle.dumps(obj)) == obj


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a.md", "b.md", "c.md"]),
                          st.lists(st.sampled_from(["a.md", "b.md", "c.md", "d"]), max_size=4),
                          st.booleans()), max_size=12))
def test_a_graph_counts_its_edges_as_files_come_and_go(
        steps: list[tuple[str, list[str], bool]]) -> None:
    graph = LinkGraph()
    for src, dsts, remove in steps:
        if remove:
            graph.remove_file(src)
        else:  # an edge of another source is not the file's own: it is left out
            graph.add_file(src, [Link(src, d, "link", i + 1) for i, d in enumerate(dsts)]
                           + [Link("other.md", "a.md", "link", 1)])
    assert len(graph) == len(graph.to_records())


def test_a_link_resolves_when_its_target_comes_later(tmp_path: Path) -> None:
    # A note applied before the note it links to by name (written first, or in an
    # earlier batch of a pass) gets the edge once that note is applied.
    (tmp_path / "memory/2026-07-01").mkdir(parents=True)
    (tmp_path / "digest/wiki").mkdir(parents=True)
    (tmp_path / "memory/2026-07-01/a.md").write_text(
        "# A\nsee [[Zed Notes|the notes]]\nand [[ zed notes#Part ]] and [[Nowhere]]\n")
    (tmp_path / "digest/wiki/Zed Notes.md").write_text("# Zed\nzed body\n")
    state = IndexState()
    state.apply([prepare_files(tmp_path, ["memory/2026-07-01/a.md"], max_chars=2000,
                               digests={})])
    assert all(not lk.resolved for lk in state.graph.outgoing("memory/2026-07-01/a.md"))
    assert state.neighbours("memory/2026-07-01/a.md") == []
    state.apply([prepare_files(tmp_path, ["digest/wiki/Zed Notes.md"], max_chars=2000,
                               digests={})])
    links = state.graph.outgoing("memory/2026-07-01/a.md")
    assert [(lk.dst, lk.resolved, lk.alias, lk.heading) for lk in links] == [
        ("digest/wiki/Zed Notes.md", True, "the notes", ""),
        ("digest/wiki/Zed Notes.md", True, "", "Part"),
        ("Nowhere", False, "", "")]
    assert state.neighbours("digest/wiki/Zed Notes.md") == ["memory/2026-07-01/a.md"]
    # The name still waited for is listed, whatever its case; the resolved one is not.
    assert state.graph.waiting_for("NOWHERE") == ["memory/2026-07-01/a.md"]
    assert state.graph.waiting_for("zed notes") == []
    # A graph loaded from its records waits for the same names.
    loaded = LinkGraph.from_records(json.loads(json.dumps(state.graph.to_records())))
    assert loaded.waiting_for("nowhere") == ["memory/2026-07-01/a.md"]
    (tmp_path / "memory/2026-07-01/a.md").unlink()
    state.apply([prepare_files(tmp_path, ["memory/2026-07-01/a.md"], max_chars=2000,
                               digests={})])
    assert state.graph.waiting_for("nowhere") == []


def test_a_path_of_the_last_folders_takes_the_note_at_the_very_path(tmp_path: Path) -> None:
    # [[Wiki/Kafka]] names digest/wiki/kafka.md while no note is at wiki/kafka.md; one
    # written there later takes the link, as a first build of both would give it.
    for rel, text in (("digest/wiki/kafka.md", "# k\nx\n"),
                      ("memory/d/p.md", "# P\nsee [[Wiki/Kafka]]\n"),
                      ("wiki/kafka.md", "# k\ny\n")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    state = IndexState()
    state.apply([prepare_files(tmp_path, ["digest/wiki/kafka.md", "memory/d/p.md"],
                               max_chars=2000, digests={})])
    assert [lk.dst for lk in state.graph.outgoing("memory/d/p.md")] == ["digest/wiki/kafka.md"]
    state.apply([prepare_files(tmp_path, ["wiki/kafka.md"], max_chars=2000, digests={})])
    assert [lk.dst for lk in state.graph.outgoing("memory/d/p.md")] == ["wiki/kafka.md"]
    # Saved and loaded, it names it by the path written still.
    loaded = LinkGraph.from_records(state.graph.to_records())
    assert loaded.outgoing("memory/d/p.md") == state.graph.outgoing("memory/d/p.md")
    assert loaded.naming("kafka") == ["memory/d/p.md"]


def test_a_path_from_the_root_names_the_root_note_only() -> None:
    # ``[[/x]]`` and a relative link landing at the root name the root's ``x``, not the
    # bare name ``x`` of any folder; a folder path names no note.
    notes = ["memory/d/plan.md", "plan.md", "wiki/ideas.md"]
    assert pick_note("/plan", notes) == "plan.md"
    assert pick_note("/ideas", notes) is None
    assert pick_note("/Plan.MD", notes[:1]) is None
    assert normalize_target("/Ideas") == ("/Ideas.md", False)
    assert normalize_target("../../ideas", None, "memory/d/n.md") == ("/ideas.md", False)
    assert normalize_target("./ideas", None, "n.md") == ("/ideas.md", False)
    for folder in ("wiki/", "/wiki/", "/", "wiki/..", ".", ".."):
        assert normalize_target(folder, found, "memory/d/n.md") == (folder, False)
