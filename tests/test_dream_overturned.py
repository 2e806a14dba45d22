"""A correction starts a node's backing again: the notes of the claim it overturned stay
recorded (``overturned_sources``, and named in the History entry) but no longer raise its
confidence (a real daemon and a scripted model, see test_dream.py; and the pure rules)."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write

from recalld.daemon.memory import digest, integration

DRINK = "digest/personal/drink.md"


def said(model: ScriptedModel, note: str, action: str, content: str = "") -> None:
    args = {"action": action, "bucket": "personal", "name": "Drink", "reason": "told so",
            **({"content": content} if content else {}),
            **({"node": DRINK} if action != "CREATE" else {})}
    model.plan[note] = [[("integrate", args)]]


def test_a_claim_corrected_back_and_forth_is_no_surer_for_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Tea, then coffee, then tea again over three notes ended at confidence 0.88, above a
    fact said twice: the notes whose claim was overturned still counted as backing what
    the node says now."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b, c, d = (f"memory/2027-03-0{day}/drinks.md" for day in (1, 2, 3, 4))
    write(root, a, "Green tea every morning.\n")
    write(root, b, "Switched to espresso.\n")
    said(model, a, "CREATE", "- green tea in the morning")
    said(model, b, "CORRECT", "- espresso in the morning")
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CREATE": 1, "CORRECT": 1}
    fields, _ = node(root, DRINK)
    assert (fields["sources"], fields["overturned_sources"]) == ([b], [a]), fields
    after_first = (root / DRINK).read_bytes()

    write(root, c, "Back to green tea; espresso kept me awake.\n")
    said(model, c, "CORRECT", "- green tea in the morning")
    second = dream(daemon)
    assert second["actions"] == {"CORRECT": 1}, second
    fields, text = node(root, DRINK)
    assert fields["sources"] == [c] and fields["overturned_sources"] == [a, b], fields
    assert (fields["confidence"], fields["corroborations"]) == (0.5, 0), fields
    assert text.split("## Sources\n\n", 1)[1] == f"- [[{c}]]\n", text
    history = text.split("## History\n", 1)[1].split("## Sources")[0]
    assert f'"espresso in the morning" (source: [[{c}]]; reason: told so; it stood on: ' \
           f"[[{b}]])" in history, history
    corrected = (root / DRINK).read_bytes()

    # Undone, the node is as the first run left it, byte for byte; dreamed again, as before.
    daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second["run_id"]})
    assert (root / DRINK).read_bytes() == after_first
    assert dream(daemon)["actions"] == {"CORRECT": 1}
    assert (root / DRINK).read_bytes() == corrected

    # A later note saying it again corroborates what the node says now.
    write(root, d, "Green tea again this morning.\n")
    said(model, d, "CORROBORATE")
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}
    fields, _ = node(root, DRINK)
    assert fields["sources"] == [c, d] and fields["confidence"] == 0.75, fields

    # The notes overturned, renamed or deleted, are followed in the field and History.
    renamed = "memory/2027-03-01/drinks (morning).md"
    (root / a).rename(root / renamed)
    (root / b).unlink()
    assert dream(daemon)["actions"] == {"RELINK": 2}  # the rename, then the deletion
    fields, text = node(root, DRINK)
    assert fields["overturned_sources"] == [renamed, b], fields
    assert fields["sources"] == [c, d] and fields["confidence"] == 0.75, fields
    assert f"[[{renamed}]]" in text and f"[[{a}]]" not in text, text
    assert f"it stood on: {b} (deleted))" in text and f"[[{b}]]" not in text, text


PATH = "digest/wiki/standup.md"


def correct(existing: digest.Node, source: str = "memory/2027-04-09/standup.md"
            ) -> digest.Node:
    out = integration.integrate(existing, digest.Integration(
        action="CORRECT", bucket="wiki", name="Standup", node=PATH, sources=(source,),
        content="- the standup is at 10:00", reason="moved"), "2027-04-10")
    assert out.status == "applied" and out.text is not None, out
    again = digest.parse_node(PATH, out.text)
    assert digest.render_node(again) == out.text  # read back as written
    return again


def test_older_hand_written_and_reme_nodes_are_corrected_alike() -> None:
    """A node of ReMe's form (``derived_from::`` lines), one a person wrote with words
    after a source's link and a deleted source, and one a person links an overturned
    note of again: only the sources of what it says now count."""
    reme = digest.parse_node(PATH, "---\nname: Standup\n---\n# Standup\n\n- at 9:30\n"
                                   "derived_from:: [[memory/2027-04-01/a.md]]\n"
                                   "derived_from:: [[memory/2027-04-02/b.md]]\n")
    assert reme.confidence == 0.75
    node = correct(reme)
    assert node.sources == ["memory/2027-04-09/standup.md"] and node.confidence == 0.5
    assert node.overturned_sources == ["memory/2027-04-01/a.md", "memory/2027-04-02/b.md"]

    by_hand = digest.parse_node(PATH, (
        "---\nname: Standup\nsources: [memory/2027-04-01/a.md]\n"
        "deleted_sources: [memory/2027-04-03/c.md]\nowner: me\n---\n# Standup\n\n- at 9:30\n\n"
        "## Sources\n\nWhere it was said:\n- [[memory/2027-04-01/a.md]] (Monday's call)\n"
        "- memory/2027-04-03/c.md (deleted)\n"))
    node = correct(by_hand)
    assert node.overturned_sources == ["memory/2027-04-01/a.md", "memory/2027-04-03/c.md"]
    assert (node.deleted_sources, node.confidence, node.extra) == ([], 0.5, {"owner": "me"})
    # The person's own line stays; the lines of the notes overturned go with them.
    assert digest.render_node(node).split("## Sources\n\n", 1)[1] == \
        "Where it was said:\n- [[memory/2027-04-09/standup.md]]\n"
    assert "it stood on: [[memory/2027-04-01/a.md]], memory/2027-04-03/c.md (deleted))" \
        in node.history[0], node.history

    # A person links an overturned note again: it backs the node again.
    text = digest.render_node(node).replace(
        "## Sources\n\n", "## Sources\n\n- [[memory/2027-04-01/a.md]]\n")
    linked = digest.parse_node(PATH, text)
    assert linked.overturned_sources == ["memory/2027-04-03/c.md"] and \
        linked.confidence == 0.75, linked
    # What a person writes in the field that names no note is not read as written.
    assert "overturned_sources holds a number" in digest.parse_node(
        PATH, text.replace("overturned_sources: [", "overturned_sources: [7, ")).problem


def test_a_note_stating_the_old_number_in_numerals_is_no_corroboration(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Chinese numerals and Thai digits were compared a character at a time: a node
    saying the rent is 九百五十 (950) "held" a note's line saying 九百 (900), one saying
    ๙๕๐ held ๙๐๐, and the model's CREATE of the older number was applied as a
    corroboration of the newer. A number is one word, however it is written."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b, c = ("memory/2026-11-20/a.md", "memory/2026-11-21/b.md",
               "memory/2026-11-22/c.md")
    rent = "digest/personal/rent.md"
    now = "- 房租每月九百五十欧元\n- ค่าเช่า ๙๕๐ บาท"
    write(root, a, "房租涨到九百五十欧元。ค่าเช่า ๙๕๐ บาท\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Rent",
                                     "content": now, "reason": "fact"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}, model.tool_results
    write(root, b, "旧笔记：房租每月九百欧元。ค่าเช่า ๙๐๐ บาท\n")
    model.plan[b] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Rent",
                                     "content": old, "reason": "fact"})
                      for old in ("- 房租每月九百欧元", "- ค่าเช่า ๙๐๐ บาท")]]
    second = dream(daemon)
    assert second["actions"] == {"refused": 2}, (second, model.tool_results)
    fields, text = node(root, rent)
    assert fields["sources"] == [a] and fields["corroborations"] == 0, fields
    assert "九百五十" in text and "九百欧元" not in text, text
    write(root, c, "房租还是九百五十欧元。\n")
    model.plan[c] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Rent",
                                     "content": "- 房租每月九百五十欧元", "reason": "again"})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}, model.tool_results
    assert node(root, rent)[0]["sources"] == [a, c]


def test_a_note_stating_a_version_date_or_sign_otherwise_is_no_corroboration(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A number's parts were words of their own: "2.1.0" and "2.0.1", "2026-03-05" and
    "2026-05-03" had the same words, and "-5" was "5" (its sign read as a list mark at a
    line's start). A note saying the other version, day or temperature was applied as a
    corroboration of what it contradicts. A number is one word with its separators and
    its sign."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    ops = "digest/procedure/ops.md"
    write(root, a, "Pinned to 2.1.0; deadline 2026-03-05; freezer at -5 °C.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {
        "action": "CREATE", "bucket": "procedure", "name": "Ops", "reason": "facts",
        "content": "- pinned to 2.1.0\n- deadline 2026-03-05\n-5 °C in the freezer"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}, model.tool_results
    write(root, b, "Pinned to 2.0.1; deadline 2026-05-03; 5 °C in the freezer.\n")
    model.plan[b] = [[("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Ops",
                                     "content": said, "reason": "facts"})
                      for said in ("- pinned to 2.0.1", "- deadline 2026-05-03",
                                   "- 5 °C in the freezer")]]
    second = dream(daemon)
    assert second["actions"] == {"refused": 3}, (second, model.tool_results)
    fields, _ = node(root, ops)
    assert fields["sources"] == [a] and fields["corroborations"] == 0, fields
