"""auto_resource while files change under it: a file deleted while the model is asked,
a file moved to another date folder. A real daemon, a real resource folder, the scripted
chat model."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, Reply
from test_dream import ScriptedModel, write
from test_dream_crash import inbox_on_disk
from test_resource import (
    active_jobs,
    catalog,
    note_of,
    open_ws,
    resource_items,
    wait_state,
)
from waits import wait_for, workspace_status

from recalld.daemon.store.applog import AppendLog


def test_a_file_deleted_while_the_model_fails_on_it_is_removed_not_failed(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The model's failure is about bytes that are gone: the file is removed (its note
    # marked so), not a failed file that status counts and the nightly dream retries.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/plan.txt", "The launch is on Monday.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/plan.txt", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    gate = fake.gate(lambda body: "moved to Friday" in str(body.get("messages")))
    fake.script(Reply(raw=b"not json at all"))
    write(root, "resource/plan.txt", "The launch moved to Friday.\n")
    assert gate.entered.wait(30)
    (root / "resource/plan.txt").unlink()
    wait_state(root, "resource/plan.txt", "removed")
    gate.open()
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    entry = catalog(root)["resource/plan.txt"]
    assert entry["state"] == "removed" and entry["marked"], entry
    fields, text = note_of(root, "resource/plan.txt")
    assert fields["source_removed"] and "was removed on" in text, text
    ws = workspace_status(daemon, "res")
    assert ws is not None and ws["resource"]["files"] == {"removed": 1}, ws["resource"]



def test_a_note_written_twice_in_one_job_counts_once(daemon: DaemonHandle, fake: FakeProvider,
                                                    tmp_path: Path) -> None:
    # One job interprets a file, then (while the model reads another) the file changes,
    # and the job interprets it again: one note updated twice, one note in the summary.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/a.txt", "Budget: 10k.\n")
    gate = fake.gate(lambda body: "resource/b.txt" in str(body.get("messages")))
    write(root, "resource/b.txt", "Venue: Porto.\n")
    open_ws(daemon, "res", root, fake)
    assert gate.entered.wait(30)
    wait_state(root, "resource/a.txt", "processed")
    write(root, "resource/a.txt", "Budget: 12k.\n")
    wait_state(root, "resource/a.txt", "queued")
    gate.open()
    job = wait_for(lambda: [j for j in daemon.call("jobs.list", {"agent_id": "res"})["jobs"]
                            if j["state"] == "succeeded"])[0]
    notes = [catalog(root)[f"resource/{n}.txt"]["note"] for n in "ab"]
    assert sorted(job["result"]["notes"]) == sorted(notes), job["result"]
    item = daemon.call("inbox.list", {"agent_id": "res"})["items"][0]
    assert item["summary"] == "resources: 2 note(s) written or updated", item
    assert sorted(item["changes"]) == sorted(notes)


def test_a_file_added_as_the_job_ends_is_interpreted(daemon: DaemonHandle, fake: FakeProvider,
                                                     tmp_path: Path) -> None:
    # The job has looked for work for the last time and writes its inbox item (slow here:
    # the item compacts an inbox of 1000 large items). A file added meanwhile asks for a
    # job, and is refused one (one auto_resource job at a time): the running job takes
    # it; it did not, and the file stayed queued until some other change.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    log = root / "mem_metadata/inbox/inbox.jsonl"
    inbox = AppendLog(log)
    inbox.open()
    changes = [f"digest/wiki/node-{n:04d}-{'x' * 60}.md" for n in range(400)]
    inbox.append([{"op": "push", "item": {
        "id": f"{n:010d}", "time": 1.0, "kind": "auto_dream", "summary": "a dream",
        "changes": changes, "job_id": None, "details": {}, "acked": False}}
        for n in range(1, 1001)])
    inbox.append([{"op": "ack", "ids": ["1"], "time": 1.0}] * 1100)
    inbox.close()
    size = log.stat().st_size
    write(root, "resource/a.txt", "Alpha: the first report.\n")
    open_ws(daemon, "res", root, fake)
    # The job's item is appended, then the inbox compacted: the file comes meanwhile.
    wait_for(lambda: log.stat().st_size != size, "the job's inbox item", deadline_s=60,
             poll_s=0.001)
    write(root, "resource/b.txt", "Beta: the second report.\n")
    # Taken by the running job, or by one of its own when it came after that job's last
    # look: the catalog says queued before that job is asked for, so no job running while
    # it is queued is no sign of one left without a job.
    wait_state(root, "resource/b.txt", "processed")


def test_a_lost_catalog_does_not_have_the_files_summarised_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The catalog damaged, or the workspace copied without its metadata folder: the notes
    # still name their files and the bytes they were written from. Each file keeps its
    # note (one renamed since too) and only a file changed meanwhile goes to the model.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    write(root, "resource/top.txt", "Budget: 10k.\n")
    write(root, "resource/2026-11-02/data.csv", "a,b\n1,2\n")
    write(root, "resource/old/plan.md", "Launch on Monday.\n")
    open_ws(daemon, "res", root, fake)
    for rel in ("resource/top.txt", "resource/2026-11-02/data.csv", "resource/old/plan.md"):
        wait_state(root, rel, "processed")
    (root / "resource/old").rename(root / "resource/new")
    wait_state(root, "resource/new/plan.md", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    before = {rel: rec["note"] for rel, rec in catalog(root).items()}
    notes = sorted((root / "memory").rglob("*.md"))
    daemon.call("workspace.close", {"agent_id": "res"})
    (root / "mem_metadata/catalog/resource.jsonl.zst").unlink()
    write(root, "resource/2026-11-02/data.csv", "a,b\n1,3\n")
    calls = len(fake.requests)
    model.resource_answer = "Data.\n- b is 3 now"
    open_ws(daemon, "res", root, fake)
    for rel in before:
        wait_state(root, rel, "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    assert {rel: rec["note"] for rel, rec in catalog(root).items()} == before
    assert sorted((root / "memory").rglob("*.md")) == notes
    assert len(fake.requests) == calls + 1
    _, text = note_of(root, "resource/2026-11-02/data.csv")
    assert "b is 3 now" in text


def test_a_folder_moved_out_and_back_is_not_summarised_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Its files were removed (their notes marked so) and are back with the same bytes:
    # each has its note again, unmarked, without the model.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/2026-11-02/data.csv", "a,b\n1,2\n")
    write(root, "resource/2026-11-02/minutes.txt", "Venue: Porto.\n")
    open_ws(daemon, "res", root, fake)
    for name in ("data.csv", "minutes.txt"):
        wait_state(root, f"resource/2026-11-02/{name}", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    note = catalog(root)["resource/2026-11-02/data.csv"]["note"]
    calls = len(fake.requests)
    (root / "resource/2026-11-02").rename(tmp_path / "away")
    wait_for(lambda: catalog(root)["resource/2026-11-02/data.csv"].get("marked") is True)
    (tmp_path / "away").rename(root / "resource/2026-11-02")
    for name in ("data.csv", "minutes.txt"):
        # Queued files have their job asked for after the catalog says so: wait for the
        # end state itself, not for a moment with no job running.
        wait_state(root, f"resource/2026-11-02/{name}", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    assert len(fake.requests) == calls
    assert catalog(root)["resource/2026-11-02/data.csv"]["note"] == note
    fields, text = note_of(root, "resource/2026-11-02/data.csv")
    assert "source_removed" not in fields and "was removed" not in text, text
    assert text.rstrip().endswith("Source: [[resource/2026-11-02/data.csv]]"), text


def test_a_removed_file_renamed_back_in_while_the_job_runs(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The job has the removed file in its work when the file turns up under a new name
    # and takes its note back: the job goes on with the rest, and says what it wrote.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/x.txt", "Venue: Porto.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/x.txt", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    first = fake.gate(lambda body: "resource/a.txt" in str(body.get("messages")))
    second = fake.gate(lambda body: "resource/b.txt" in str(body.get("messages")))
    write(root, "resource/a.txt", "Budget: 10k.\n")
    assert first.entered.wait(30)
    write(root, "resource/b.txt", "Launch: Monday.\n")
    (root / "resource/x.txt").unlink()
    wait_state(root, "resource/x.txt", "removed")
    first.open()  # the job's next round: b.txt, then x.txt's note to mark
    assert second.entered.wait(30)
    write(root, "resource/y.txt", "Venue: Porto.\n")
    wait_state(root, "resource/y.txt", "processed")
    second.open()
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    jobs = [j for j in daemon.call("jobs.list", {"agent_id": "res"})["jobs"]
            if j["kind"] == "auto_resource"]
    assert [j["state"] for j in jobs] == ["succeeded"] * len(jobs), jobs
    assert catalog(root)["resource/b.txt"]["state"] == "processed"
    fields, _ = note_of(root, "resource/y.txt")
    assert "source_removed" not in fields and fields["source_resource"] == "[[resource/y.txt]]"


def test_notes_written_before_the_daemon_stops_are_told_and_the_rest_follows_the_restart(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # The job's item was pushed only once every file was done: stopped while the model
    # read the second file, the first file's note was written and never told, at the stop
    # or after it (the job is not resumed; the file left is interpreted by a new one).
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/a.txt", "Budget: 10k.\n")
    gate = fake.gate(lambda body: "resource/c.txt" in str(body.get("messages")))
    d = daemon_factory()
    open_ws(d, "res", root, fake)
    wait_state(root, "resource/a.txt", "processed")
    wait_for(lambda: not active_jobs(d, "res", "auto_resource"))
    write(root, "resource/b.txt", "Venue: Porto.\n")
    write(root, "resource/c.txt", "Caterer: Ana.\n")
    assert gate.entered.wait(30)
    first = catalog(root)["resource/a.txt"]["note"]
    told = [i for i in inbox_on_disk(root) if i["kind"] == "auto_resource"]
    assert [i["changes"] for i in told] == [[first]]
    done = [catalog(root)[f"resource/{n}.txt"] for n in "bc"]
    assert done[0]["state"] == "processed" and done[1]["state"] == "queued", done
    assert d.stop() == 0
    gate.open()
    told = [i for i in inbox_on_disk(root) if i["kind"] == "auto_resource"]
    assert [i["changes"] for i in told] == [[first], [done[0]["note"]]], told
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    wait_state(root, "resource/c.txt", "processed")
    wait_for(lambda: not active_jobs(d2, "res", "auto_resource"))
    notes = [catalog(root)[f"resource/{n}.txt"]["note"] for n in "abc"]
    assert [i["changes"] for i in resource_items(d2, "res") or []] == [[n] for n in notes]



def test_notes_written_before_a_kill_are_told_once_at_the_next_start(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # Killed while the model read the third file, the job never ended: the note of the
    # second, processed in the catalog, was written and told to nobody, ever.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/a.txt", "Budget: 10k.\n")
    gate = fake.gate(lambda body: "resource/c.txt" in str(body.get("messages")))
    d = daemon_factory()
    open_ws(d, "res", root, fake)
    wait_state(root, "resource/a.txt", "processed")
    wait_for(lambda: not active_jobs(d, "res", "auto_resource"))
    write(root, "resource/b.txt", "Venue: Porto.\n")
    write(root, "resource/c.txt", "Caterer: Ana.\n")
    assert gate.entered.wait(30)
    assert catalog(root)["resource/b.txt"]["state"] == "processed"
    d.kill()
    gate.open()
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    wait_state(root, "resource/c.txt", "processed")
    wait_for(lambda: not active_jobs(d2, "res", "auto_resource"))
    notes = {n: catalog(root)[f"resource/{n}.txt"]["note"] for n in "abc"}
    wait_for(lambda: len(resource_items(d2, "res") or []) == 3, what="the three items")
    items = resource_items(d2, "res") or []
    assert sorted(n for i in items for n in i["changes"]) == sorted(notes.values()), items
    (cut,) = [i for i in items if i["changes"] == [notes["b"]]]
    assert cut["details"] == {"cut_short": True}, cut
    assert d2.stop() == 0
    # Told, so no start tells them again.
    assert not [r for r in catalog(root).values() if "untold" in r], catalog(root)

def test_a_file_replaced_by_a_folder_of_its_name_is_removed(daemon: DaemonHandle,
                                                            fake: FakeProvider,
                                                            tmp_path: Path) -> None:
    # ``notes.txt`` deleted and a folder ``notes.txt/`` made in its place: the file is
    # gone (its note marked so), the files in the folder are new ones.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "resource/notes.txt", "Budget: 10k.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/notes.txt", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    (root / "resource/notes.txt").unlink()
    write(root, "resource/notes.txt/inner.md", "Venue: Porto.\n")
    wait_state(root, "resource/notes.txt/inner.md", "processed")
    wait_state(root, "resource/notes.txt", "removed")
    wait_for(lambda: catalog(root)["resource/notes.txt"].get("marked"))
    fields, text = note_of(root, "resource/notes.txt")
    assert fields.get("source_removed") and "was removed on" in text, text
    assert catalog(root)["resource/notes.txt/inner.md"]["note"] != catalog(root)[
        "resource/notes.txt"]["note"]
