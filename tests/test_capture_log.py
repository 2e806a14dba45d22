"""auto_memory keeps a change log: every run that changed or refused to change a note.

A real daemon and a scripted OpenAI-compatible chat server: a good merge is a record of
the facts added; a destructive rewrite is refused, in the job result AND in the change
log, which names the bullet points it would have dropped (CJK, nested, several of them).
The records are listed by ``memory.changes`` and ``recalld changes``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_capture import add, config, done, notes, turn, write_note
from test_cli import recalld
from waits import wait_job

from recalld.daemon.memory import capture_log, changelog
from recalld.daemon.memory.textlines import dropped_bullets

FIRST = ("- 妹妹安娜住在格拉茨\n"
         "- Brother Tom is a pilot\n"
         "  - flies the A320 out of Vienna\n"
         "- 花粉症：每年春天都很严重")


def records(root: Path) -> list[dict[str, Any]]:
    folder = root / "mem_metadata" / "auto_memory" / "runs"
    out = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return sorted(out, key=lambda r: r["started"])


def edit_note(path: str, old: str, new: str) -> Reply:
    return Reply(json=chat_answer(None, [tool_call("edit", {
        "path": path, "old": old, "new": new})]))


def test_refusals_and_merges_are_in_the_change_log(daemon_factory: Any, fake: FakeProvider,
                                                   tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    session = "family-chat:42@phone"
    fake.script(write_note("family", FIRST), done())
    first = add(d, session, turn("我妹妹安娜住在格拉茨。My brother Tom flies A320s from Vienna."),
                flush=True)
    job = wait_job(d, first["job_id"])
    assert job["state"] == "succeeded", job
    (note,) = notes(root)
    rel = note.relative_to(root).as_posix()
    (created,) = records(root)
    assert created["outcome"] == "changed" and created["note"] == rel
    assert created["session_id"] == session and created["agent_id"] == "w"
    assert created["job_id"] == first["job_id"] and created["trigger"] == "flush"
    assert created["files"][rel]["before_sha256"] is None
    assert created["added"] == [ln.strip() for ln in FIRST.splitlines()]
    assert job["result"]["log"] == f"mem_metadata/auto_memory/runs/{created['run_id']}.md"

    # A destructive rewrite (every old bullet gone, nested one included) is refused; the
    # model then merges, refining a CJK bullet by inserting detail inside it.
    merged = ("- 妹妹安娜住在奥地利格拉茨，是护士\n- Brother Tom is a pilot\n"
              "  - flies the A320 out of Vienna\n- 花粉症：每年春天都很严重\n"
              "- Works night shifts at the 市立医院")
    fake.script(write_note("family", "- Works night shifts at the 市立医院"),
                write_note("family", merged), done())
    second = add(d, session, turn("I work night shifts at the city hospital (市立医院)."),
                 flush=True)
    job = wait_job(d, second["job_id"])
    assert job["state"] == "succeeded", job
    dropped = [ln.strip() for ln in FIRST.splitlines()]
    assert job["result"]["refused"] == [{"tool": "daily_write", "path": rel,
                                         "dropped": dropped}]
    text = note.read_text()
    assert "奥地利格拉茨" in text and "A320" in text and "市立医院" in text
    log = records(root)[-1]
    assert log["outcome"] == "changed, some rewrites refused"
    assert log["refused"] == job["result"]["refused"]
    assert log["added"] == ["- 妹妹安娜住在奥地利格拉茨，是护士",
                            "- Works night shifts at the 市立医院"]
    md = (root / job["result"]["log"]).read_text()
    assert "## Rewrites refused" in md and "would have dropped 4 line(s)" in md
    for bullet in ("妹妹安娜住在格拉茨", "flies the A320 out of Vienna",
                   "花粉症：每年春天都很严重"):
        assert f"  - {bullet}" in md, (bullet, md)
    assert "## Facts added" in md and "- Works night shifts at the 市立医院" in md
    assert f"- session: {session}" in md and "- agent: w" in md

    # A model that only drops facts (here by an edit of a nested bullet) changes nothing:
    # the refusal alone is a record, the job result says so too.
    fake.script(edit_note(rel, "  - flies the A320 out of Vienna\n", ""), done())
    third = add(d, session, turn("Tom changed airlines."), flush=True)
    job = wait_job(d, third["job_id"])
    assert job["state"] == "succeeded" and job["result"]["changed"] == [], job
    assert note.read_text() == text
    refusal = records(root)[-1]
    assert refusal["outcome"] == "refused" and refusal["files"] == {}
    assert refusal["refused"] == [{"tool": "edit", "path": rel,
                                   "dropped": ["- flies the A320 out of Vienna"]}]
    assert job["result"]["refused"] == refusal["refused"]
    assert job["result"]["log"].endswith(f"{refusal['run_id']}.md")

    # Nothing worth saving leaves no record.
    fake.script(Reply(json=chat_answer("nothing to save")))
    fourth = add(d, session, turn("Thanks!"), flush=True)
    assert wait_job(d, fourth["job_id"])["result"]["log"] is None
    assert len(records(root)) == 3

    listed = d.call("memory.changes", {"agent_id": "w"})["changes"]
    assert [c["run_id"] for c in listed] == [r["run_id"] for r in reversed(records(root))]
    assert [c["outcome"] for c in listed] == ["refused", "changed, some rewrites refused",
                                              "changed"]
    assert listed[0]["refused"] == 1 and listed[1]["refused"] == 4 and listed[2]["added"] == 4
    assert d.call("memory.changes", {"agent_id": "w", "kind": "auto_dream"})["changes"] == []

    cli = recalld("changes", "--agent", "w", env=d.env)
    assert cli.returncode == 0, cli.stderr
    assert "4 bullet(s) a refused rewrite would have dropped" in cli.stdout
    shown = recalld("changes", "--agent", "w", "--show", listed[1]["run_id"], env=d.env)
    assert shown.returncode == 0 and "  - 妹妹安娜住在格拉茨" in shown.stdout, shown
    missing = recalld("changes", "--agent", "w", "--show", "20260101T000000Z-abcdef", env=d.env)
    assert missing.returncode == 1 and "no change record" in missing.stderr
    bad = recalld("changes", "--agent", "w", "--kind", "dreams", env=d.env)
    assert bad.returncode == 2


def test_a_failed_run_after_a_refusal_is_recorded(daemon_factory: Any, fake: FakeProvider,
                                                  tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    fake.script(write_note("plans", "1. Move to Lisbon in May\n2. Learn Portuguese"), done())
    assert wait_job(d, add(d, "s1", turn("We move to Lisbon."), flush=True)["job_id"])[
        "state"] == "succeeded"
    # The model insists on dropping a numbered item until the job gives up: the job fails
    # (turns stay pending) and its refusals are still in the change log.
    fake.script(*[write_note("plans", "1. Move to Lisbon in May")] * 8)
    job = wait_job(d, add(d, "s1", turn("Portuguese is hard."), flush=True)["job_id"])
    assert job["state"] == "failed", job
    log = records(root)[-1]
    assert log["outcome"] == "failed" and "did not finish" in log["error"]
    assert len(log["refused"]) == 8
    assert all(r["dropped"] == ["2. Learn Portuguese"] for r in log["refused"])


def test_cjk_and_nested_bullets_in_the_loss_check() -> None:
    old = "- 喜欢喝乌龙茶\n  * 不加糖\n1) 每周三游泳\n- 住在大阪の北区"
    assert dropped_bullets(old, "- 喜欢喝台湾乌龙茶\n- 不加糖也不加奶\n- 每周三和周五游泳\n"
                                "- 住在大阪の北区") == []
    assert dropped_bullets(old, "- 喜欢喝红茶\n- 每周三游泳") == [
        "- 喜欢喝乌龙茶", "* 不加糖", "- 住在大阪の北区"]
    assert capture_log.added_facts("---\nname: x\n---\n- a\n", "---\nname: y\n---\n- a\n- b\n"
                                   ) == ["- b"]


def test_lists_people_paste_are_facts_too() -> None:
    # Bullets pasted from documents and chat apps, and the numbering of Chinese and
    # Japanese lists (often with no space after the mark), guard their items as "-" does.
    old = ("• Allergic to penicillin\n◦ sister lives in Graz\n1、喜欢喝乌龙茶\n（2）每周三游泳\n"
           "③ 住在大阪\n・猫の名前はミソ\n– prefers aisle seats\n3.5 GHz is the CPU clock\n")
    assert dropped_bullets(old, "- Prefers aisle seats\n") == [
        "• Allergic to penicillin", "◦ sister lives in Graz", "1、喜欢喝乌龙茶", "（2）每周三游泳",
        "③ 住在大阪", "・猫の名前はミソ"]
    kept = ("- Allergic to penicillin (since 2019)\n- Sister lives in Graz\n- 喜欢喝台湾乌龙茶\n"
            "- 每周三和周五游泳\n- 住在大阪\n- 猫の名前はミソ\n")
    assert dropped_bullets(old, kept) == ["– prefers aisle seats"]


def test_the_log_is_bounded(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    for i in range(7):
        changelog.write_record(folder, f"2026010{i}T000000Z-00000{i}", {"version": 1}, "x",
                               keep=5)
    kept = sorted(p.stem for p in folder.glob("*.json"))
    assert kept == [f"2026010{i}T000000Z-00000{i}" for i in range(2, 7)]
    assert len(list(folder.glob("*.md"))) == 5


def test_an_edit_that_empties_a_bullet_from_inside_is_refused(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """An edit of part of a line, without its bullet mark (``Brother Tom is a pilot`` to
    nothing, or across the end of one bullet into the next), dropped facts the loss guard
    never saw: it judged the edit's two fragments, not the note."""
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    fake.script(write_note("family", FIRST), done())
    job = wait_job(d, add(d, "s1", turn("Family facts."), flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    (note,) = notes(root)
    rel, text = note.relative_to(root).as_posix(), note.read_text()
    for old, new, gone in (("Brother Tom is a pilot", "", "- Brother Tom is a pilot"),
                           ("格拉茨\n- Brother Tom", "格拉茨\n- Tom", "- Brother Tom is a pilot")):
        fake.script(edit_note(rel, old, new), done())
        job = wait_job(d, add(d, "s1", turn("Tom changed airlines."), flush=True)["job_id"])
        assert job["state"] == "succeeded", job
        assert job["result"]["refused"] == [{"tool": "edit", "path": rel, "dropped": [gone]}]
        assert note.read_text() == text
    # An edit that keeps every fact (a detail added inside a bullet) is made.
    fake.script(edit_note(rel, "is a pilot", "is a senior pilot"), done())
    job = wait_job(d, add(d, "s1", turn("Tom was promoted."), flush=True)["job_id"])
    assert job["result"]["refused"] == [] and "Tom is a senior pilot" in note.read_text(), job


def test_changes_show_prints_a_log_longer_than_one_read(daemon_factory: Any,
                                                        fake: FakeProvider,
                                                        tmp_path: Path) -> None:
    """A run that added long facts (a pasted itinerary each) has a log longer than one
    ``memory.read`` answers (512 KiB): ``recalld changes --show`` prints all of it."""
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    facts = [f"- Reise {i}: " + ", ".join(f"Zug nach Triest {i}.{k} um {k % 24:02d}:15"
                                         for k in range(140)) for i in range(150)]
    fake.script(write_note("travel", "\n".join(facts)), done())
    job = wait_job(d, add(d, "trip", turn("Meine Reisen, alle."), flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    (record,) = records(root)
    log = (root / job["result"]["log"]).read_text()
    assert len(log.encode()) > 512 * 1024 and facts[-1] in log
    shown = recalld("changes", "--agent", "w", "--show", record["run_id"], env=d.env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == log
    as_json = recalld("changes", "--agent", "w", "--show", record["run_id"], "--json",
                      env=d.env)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["text"] == log


def test_changes_show_finds_a_record_older_than_the_newest_listed(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """auto_memory keeps 2,000 records and ``memory.changes`` lists the newest 500: a
    run among the older ones is still shown by ``--show``, not said to be missing."""
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    fake.script(write_note("garden", "- Tomatoes go in after the last frost"), done())
    job = wait_job(d, add(d, "garden", turn("Tomatoes after the frost."), flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    (first,) = records(root)
    runs = root / "mem_metadata" / "auto_memory" / "runs"
    log = (runs / f"{first['run_id']}.md").read_text()
    # 500 later runs, as the daemon writes them (record and log), a minute apart.
    for n in range(500):
        run_id = f"20991231T{n // 60:02d}{n % 60:02d}00Z-{n:06x}"
        (runs / f"{run_id}.json").write_text(json.dumps(
            {**first, "run_id": run_id, "started": f"2099-12-31T{n // 60:02d}:{n % 60:02d}:00Z"}))
        (runs / f"{run_id}.md").write_text(log.replace(first["run_id"], run_id))
    listed = d.call("memory.changes", {"agent_id": "w", "limit": 500})["changes"]
    assert first["run_id"] not in {c["run_id"] for c in listed}  # the case itself
    shown = recalld("changes", "--agent", "w", "--show", first["run_id"], env=d.env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == log
    missing = recalld("changes", "--agent", "w", "--show", "20000101T000000Z-abcdef",
                      env=d.env)
    assert missing.returncode == 1 and "no change record" in missing.stderr, missing
