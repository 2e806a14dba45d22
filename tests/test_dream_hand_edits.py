"""A digest node a person edited by hand between dreams: a rewrite the model proposes
without reading it is refused, and one proposed on what it read keeps the edit."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, dream, node, open_ws, run_job, write
from test_dream_history import history_text

from recalld.daemon.memory import digest, integration

TRIP = "digest/personal/trip-to-lisbon.md"
HAND = "- la réservation est au nom de Zoë Ørsted (ajouté à la main)"


def test_a_rewrite_of_a_node_edited_by_hand_needs_the_node_read(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    write(root, "memory/2026-05-01/trip.md", "Trip to Lisbon from 3 to 7 June.\n")
    model.plan["memory/2026-05-01/trip.md"] = [[("integrate", {
        "action": "CREATE", "bucket": "personal", "name": "Trip to Lisbon",
        "content": "- from 3 to 7 June\n- hotel in Alfama", "reason": "planned"})]]
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CREATE": 1}
    text = (root / TRIP).read_text(encoding="utf-8")
    (root / TRIP).write_text(text.replace("- hotel in Alfama\n", f"- hotel in Alfama\n{HAND}\n"),
                             encoding="utf-8")
    # A later note contradicts the first: the trip moved. The model's first rewrite is
    # made on what it guessed the node says, the second on what it read.
    later = "memory/2026-05-09/trip.md"
    write(root, later, "The Lisbon trip moved: 10 to 14 June now.\n")
    guess = {"action": "CORRECT", "bucket": "personal", "name": "Trip to Lisbon",
             "node": TRIP, "content": "- from 10 to 14 June\n- hotel in Alfama",
             "reason": "moved"}
    model.plan[later] = [[("integrate", guess)], [("node_read", {"path": TRIP})],
                         [("integrate", {**guess, "content": "- from 10 to 14 June\n"
                                                 f"- hotel in Alfama\n{HAND}"})]]
    second = dream(daemon)
    assert second["actions"] == {"refused": 1, "CORRECT": 1}, second
    assert any("edited by hand" in r for r in model.tool_results), model.tool_results
    _, text = node(root, TRIP)
    body = text.split("## History")[0]
    assert HAND in body and "- from 10 to 14 June" in body, text
    assert "Zoë" not in history_text(text) and "3 to 7 June" in history_text(text), text

    # Written by the dream since, the node is no longer a hand edit: a rewrite of it
    # without reading it is judged as any other.
    third = "memory/2026-05-10/trip.md"
    write(root, third, "Lisbon hotel: in Alfama, the one with the blue door.\n")
    model.plan[third] = [[("integrate", {
        **guess, "action": "REFINE", "reason": "detail",
        "content": f"- from 10 to 14 June\n- hotel in Alfama, blue door\n{HAND}"})]]
    assert dream(daemon)["actions"] == {"REFINE": 1}
    assert "blue door" in node(root, TRIP)[1]


NOTES = "digest/wiki/lab-notebook.md"
PERSON = "- le carnet bleu est rangé sous l'évier (écrit à la main)"


def test_a_node_no_dream_wrote_is_read_before_it_is_rewritten(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A node a person made in the digest folder (or ReMe wrote, or a dream whose run
    # records are gone): no run record says what a dream left in it.
    root = tmp_path / "ws"
    write(root, NOTES, "---\nname: Lab notebook\nbucket: wiki\n---\n# Lab notebook\n\n"
                       f"- kept in room 4\n{PERSON}\n")
    note = "memory/2026-07-02/lab.md"
    write(root, note, "The lab notebook moved to room 9.\n")
    model = ScriptedModel(fake)
    guess = {"action": "CORRECT", "bucket": "wiki", "node": NOTES, "name": "Lab notebook",
             "content": "- kept in room 9", "reason": "moved"}
    model.plan[note] = [[("integrate", guess)], [("node_read", {"path": NOTES})],
                        [("integrate", {**guess, "content": f"- kept in room 9\n{PERSON}"})]]
    open_ws(daemon, root, fake)
    result = dream(daemon)
    assert result["actions"] == {"refused": 1, "CORRECT": 1}, result
    assert any("edited by hand" in r for r in model.tool_results), model.tool_results
    _, text = node(root, NOTES)
    body = text.split("## History")[0]
    assert PERSON in body and "- kept in room 9" in body, text
    assert "évier" not in history_text(text) and "room 4" in history_text(text), text


def test_a_hand_edit_a_dream_wrote_around_unread_still_needs_the_node_read(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A node a person edited, then corroborated by a note whose model did not read it,
    still holds lines no model read: a later rewrite on a guess is refused as before."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    first, again, moved = ("memory/2026-07-01/lab.md", "memory/2026-07-03/lab.md",
                           "memory/2026-07-04/lab.md")
    write(root, first, "The lab notebook is in room 4.\n")
    made = {"action": "CREATE", "bucket": "wiki", "name": "Lab notebook",
            "content": "- kept in room 4", "reason": "fact"}
    model.plan[first] = [[("integrate", made)]]
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CREATE": 1}
    text = (root / NOTES).read_text(encoding="utf-8")
    (root / NOTES).write_text(text.replace("- kept in room 4\n", f"- kept in room 4\n{PERSON}\n"),
                              encoding="utf-8")
    write(root, again, "Yes, the lab notebook is in room 4.\n")
    model.plan[again] = [[("integrate", {**made, "action": "CORROBORATE", "node": NOTES})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}
    write(root, moved, "The lab notebook moved to room 9.\n")
    model.plan[moved] = [[("integrate", {**made, "action": "CORRECT", "node": NOTES,
                                         "content": "- kept in room 9", "reason": "moved"})]]
    assert dream(daemon)["actions"] == {"refused": 1}
    assert PERSON in node(root, NOTES)[1].split("## History")[0]


def test_a_node_longer_than_a_rewrite_may_be_is_not_rewritten(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A person's page whose content, shown whole, is longer than a proposal may hold
    (8,000 characters): a CORRECT could keep at most that much, and pushed the rest into
    one History entry thousands of characters long. It is refused, saying why."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    page = "digest/wiki/glossary.md"
    lines = [f"- term {n}: a word the team uses for thing number {n}" for n in range(220)]
    write(root, page, "---\nname: Glossary\n---\n\n# Glossary\n\n" + "\n".join(lines) + "\n")
    before = (root / page).read_text(encoding="utf-8")
    note = "memory/2026-06-03/terms.md"
    write(root, note, "Term 0 now means thing 1000.\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [[("node_read", {"path": page})], [("integrate", {
        "action": "CORRECT", "node": page, "reason": "changed", "sources": [note],
        "content": "\n".join(["- term 0: thing 1000", *lines[1:150]])})]]
    result = dream(daemon)
    assert result["actions"] == {"refused": 1}, (result, model.tool_results)
    assert "[cut:" not in model.tool_results[0]
    assert "more than a rewrite may hold (8000)" in model.tool_results[1], model.tool_results
    assert (root / page).read_text(encoding="utf-8") == before


def test_a_node_shown_cut_inside_its_content_is_not_rewritten_on_the_part_read(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A person's node with a long frontmatter before a content a rewrite may hold: a tool
    result cut node_read's text inside the content, yet the node was recorded read, so a
    CORRECT on the lines shown sent the lines never shown to History. Now the cut is
    said, and a rewrite of a content shown in part is refused; a CORROBORATE applies."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    page = "digest/procedure/runbook.md"
    lines = [f"- step {n}: restart s{n} and read its log" for n in range(180)]
    aside = " ".join(f"word{n}" for n in range(1800))
    write(root, page, f"---\nname: Runbook\nkept_aside: {aside}\n---\n\n# Runbook\n\n"
          + "\n".join(lines) + "\n")
    note = "memory/2026-06-02/runbook.md"
    write(root, note, "Step 0 of the runbook now restarts s0 twice.\n")
    open_ws(daemon, root, fake)
    fix = {"action": "CORRECT", "node": page, "reason": "changed", "sources": [note],
           "content": "- step 0: restart s0 twice"}
    model.plan[note] = [[("node_read", {"path": page})], [("integrate", fix)],
                        [("integrate", {"action": "CORROBORATE", "node": page,
                                        "reason": "same", "sources": [note]})]]
    result = dream(daemon)
    assert result["actions"] == {"refused": 1, "CORROBORATE": 1}, (result, model.tool_results)
    shown, refused = model.tool_results[0], model.tool_results[1]
    assert "[truncated]" not in shown and "cannot be rewritten (REFINE, CORRECT)" in shown
    assert shown.endswith("]") and "step 179" not in shown and "- step 0:" in shown, shown[-300:]
    assert "too long to be shown whole" in refused, refused
    text = (root / page).read_text(encoding="utf-8")
    assert all(line in text for line in lines) and "## History" not in text, text[-500:]



def test_a_node_whose_own_fields_say_what_they_cannot_is_refused_saying_what(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A hand-edited ``deleted_sources: yes`` was read as a source named ``yes`` and
    counted toward the confidence; ``corroborations: -5`` became -4; a frontmatter that
    did not parse for a nested list was said to hold a duplicate key or an open quote."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-07-02/kitchen.md"
    write(root, note, "The kettle boils in 90 s.\n")
    nodes = {
        "kettle": "deleted_sources: yes\n",
        "mug": "corroborations: -5\n",
        "jar": "sources: [memory/2026-07-01/a.md, 17]\n",
        "pot": "sources: [memory/2026-07-01/a.md, {by: hand}]\n",
    }
    for name, field in nodes.items():
        write(root, f"digest/wiki/{name}.md",
              f"---\nname: {name}\n{field}---\n# {name}\n\n- boils\n")
    before = {name: (root / f"digest/wiki/{name}.md").read_bytes() for name in nodes}
    model.plan[note] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki",
                                        "node": f"digest/wiki/{name}.md", "reason": "again"})
                         for name in nodes]]
    open_ws(daemon, root, fake)
    job = run_job(daemon, "auto_dream")  # the note waits on the nodes to be mended
    assert job["state"] == "failed" and "cannot be read as written" in job["error"], job
    told = dict(zip(nodes, model.tool_results, strict=True))
    assert all(told[name].startswith("refused:") for name in nodes), told
    assert "deleted_sources holds 'yes', which is no note's path" in told["kettle"], told
    assert "corroborations is -5, not a count" in told["mug"], told
    assert "sources holds a number (17), not a path" in told["jar"], told
    assert "sources: a { inside a flow list or mapping" in told["pot"], told
    assert not any("duplicate key" in t for t in told.values()), told
    assert {name: (root / f"digest/wiki/{name}.md").read_bytes() for name in nodes} == before


def test_an_older_node_naming_a_source_by_name_stays_readable_once_written() -> None:
    """A ReMe node links a source note by its bare name; written again, the name is in
    its frontmatter's sources, which a source of any text may be (deleted ones may not)."""
    old = digest.parse_node("digest/wiki/x.md", "---\nname: x\n---\n# x\n\n- a fact\n"
                                                "derived_from:: [[standup-notes]]\n")
    out = integration.integrate(old, digest.Integration(
        action="CORROBORATE", bucket="wiki", name="x", node="digest/wiki/x.md",
        sources=("memory/2026-07-04/b.md",)), "2026-07-05")
    assert out.text is not None and "sources: [standup-notes, memory/" in out.text, out
    again = digest.parse_node("digest/wiki/x.md", out.text)
    assert not again.unreadable and again.confidence == digest.confidence_for(2), again


