"""An undone dream run is dreamed again: its notes are read by the next run, and what it
did to the catalog (a renamed note followed, a deleted one marked) is undone with its
files (a real daemon and a scripted model, see test_dream.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write
from waits import wait_for

from recalld.daemon.memory import changelog, runjournal
from recalld.daemon.memory.catalog import load_catalog, save_catalog, undo_changes
from recalld.daemon.memory.secret_names import mask_path
from recalld.ipc.errors import AlreadyRunning, NotAllowed

CAT = "digest/personal/cat.md"


def plan_cat(model: ScriptedModel, note: str, content: str) -> None:
    """The model's answer to ``note``: the node Cat, made with ``content``."""
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                        "name": "Cat", "content": content,
                                        "reason": "fact"})]]


def undo(daemon: DaemonHandle, run_id: str) -> dict[str, object]:
    result: dict[str, object] = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": run_id})
    return result


def test_the_notes_of_an_undone_run_are_dreamed_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Undone, the run's node went, but its notes stayed "processed" in the catalog: the
    # next run found nothing to do, and what they said was in no node ever again.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, other = "memory/2026-03-14/pets.md", "memory/2026-03-15/garden.md"
    write(root, note, "Our cat is called Miso; she is afraid of the hoover.\n")
    plan_cat(model, note, "- the cat is Miso")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    assert first["actions"] == {"CREATE": 1}
    write(root, other, "The roses need water on Sundays.\n")  # dreamed by a later run
    assert dream(daemon)["notes"] == 1

    undone = undo(daemon, first["run_id"])
    assert CAT in undone["removed"] and undone["dreamed_again"] == [note], undone
    assert not (root / CAT).exists()
    plan_cat(model, note, "- the cat is Miso, shy")
    again = dream(daemon)
    assert again["notes"] == 1 and again["actions"] == {"CREATE": 1}, again
    assert "- the cat is Miso, shy" in node(root, CAT)[1]
    assert dream(daemon)["run_id"] is None  # once


