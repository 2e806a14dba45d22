"""Links between nodes follow a node whose file a person renamed."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, dream, node, open_ws, write


def test_related_links_follow_a_node_renamed_by_hand(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-09-01/a.md", "memory/2026-09-02/b.md"
    old, new = "digest/procedure/release-steps.md", "digest/procedure/how-we-release.md"
    hand = "digest/wiki/changelog.md"
    write(root, a, "Release: tag, build, upload. The changelog lists every release.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Release steps",
                       "content": "- tag\n- build\n- upload", "reason": "how-to"}),
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Changelog",
                       "content": "- lists every release", "related": [old],
                       "reason": "fact"})]]
    first = dream(daemon)
    assert first["actions"] == {"CREATE": 2}, first
    assert node(root, hand)[0]["related"] == [old]
    (root / old).rename(root / new)  # by hand: the name in its frontmatter stays
    text = (root / hand).read_text(encoding="utf-8")
    (root / hand).write_text(text.replace(f"- [[{old}]]", f"- [[{old}]] (see the steps)"),
                             encoding="utf-8")
    before = (root / hand).read_bytes()

    write(root, b, "Nothing new about releases.\n")
    second = dream(daemon)
    assert second["actions"] == {"RELINK": 1}, second
    fields, text = node(root, hand)
    assert fields["related"] == [new], fields
    assert f"- [[{new}]] (see the steps)\n" in text and f"[[{old}]]" not in text, text
    assert "renamed related node(s)" in (root / second["log"]).read_text(encoding="utf-8")
    daemon.call("dream.undo", {"agent_id": "dreamer", "run_id": second["run_id"]})
    assert (root / hand).read_bytes() == before


def test_a_run_with_no_note_to_read_still_follows_a_renamed_node(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A run with no changed note returned before it followed renamed nodes: links to a
    node renamed by hand stayed dangling until some note changed."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a = "memory/2026-03-14/pi.md"
    old, new = "digest/wiki/pi-day.md", "digest/wiki/march-14.md"
    cake = "digest/personal/cake.md"
    write(root, a, "Pi day: the user bakes a lemon cake every year.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Pi day",
                       "content": "- on March 14", "reason": "date"}),
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "Cake",
                       "content": "- lemon, every pi day", "related": ["Pi day"],
                       "reason": "habit"})]]
    assert dream(daemon)["actions"] == {"CREATE": 2}
    assert dream(daemon)["run_id"] is None  # nothing changed: nothing to do
    before = (root / cake).read_bytes()
    (root / old).rename(root / new)
    asked = len(fake.requests)
    second = dream(daemon)
    assert second["notes"] == 0 and second["actions"] == {"RELINK": 1}, second
    assert len(fake.requests) == asked  # no model asked
    assert node(root, cake)[0]["related"] == [new]
    assert f"[[{old}]]" not in node(root, cake)[1]
    assert dream(daemon)["run_id"] is None  # followed: not again
    daemon.call("dream.undo", {"agent_id": "dreamer", "run_id": second["run_id"]})
    assert (root / cake).read_bytes() == before


def test_links_written_as_wikilinks_with_an_alias_or_a_heading_name_their_node(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """``[[node|alias]]``, ``[[Name#heading]]`` and a path without ``.md`` name the node
    they link in Obsidian; they were dropped without a word, or taken for other nodes."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-09-03/a.md", "memory/2026-09-04/b.md"
    kettle, tea = "digest/wiki/électrique-kettle.md", "digest/personal/zoë-tea.md"
    write(root, a, "The électrique kettle boils in 90 s. Zoë drinks oolong.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Électrique kettle",
                       "content": "- boils in 90 s", "reason": "fact"}),
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "Zoë tea",
                       "content": "- oolong", "reason": "fact"})]]
    assert dream(daemon)["actions"] == {"CREATE": 2}
    write(root, b, "Zoë boils her oolong in the électrique kettle.\n")
    model.plan[b] = [[("integrate", {
        "action": "CREATE", "bucket": "procedure", "name": "Making oolong",
        "content": "- boil water in the kettle", "reason": "how-to",
        "related": [f"[[{kettle}|the kettle]]", "[[Zoë tea#Oolong]]",
                    "digest/personal/zoë-tea", "[[Nowhere at all|nothing]]"]}),
        ("node_read", {"path": f"[[{kettle}#Speed|kettle]]"}),
        ("integrate", {"action": "CORROBORATE", "bucket": "wiki", "name": "Électrique kettle",
                       "node": f"[[{kettle}|kettle]]", "reason": "said again"})]]
    second = dream(daemon)
    assert second["actions"] == {"CREATE": 1, "CORROBORATE": 1}, (second, model.tool_results)
    fields, text = node(root, "digest/procedure/making-oolong.md")
    assert fields["related"] == [kettle, tea], text
    made, read = model.tool_results[2:4]
    assert made.endswith("not linked, no such node: digest/procedure/nowhere-at-all.md"), made
    assert "- boils in 90 s" in read, read
    assert node(root, kettle)[0]["sources"] == [a, b]