def test_content_a_corroboration_carries_is_not_written_and_the_model_is_told(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The node gains the source; what the content says beyond it was dropped while the
    model was told "applied", as if it were kept."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, pan = "memory/2026-07-03/pan.md", "digest/wiki/pan.md"
    write(root, note, "The pan fries eggs in 3 minutes.\n")
    write(root, pan, "---\nname: pan\nsources: [memory/2026-07-01/a.md]\n---\n# pan\n\n- fries\n")
    said = {"action": "CORROBORATE", "bucket": "wiki", "node": pan, "reason": "again"}
    model.plan[note] = [[("integrate", {**said, "content": "- fries eggs in 3 minutes"})],
                        [("integrate", {**said, "content": "- Fries"})]]
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CORROBORATE": 1, "unchanged": 1}
    more, same = model.tool_results
    assert more.startswith("applied: CORROBORATE") and "was not written" in more, more
    assert "REFINE" in more and "CORRECT" in more, more
    # Content the node already says (another case) is no news: nothing to tell.
    assert same.startswith("unchanged:") and "not written" not in same, same
    fields, text = node(root, pan)
    assert fields["corroborations"] == 1 and "eggs" not in text, text


def test_the_first_source_of_a_node_a_person_wrote_backs_it_and_corroborates_nothing(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A node written by hand, citing no note: the first note that says it is its first
    source (counted 0 corroborations, as a created node's), the next one a corroboration;
    it said 1 and then 2, with its confidence at 0.5 and 0.75."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    tea = "digest/personal/お茶.md"
    write(root, tea, "---\nname: お茶\n---\n# お茶\n\n- 緑茶が好き\n")
    first, second = "memory/2026-06-01/朝.md", "memory/2026-06-02/夜.md"
    write(root, first, "朝は緑茶。\n")
    write(root, second, "夜も緑茶が好き。\n")
    # A CREATE of what the node says lands on it as a corroboration; then the explicit one.
    model.plan[first] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                         "name": "お茶", "content": "- 緑茶が好き",
                                         "reason": "said"})]]
    model.plan[second] = [[("integrate", {"action": "CORROBORATE", "bucket": "personal",
                                          "node": tea, "reason": "said again"})]]
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CORROBORATE": 2}, model.tool_results
    fields, _ = node(root, tea)
    assert fields["sources"] == [first, second], fields
    assert (fields["corroborations"], fields["confidence"]) == (1, 0.75), fields
    assert model.tool_results[0].endswith("confidence 0.5 -> 0.5"), model.tool_results


