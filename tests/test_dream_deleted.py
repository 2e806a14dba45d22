"""A daily note deleted after its dream: the nodes citing it keep its claim and count it,
no longer link it, and link it again when it comes back (a real daemon and a scripted
model, see test_dream.py)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write

from recalld.daemon.memory.digest import MAX_HISTORY_ENTRIES

CAT = "digest/personal/cat.md"


def sources_section(text: str) -> str:
    return text.split("## Sources\n\n", 1)[1]


def test_a_deleted_note_stays_counted_and_is_no_dangling_link(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A note deleted stayed cited as a source: a ``[[link]]`` to nothing in the node's
    Sources and frontmatter."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    early, late = "memory/2026-05-02/vet.md", "memory/2026-05-09/vet visit #2.md"
    write(root, early, "The cat, Miso, sees the vet on Fridays.\n")
    write(root, late, "Miso saw the vet again on Friday.\n")
    os.utime(root / early, (1, 1))
    model.plan[early] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                         "name": "Cat", "content": "- Miso sees the vet on Fridays",
                                         "reason": "fact"})]]
    model.plan[late] = [[("integrate", {"action": "CORROBORATE", "bucket": "personal",
                                        "node": CAT, "sources": [late], "reason": "again"})]]
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CREATE": 1, "CORROBORATE": 1}
    full = (root / CAT).read_bytes()
    assert node(root, CAT)[0]["sources"] == [early, late]

    (root / late).unlink()
    asked = len(fake.requests)
    marked = dream(daemon)
    assert marked["notes"] == 0 and marked["actions"] == {"RELINK": 1}, marked
    assert len(fake.requests) == asked  # no model asked
    fields, text = node(root, CAT)
    assert (fields["sources"], fields["deleted_sources"]) == ([early], [late]), fields
    assert fields["confidence"] == 0.75 and fields["corroborations"] == 1
    assert f"[[{late}]]" not in text and "- Miso sees the vet on Fridays" in text
    assert sources_section(text) == f"- [[{early}]]\n- {late} (deleted)\n", text
    assert "deleted source note(s)" in (root / marked["log"]).read_text(encoding="utf-8")
    assert dream(daemon)["run_id"] is None  # told once
    held = (root / CAT).read_bytes()

    # The deleted note still dates the node: a note of a day before it corrects nothing.
    middle = "memory/2026-05-05/vet.md"
    write(root, middle, "Miso sees the vet on Mondays.\n")
    model.plan[middle] = [[("integrate", {"action": "CORRECT", "bucket": "personal",
                                          "node": CAT, "content": "- Miso sees the vet on Mondays",
                                          "reason": "changed"})]]
    assert dream(daemon)["actions"] == {"refused": 1}
    assert "older than" in model.tool_results[-1], model.tool_results
    assert (root / CAT).read_bytes() == held

    # Back (restored from the trash): linked again, the node as it was.
    write(root, late, "Miso saw the vet again on Friday.\n")
    back = dream(daemon)
    assert back["notes"] == 0 and back["actions"] == {"RELINK": 1}, back
    assert (root / CAT).read_bytes() == full

    (root / late).unlink()
    again = dream(daemon)
    assert again["actions"] == {"RELINK": 1}
    daemon.call("dream.undo", {"agent_id": AGENT, "run_id": again["run_id"]})
    assert (root / CAT).read_bytes() == full


def test_a_deleted_note_back_under_another_name_is_linked_by_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-05-02/vet.md"
    write(root, note, "The cat, Miso, sees the vet on Fridays.\n")
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                        "name": "Cat", "content": "- Miso sees the vet",
                                        "reason": "fact"})]]
    open_ws(daemon, root, fake)
    dream(daemon)
    kept = (root / note).read_bytes()
    (root / note).unlink()
    assert dream(daemon)["actions"] == {"RELINK": 1}
    assert node(root, CAT)[0]["deleted_sources"] == [note]
    moved = "memory/2026-05-02/pets/vet.md"
    (root / moved).parent.mkdir(parents=True)
    (root / moved).write_bytes(kept)
    asked = len(fake.requests)
    assert dream(daemon)["actions"] == {"RELINK": 1}
    assert len(fake.requests) == asked
    fields, text = node(root, CAT)
    assert fields["sources"] == [moved] and "deleted_sources" not in fields, fields
    assert sources_section(text) == f"- [[{moved}]]\n", text
    assert dream(daemon)["run_id"] is None


def test_a_deleted_source_keeps_the_line_a_person_wrote_for_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A Sources line written by hand (an alias, words after the link) was kept as the
    deleted source's line and a second line was added for it; back, the note was listed
    twice. A node whose frontmatter a hand edit broke is left as it is."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    day = "memory/2026-06-02"
    a, b, c = "memory/2026-06-01/a.md", f"{day}/b.md", f"{day}/c.md"
    for n in (a, b, c):
        write(root, n, f"Tea, as {n} says.\n")
    tea, broken = "digest/wiki/tea.md", "digest/wiki/broken.md"
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": n,
                                     "content": "- green", "reason": "x"})
                      for n in ("Tea", "Broken")]]
    model.plan[b] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki", "node": n,
                                     "sources": [b], "reason": "y"}) for n in (tea, broken)]]
    model.plan[c] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki", "node": tea,
                                     "sources": [c], "reason": "z"})]]
    open_ws(daemon, root, fake)
    dream(daemon)
    text = (root / tea).read_text(encoding="utf-8").replace(
        f"- [[{b}]]", f"- [[{b}|the tuesday note]] (said at lunch)")
    (root / tea).write_text(text, encoding="utf-8")
    (root / broken).write_text((root / broken).read_text(encoding="utf-8").replace(
        "name: Broken", "name: Broken\nname: twice"), encoding="utf-8")
    held = (root / broken).read_bytes()
    for n in (b, c):  # the day's folder goes
        (root / n).unlink()
    (root / day).rmdir()
    assert dream(daemon)["actions"] == {"RELINK": 1}
    fields, text = node(root, tea)
    assert fields["deleted_sources"] == [b, c] and fields["confidence"] == 0.88, fields
    assert sources_section(text) == (f"- [[{a}]]\n- {b} (deleted) (said at lunch)\n"
                                     f"- {c} (deleted)\n"), text
    assert (root / broken).read_bytes() == held
    write(root, b, f"Tea, as {b} says.\n")
    assert dream(daemon)["actions"] == {"RELINK": 1}
    fields, text = node(root, tea)
    assert (fields["sources"], fields["deleted_sources"]) == ([a, b], [c]), fields
    assert sources_section(text) == (f"- [[{a}]]\n- [[{b}]] (said at lunch)\n"
                                     f"- {c} (deleted)\n"), text


def test_deleted_notes_named_with_brackets_or_a_bar_are_unlinked_and_back_in_place(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The link of a note named ``plan [v2].md`` or ``a|b.md`` does not read back as
    that note: it stayed in Sources beside its ``(deleted)`` line, and both were links
    once the note came back, the source counted twice."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    notes = ["memory/2026-07-01/plan [v2].md", "memory/2026-07-01/tea|coffee.md",
             "memory/2026-07-02/later.md"]
    for n in notes:
        write(root, n, f"Green tea, says {n}.\n")
    model.plan[notes[0]] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                            "name": "Tea", "content": "- green",
                                            "reason": "x"})]]
    for n in notes[1:]:
        model.plan[n] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki",
                                         "node": "digest/wiki/tea.md", "sources": [n],
                                         "reason": "again"})]]
    open_ws(daemon, root, fake)
    dream(daemon)
    full = (root / "digest/wiki/tea.md").read_bytes()
    for n in notes[:2]:
        (root / n).rename(root / f"{n}.bak")
    assert dream(daemon)["actions"] == {"RELINK": 1}
    fields, text = node(root, "digest/wiki/tea.md")
    assert fields["sources"] == [notes[2]] and fields["confidence"] == 0.88, fields
    assert sources_section(text) == (f"- {notes[0]} (deleted)\n- {notes[1]} (deleted)\n"
                                     f"- [[{notes[2]}]]\n"), text
    for n in notes[:2]:
        (root / f"{n}.bak").rename(root / n)
    assert dream(daemon)["actions"] == {"RELINK": 1}
    assert (root / "digest/wiki/tea.md").read_bytes() == full


def test_history_entries_stop_linking_deleted_notes_and_link_them_again_when_back(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Notes that contradict each other day after day: each correction's History entry
    cites its note. Deleted, those notes are no longer linked, in the node's History nor
    in the archive beside it; back, they are linked again, both files as they were."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    standup = "digest/wiki/daily-standup.md"
    archive = "digest/wiki/daily-standup.history.txt"
    notes = [f"memory/2026-09-{day:02d}/team sync.md" for day in range(1, MAX_HISTORY_ENTRIES + 4)]
    for i, rel in enumerate(notes):
        write(root, rel, f"Stand-up is at {8 + i // 60}:{i % 60:02d} from now on.\n")
        args = {"bucket": "wiki", "name": "Daily standup", "reason": f"moved ({i})",
                "content": f"- the stand-up is at {8 + i // 60}:{i % 60:02d}"}
        model.plan[rel] = [[("integrate", {**args, "action": "CREATE"} if i == 0 else
                             {**args, "action": "CORRECT", "node": standup})]]
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CREATE": 1, "CORRECT": len(notes) - 1}
    before = {p: (root / p).read_bytes() for p in (standup, archive)}
    assert f"[[{notes[1]}]]" in before[archive].decode()
    assert f"[[{notes[-1]}]]" in before[standup].decode().split("## History")[1]
    gone = (notes[1], notes[-1])  # cited in the archive, and in the node's History
    kept = {rel: (root / rel).read_bytes() for rel in gone}
    for rel in gone:
        (root / rel).unlink()
    assert dream(daemon)["actions"] == {"RELINK": 1}
    for path in (standup, archive):
        text = (root / path).read_text(encoding="utf-8")
        for rel in gone:
            assert f"[[{rel}]]" not in text, (path, text)
    assert f"{notes[-1]} (deleted)" in (root / standup).read_text().split("## History")[1]
    assert f"{notes[1]} (deleted)" in (root / archive).read_text()
    for rel, data in kept.items():
        (root / rel).write_bytes(data)
    assert dream(daemon)["actions"] == {"RELINK": 1}
    assert {p: (root / p).read_bytes() for p in before} == before
