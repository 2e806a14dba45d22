"""Jobs held for a workspace that is not served stay held across a restart.

A real daemon, a real socket, a scripted OpenAI-compatible chat server on 127.0.0.1; every
wait is on a condition (the fake's gate, the daemon's answers) with a generous cap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from test_capture import done, notes, turn, write_note
from test_cli import as_json, recalld
from test_jobs_held import flush, job_state, two_agents
from waits import wait_job, wait_value, workspace_status


def job_counts(d: Any) -> tuple[int, int, int]:
    """Jobs running, queued, and of those held for their workspace (daemon.status)."""
    jobs = d.call("daemon.status")["queues"]["jobs"]
    return jobs["running"], jobs["queued"], jobs["held"]


def send_away(tmp_path: Path) -> None:
    """Move bob's folder away, a link to alice's in its place: the start refuses bob."""
    os.rename(tmp_path / "bob", tmp_path / "bob.away")
    os.symlink(tmp_path / "alice", tmp_path / "bob")


def bring_back(tmp_path: Path) -> None:
    os.unlink(tmp_path / "bob")
    os.rename(tmp_path / "bob.away", tmp_path / "bob")


def restart(d: Any, daemon_factory: Any, text: str) -> Any:
    assert d.stop() == 0
    return daemon_factory(text, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])


def test_a_resumed_job_of_a_workspace_refused_at_the_start_waits_for_it(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The stop put bob's running auto_memory back in its queue; at the next start bob's
    # folder was away (a link to alice's in its place) and its opening refused, yet the
    # job ran at once, waited 30 s for the workspace and failed "workspace 'bob' failed:
    # ...": its turns were left for a later flush, and the operator saw a failure.
    text = two_agents(tmp_path, fake)
    d = daemon_factory(text)
    held = fake.gate(lambda body: True)
    job_id = flush(d, "bob", "I drink oolong tea.")
    assert held.entered.wait(30)
    bob = tmp_path / "bob"
    assert d.stop() == 0
    held.open()
    send_away(tmp_path)
    d = daemon_factory(text, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    entry = workspace_status(d, "bob")
    assert entry is not None and entry["state"] == "failed", entry
    job = d.call("jobs.get", {"agent_id": "bob", "job_id": job_id})
    assert (job["state"], job["resumed"]) == ("queued", True), job
    assert job_counts(d) == (0, 1, 1)  # held, not running (nor waiting for bob to open)
    assert [j["job_id"] for j in d.call("jobs.list", {"agent_id": "bob"})["jobs"]] == [job_id]
    # The operator's listing of every workspace's jobs shows it too.
    listed = as_json(recalld("jobs", "list", "--json", env=d.env))
    assert [(j["job_id"], j["held"]) for j in listed] == [(job_id, True)], listed
    shown = recalld("jobs", "list", env=d.env)
    assert shown.returncode == 0 and "queued (held)" in shown.stdout, shown

    bring_back(tmp_path)
    fake.script(write_note("tea", "- Bob drinks oolong tea"), done())
    assert d.call("workspace.open", {"agent_id": "bob"})["state"] == "ready"
    job = wait_job(d, job_id, agent="bob")
    assert job["state"] == "succeeded", job
    assert len(notes(bob)) == 1 and "oolong" in notes(bob)[0].read_text()


def test_held_jobs_of_every_kind_are_still_held_after_a_restart(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # A reindex queued behind bob's two running auto_memory jobs was held with them when
    # bob closed; the restart reported it failed "interrupted by daemon restart" although
    # it had never started (reindex is not a kind that resumes), and ran the two others
    # at once, to wait 30 s for a workspace whose folder was away and fail.
    text = two_agents(tmp_path, fake)
    d = daemon_factory(text)
    bob = tmp_path / "bob"
    (bob / "memory" / "2026-12-01").mkdir(parents=True, exist_ok=True)
    (bob / "memory" / "2026-12-01" / "kettle.md").write_text(
        "# Kettle\n\nThe kettle whistles at dawn.\n")
    held = fake.gate(lambda body: True)
    first = flush(d, "bob", "I drink oolong tea.")
    second = d.call("memory.add_turns", {"agent_id": "bob", "session_id": "s2",
                                         "messages": turn("I walk at dusk."),
                                         "flush": True})["job_id"]
    wait_value(lambda: held.held, lambda n: n == 2, "both chat requests held")
    reindex = d.call("jobs.submit", {"agent_id": "bob", "kind": "reindex"})["job_id"]
    assert job_counts(d) == (2, 1, 0)
    d.call("workspace.close", {"agent_id": "bob"})
    held.open()
    assert job_counts(d) == (0, 3, 3)

    assert d.stop() == 0
    send_away(tmp_path)
    d = daemon_factory(text, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    for _ in range(2):  # and again: held is not "resumed", not even once
        jobs = d.call("jobs.list", {"agent_id": "bob"})["jobs"]
        assert [(j["job_id"], j["state"], j["error"], j["resumed"], j["held"])
                for j in jobs] == [(first, "queued", None, False, True),
                                   (second, "queued", None, False, True),
                                   (reindex, "queued", None, False, True)], jobs
        assert job_counts(d) == (0, 3, 3)
        d = restart(d, daemon_factory, text)

    bring_back(tmp_path)
    fake.script(done(), done())
    assert d.call("workspace.open", {"agent_id": "bob"})["state"] == "ready"
    for job_id in (first, second, reindex):
        job = wait_job(d, job_id, agent="bob")
        assert job["state"] == "succeeded", job
    assert job["result"]["files"] >= 1, job  # the reindex ran on bob's own folder
    assert job_counts(d) == (0, 0, 0)


def test_a_held_job_cancelled_after_a_restart_does_not_run(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Held across the restart, the job is seen and cancelled while bob's folder is away,
    # and the workspace opening again later runs nothing.
    text = two_agents(tmp_path, fake)
    d = daemon_factory(text)
    held = fake.gate(lambda body: True)
    job_id = flush(d, "bob", "I drink rooibos.")
    assert held.entered.wait(30)
    d.call("workspace.close", {"agent_id": "bob"})
    held.open()
    assert job_state(d, "bob", job_id) == "queued"
    assert d.stop() == 0
    send_away(tmp_path)
    d = daemon_factory(text, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    entry = workspace_status(d, "bob")
    assert entry is not None and entry["state"] == "failed", entry
    job = d.call("jobs.get", {"agent_id": "bob", "job_id": job_id})
    assert (job["state"], job["resumed"]) == ("queued", False), job
    assert job_counts(d) == (0, 1, 1)
    # By its id alone, as the operator finds it in `recalld jobs list`.
    cancelled = as_json(recalld("jobs", "cancel", job_id, "--json", env=d.env))
    assert cancelled["state"] == "cancelled", cancelled
    assert job_counts(d) == (0, 0, 0)
    asked = sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))
    bring_back(tmp_path)
    assert d.call("workspace.open", {"agent_id": "bob"})["state"] == "ready"
    assert job_state(d, "bob", job_id) == "cancelled"
    assert sum(1 for r in fake.requests if r.path.endswith("/chat/completions")) == asked
    assert job_counts(d) == (0, 0, 0)
