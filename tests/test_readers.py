"""What an agent a workspace is shared with sees of the owner's jobs and inbox.

A real daemon, the real socket, a scripted OpenAI-compatible chat server on 127.0.0.1,
so that auto_memory writes a real note and its job a real result. ``robin`` shares its
workspace with ``ash`` (listed before it), not with ``kim``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_cli import SCRIPT, as_json, recalld
from waits import wait_for, wait_job

from recalld.ipc import errors
from recalld.ipc.client import Client

SESSION = "robin-payroll-7f3"
SECRET = "Quillon wages are 4,812 guilders"
REPLY = "Stored the wages: 4,812 guilders, see the payroll note"


def _chat(fake: FakeProvider) -> str:
    return (f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "k", '
            f'model_name = "fake", timeout_s = 60.0}}\n')


def _config(fake: FakeProvider) -> str:
    return (f'[workspaces.robin]\nshared_with = ["ash"]\nauto_memory_idle_s = 600\n'
            f"{_chat(fake)}"
            "[workspaces.ash]\n[workspaces.kim]\n")


def _until_done(sub: Client, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The events ``sub`` got up to the end of ``job_id`` (the inbox item of a job is
    published before its last state)."""
    seen = []
    for event in sub.events(timeout_s=60):
        seen.append((event.topic, dict(event.data)))
        if event.topic == "job.state" and event.data.get("job_id") == job_id and (
                event.data.get("state") == "succeeded"):
            return seen
    raise AssertionError(f"job {job_id} did not end: {seen}")


def _owners_words(text: str) -> list[str]:
    return [w for w in (SESSION, "4,812", "mem_metadata", "dialog", "daily_write")
            if w in text]


def test_a_reader_sees_that_the_owners_jobs_ran_not_what_they_did(
        daemon_factory: DaemonFactory, fake: FakeProvider) -> None:
    d = daemon_factory(_config(fake))
    subs = {agent: Client(d.socket_path) for agent in ("robin", "ash", "kim")}
    for agent, sub in subs.items():
        sub.subscribe(["job.*", "inbox.*"], agent)
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "payroll", "description": "wages", "content": f"- {SECRET}"})])),
        Reply(json=chat_answer(REPLY)))
    with Client(d.socket_path) as c:
        job_id = c.call("memory.add_turns", {
            "agent_id": "robin", "session_id": SESSION, "flush": True,
            "messages": [{"role": "user", "content": SECRET}]})["job_id"]
        wait_job(d, job_id, agent="robin")

        # The owner gets it all: its session, the model's answer, the inbox item.
        owner = _until_done(subs["robin"], job_id)
        assert {t for t, _ in owner} >= {"job.state", "job.progress", "inbox.item"}
        assert owner[-1][1]["params"]["session_id"] == SESSION
        assert owner[-1][1]["result"]["model_text"] == REPLY
        whole = c.call("jobs.get", {"agent_id": "robin", "job_id": job_id})
        assert whole["result"]["model_text"] == REPLY

        # The reader: that it ran, its kind, state, counts and times; nothing it read,
        # was given or wrote, and no inbox item.
        reader = _until_done(subs["ash"], job_id)
        assert {t for t, _ in reader} == {"job.state", "job.progress"}, reader
        assert not _owners_words(json.dumps(reader)), reader
        last = reader[-1][1]
        assert (last["kind"], last["agent_id"], last["params"], last["result"],
                last["error"]) == ("auto_memory", "robin", {}, None, None)
        assert last["progress"]["done"] == last["progress"]["total"] == 4
        assert last["finished_at"] == whole["finished_at"]
        listed = [j for j in c.call("jobs.list", {"agent_id": "ash"})["jobs"]
                  if j["job_id"] == job_id]
        got = c.call("jobs.get", {"agent_id": "robin", "job_id": job_id, "as_agent": "ash"})
        assert listed == [got] and got["state"] == "succeeded"
        assert not _owners_words(json.dumps(got)), got

        # Another agent sees none of it.
        assert all(j["agent_id"] != "robin"
                   for j in c.call("jobs.list", {"agent_id": "kim"})["jobs"])
        with pytest.raises(errors.NotAllowed, match="shared_with"):
            c.call("jobs.get", {"agent_id": "robin", "job_id": job_id, "as_agent": "kim"})
        assert not list(subs["kim"].events(timeout_s=0))

        # What the operator's status shows is the owner's record, whoever lists first;
        # the jobs of one agent are its own.
        (shown,) = [j for j in c.jobs_of_every_workspace() if j["job_id"] == job_id]
        assert shown["result"] == whole["result"]
        assert as_json(recalld("--json", "jobs", "list", "--agent", "robin", env=d.env)) == [
            whole]
        assert as_json(recalld("--json", "jobs", "list", "--agent", "ash", env=d.env)) == []
    for sub in subs.values():
        sub.close()


def _calls(d: DaemonHandle, method: str) -> int:
    families = {f["name"]: f for f in d.call("daemon.metrics")["families"]}
    samples = families["recalld_rpc_seconds"]["samples"]
    return sum(int(s["count"]) for s in samples if s["labels"]["method"] == method)


def test_a_job_followed_from_the_command_line_ends_with_its_result(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # heron is shared with every agent, so the default agent reads it too: the command
    # following heron's job must get heron's own events, not what a reader sees.
    root = tmp_path / "heron"
    (root / "memory/2026-02-11").mkdir(parents=True)
    (root / "memory/2026-02-11/weir.md").write_text("The heron nests by the weir.\n")
    d = daemon_factory(f'[workspaces.heron]\npath = "{root}"\nshared_with = ["*"]\n'
                       f"dream_cron_enabled = false\n{_chat(fake)}")
    held = fake.gate(lambda body: True)
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    proc = subprocess.Popen([*cmd, "--json", "dream", "--agent", "heron"], env=d.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert held.entered.wait(60), "the dream never asked the model"
        # The end comes by event: the command has subscribed and looked at the job.
        wait_for(lambda: _calls(d, "events.subscribe") and _calls(d, "jobs.get"),
                 "the command following the job")
        held.open()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, (out, err)
    job = json.loads(out)
    assert job["state"] == "succeeded" and job["progress"]["message"], job
    assert job["result"] is not None and job["result"]["notes"] == 1, job