def test_a_node_read_by_its_name_in_any_form_may_then_be_rewritten(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A person's node, in a bucket of its own, named by its name as integrate takes it:
    # bare, as a wikilink, decomposed (NFD), in capitals or full-width letters.
    root = tmp_path / "ws"
    cafe = "digest/procedure/café-zoë.md"
    write(root, cafe, "---\nname: Café Zoë\nbucket: procedure\n---\n# Café Zoë\n\n"
                      "- order crêpes at the counter\n")
    note = "memory/2026-07-03/cafe.md"
    write(root, note, "At Café Zoë, pay at the counter before ordering.\n")
    model = ScriptedModel(fake)
    forms = ["Café Zoë", "[[Café Zoë]]", unicodedata.normalize("NFD", "Café Zoë"),
             "CAFÉ ZOË", "Ｃａｆé Ｚｏë", "café-zoë.md"]
    model.plan[note] = [[("node_read", {"path": f}) for f in forms], [("integrate", {
        "action": "REFINE", "bucket": "procedure", "node": "Café Zoë", "reason": "detail",
        "content": "- pay at the counter first\n- order crêpes at the counter"})]]
    open_ws(daemon, root, fake)
    result = dream(daemon)
    reads = model.tool_results[:len(forms)]
    assert all(r.startswith(f"(the node {cafe})\n---\nname: Café Zoë") for r in reads), reads
    assert result["actions"] == {"REFINE": 1}, model.tool_results
    assert "- pay at the counter first" in node(root, cafe)[1]


def test_a_dream_writes_no_content_it_could_not_read_whole_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Chinese text costs a model about nine times as much as English of the same length:
    # 3,000 characters are within what a proposal may hold (8,000), but beyond what
    # node_read shows. Written, such a node could never be refined or corrected again.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-06-04/zh.md"
    write(root, note, "用户的读书笔记很长。\n")
    long_zh = "\n".join(f"- 第{n:03d}条：用户读过的书里有一段很长的摘录需要记住"
                        for n in range(120))
    short_zh = "\n".join(long_zh.splitlines()[:20])
    create = {"action": "CREATE", "bucket": "wiki", "name": "读书笔记", "reason": "书",
              "content": long_zh}
    model.plan[note] = [[("integrate", create)],
                        [("integrate", {**create, "content": short_zh})]]
    open_ws(daemon, root, fake)
    result = dream(daemon)
    assert result["actions"] == {"refused": 1, "CREATE": 1}, model.tool_results
    assert "too long to be read whole" in model.tool_results[0], model.tool_results
    made = "digest/wiki/读书笔记.md"
    assert node(root, made)[1].count("- 第") == 20
    # What was written can be read whole and rewritten.
    later = "memory/2026-06-05/zh.md"
    write(root, later, "又读了一本书。\n")
    model.plan[later] = [[("node_read", {"path": made})], [("integrate", {
        "action": "REFINE", "node": made, "reason": "又一本",
        "content": short_zh + "\n- 又读了一本书"})]]
    assert dream(daemon)["actions"] == {"REFINE": 1}, model.tool_results


def test_a_node_named_by_its_name_without_a_bucket_is_found_in_its_own(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-06-06/a.md", "memory/2026-06-07/b.md"
    write(root, a, "Kites fly best in steady wind.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Kites",
                                     "content": "- fly best in steady wind", "reason": "r"})]]
    dream(daemon)
    write(root, b, "Kites fly best in steady wind, again.\n")
    model.plan[b] = [[("integrate", {"action": "CORROBORATE", "node": "Kites",
                                     "reason": "said again"})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}, model.tool_results
    fields = node(root, "digest/wiki/kites.md")[0]
    assert fields["sources"] == [a, b] and fields["bucket"] == "wiki", fields


def test_a_node_saved_decomposed_by_hand_is_refined_by_a_composed_rewrite(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A node a person saved in decomposed form (``o`` and a combining diaeresis, as
    macOS writes names) shared no line with the model's composed rewrite of it: a REFINE
    that only added a line "kept 0%" and was refused. Lines are compared in one form (and
    case folded as names are: ``STRASSE`` is ``straße``)."""
    root = tmp_path / "ws"
    rel = "digest/personal/anna.md"
    lines = ["- Anna wohnt in der Hauptstraße in Köln", "- trinkt Café au lait"]
    write(root, rel, unicodedata.normalize(
        "NFD", "---\nname: Anna\nbucket: personal\n---\n# Anna\n\n" + "\n".join(lines) + "\n"))
    note = "memory/2026-07-02/anna.md"
    write(root, note, "Anna hat eine Katze namens Jöns.\n")
    model = ScriptedModel(fake)
    content = "\n".join([lines[0].replace("straße", "STRASSE"), lines[1],
                         "- hat eine Katze namens Jöns"])
    model.plan[note] = [[("node_read", {"path": rel})],
                        [("integrate", {"action": "REFINE", "bucket": "personal", "node": rel,
                                        "name": "Anna", "content": content,
                                        "reason": "her cat"})]]
    open_ws(daemon, root, fake)
    result = dream(daemon)
    assert result["actions"] == {"REFINE": 1}, (result, model.tool_results)
    fields, text = node(root, rel)
    assert "- hat eine Katze namens Jöns" in text and fields["sources"] == [note], text
    assert "## History" not in text, text
