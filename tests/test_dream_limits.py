"""auto_dream at its edges: a conversation the step budget cuts off; node names in
scripts whose vowels are combining marks; notes whose names hold link syntax; the
order a day's notes are read in; notes with nothing to read; a node whose frontmatter a
hand edit broke; refinements in scripts written without spaces; more changed notes than
a run reads; a note named with a line break; a copy of a note already dreamed; node
paths the model spells with the node's name; the inbox item of a run that left a note;
a digest_dir of two folders; node properties that hold links and a section of a
person's own; a node read by its name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, run_job, write

STEPS = 12  # DreamConfig.max_steps_per_note


def _fact(n: int) -> list[tuple[str, dict[str, str]]]:
    return [("integrate", {"action": "CREATE", "bucket": "wiki", "name": f"Host {n}",
                           "content": f"- host {n} runs service {n}", "reason": "fact"})]


def test_a_note_cut_off_by_the_step_budget_is_read_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-11-27/hosts.md"
    write(root, note, "".join(f"- host {n} runs service {n}\n" for n in range(STEPS + 2)))
    open_ws(daemon, root, fake)
    # One fact a step: the budget ends with two facts still to go.
    model.plan[note] = [_fact(n) for n in range(STEPS + 2)]
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and f"within {STEPS} steps" in job["error"], job
    assert (root / "digest/wiki/host-11.md").exists()
    assert not (root / f"digest/wiki/host-{STEPS}.md").exists()
    # The next run reads the note again; what was integrated is not doubled.
    model.plan[note] = [_fact(STEPS), _fact(STEPS + 1), _fact(0)]
    result = dream(daemon)
    assert result["notes"] == 1 and result["actions"] == {"CREATE": 2, "unchanged": 1}, result
    assert (root / f"digest/wiki/host-{STEPS + 1}.md").exists()
    runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert len(runs) == 2


def test_names_whose_vowels_are_marks_stay_words_and_stay_apart(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # "Kim" and "Kom" in Devanagari differ only in their vowel signs (combining marks);
    # Thai and Tamil names lose their meaning without theirs.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    one, two = "memory/2026-11-28/a.md", "memory/2026-11-29/b.md"
    write(root, one, "किम और कोम\n")
    write(root, two, "किम फिर से\n")
    # A node made when the marks were dropped from file names: found by its name still
    # (a CREATE saying what it says corroborates it).
    write(root, "digest/wiki/ह-न-द-न-ट.md", "---\nname: हिन्दी नोट\nsources: []\n---\n"
          "# हिन्दी नोट\n\n- हिन्दी नोट\n")
    open_ws(daemon, root, fake)

    def create(name: str) -> tuple[str, dict[str, str]]:
        return ("integrate", {"action": "CREATE", "bucket": "wiki", "name": name,
                              "content": f"- {name}", "reason": "fact"})

    model.plan[one] = [[create("किम"), create("कोम"), create("ที่นี่"),
                        create("தமிழ் குறிப்பு")]]
    model.plan[two] = [[create("किम"), create("हिन्दी नोट")]]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 4, "CORROBORATE": 2}, (result, model.tool_results)
    names = {p.name for p in (root / "digest/wiki").iterdir()}
    assert names == {"किम.md", "कोम.md", "ที่นี่.md", "தமிழ்-குறிப்பு.md", "ह-न-द-न-ट.md"}
    assert node(root, "digest/wiki/किम.md")[0]["sources"] == [one, two]
    assert node(root, "digest/wiki/ह-न-द-न-ट.md")[0]["sources"] == [two]


def test_a_note_named_with_brackets_or_a_bar_is_one_source(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # "[[memory/d/plan|v2.md]]" reads as a link to "memory/d/plan" (| starts an alias):
    # that was counted as a second source (confidence up) and listed again at each write.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    one, two = "memory/2026-11-30/plan [v2] | draft.md", "memory/2026-12-01/x]].md"
    write(root, one, "The release is on Friday.\n")
    write(root, two, "Release: Friday, after the freeze.\n")
    open_ws(daemon, root, fake)
    rel = "digest/wiki/release.md"
    model.plan[one] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Release",
                                       "content": "- on Friday", "reason": "fact"})]]
    model.plan[two] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki", "node": rel,
                                       "name": "Release", "reason": "again"})],
                       [("integrate", {"action": "REFINE", "bucket": "wiki", "node": rel,
                                       "name": "Release", "reason": "detail",
                                       "content": "- on Friday\n- after the freeze"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1, "CORROBORATE": 1, "REFINE": 1}
    fields, text = node(root, rel)
    assert (fields["sources"], fields["confidence"]) == ([one, two], 0.75), text
    assert text.count(f"- [[{one}]]") == 1 and text.count(f"- [[{two}]]") == 1, text


def test_a_days_notes_are_read_in_the_order_they_were_written(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The evening's note corrects the morning's: read by name, "alpha" (evening) came
    # first, and the morning's claim was what the node said. The next day's note, named
    # by its date and restored with an old time, comes after both: it is of a later day.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    morning = write(root, "memory/2026-12-02/zeta.md", "The review is at 10:00.\n")
    evening = write(root, "memory/2026-12-02/alpha.md", "The review moved to 11:00.\n")
    next_day = write(root, "memory/2026-12-03.md", "The review moved again, to 12:00.\n")
    os.utime(morning, ns=(1_796_000_000_000_000_000,) * 2)
    os.utime(evening, ns=(1_796_000_000_000_000_000 + 3600 * 10**9,) * 2)
    os.utime(next_day, ns=(1_700_000_000_000_000_000,) * 2)
    open_ws(daemon, root, fake)
    rel = "digest/wiki/review.md"
    model.plan["memory/2026-12-02/zeta.md"] = [[(
        "integrate", {"action": "CREATE", "bucket": "wiki", "name": "Review",
                      "content": "- at 10:00", "reason": "fact"})]]
    model.plan["memory/2026-12-02/alpha.md"] = [[(
        "integrate", {"action": "CORRECT", "bucket": "wiki", "node": rel, "name": "Review",
                      "content": "- at 11:00", "reason": "moved"})]]
    model.plan["memory/2026-12-03.md"] = [[(
        "integrate", {"action": "CORRECT", "bucket": "wiki", "node": rel, "name": "Review",
                      "content": "- at 12:00", "reason": "moved again"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1, "CORRECT": 2}, model.tool_results
    text = node(root, rel)[1]
    assert "- at 12:00" in text and 'previously: "at 10:00"' in text, text
    assert 'previously: "at 11:00"' in text, text


def test_a_note_with_nothing_beyond_its_frontmatter_asks_no_model(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "memory/2026-12-03/empty.md", "")
    write(root, "memory/2026-12-03/blank.md", " \n\n\t\n")
    write(root, "memory/2026-12-03/session.md", "---\nsession_id: s1\n---\n\n")
    open_ws(daemon, root, fake)
    result = dream(daemon)
    assert (result["notes"], result["failed_notes"], result["changed"]) == (3, 0, False)
    assert not [r for r in fake.requests if r.path.endswith("/chat/completions")]
    # Written to later, the note is read then.
    write(root, "memory/2026-12-03/session.md", "---\nsession_id: s1\n---\nI like tea.\n")
    assert dream(daemon)["notes"] == 1
    assert [r for r in fake.requests if r.path.endswith("/chat/completions")]


def test_a_node_whose_frontmatter_a_hand_edit_broke_is_left_as_it_is(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Written again, its frontmatter (sources, dates, a person's tags) became content under
    # a new one that had lost them; a node not in UTF-8 lost its text.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    rel = "digest/personal/tea.md"
    broken = ("---\nname: Tea\nname: Green tea\ntags: [drinks\nsources: [memory/2026-11-01/a.md]"
              "\ncreated: 2026-11-01\n---\n# Tea\n\n- likes green tea\n\n## Sources\n\n"
              "- [[memory/2026-11-01/a.md]]\n")
    write(root, rel, broken)
    # Saved by an editor in GBK: read as UTF-8, its words are U+FFFD; written, lost.
    gbk = root / "digest/wiki/oolong.md"
    gbk.parent.mkdir(parents=True)
    gbk.write_bytes("---\nname: Oolong\n---\n# Oolong\n\n- 乌龙茶，半发酵\n".encode("gbk"))
    # Saved as Latin-1: it reads as written, and written it would be UTF-8, which its
    # person's editor reads as something else.
    latin = "---\nname: Café\n---\n# Café\n\n- café crème à 8h\n".encode("latin-1")
    (root / "digest/wiki/cafe.md").write_bytes(latin)
    note = "memory/2026-12-04/b.md"
    write(root, note, "Green tea again, no sugar. 乌龙茶 too.\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [
        [("integrate", {"action": "CORROBORATE", "bucket": "personal", "node": rel,
                        "name": "Tea", "reason": "again"})],
        [("integrate", {"action": "REFINE", "bucket": "personal", "node": rel, "name": "Tea",
                        "content": "- likes green tea\n- no sugar", "reason": "detail"})],
        [("integrate", {"action": "CORROBORATE", "bucket": "wiki",
                        "node": "digest/wiki/oolong.md", "reason": "again"})],
        [("integrate", {"action": "CORROBORATE", "bucket": "wiki",
                        "node": "digest/wiki/cafe.md", "reason": "again"})]]
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "cannot be read" in job["error"], job
    assert (root / rel).read_text() == broken
    assert gbk.read_bytes().decode("gbk").endswith("- 乌龙茶，半发酵\n")
    assert (root / "digest/wiki/cafe.md").read_bytes() == latin
    assert all("cannot be read" in t for t in model.tool_results), model.tool_results
    assert all("UTF-8" in t for t in model.tool_results[-2:]), model.tool_results
    # Fixed by hand, the node is integrated into by the next run, which reads the note again.
    model.plan[note] = model.plan[note][:2]
    write(root, rel, broken.replace("name: Tea\n", "").replace("[drinks", "[drinks]"))
    result = dream(daemon)
    assert result["actions"] == {"CORROBORATE": 1, "REFINE": 1}, result
    fields, text = node(root, rel)
    assert fields["name"] == "Green tea" and fields["tags"] == ["drinks"]
    assert fields["sources"] == ["memory/2026-11-01/a.md", note] and "- no sugar" in text


def test_detail_added_inside_a_thai_line_is_a_refinement(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Thai has no spaces between words: a line with a word added inside was read as one
    # other word, so adding detail "dropped" every line and the refinement was refused.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    one, two = "memory/2026-12-01/a.md", "memory/2026-12-02/b.md"
    write(root, one, "ฉันชอบชาเขียว แมวชื่อมิโซะ\n")
    write(root, two, "ชาเขียวร้อน แมวสีส้ม\n")
    open_ws(daemon, root, fake)
    rel = "digest/personal/ชา.md"
    model.plan[one] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "ชา",
                                       "content": "- ฉันชอบชาเขียว\n- แมวชื่อมิโซะ",
                                       "reason": "fact"})]]
    model.plan[two] = [[("integrate", {"action": "REFINE", "bucket": "personal", "node": rel,
                                       "name": "ชา", "reason": "detail",
                                       "content": "- ฉันชอบชาเขียวร้อน\n- แมวสีส้มชื่อมิโซะ"})]]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 1, "REFINE": 1}, (result, model.tool_results)
    assert "- แมวสีส้มชื่อมิโซะ" in node(root, rel)[1]


def test_notes_beyond_a_runs_limit_are_counted_and_shown(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # (Notes of frontmatter alone: read without a model call.) Those past the limit waited
    # for the next night with nothing saying so.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    for n in range(203):
        write(root, f"memory/2026-12-{n % 28 + 1:02d}/n{n}.md", f"---\nsession_id: s{n}\n---\n")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    assert (first["notes"], first["left"]) == (200, 3), first
    assert "- notes left for the next run (at most 200 a run): 3" in (
        root / first["log"]).read_text()
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "status"], env=daemon.env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert "3 changed note(s) left for the next run" in " ".join(proc.stdout.split()), proc.stdout
    second = dream(daemon)
    assert (second["notes"], second["left"]) == (3, 0), second


def test_a_note_named_with_a_line_break_is_passed_by(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Its [[link]] split over two lines: read back as no source, it was listed again under
    # Sources at each rewrite of a node citing it.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    odd, plain = "memory/2026-12-05/a\nb.md", "memory/2026-12-05/c.md"
    write(root, odd, "The boiler is serviced in May.\n")
    write(root, plain, "The boiler is a Vaillant.\n")
    open_ws(daemon, root, fake)
    for note in (odd, plain):
        model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                            "name": "Boiler", "content": "- a boiler",
                                            "reason": "fact"})]]
    result = dream(daemon)
    assert (result["notes"], result["actions"]) == (1, {"CREATE": 1}), result
    assert node(root, "digest/wiki/boiler.md")[0]["sources"] == [plain]
    assert "its name holds a control character" in daemon.log()


def test_a_copy_of_a_dreamed_note_is_no_second_source(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A note copied (kept as a template, duplicated by a sync tool) was dreamed again and
    # counted as a second source of everything it said: confidence rose on no new evidence.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    original, copy = "memory/2026-12-06/plants.md", "memory/2026-12-07/plants copy.md"
    write(root, original, "Water the fern every Sunday.\n")
    open_ws(daemon, root, fake)
    fern = [[("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Fern",
                            "content": "- water every Sunday", "reason": "routine"})]]
    model.plan[original] = model.plan[copy] = fern
    assert dream(daemon)["actions"] == {"CREATE": 1}
    write(root, copy, "Water the fern every Sunday.\n")
    result = dream(daemon)
    assert result["notes"] == 0, result
    fields, _ = node(root, "digest/procedure/fern.md")
    assert (fields["sources"], fields["confidence"]) == ([original], 0.5)
    # Once it says more than the original, it is a note of its own.
    write(root, copy, "Water the fern every Sunday. It likes shade.\n")
    assert dream(daemon)["notes"] == 1


@pytest.mark.parametrize("notes", [
    ("memory/2026-09-02/standup.md", "memory/2026-10-15/infra.md", "memory/2026-11-30/infra.md"),
    # ReMe's layout: a day's note named by its date.
    ("memory/2026-09-02.md", "memory/2026-10-15.md", "memory/2026-11-30.md")])
def test_an_older_note_edited_again_does_not_correct_a_node_back(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path,
        notes: tuple[str, str, str]) -> None:
    # A node says what the newest note said; a typo fixed in an older note has it read
    # again, and the model proposes its older claim as a correction: that is refused. A
    # correction from a note of a later day still applies.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    old, new, later = notes
    path = "digest/wiki/primary-database.md"
    write(root, old, "The primary database runs PostgreSQL 13 on db-eu-1.\n")
    open_ws(daemon, root, fake)

    def claim(note: str, action: str, content: str) -> None:
        model.plan[note] = [[("integrate", {
            "action": action, "bucket": "wiki", "name": "Primary database",
            "node": path, "sources": [note], "content": content, "reason": "upgrade"})]]

    claim(old, "CREATE", "- PostgreSQL 13 on db-eu-1")
    dream(daemon)
    write(root, new, "We upgraded the primary database to PostgreSQL 16.\n")
    claim(new, "CORRECT", "- PostgreSQL 16 on db-eu-1")
    assert dream(daemon)["actions"] == {"CORRECT": 1}
    write(root, old, "The primary database runs PostgreSQL 13 on db-eu-1 (eu-west).\n")
    claim(old, "CORRECT", "- PostgreSQL 13 on db-eu-1 (eu-west)")
    assert dream(daemon)["actions"] == {"refused": 1}
    _, text = node(root, path)
    assert "- PostgreSQL 16 on db-eu-1" in text.split("## History")[0]
    write(root, later, "The primary database moved to db-eu-2, still PostgreSQL 16.\n")
    claim(later, "CORRECT", "- PostgreSQL 16 on db-eu-2")
    assert dream(daemon)["actions"] == {"CORRECT": 1}
    _, text = node(root, path)
    assert "- PostgreSQL 16 on db-eu-2" in text.split("## History")[0]


def test_a_node_path_spelled_with_its_name_is_one_node_named_by_its_slug(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(root, a, "构建服务器叫 hal。The wiki lives at wiki.example.\n")
    hand = "digest/procedure/Release Steps.md"  # a node a person made and named
    write(root, hand, "---\nname: Release steps\n---\n# Release steps\n\n- tag, then push\n")
    open_ws(daemon, root, fake)
    long = "É" * 130  # as a file name: 260 bytes, more than a name may have
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "wiki", "node": "digest/wiki/构建 服务器!.md",
                       "name": "构建 服务器", "content": "- 叫 hal", "reason": "fact"}),
        ("integrate", {"action": "CREATE", "bucket": "wiki", "node": f"digest/wiki/{long}.md",
                       "content": "- long", "reason": "fact"}),
        ("integrate", {"action": "CORROBORATE", "bucket": "procedure",
                       "node": "digest/procedure/release-steps.md", "reason": "again"}),
        # A device name on Windows, where the workspace may be restored.
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "CON",
                       "content": "- the console", "reason": "fact"}),
    ]]
    first = dream(daemon)
    assert first["actions"] == {"CREATE": 3, "CORROBORATE": 1}, model.tool_results
    slug = f"digest/wiki/{'é' * 60}.md"
    assert sorted(p.relative_to(root).as_posix() for p in (root / "digest").rglob("*.md")) \
        == sorted(["digest/wiki/构建-服务器.md", slug, hand, "digest/wiki/con_.md"])
    assert node(root, slug)[0]["name"] == long
    write(root, b, "hal 又提到了。\n")
    model.plan[b] = [[
        ("integrate", {"action": "CORROBORATE", "bucket": "wiki",
                       "node": "digest/wiki/构建 服务器!.md", "sources": [b], "reason": "again"}),
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "构建 服务器",
                       "node": "digest/wiki/构建 – 服务器.md", "content": "- 叫 hal",
                       "reason": "fact"}),
        ("integrate", {"action": "CORROBORATE", "bucket": "wiki", "node": "digest/wiki/CON.md",
                       "sources": [b], "reason": "again"}),
    ]]
    second = dream(daemon)
    assert second["actions"] == {"CORROBORATE": 2, "unchanged": 1}, model.tool_results
    assert node(root, "digest/wiki/con_.md")[0]["sources"] == [a, b]
    assert node(root, "digest/wiki/构建-服务器.md")[0]["sources"] == [a, b]
    assert node(root, hand)[0]["sources"] == [a]


def test_the_inbox_item_of_a_run_says_which_notes_it_left_and_what_it_did(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    good, bad = "memory/2026-11-20/山行.md", "memory/2026-11-21/broken.md"
    write(root, good, "I love hiking; 周末去爬山。\n")
    write(root, bad, "The VPN moved.\n")
    open_ws(daemon, root, fake)
    model.plan[good] = [[("note_interests", {"topics": ["hiking", "爬山", 7, " "]})]]
    model.plan[bad] = [[("integrate", "{not json")]]
    result = dream(daemon)
    assert (result["failed_notes"], result["files_changed"]) == (1, ["digest/interests.yaml"])
    items = daemon.call("inbox.list", {"agent_id": AGENT})["items"]
    assert len(items) == 1, items
    item = items[0]
    assert item["details"]["failed_notes"] == [bad]
    assert item["details"]["log"] == result["log"]
    summary = item["summary"]
    assert "interest topics refreshed" in summary and "no actions" not in summary, summary
    assert "1 of 2 note(s) not processed" in summary and result["log"] in summary, summary
    assert "noted 2 topic(s); 2 left out" in model.tool_results[0], model.tool_results
    shown = (root / result["log"]).read_text()
    assert "the interest topics were refreshed" in shown and "No memory changed" not in shown


def test_nodes_in_a_digest_dir_of_two_folders_are_named_and_linked(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    tea, deploy = "kb/digest/personal/tea.md", "kb/digest/procedure/deploy.md"
    write(root, a, "用户喝茶. Deploy with make.\n")
    open_ws(daemon, root, fake, digest_dir="kb/digest")
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea",
                       "content": "- 喝茶", "reason": "fact"}),
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Deploy",
                       "content": "- make", "reason": "how-to", "related": [f"[[{tea}]]"]})]]
    dream(daemon)
    assert node(root, deploy)[0]["related"] == [tea]
    write(root, b, "喝茶 again.\n")
    model.plan[b] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki", "node": tea,
                                     "sources": [b], "reason": "again"})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}, model.tool_results
    assert node(root, tea)[0]["sources"] == [a, b]


def test_a_node_whose_properties_hold_links_keeps_them_as_links(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A person keeps the digest in Obsidian, whose properties hold links as "[[...]]",
    # and added a section of their own below the node's Sources: its links are no sources.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    tea, coffee = "digest/personal/tea.md", "digest/wiki/coffee.md"
    write(root, coffee, "# Coffee\n\n- a drink\n")
    own = "## 我的笔记\n\nCompare [[digest/wiki/coffee.md]], [[memory/2026-01-01/old.md]].\n"
    write(root, tea, f'---\nname: Tea\nsources:\n  - "[[{a}]]"\nrelated: ["[[{coffee}|Coffee]]"]\n'
                     f"---\n# Tea\n\n- 绿茶 green tea\n\n## Sources\n\n- [[{a}]]\n\n{own}")
    write(root, b, "喝绿茶 again.\n")
    open_ws(daemon, root, fake)
    model.plan[b] = [[("integrate", {"action": "CORROBORATE", "bucket": "personal", "node": tea,
                                     "sources": [b], "reason": "again"})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}, model.tool_results
    fields, text = node(root, tea)
    assert (fields["sources"], fields["related"], fields["confidence"]) == ([a, b], [coffee], 0.75)
    assert "[[[" not in text and f"- [[{coffee}]]\n" in text and f"- [[{a}]]\n" in text, text
    assert own in text, text


def test_a_node_read_by_its_name_is_the_node_integrate_lands_on(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a = "memory/2026-11-20/a.md"
    tea = "digest/personal/tea-preference.md"
    write(root, tea, "---\nname: Tea preference\n---\n# Tea preference\n\n- 绿茶 green tea\n")
    write(root, a, "She likes her green tea hot, 80°C.\n")
    open_ws(daemon, root, fake)
    spelled = "digest/personal/Tea Preference.md"
    model.plan[a] = [[("node_read", {"path": spelled})], [("integrate", {
        "action": "REFINE", "bucket": "personal", "node": spelled, "reason": "detail",
        "content": "- 绿茶 green tea, hot (80°C)"})]]
    assert dream(daemon)["actions"] == {"REFINE": 1}, model.tool_results
    assert model.tool_results[0] == f"(the node {tea})\n" + (
        "---\nname: Tea preference\n---\n# Tea preference\n\n- 绿茶 green tea\n")
    assert "- 绿茶 green tea, hot (80°C)" in node(root, tea)[1]
