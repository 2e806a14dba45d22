"""auto_dream on nodes and notes of other shapes than the model or the dream made: a
real daemon, a real socket and a scripted OpenAI-compatible model (see test_dream.py)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write
from waits import wait_status

from recalld.daemon.store.fsio import REAL
from recalld.daemon.store.records import write_records
from recalld.ipc.errors import NotAllowed


def digest_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "digest").rglob("*.md"))


def test_a_node_renamed_by_hand_is_found_by_its_name(daemon: DaemonHandle,
                                                     fake: FakeProvider,
                                                     tmp_path: Path) -> None:
    """A person renames a node's file (and moves one to another bucket), keeping its
    frontmatter name: the model's CREATE of that name, a link to it by its old file name,
    land on the renamed files; no second node of one name is made."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(root, a, "Green tea in the morning. Deploys on Fridays.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "Morning Tea",
                       "content": "- green tea in the morning", "reason": "habit"}),
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Deploy day",
                       "content": "- deploys on Fridays", "reason": "rule"})]]
    assert dream(daemon)["actions"] == {"CREATE": 2}
    (root / "digest/personal/morning-tea.md").rename(root / "digest/personal/drinks.md")
    (root / "digest/wiki").mkdir(exist_ok=True)
    (root / "digest/procedure/deploy-day.md").rename(root / "digest/wiki/releases.md")
    write(root, b, "Green tea again; deploys stay on Fridays.\n")
    model.plan[b] = [[
        ("integrate", {"action": "CREATE", "bucket": "personal", "name": "morning  tea",
                       "content": "- green tea in the morning", "sources": [b],
                       "reason": "seen again", "related": ["digest/procedure/deploy-day.md"]}),
        ("integrate", {"action": "CORROBORATE", "bucket": "procedure",
                       "node": "digest/procedure/deploy-day.md", "sources": [b],
                       "reason": "seen again"})]]
    second = dream(daemon)
    assert second["actions"] == {"CORROBORATE": 2}, (second, model.tool_results)
    assert digest_files(root) == ["digest/personal/drinks.md", "digest/wiki/releases.md"]
    fields, _ = node(root, "digest/personal/drinks.md")
    assert fields["name"] == "Morning Tea" and fields["sources"] == [a, b]
    assert fields["related"] == ["digest/wiki/releases.md"], fields
    assert node(root, "digest/wiki/releases.md")[0]["sources"] == [a, b]


def test_a_damaged_run_record_is_refused_by_undo_with_the_reason(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A run record edited by hand or restored from elsewhere, with fields of other
    types: undo says what is wrong and restores nothing (a lenient base64 decode would
    have written what is left of a damaged previous version), the run list leaves it
    out and lists the others."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    tea = "digest/personal/tea.md"
    write(root, a, "Tea.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea",
                                     "content": "- tea", "reason": "habit"})]]
    first = dream(daemon)["run_id"]
    write(root, b, "Green tea.\n")
    model.plan[b] = [[("integrate", {"action": "REFINE", "bucket": "personal", "node": tea,
                                     "content": "- tea\n- green", "sources": [b],
                                     "reason": "detail"})]]
    second = dream(daemon)["run_id"]
    record = root / "mem_metadata/dream/runs" / f"{second}.json"
    good = orjson.loads(record.read_bytes())
    refined = (root / tea).read_bytes()
    entry = good["files"][tea]
    damaged: dict[str, Any] = {
        "files must map": {**good, "files": [tea]},
        "files must map ": {**good, "files": "abc"},
        "is not an object": {**good, "files": {tea: "x"}},
        "not base64": {**good, "files": {tea: {**entry, "before": 5}}},
        "not base64 ": {**good, "files": {tea: {**entry, "before": "!!" + entry["before"]}}},
        "not a SHA-256": {**good, "files": {tea: {**entry, "after_sha256": 7}}},
        "notes must be": {**good, "notes": 3},
        "undone must be": {**good, "undone": 5},
        "unknown format": [good],
    }
    for why, data in damaged.items():
        record.write_bytes(orjson.dumps(data))
        with pytest.raises(NotAllowed, match=re.escape(why.strip())):
            daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second, "force": True})
        assert (root / tea).read_bytes() == refined, why
        runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
        assert [r["run_id"] for r in runs] == [first], (why, runs)
    # Well formed, but a folder where it names a file: said so, nothing restored.
    record.write_bytes(orjson.dumps({**good, "files": {**good["files"],
                                                        "digest/personal": entry}}))
    with pytest.raises(NotAllowed, match=re.escape("digest/personal cannot be read")):
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second, "force": True})
    assert (root / tea).read_bytes() == refined
    record.write_bytes(orjson.dumps(good))
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second})
    assert tea in undone["restored"] and "- green" not in (root / tea).read_text()