def test_a_related_path_that_is_no_node_is_named_to_the_model(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A daily note, a file outside the buckets or a folder deeper than a bucket in
    ``related`` was dropped without a word: the model took the link as written."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a = "memory/2026-09-05/a.md"
    write(root, a, "The garden hose is in the shed; see the notes of May.\n")
    open_ws(daemon, root, fake)
    odd = ["memory/2026-05-01.md", "[[digest/shed.md]]", "digest/wiki/old/hose.md",
           "notes/garden"]
    model.plan[a] = [[("integrate", {
        "action": "CREATE", "bucket": "wiki", "name": "Garden hose",
        "content": "- in the shed", "reason": "fact", "related": odd})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}, model.tool_results
    fields, _ = node(root, "digest/wiki/garden-hose.md")
    assert fields.get("related", []) == [], fields
    told = model.tool_results[0]
    assert ("not linked, not a node path (digest/<bucket>/<name>.md): memory/2026-05-01.md, "
            "digest/shed.md, digest/wiki/old/hose.md, notes/garden.md") in told, told


def test_links_to_a_node_deleted_by_hand_are_unlinked_and_linked_again_when_back(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A node a person deleted stayed in the ``related`` of the nodes that named it, a
    ``[[wikilink]]`` to nothing, even in a node the run wrote."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-04-01/kite.md", "memory/2026-04-02/kite.md"
    gone, kept = "digest/wiki/ветер-в-дюнах.md", "digest/wiki/kite-club.md"
    hobby = "digest/personal/kite-surfing.md"
    write(root, a, "Aiko kite-surfs with the club when the wind in the dunes is strong.\n")
    open_ws(daemon, root, fake)
    made = {"action": "CREATE", "bucket": "personal", "name": "Kite surfing",
            "content": "- Aiko kite-surfs", "related": ["Ветер в дюнах", "Kite club"],
            "reason": "hobby"}
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Ветер в дюнах",
                       "content": "- strong in spring", "reason": "fact"}),
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Kite club",
                       "content": "- meets on Sundays", "reason": "fact"}),
        ("integrate", made)]]
    assert dream(daemon)["actions"] == {"CREATE": 3}
    assert node(root, hobby)[0]["related"] == [gone, kept]
    text = (root / hobby).read_text(encoding="utf-8")
    (root / hobby).write_text(text.replace(f"- [[{gone}]]", f"- [[{gone}]] (best in April)\n"
                                           "- [[Beaufort scale]] (a page elsewhere)"),
                              encoding="utf-8")
    wind = (root / gone).read_bytes()
    (root / gone).unlink()

    write(root, b, "Aiko kite-surfed again.\n")
    model.plan[b] = [[("integrate", {**made, "action": "CORROBORATE", "node": hobby,
                                     "related": []})]]
    second = dream(daemon)
    assert second["actions"] == {"RELINK": 1, "CORROBORATE": 1}, second
    fields, text = node(root, hobby)
    assert fields["related"] == [kept, "Beaufort scale"], fields
    assert f"[[{gone}]]" not in text and f"- {gone} (deleted) (best in April)\n" in text, text
    assert f"- [[{kept}]]\n" in text and "- [[Beaufort scale]] (a page elsewhere)" in text
    told = (root / second["log"]).read_text(encoding="utf-8")
    # No note asked for it: the change log names no source, not an empty one ("From .").
    assert "related node(s) deleted" in told and "From ." not in told, told

    (root / gone).write_bytes(wind)  # back (from a backup, a trash folder)
    third = dream(daemon)
    assert third["actions"] == {"RELINK": 1}, third
    fields, text = node(root, hobby)
    assert sorted(fields["related"]) == sorted([gone, kept, "Beaufort scale"]), fields
    assert f"- [[{gone}]] (best in April)\n" in text and "(deleted)" not in text, text
    assert dream(daemon)["run_id"] is None  # followed: not again

    # Deleted again, then made again by a dream: the run after links it again.
    (root / gone).unlink()
    assert dream(daemon)["actions"] == {"RELINK": 1}
    c = "memory/2026-04-03/wind.md"
    write(root, c, "The wind in the dunes is strong in spring.\n")
    model.plan[c] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                     "name": "Ветер в дюнах", "content": "- strong in spring",
                                     "reason": "fact"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}
    assert f"- {gone} (deleted) (best in April)\n" in node(root, hobby)[1]
    last = dream(daemon)
    assert last["notes"] == 0 and last["actions"] == {"RELINK": 1}, last
    assert f"- [[{gone}]] (best in April)\n" in node(root, hobby)[1]
    assert dream(daemon)["run_id"] is None
