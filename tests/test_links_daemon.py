"""Links by name between notes, as a daemon resolves them: in whatever order a first build
applies the notes, and when the note linked to is written after the one linking to it."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

from conftest import DaemonFactory, DaemonHandle
from waits import wait_committed

from recalld.daemon.index.passes import POOL_MIN_FILES
from recalld.daemon.store.records import read_records


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


def linked(d: DaemonHandle, word: str) -> tuple[list[str], list[str]]:
    answer = d.call("memory.search", {"agent_id": "w", "query": word, "sync": True})
    return answer["results"][0]["links"], [e["path"] for e in answer["expanded"]]


def test_a_link_by_name_follows_its_note_to_another_folder(daemon_factory: DaemonFactory,
                                                           tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-08-01/plan.md", "# Plan\nplanword: see [[Foo]] and [[bar|B]]\n")
    write(root, "memory/2026-08-01/foo.md", "# Foo\nfooword\n")
    write(root, "memory/2026-08-01/bar.md", "# Bar\nbarword\n")
    config = f'[workspaces.w]\npath = "{root}"\n[daemon]\npersist_delay_s = 0.05\n'
    d = daemon_factory(config)
    assert linked(d, "planword")[1] == ["memory/2026-08-01/bar.md",
                                        "memory/2026-08-01/foo.md"]

    # Moved to another day's folder: [[Foo]] names it there.
    (root / "memory/2026-08-02").mkdir()
    (root / "memory/2026-08-01/foo.md").rename(root / "memory/2026-08-02/foo.md")
    assert linked(d, "planword") == (["memory/2026-08-01/bar.md", "memory/2026-08-02/foo.md"],
                                     ["memory/2026-08-01/bar.md", "memory/2026-08-02/foo.md"])
    assert linked(d, "fooword")[0] == ["memory/2026-08-01/plan.md"]
    # Deleted, then a new note of that name elsewhere: [[bar]] names the new one.
    (root / "memory/2026-08-01/bar.md").unlink()
    assert linked(d, "planword")[0] == ["memory/2026-08-02/foo.md"]
    write(root, "digest/wiki/Bar.md", "# Bar again\nnewbarword\n")
    assert linked(d, "planword")[0] == ["digest/wiki/Bar.md", "memory/2026-08-02/foo.md"]

    # After a restart too (the saved links remember which were written by name).
    wait_committed(d, "w")
    assert d.stop() == 0
    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
    (root / "memory/2026-08-02/foo.md").rename(root / "digest/wiki/foo.md")
    assert linked(d2, "planword")[0] == ["digest/wiki/Bar.md", "digest/wiki/foo.md"]
    # A link by path stays with its path.
    write(root, "digest/wiki/by_path.md", "# By path\npathword [[digest/wiki/foo]]\n")
    assert linked(d2, "pathword")[0] == ["digest/wiki/foo.md"]
    (root / "digest/wiki/foo.md").rename(root / "memory/2026-08-02/foo.md")
    assert linked(d2, "pathword")[0] == []


def test_a_link_by_name_finds_its_note_in_any_unicode_form(daemon: DaemonHandle,
                                                            tmp_path: Path) -> None:
    nfd = unicodedata.normalize("NFD", "ラーメンが好き")  # as a Mac names the file
    assert nfd != "ラーメンが好き"
    root = tmp_path / "ws"
    write(root, f"memory/2026-08-01/{nfd}.md", "# ラーメン\nnoodleword\n")
    write(root, "memory/2026-08-01/plan.md",
          "# Plan\nplanword [[ラーメンが好き]] and [[ＡＰＩ設計|the design]]\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    assert links_of(daemon, "planword") == [f"memory/2026-08-01/{nfd}.md"]
    # Written after the note naming it, in full-width letters there.
    write(root, "digest/wiki/API設計.md", "# API\ndesignword\n")
    assert links_of(daemon, "planword") == ["digest/wiki/API設計.md",
                                            f"memory/2026-08-01/{nfd}.md"]
    assert links_of(daemon, "noodleword") == ["memory/2026-08-01/plan.md"]


def test_a_link_by_name_goes_to_another_note_of_that_name_when_its_own_goes(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-08-01/standup.md", "# Standup\nfirstword\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("index.sync", {"agent_id": "w"})
    write(root, "memory/2026-08-02/standup.md", "# Standup\nsecondword\n")
    daemon.call("index.sync", {"agent_id": "w"})
    write(root, "memory/2026-08-02/plan.md", "# Plan\nplanword [[standup]]\n")
    assert links_of(daemon, "planword") == ["memory/2026-08-02/standup.md"]
    (root / "memory/2026-08-02/standup.md").unlink()
    assert links_of(daemon, "planword") == ["memory/2026-08-01/standup.md"]
    write(root, "memory/2026-08-03/other.md", "# Other\notherword [[Standup]]\n")
    assert links_of(daemon, "otherword") == ["memory/2026-08-01/standup.md"]


def test_links_name_notes_as_obsidian_does(daemon: DaemonHandle, tmp_path: Path) -> None:
    # A name with its ".md", a path in another case or of the last folders only: the
    # note they name. Of two notes alike but for case, the one of the case written.
    root = tmp_path / "ws"
    write(root, "memory/2026-08-01/kafka.md", "# kafka\nlowerword\n")
    write(root, "memory/2026-08-01/Kafka.md", "# Kafka\nupperword\n")
    write(root, "digest/wiki/Broker Notes.md", "# Broker\nbrokerword\n")
    write(root, "memory/2026-08-02/a.md", "# a\nalphaword [[kafka.md]]\n")
    write(root, "memory/2026-08-02/b.md", "# b\nbetaword [[Kafka#Topics|the log]]\n")
    write(root, "memory/2026-08-02/c.md", "# c\ngammaword [[wiki/broker notes]]\n")
    write(root, "memory/2026-08-02/d.md",
          "# d\ndeltaword [[/Digest/Wiki/BROKER NOTES.MD]] [[resource/a.txt]]\n"
          "[[MEMORY/2026-08-01/kafka]] [[memory/2026-08-02/D]]\n")
    write(root, "memory/2026-08-02/e.md", "# e\nepsilonword [[Later/Plan]]\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    assert links_of(daemon, "alphaword") == ["memory/2026-08-01/kafka.md"]
    assert links_of(daemon, "betaword") == ["memory/2026-08-01/Kafka.md"]
    assert links_of(daemon, "gammaword") == ["digest/wiki/Broker Notes.md"]
    # No note at resource/a.txt(.md): no edge to one; a link to itself is none.
    assert links_of(daemon, "deltaword") == ["digest/wiki/Broker Notes.md",
                                             "memory/2026-08-01/kafka.md"]
    assert linked(daemon, "upperword") == (["memory/2026-08-02/b.md"],
                                           ["memory/2026-08-02/b.md"])
    # A path whose note comes later, in another case: linked when it comes.
    assert links_of(daemon, "epsilonword") == []
    write(root, "digest/later/plan.md", "# Plan\nplanword\n")
    assert links_of(daemon, "epsilonword") == ["digest/later/plan.md"]
    assert links_of(daemon, "planword") == ["memory/2026-08-02/e.md"]
    # Renamed to another case: the path written names it still.
    (root / "digest/later/plan.md").rename(root / "digest/later/Plan.md")
    assert links_of(daemon, "epsilonword") == ["digest/later/Plan.md"]


def test_a_search_of_several_workspaces_expands_as_one_does(daemon_factory: DaemonFactory,
                                                            tmp_path: Path) -> None:
    config = ""
    for agent in ("alice", "bob"):
        root = tmp_path / agent
        config += f'[workspaces.{agent}]\npath = "{root}"\nshared_with = ["alice"]\n'
        for i in range(4):
            write(root, f"memory/2026-08-01/{agent}{i}.md",
                  f"# {agent} {i}\n" + "heronword " * (4 - i)
                  + f"\n[[{agent}{i}a]] [[{agent}{i}b]]\n")
            for side in "ab":
                write(root, f"memory/2026-08-02/{agent}{i}{side}.md", f"neighbour {side}\n")
    d = daemon_factory(config)
    for agent in ("alice", "bob"):
        d.call("index.sync", {"agent_id": agent})
    answer = d.call("memory.search", {"agent_id": "alice", "query": "heronword",
                                      "agents": ["alice", "bob"], "max_results": 3})
    results = [(r["agent_id"], r["path"]) for r in answer["results"]]
    assert len(results) == 3
    # At most max_results neighbours, those of the first results first.
    vias = [(e["agent_id"], e["via"]) for e in answer["expanded"]]
    assert len(vias) == 3
    assert vias == sorted(vias, key=results.index)
    assert vias[0] == results[0]


def test_a_hit_cut_from_a_search_of_several_workspaces_stays_a_neighbour(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # alice's weak hit x is linked from her strong hit y; bob's two hits outrank x, so
    # the merge cuts it: y still brings it, as a search of alice alone does.
    config = ""
    for agent in ("alice", "bob"):
        config += (f'[workspaces.{agent}]\npath = "{tmp_path / agent}"\n'
                   'shared_with = ["alice"]\n')
    write(tmp_path / "alice", "digest/wiki/y.md", "# Y\nheronword heronword heronword [[x]]\n")
    write(tmp_path / "alice", "digest/wiki/x.md",
          "---\nname: x\n---\n# X\nheronword " + " ".join(f"w{i}" for i in range(300)) + "\n")
    for name in ("b1", "b2"):
        write(tmp_path / "bob", f"digest/wiki/{name}.md", f"# {name}\nheronword heronword\n")
    d = daemon_factory(config)
    for agent in ("alice", "bob"):
        d.call("index.sync", {"agent_id": agent})

    def search(**params: object) -> dict[str, Any]:
        answer: dict[str, Any] = d.call("memory.search", {
            "agent_id": "alice", "query": "heronword", "max_results": 3, **params})
        return answer

    both = search(agents=["alice", "bob"])
    assert sorted((r["agent_id"], r["path"]) for r in both["results"]) == [
        ("alice", "digest/wiki/y.md"), ("bob", "digest/wiki/b1.md"),
        ("bob", "digest/wiki/b2.md")]
    alone = search(max_results=1)
    assert [r["path"] for r in alone["results"]] == ["digest/wiki/y.md"]
    (want,) = alone["expanded"]
    (got,) = both["expanded"]
    assert got.pop("agent_id") == "alice"
    assert got == want and want["via"] == "digest/wiki/y.md"
    assert want["start_line"] == 4 and "name: x" not in want["text"]


def test_a_code_block_ends_at_its_own_fence(daemon: DaemonHandle, tmp_path: Path) -> None:
    # A ```` block that shows a ``` one, and a ``` block holding a ```python line: neither
    # inner line closes its block (CommonMark), so what follows it is still code: no
    # heading that starts a chunk, no link.
    root = tmp_path / "ws"
    write(root, "digest/wiki/kettle.md", "# Kettle\nkettleword\n")
    write(root, "memory/2026-08-01/howto.md",
          "# Code blocks\nhowtoword: use a longer fence\n\n````markdown\n```python\n"
          "# a comment, no heading\nprint(1)\n```\n\nsee [[kettle]]\n````\n\ndone\n")
    write(root, "memory/2026-08-01/log.md",
          "# Log\nlogword\n```\nout\n```python\n# also code\n[[kettle]]\n```\n")
    # Blocks fenced inside a quote or a list item are code as well, up to their fence or
    # the end of what holds them; a link after them counts.
    write(root, "digest/wiki/after.md", "# After\nafterword\n")
    write(root, "memory/2026-08-01/steps.md",
          "# Steps\nstepsword\n\n> ```\n> see [[kettle]]\n> ```\n\n- install:\n"
          "    ```bash\n    # [[kettle]]\n\n    ```\n2. run:\n   ~~~\n   [[kettle]]\n"
          "1. - ```\n     [[kettle]]\n> ```\n> [[kettle]]\n\nthen [[after]]\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    for word, end in (("howtoword", 13), ("logword", 8)):
        answer = daemon.call("memory.search", {"agent_id": "w", "query": word, "sync": True})
        (hit,) = answer["results"]
        assert (hit["start_line"], hit["end_line"]) == (1, end), word
        assert hit["links"] == [] and answer["expanded"] == [], word
    answer = daemon.call("memory.search", {"agent_id": "w", "query": "stepsword"})
    assert answer["results"][0]["links"] == ["digest/wiki/after.md"], answer
    comment = daemon.call("memory.search", {"agent_id": "w", "query": "comment heading"})
    assert [(r["start_line"], r["heading"]) for r in comment["results"]] == [(1, "Code blocks")]


def test_a_link_to_a_note_named_for_a_credential_is_kept(daemon: DaemonHandle,
                                                         tmp_path: Path) -> None:
    # Notes about keys and tokens, named so: their paths are words and dates, no secret,
    # so the index keeps the links naming them and the text showing them.
    root = tmp_path / "ws"
    targets = ["memory/2026-09-14/gitlab-token-renewal.md", "digest/ops/ssh-key-handover.md"]
    for i, rel in enumerate(targets):
        write(root, rel, f"# {rel}\nrenewal{i} steps\n")
    write(root, "digest/wiki/ops.md",
          "# Ops\nopsword: see [[memory/2026-09-14/gitlab-token-renewal.md]] and\n"
          "[[digest/ops/ssh-key-handover]] first\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    assert sorted(links_of(daemon, "opsword")) == sorted(targets)
    hit = daemon.call("memory.search", {"agent_id": "w", "query": "opsword"})["results"][0]
    assert all(rel.removesuffix(".md") in hit["text"] for rel in targets), hit["text"]
    assert "[REDACTED]" not in hit["text"], hit["text"]


def test_a_link_from_the_root_names_no_note_of_its_name_elsewhere(daemon: DaemonHandle,
                                                                  tmp_path: Path) -> None:
    # ``[[/plan]]`` and ``[[../../plan]]`` from a day's note name the root's plan.md (a
    # root note is not indexed), not the day's plan.md beside the note; a folder link
    # names no note of the folder's name. A path from the note's folder still does.
    root = tmp_path / "ws"
    write(root, "memory/2026-08-01/plan.md", "# Day plan\ndayplanword\n")
    write(root, "memory/2026-08-01/wiki.md", "# Day wiki\ndaywikiword\n")
    write(root, "memory/2026-08-01/a.md",
          "# a\nrootlinkword [[/plan]] [[../../Plan]] [[wiki/]] [[/]]\n")
    write(root, "memory/2026-08-02/b.md", "# b\nbesideword [[../2026-08-01/plan]]\n")
    # A path from the root with folders names the note at that very path, not one whose
    # path ends so (as ``[[wiki/kafka]]`` would), also where a relative path lands.
    write(root, "digest/wiki/kafka.md", "# Kafka\nkafkaword\n")
    write(root, "memory/2026-08-03/c.md",
          "# c\ndeepword [[/wiki/kafka]] [[/2026-08-01/Plan]] [[../../wiki/kafka|K]]\n"
          "[[../../2026-08-01/plan#Top]]\n")
    write(root, "memory/2026-08-03/d.md", "# d\nrightword [[/digest/wiki/Kafka]]\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    assert links_of(daemon, "deepword") == []
    assert links_of(daemon, "rightword") == ["digest/wiki/kafka.md"]
    assert links_of(daemon, "kafkaword") == ["memory/2026-08-03/d.md"]
    assert links_of(daemon, "rootlinkword") == []
    assert links_of(daemon, "besideword") == ["memory/2026-08-01/plan.md"]
    assert links_of(daemon, "dayplanword") == ["memory/2026-08-02/b.md"]
    # Another note of the name coming later does not take them either.
    write(root, "digest/plan.md", "# Digest plan\ndigestplanword\n")
    write(root, "memory/wiki/kafka.md", "# Kafka\nmemkafkaword\n")
    assert links_of(daemon, "digestplanword") == []
    assert links_of(daemon, "rootlinkword") == []
    assert links_of(daemon, "memkafkaword") == []
    assert links_of(daemon, "deepword") == []


def test_links_no_renderer_shows_are_none(daemon_factory: DaemonFactory,
                                          tmp_path: Path) -> None:
    # In a comment (HTML or Obsidian, on one line or over several, closed or running to
    # the end) or escaped, a link is shown by no Markdown renderer: no edge, no neighbour.
    # Beside such a comment, or after it closes, a link counts.
    root = tmp_path / "ws"
    write(root, "digest/wiki/Heron Plan.md", "# Heron plan\ntargetword\n")
    write(root, "digest/wiki/kept.md", "# Kept\nkeptword\n")
    write(root, "memory/2026-08-01/hidden.md",
          "# Hidden\nhiddenword <!--see [[heron plan]]--> and %%[[Heron Plan#Why]]%%\n"
          "<!-- draft:\n  - [[HERON PLAN|plan]]\n-->\n%%\n[[heron plan]]\n%%\n"
          "escaped \\[[heron plan]] and \\\\\\[[heron plan|p]]\n"
          "<!-- todo --> [[kept]] %%x%%\n%% never closed\n[[heron plan]]\n")
    write(root, "memory/2026-08-01/shown.md",
          "# Shown\nshownword 100% sure <!-- [[heron plan]], and \\\\[[Heron Plan]]\n")
    # Two links of one line to one note, by other headings and aliases: both kept.
    write(root, "memory/2026-08-01/two.md",
          "# Two\ntwoword [[Heron Plan#^step1|first]] then [[heron plan#Risks|risks]]\n")
    daemon = daemon_factory(f'[workspaces.w]\npath = "{root}"\n'
                            '[daemon]\npersist_delay_s = 0.05\n')
    assert linked(daemon, "hiddenword") == (["digest/wiki/kept.md"], ["digest/wiki/kept.md"])
    assert links_of(daemon, "shownword") == ["digest/wiki/Heron Plan.md"]
    assert linked(daemon, "targetword") == (
        ["memory/2026-08-01/shown.md", "memory/2026-08-01/two.md"],
        ["memory/2026-08-01/shown.md", "memory/2026-08-01/two.md"])
    wait_committed(daemon, "w")
    graph = max((root / "mem_metadata/index").glob("graph.g*.jsonl.zst"))
    edges = [(r["src"].rsplit("/", 1)[1], r["line"], r["heading"], r["alias"])
             for r in read_records(graph)]
    assert edges == [("hidden.md", 10, "", ""), ("shown.md", 2, "", ""),
                     ("two.md", 2, "^step1", "first"), ("two.md", 2, "Risks", "risks")]