def test_undo_does_not_read_a_fifo_in_place_of_a_node(daemon: DaemonHandle,
                                                      fake: FakeProvider,
                                                      tmp_path: Path) -> None:
    """A FIFO where a run's node was: undo refuses at once (opening it to read would wait
    for a writer, holding the workspace's writes), and the workspace still writes."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a = "memory/2026-11-20/a.md"
    tea = root / "digest/personal/tea.md"
    write(root, a, "Tea.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea",
                                     "content": "- tea", "reason": "habit"})]]
    run = dream(daemon)["run_id"]
    tea.unlink()
    os.mkfifo(tea)
    with pytest.raises(NotAllowed, match=re.escape("personal/tea.md cannot be read")):
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": run, "force": True},
                    timeout=30)
    assert stat.S_ISFIFO(tea.lstat().st_mode)
    added = daemon.call("memory.add_note", {"agent_id": AGENT, "content": "still writes"},
                        timeout=30)
    assert added["changed"] is True


def test_an_older_note_does_not_turn_a_node_back_by_refining_it(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A note of a day before the node's newest source, dreamed later (edited since, or
    new), proposes the node's old claim: as a CORRECT it was refused, as a REFINE that
    rewrites one line of three it was applied. It may still add detail."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    new, old = "memory/2026-11-21/new.md", "memory/2026-11-20/old.md"
    meeting = "digest/wiki/meeting.md"
    write(root, new, "The meeting moved to Friday.\n")
    open_ws(daemon, root, fake)
    lines = "- weekly meeting on Friday\n- in room 4\n- led by Ana"
    model.plan[new] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Meeting",
                                       "content": lines, "reason": "schedule"})]]
    dream(daemon)
    write(root, old, "The meeting is on Thursday, in room 4 on the second floor.\n")
    back = lines.replace("Friday", "Thursday")
    model.plan[old] = [[("integrate", {"action": action, "bucket": "wiki", "node": meeting,
                                       "sources": [old], "content": content,
                                       "reason": "old note"})
                        for action, content in (
                            ("CORRECT", back), ("REFINE", back),
                            ("REFINE", "- weekly meeting on Friday\n- led by Ana"),
                            ("REFINE", lines.replace("room 4", "room 4 (second floor)")))]]
    result = dream(daemon)
    assert result["actions"] == {"refused": 3, "REFINE": 1}, (result, model.tool_results)
    assert sum("older than what" in r for r in model.tool_results) == 3
    text = (root / meeting).read_text()
    assert "- weekly meeting on Friday\n- in room 4 (second floor)\n- led by Ana" in text
    assert "Thursday" not in text


def test_calls_of_one_answer_do_not_undo_each_other(daemon: DaemonHandle,
                                                    fake: FakeProvider,
                                                    tmp_path: Path) -> None:
    """A model answers with a CORRECT and a REFINE of one node in one answer, both written
    on the node as it read it: the REFINE was applied over the correction and turned the
    corrected claim back. A REFINE or CORRECT of a node whose content an earlier call of
    the same answer changed is refused; in the next answer, on what the node says now, it
    applies. A CORROBORATE of the same answer does not stand in the way."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    meeting, deploy = "digest/wiki/meeting.md", "digest/procedure/deploy.md"
    write(root, a, "The meeting is on Friday in room 4. Deploys run make deploy.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[
        ("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Meeting",
                       "content": "- on Friday\n- in room 4", "reason": "schedule"}),
        ("integrate", {"action": "CREATE", "bucket": "procedure", "name": "Deploy",
                       "content": "- run make deploy", "reason": "how-to"})]]
    dream(daemon)
    write(root, b, "The meeting moved to Monday, room 4 on floor 2. Deploys: make ship.\n")

    def call(action: str, node_path: str, content: str) -> tuple[str, dict[str, Any]]:
        return ("integrate", {"action": action, "node": node_path, "content": content,
                              "sources": [b], "reason": action.lower()})

    model.plan[b] = [
        [("node_read", {"path": meeting})],
        [call("CORRECT", meeting, "- on Monday\n- in room 4"),
         call("REFINE", meeting, "- on Friday\n- in room 4 on floor 2"),
         call("CORROBORATE", deploy, ""),
         call("CORRECT", deploy, "- run make ship")],
        [call("REFINE", meeting, "- on Monday\n- in room 4 on floor 2")]]
    result = dream(daemon)
    assert result["actions"] == {"CORRECT": 2, "CORROBORATE": 1, "refused": 1,
                                 "REFINE": 1}, (result, model.tool_results)
    assert sum("an earlier call of this same answer" in r for r in model.tool_results) == 1
    text = (root / meeting).read_text(encoding="utf-8")
    assert "- on Monday\n- in room 4 on floor 2\n" in text and "- on Friday\n" not in text
    assert "- run make ship" in (root / deploy).read_text(encoding="utf-8")


