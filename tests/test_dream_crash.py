"""auto_dream in the middle of a run: a daemon killed (SIGKILL) there leaves what the run
wrote in its change log (so it can be undone), goes on with the job once at its next
start, and the notes it finished are not dreamed again; a daemon stopped there tells the
inbox what the run wrote; a run going on cannot be undone under its feet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, Reply
from test_dream import AGENT, HALF_A, HALF_B, dream, dream_until_the_second_note, open_ws
from waits import wait_for, wait_job

from recalld.daemon.memory import changelog, runjournal
from recalld.ipc.errors import AlreadyRunning


def test_a_dream_killed_midway_keeps_its_undo_record_and_goes_on_once_at_the_start(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory()
    model, job_id = dream_until_the_second_note(d, fake, root)
    d.kill()

    # The next start goes on with the job: the note the killed run finished is not sent
    # to the model again. Killed in the middle once more, the job is not resumed again.
    fake.script(Reply(delay_s=30))
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    wait_for(lambda: not fake.pending_script(), "the resumed job to reach the second note")
    assert d2.call("jobs.get", {"agent_id": AGENT, "job_id": job_id})["resumed"] is True
    d2.kill()
    d3 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    open_ws(d3, root, fake)
    job = wait_job(d3, job_id, agent=AGENT)
    assert job["state"] == "failed" and "interrupted" in job["error"], job
    # The resumed run wrote nothing before it was killed: it left no record. The first
    # one's record, recovered from its journal, has an inbox item as a finished run's.
    (first,) = d3.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert first["files"] == ["digest/personal/cat.md"], first
    (item,) = d3.call("inbox.list", {"agent_id": AGENT})["items"]
    assert item["kind"] == "auto_dream" and item["changes"] == ["digest/personal/cat.md"]
    assert item["details"]["run_id"] == first["run_id"] and "cut short" in item["summary"]
    shown = (root / f"mem_metadata/dream/runs/{first['run_id']}.md").read_text()
    assert "**CREATE** [[digest/personal/cat.md]]" in shown and "- finished: not" in shown
    # The next run reads only the note neither killed run finished.
    model.plan[HALF_B] = []
    assert dream(d3)["notes"] == 1
    assert sum(1 for r in fake.requests if HALF_A in r.body.decode()) == 2  # both the first's
    d3.call("dream.undo", {"agent_id": AGENT, "run_id": first["run_id"]})
    assert not (root / "digest/personal/cat.md").exists()


def test_a_run_going_on_is_not_undone_under_its_feet(daemon: DaemonHandle, fake: FakeProvider,
                                                      tmp_path: Path) -> None:
    root = tmp_path / "ws"
    _, job_id = dream_until_the_second_note(daemon, fake, root)
    runs = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    assert len(runs) == 1, runs
    # Undone now, the run's next save would write its record over the undo.
    with pytest.raises(AlreadyRunning, match="still running"):
        daemon.call("dream.undo", {"agent_id": AGENT, "run_id": runs[0]["run_id"]})
    assert (root / "digest/personal/cat.md").exists()
    daemon.call("jobs.cancel", {"agent_id": AGENT, "job_id": job_id})
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": runs[0]["run_id"]})
    assert undone["removed"] == ["digest/personal/cat.md"]
    assert daemon.call("dream.runs", {"agent_id": AGENT})["runs"][0]["undone"]


def test_a_journal_left_behind_becomes_the_runs_record_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = changelog.RunLog("20261204T040000Z-abcdef", "2026-12-04T04:00:00+00:00", "cron",
                           notes=["memory/2026-12-03/a.md"],
                           waiting={"memory/2026-12-01/w.md": "the model failed on it 3 times"},
                           seq=7)
    journal = runjournal.Journal(runs, run)
    # z: written keeping a person's lines no model read (the next rewrite needs a read).
    for rel, before, after, unread in (("digest/wiki/x.md", None, b"x1", False),
                                       ("digest/wiki/y.md", b"y0", b"y1", False),
                                       ("digest/wiki/z.md", b"z0", b"z1", True),
                                       ("digest/wiki/x.md", None, b"x2", False)):
        journal.append([{"file": rel, **run.record_write(rel, before, after, unread)}])
    journal.append([{"failed_note": "memory/2026-12-03/b.md", "reason": "down"}])
    # The daemon dies here, a line half written.
    with open(runjournal.journal_path(runs, run.run_id), "ab") as f:
        f.write(b'0123abcd {"file": "digest/wi')
    (runs / "20261204T035959Z-000000.journal").mkdir()  # no journal: left, no error
    assert runjournal.recover(runs, {run.run_id}) == []  # still running: left alone
    assert [(r.run_id, cut) for r, cut in runjournal.recover(runs, set())] == [
        (run.run_id, True)]
    record = changelog.load_run(runs, run.run_id)
    assert record["files"] == {
        "digest/wiki/x.md": {"before": None, "after_sha256": changelog.sha256(b"x2")},
        "digest/wiki/y.md": {"before": "eTA=", "after_sha256": changelog.sha256(b"y1")},
        "digest/wiki/z.md": {"before": "ejA=", "after_sha256": changelog.sha256(b"z1"),
                             "unread": True}}
    assert changelog.last_writes(runs) == {"digest/wiki/x.md": changelog.sha256(b"x2"),
                                           "digest/wiki/y.md": changelog.sha256(b"y1"),
                                           "digest/wiki/z.md": None}
    assert record["failed_notes"] == {"memory/2026-12-03/b.md": "down"}
    assert record.get("waiting") == run.waiting, record  # the notes it left out, and why
    assert record.get("seq") == 7, record  # its place among the runs
    assert not runjournal.journal_path(runs, run.run_id).exists()
    assert runjournal.recover(runs, set()) == []


def inbox_on_disk(root: Path) -> list[dict[str, Any]]:
    """The inbox items written to the workspace's log (read with no daemon running)."""
    path = root / "mem_metadata/inbox/inbox.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    ops = [json.loads(line.split(" ", 1)[1]) for line in lines if line.strip()]
    return [op["item"] for op in ops if op["op"] == "push"]


def test_a_dream_stopped_with_the_daemon_tells_the_inbox_and_goes_on_once_after(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # The workspaces closed while the run ended: its inbox item came only after the
    # restart (from the journal it left), the job's stop raced with the inbox's close.
    root = tmp_path / "ws"
    d = daemon_factory()
    model, job_id = dream_until_the_second_note(d, fake, root)
    assert d.stop() == 0
    (item,) = inbox_on_disk(root)  # told before the daemon ended, not at the next start
    assert item["job_id"] == job_id and item["changes"] == ["digest/personal/cat.md"], item
    assert "stopped before its end" in item["summary"]
    model.plan[HALF_B] = []  # the second note adds nothing
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    open_ws(d2, root, fake)
    job = wait_job(d2, job_id, agent=AGENT)
    assert job["state"] == "succeeded" and job["resumed"], job
    assert job["result"]["notes"] == 1, job  # the first note is not dreamed again
    assert sum(1 for r in fake.requests if HALF_A in r.body.decode()) == 2
    (run,) = [r for r in d2.call("dream.runs", {"agent_id": AGENT})["runs"] if r["files"]]
    assert item["details"]["run_id"] == run["run_id"], item
    # Told once: neither the restart nor the resumed run adds an item.
    assert [i["id"] for i in d2.call("inbox.list", {"agent_id": AGENT})["items"]] == [
        item["id"]]