def test_undoing_a_run_that_marked_a_deleted_note_marks_it_again_next_run(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The undo put the node back as it was, linking the deleted note, but the catalog
    # kept the note marked deleted: no later run unlinked it, a dangling link for good.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-03-14/vet visit.md"
    write(root, note, "Miso sees the vet on Tuesdays.\n")
    plan_cat(model, note, "- Miso sees the vet")
    open_ws(daemon, root, fake)
    dream(daemon)
    linked = (root / CAT).read_bytes()
    (root / note).unlink()
    marked = dream(daemon)
    assert marked["actions"] == {"RELINK": 1}
    unlinked = (root / CAT).read_bytes()

    undone = undo(daemon, marked["run_id"])
    assert CAT in undone["restored"] and undone["dreamed_again"] == [], undone
    assert (root / CAT).read_bytes() == linked
    again = dream(daemon)
    assert again["actions"] == {"RELINK": 1}, again
    assert (root / CAT).read_bytes() == unlinked
    assert dream(daemon)["run_id"] is None


def test_undoing_a_run_that_followed_a_renamed_note_follows_it_again_next_run(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, moved = "memory/2026-03-14/vet.md", "memory/2026-03-14/pets/vet.md"
    write(root, note, "Miso sees the vet on Tuesdays.\n")
    plan_cat(model, note, "- Miso sees the vet")
    open_ws(daemon, root, fake)
    dream(daemon)
    linked = (root / CAT).read_bytes()
    (root / moved).parent.mkdir(parents=True)
    (root / note).rename(root / moved)
    followed = dream(daemon)
    assert followed["notes"] == 0 and followed["run_id"] is not None, followed
    relinked = (root / CAT).read_bytes()
    assert f"[[{moved}]]" in relinked.decode()

    undo(daemon, followed["run_id"])
    assert (root / CAT).read_bytes() == linked
    asked = len(fake.requests)
    again = dream(daemon)
    assert again["notes"] == 0 and again["run_id"] is not None, again
    assert len(fake.requests) == asked  # followed, not read again
    assert (root / CAT).read_bytes() == relinked
    assert dream(daemon)["run_id"] is None


def test_a_run_cut_short_keeps_its_catalog_changes_for_undo(tmp_path: Path) -> None:
    # Its record is made from its journal: without the catalog changes in it, undoing a
    # run that a crash cut short left its notes processed and its deletions marked.
    runs = tmp_path / "runs"
    cat = tmp_path / "dream.jsonl.zst"
    note, gone = "memory/2026-03-14/a.md", "memory/2026-03-13/b.md"
    earlier = {"path": gone, "digest": "1" * 64, "state": "processed", "run_id": "r0"}
    run = changelog.RunLog(changelog.new_run_id(datetime.now(UTC)), "t", "manual",
                           notes=[note])
    journal = runjournal.Journal(runs, run)
    marked = {**earlier, "deleted_at": "t"}
    read = {"path": note, "digest": "2" * 64, "state": "processed", "run_id": run.run_id}
    journal.append([{"catalog": gone, "before": earlier, "after": marked},
                    {"catalog": note, "before": None, "after": read}])
    save_catalog(cat, {gone: marked, note: read})
    [(recovered, cut)] = runjournal.recover(runs, ())
    assert cut
    again = undo_changes(cat, changelog.load_run(runs, recovered.run_id))
    assert again == [note]
    assert load_catalog(cat) == {gone: earlier}


def test_no_undo_while_a_dream_of_the_workspace_runs(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The dream going on holds the catalog and saves it after each note: what an undo
    # put back meanwhile would be written over, and its notes never dreamed again.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, later = "memory/2026-03-14/pets.md", "memory/2026-03-16/later.md"
    write(root, note, "Our cat is called Miso.\n")
    plan_cat(model, note, "- the cat is Miso")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    write(root, later, "Nothing much.\n")
    fake.script(Reply(delay_s=30))  # the next run's first request hangs
    job_id = daemon.call("jobs.submit", {"agent_id": AGENT, "kind": "auto_dream"})["job_id"]
    wait_for(lambda: not fake.pending_script(), "the next run to ask the model")
    with pytest.raises(AlreadyRunning, match="is running"):
        undo(daemon, first["run_id"])
    assert (root / CAT).exists()
    daemon.call("jobs.cancel", {"agent_id": AGENT, "job_id": job_id})
    assert undo(daemon, first["run_id"])["dreamed_again"] == [note]
    assert dream(daemon)["notes"] == 2  # the undone run's note, and the one left


def test_an_undo_tells_the_inbox_what_it_put_back(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The run's item told the agents what changed; the undo changed it back and told no one.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    token = "ghp_Zr4Tq9Lm2Xw7Ks3Vn8Bp1Dh6Fy0Jc5Ga2Ue9"
    note = f"memory/2026-03-14/pets-{token}.md"
    write(root, note, "Our cat is called Miso.\n")
    plan_cat(model, mask_path(note), "- the cat is Miso")  # as the model is shown it
    open_ws(daemon, root, fake)
    first = dream(daemon)
    listed = daemon.call("inbox.list", {"agent_id": AGENT})["items"]
    assert [i["details"]["run_id"] for i in listed] == [first["run_id"]], listed

    undo(daemon, first["run_id"])
    items = daemon.call("inbox.list", {"agent_id": AGENT, "since": listed[-1]["id"]})["items"]
    assert len(items) == 1, items
    [item] = items
    assert item["kind"] == "auto_dream" and CAT in item["changes"], item
    assert item["details"]["undone"] is True and item["details"]["run_id"] == first["run_id"]
    assert CAT in item["details"]["removed"], item
    assert item["summary"].startswith(f"dream {first['run_id']} undone: "), item
    # The note read again is named as search shows it: masked.
    assert item["details"]["dreamed_again"] == [mask_path(note)], item
    assert token[4:20] not in str(item), item


def test_runs_keep_their_order_when_the_wall_clock_is_set_back_between_them(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Runs were ordered by their start time: a run after the clock was set back (an NTP
    # step, a hand change) was listed below the one before it, and undo named the wrong
    # run to undo first, or none.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    notes = [f"memory/2026-03-{day}/pets.md" for day in (14, 15, 16)]
    write(root, notes[0], "Our cat is called Miso.\n")
    plan_cat(model, notes[0], "- the cat is Miso")
    open_ws(daemon, root, fake)
    first = dream(daemon)["run_id"]
    write(root, notes[1], "Miso is afraid of the hoover.\n")
    model.plan[notes[1]] = [[("integrate", {
        "action": "CORROBORATE", "bucket": "personal", "node": CAT, "name": "Cat",
        "sources": [notes[1]], "reason": "said again"})]]
    ahead = dream(daemon)["run_id"]
    # That run started while the clock was a day ahead; it is set right before the next.
    directory = changelog.runs_dir(root, "mem_metadata")
    record = orjson.loads((directory / f"{ahead}.json").read_bytes())
    record["started"] = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    (directory / f"{ahead}.json").write_bytes(orjson.dumps(record))
    write(root, notes[2], "Miso sleeps on the piano.\n")
    model.plan[notes[2]] = [[("integrate", {
        "action": "CORROBORATE", "bucket": "personal", "node": CAT, "name": "Cat",
        "sources": [notes[2]], "reason": "said again"})]]
    last = dream(daemon)["run_id"]

    runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert [r["run_id"] for r in runs] == [last, ahead, first], runs
    for kind in ({"kind": "auto_dream"}, {}):
        changes = daemon.call("memory.changes", {"agent_id": AGENT, **kind})["changes"]
        assert [r["run_id"] for r in changes] == [last, ahead, first], changes
    for run_id in (first, ahead):
        with pytest.raises(NotAllowed, match="changed since run") as refused:
            undo(daemon, run_id)
        assert f"written again by run {last}: undo it first" in str(refused.value), \
            refused.value
    assert CAT in undo(daemon, last)["restored"]
    assert CAT in undo(daemon, ahead)["restored"]
    assert CAT in undo(daemon, first)["removed"] and not (root / CAT).exists()