def test_undo_refuses_when_the_change_log_is_a_link(daemon: DaemonHandle,
                                                    fake: FakeProvider,
                                                    tmp_path: Path) -> None:
    """The run's change log replaced by a symbolic link: undo restored the files, then
    failed with an internal error when it went to tell the undo in the log (the run left
    half undone, its record saying so). It now refuses first, with the reason, and
    restores nothing; the log back in place, it undoes."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a = "memory/2026-11-20/a.md"
    write(root, a, "Tea.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea",
                                     "content": "- tea", "reason": "habit"})]]
    run = dream(daemon)
    log_md = root / run["log"]
    elsewhere = tmp_path / "elsewhere.md"
    log_md.rename(elsewhere)
    log_md.symlink_to(elsewhere)
    with pytest.raises(NotAllowed, match=re.escape("change log")):
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": run["run_id"]})
    assert (root / "digest/personal/tea.md").is_file()
    assert "Undone" not in elsewhere.read_text(encoding="utf-8")
    log_md.unlink()
    elsewhere.rename(log_md)
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": run["run_id"]})
    assert "digest/personal/tea.md" in undone["removed"]
    assert "Undone at" in log_md.read_text(encoding="utf-8")


def test_a_catalog_record_without_a_state_does_not_break_status(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A resource catalog holding a record without a ``state``, or a path that is no
    text (written by hand or by another tool): the workspace failed to open (KeyError),
    or its status failed. The record is left out; its file is cataloged again as new."""
    root = tmp_path / "ws"
    write(root, "resource/kept.md", "Kept.\n")
    write(root, "resource/stateless.md", "No state.\n")
    records: list[dict[str, Any]] = [
        {"path": "resource/kept.md", "digest": "0" * 64, "state": "skipped",
         "reason": "kept as it was"},
        {"path": "resource/stateless.md", "digest": "1" * 64},
        {"path": 7, "state": "processed", "digest": "2" * 64}]
    (root / "mem_metadata/catalog").mkdir(parents=True)
    write_records(REAL, root / "mem_metadata/catalog/resource.jsonl.zst", records)
    open_ws(daemon, root, None)
    # Both files wait for a chat model: the one of the whole record too, as its size and
    # time are not those the record has.
    entry = wait_status(daemon, lambda s: any(
        w["agent_id"] == AGENT and w.get("resource", {}).get("files") == {"pending": 2}
        for w in s["workspaces"]), "both files cataloged as pending")
    ws = next(w for w in entry["workspaces"] if w["agent_id"] == AGENT)
    assert [f["path"] for f in ws["resource"]["skipped"]] == [], ws["resource"]


