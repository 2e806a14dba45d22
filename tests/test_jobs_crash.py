"""A daemon killed (SIGKILL) while a job's new state is being written to the job journal:
no client was told that state, so the restart contradicts nothing it was told.

The daemon is held inside the journal write of that state (a FIFO nobody writes to, as a
hung disk would hold it), observed from outside, then killed there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
from conftest import DaemonFactory, RawConnection
from fakes.provider_server import FakeProvider
from hooks import start_hook
from test_dream import chat_config
from test_jobs_held import flush
from waits import wait_for, wait_job

from recalld.daemon.jobjournal import JobJournal
from recalld.ipc.answers import JobInfo

#: Launcher lines: a job record of state $HOLD_STATE is written to the job journal only once
#: a writer opened the FIFO $HOLD (which none does); $HOLD.at is made when it gets there.
JOURNAL_HELD = "\n".join([
    "import os",
    "from recalld.daemon.store.applog import AppendLog",
    "real_append = AppendLog.append",
    "def held(self, records, **kwargs):",
    "    records = list(records)",
    "    if self.path.name == 'jobs.journal' and any(",
    "            r.get('state') == os.environ['HOLD_STATE'] for r in records):",
    "        open(os.environ['HOLD'] + '.at', 'w').close()",
    "        open(os.environ['HOLD'], 'rb').read()",
    "    return real_append(self, records, **kwargs)",
    "AppendLog.append = held"])


def states_told(listener: RawConnection, job_id: str) -> list[str]:
    """The states of ``job_id`` in the events ``listener`` got, read up to its end."""
    states = []
    while (line := listener.recv_line()) is not None:
        event: dict[str, Any] = orjson.loads(line)
        params = event.get("params", {})
        if event.get("method") == "event" and params.get("job_id") == job_id:
            states.append(params["state"])
    return states


def test_a_job_killed_while_its_end_is_written_was_never_told_ended(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The end was published (an event, jobs.get) before it was journaled: killed in
    # between, a client told "succeeded" was shown the job interrupted by the restart (or,
    # for a resumable kind, its work run again after it was told it ended).
    hold = tmp_path / "hold"
    os.mkfifo(hold)
    d = daemon_factory(**start_hook(tmp_path, JOURNAL_HELD), HOLD=str(hold),
                       HOLD_STATE="succeeded")
    d.call("workspace.open", {"agent_id": "w", "path": str(tmp_path / "w")})
    with d.connect() as listener:
        listener.call("events.subscribe", {"topics": ["job.state"], "agent_id": "w"})
        try:
            job_id = d.call("jobs.submit", {"agent_id": "w", "kind": "reindex"})["job_id"]
            wait_for(Path(f"{hold}.at").exists, "the reindex's end to be written")
            seen = d.call("jobs.get", {"agent_id": "w", "job_id": job_id})
            assert seen["state"] == "running", seen
            listed = d.call("jobs.list", {"agent_id": "w"})["jobs"]
            assert [j["state"] for j in listed] == ["running"], listed
        finally:
            d.kill()  # held in the write: a SIGTERM would wait for it
        told = states_told(listener, job_id)
    assert "succeeded" not in told and told[-1] == "running", told
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    d2.call("workspace.open", {"agent_id": "w", "path": str(tmp_path / "w")})
    job = wait_job(d2, job_id)
    assert job["state"] == "failed" and "interrupted" in job["error"], job


def test_a_job_killed_while_its_submission_is_written_was_never_told_queued(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A subscriber was told "queued" before the job was journaled: killed in between,
    # the restart had never heard of the job the subscriber saw.
    hold = tmp_path / "hold"
    os.mkfifo(hold)
    d = daemon_factory(**start_hook(tmp_path, JOURNAL_HELD), HOLD=str(hold),
                       HOLD_STATE="queued")
    d.call("workspace.open", {"agent_id": "w", "path": str(tmp_path / "w")})
    with d.connect() as listener, d.connect() as submitter:
        listener.call("events.subscribe", {"topics": ["job.*"], "agent_id": "w"})
        try:
            submitter.request("jobs.submit", {"agent_id": "w", "kind": "reindex"})
            wait_for(Path(f"{hold}.at").exists, "the submitted job to be written")
        finally:
            d.kill()
        told = list(iter(listener.recv_line, None))
        assert submitter.recv_line() is None  # no answer: the client knows it was not taken
    assert told == [], told
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    d2.call("workspace.open", {"agent_id": "w", "path": str(tmp_path / "w")})
    assert d2.call("jobs.list", {"agent_id": "w"})["jobs"] == []


async def test_a_compaction_keeps_the_end_it_was_writing(tmp_path: Path) -> None:
    # The end is journaled before the job in memory shows it: the compaction that this
    # append sets off wrote the records kept in memory, the job still running, over it.
    path = tmp_path / "jobs.journal"
    journal = JobJournal(path, 30.0)
    await journal.open()
    running: JobInfo = {
        "job_id": "j1", "agent_id": "w", "kind": "reindex", "params": {}, "state": "running",
        "progress": {"done": 0, "total": None, "message": ""}, "result": None, "error": None,
        "error_code": None, "submitted_at": 1.0, "started_at": 2.0, "finished_at": None,
        "resumed": False, "held": False}
    kept = [running]
    for _ in range(4 * len(kept) + 1000):  # the next append compacts the journal
        await journal.append(running, lambda: kept)
    await journal.append({**running, "state": "succeeded", "finished_at": 3.0}, lambda: kept)
    journal.close()
    assert len(path.read_bytes().splitlines()) == 1  # compacted
    (record,) = await JobJournal(path, 30.0).open()
    assert record["state"] == "succeeded", record


def test_a_daemon_killed_while_a_workspace_is_forgotten_keeps_it_or_none_of_its_jobs(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # Its record was dropped (saved) before its jobs were: killed in between, the restart
    # had forgotten the workspace but kept its held auto_memory job, for whichever
    # workspace would next open under that id to list and run.
    hold = tmp_path / "hold"
    os.mkfifo(hold)
    d = daemon_factory(**start_hook(tmp_path, JOURNAL_HELD), HOLD=str(hold),
                       HOLD_STATE="cancelled")
    d.call("workspace.open", {"agent_id": "bob", "path": str(tmp_path / "bob"),
                              "config": {"chat_model_config": chat_config(fake)}})
    held = fake.gate(lambda body: True)
    job_id = flush(d, "bob", "I drink green tea.")
    assert held.entered.wait(30)
    d.call("workspace.close", {"agent_id": "bob"})  # the job waits, held, for a reopen
    held.open()
    with d.connect() as closer:
        try:
            closer.request("workspace.close", {"agent_id": "bob", "forget": True})
            wait_for(Path(f"{hold}.at").exists, "the held job's cancel to be written")
        finally:
            d.kill()
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    listed = [w["agent_id"] for w in d2.call("workspace.list")["workspaces"]]
    # Not forgotten (the client was given no answer): it keeps its own job.
    assert "bob" in listed, listed
    assert job_id in [j["job_id"] for j in d2.call("jobs.list", {"agent_id": "bob"})["jobs"]]