def test_a_node_is_backed_only_by_the_note_the_model_read(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Three notes in one run, each in a conversation of its own. The model reading the
    first names the others as sources too (copied from a node it read, or guessed): they
    counted, so a fact told once stood at the confidence of two sources, and a note of a
    later day, not read yet, made the next day's correction look older than the node.
    A node gains as sources only the note the conversation is about."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b, c = ("memory/2026-11-20/a.md", "memory/2026-11-21/b.md",
               "memory/2026-11-22/c.md")
    meeting = "digest/wiki/meeting.md"
    write(root, a, "The meeting is on Friday.\n")
    write(root, b, "The meeting moved to Monday.\n")
    write(root, c, "Lunch was good.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Meeting",
                                     "content": "- on Friday", "sources": [a, b, c],
                                     "reason": "schedule"})]]
    model.plan[b] = [[("integrate", {"action": "CORRECT", "bucket": "wiki", "node": meeting,
                                     "content": "- on Monday", "sources": [b],
                                     "reason": "moved"})]]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 1, "CORRECT": 1}, (result, model.tool_results)
    fields, text = node(root, meeting)
    # Corrected: the correcting note backs the node, the one it overturned no longer.
    assert fields["sources"] == [b] and fields["confidence"] == 0.5, fields
    assert fields["overturned_sources"] == [a], fields
    assert "- on Monday" in text and f"[[{c}]]" not in text


def test_a_create_on_a_node_that_says_otherwise_is_no_corroboration(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The model, not searching first, CREATEs a node of an existing node's name with
    what a later note says against it: it was taken as a CORROBORATE, so the claim the
    note contradicts gained the note as a source and rose in confidence, and what the note
    said was lost. Such a CREATE is refused, telling the model to read the node; one
    that says what the node says (a line of it, in other words' order or case) is still
    a corroboration."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b, c = ("memory/2026-11-20/a.md", "memory/2026-11-21/b.md",
               "memory/2026-11-22/c.md")
    tea = "digest/personal/tea.md"
    write(root, a, "Tea in the morning.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea",
                                     "content": "- drinks tea\n- in the morning",
                                     "reason": "habit"})]]
    dream(daemon)
    write(root, b, "Coffee now, never tea.\n")
    model.plan[b] = [
        [("integrate", {"action": "CREATE", "bucket": "personal", "name": "tea",
                        "content": "- drinks coffee now, never tea", "reason": "habit"})],
        [("integrate", {"action": "CORRECT", "bucket": "personal", "node": tea,
                        "content": "- drinks coffee now, never tea",
                        "reason": "changed"})]]
    second = dream(daemon)
    assert second["actions"] == {"refused": 1, "CORRECT": 1}, (second, model.tool_results)
    refused = model.tool_results[1]
    assert refused.startswith("refused:") and "node_read" in refused, model.tool_results
    fields, text = node(root, tea)
    assert fields["corroborations"] == 0 and fields["sources"] == [b], fields
    assert fields["overturned_sources"] == [a], fields
    assert "- drinks coffee now, never tea" in text.split("## History")[0], text
    write(root, c, "Still coffee.\n")
    model.plan[c] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Tea",
                                     "content": "* Drinks  coffee now, never tea",
                                     "reason": "again"})]]
    assert dream(daemon)["actions"] == {"CORROBORATE": 1}, model.tool_results
    assert node(root, tea)[0]["sources"] == [b, c]


def test_a_note_dated_in_the_future_does_not_make_every_correction_older(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A note in a folder of a day still to come (a typo in its year, a day that cannot
    be) made the node's newest source: every real note was older than it, so no note
    could correct the node any more. A source's day after tomorrow says nothing of when
    its claim was made."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    typo, bad, b = ("memory/2099-11-20/typo.md", "memory/2026-19-40/bad.md",
                    "memory/2026-11-21/b.md")
    meeting = "digest/wiki/meeting.md"
    write(root, typo, "The meeting is on Friday.\n")
    write(root, bad, "The meeting is in room 4.\n")
    open_ws(daemon, root, fake)
    model.plan[bad] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Meeting",
                                       "content": "- on Friday", "reason": "schedule"})]]
    model.plan[typo] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki",
                                        "node": meeting, "reason": "again"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1, "CORROBORATE": 1}, model.tool_results
    write(root, b, "The meeting moved to Monday.\n")
    model.plan[b] = [[("integrate", {"action": "CORRECT", "bucket": "wiki", "node": meeting,
                                     "content": "- on Monday", "reason": "moved"})]]
    result = dream(daemon)
    assert result["actions"] == {"CORRECT": 1}, (result, model.tool_results)
    assert "- on Monday" in (root / meeting).read_text().split("## History")[0]


def test_a_note_saved_again_with_other_line_ends_is_not_read_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A dreamed note an editor saves again with CRLF line ends, a byte order mark,
    blanks at line ends or blank lines at its end says what was read: no model is asked
    about it again (one that named its fact otherwise would have made a second node of
    it). A word changed is read again."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-09-14/周会.md"
    said = "---\ntags: [会议]\n---\n用户每周一开会。\n下午三点。\n"
    write(root, note, said)
    open_ws(daemon, root, fake)
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "procedure",
                                        "name": "周会", "content": "- 每周一下午三点",
                                        "reason": "routine"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}
    asked = len(fake.requests)
    for saved in ("\ufeff" + said.replace("\n", "\r\n"), said.replace("\n", "  \n") + "\n\n",
                  said.replace("\n", "\r")):
        (root / note).write_bytes(saved.encode("utf-8"))
        again = dream(daemon)
        assert again["notes"] == 0 and len(fake.requests) == asked, (saved, again)
    (root / note).write_text(said.replace("三点", "四点"), encoding="utf-8")
    assert dream(daemon)["notes"] == 1 and len(fake.requests) > asked


def test_a_step_put_into_a_numbered_procedure_is_a_refinement(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A step inserted into a numbered procedure renumbers the steps after it: they were
    taken for dropped lines (``2. build`` is not ``3. build``), so the REFINE was refused
    as keeping 25% of the node, and would have put every renumbered step in History. A
    list item's number is no part of what it says, in Chinese numbering (``2、``) too."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    rel = "digest/procedure/release.md"
    steps = ["tag the release", "build the wheel", "upload it", "announce it"]
    write(root, a, "Release: tag, build, upload, announce. 发布：打标签、构建、上传。\n")
    open_ws(daemon, root, fake)
    zh = ["打标签", "构建", "上传"]

    def numbered(items: list[str], sep: str) -> str:
        return "\n".join(f"{i}{sep}{s}" for i, s in enumerate(items, 1))

    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "procedure",
                                     "name": "Release",
                                     "content": numbered(steps, ". ") + "\n"
                                     + numbered(zh, "、"), "reason": "how-to"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}, model.tool_results
    write(root, b, "Run the tests before the build. 构建前先测试。\n")
    content = (numbered([steps[0], "run the tests", *steps[1:]], ". ") + "\n"
               + numbered([zh[0], "测试", *zh[1:]], "、"))
    model.plan[b] = [[("node_read", {"path": rel})],
                     [("integrate", {"action": "REFINE", "bucket": "procedure", "node": rel,
                                     "name": "Release", "content": content,
                                     "reason": "a step added"})]]
    second = dream(daemon)
    assert second["actions"] == {"REFINE": 1}, (second, model.tool_results)
    text = node(root, rel)[1]
    assert "3. build the wheel\n" in text and "4、上传" in text, text
    assert "## History" not in text, text
