"""Jobs of a workspace that stopped serving: held at once, seen and cancelled meanwhile.

A real daemon, a real socket, a scripted OpenAI-compatible chat server on 127.0.0.1; every
wait is on a condition (the fake's gate, the daemon's answers) with a generous cap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Gate
from test_capture import done, notes, turn, write_note
from test_dream import ScriptedModel, chat_config, write
from waits import wait_committed, wait_job, wait_value, workspace_status

from recalld.ipc import errors


def two_agents(tmp_path: Path, fake: FakeProvider) -> str:
    chat = (f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "test-key", '
            f'model_name = "fake-model", timeout_s = 60.0}}\n')
    return "".join(f'[workspaces.{agent}]\npath = "{tmp_path / agent}"\n'
                   f"auto_memory_idle_s = 600\n{chat}" for agent in ("alice", "bob"))


def flush(d: Any, agent: str, user: str) -> str:
    added = d.call("memory.add_turns", {"agent_id": agent, "session_id": "s1",
                                        "messages": turn(user), "flush": True})
    job_id: str = added["job_id"]
    return job_id


def job_state(d: Any, agent: str, job_id: str) -> str:
    state: str = d.call("jobs.get", {"agent_id": agent, "job_id": job_id})["state"]
    return state


def test_a_folder_swapped_for_a_link_holds_its_running_job_at_once(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The workspace stopped serving once a link took its folder's place, but its running
    # job went on: the model's answer was written through the link, into alice's folder
    # (or refused there), and the job ended. Now the job stops at once and waits, queued,
    # until bob's own folder is back and bob opens again.
    d = daemon_factory(two_agents(tmp_path, fake))
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    d.call("workspace.open", {"agent_id": "alice"})
    held = fake.gate(lambda body: True)
    fake.script(write_note("tea", "- Bob drinks green tea"))  # taken by the held request
    job_id = flush(d, "bob", "I drink green tea.")
    assert held.entered.wait(30)
    os.rename(bob, tmp_path / "bob.old")
    os.symlink(alice, bob)
    entry = workspace_status(d, "bob")  # a use of bob: it stops
    assert entry is not None and entry["state"] == "failed", entry
    held.open()
    state = wait_value(lambda: job_state(d, "bob", job_id), lambda s: s != "running",
                       "bob's job stopped", 60)
    assert state == "queued"
    assert not notes(alice), "bob's job wrote into alice's folder"
    wait_value(lambda: d.call("daemon.status")["queues"]["jobs"],
               lambda jobs: jobs["running"] == 0 and jobs["queued"] == 1, "held, not running")

    os.unlink(bob)
    os.rename(tmp_path / "bob.old", bob)
    fake.script(write_note("tea", "- Bob drinks green tea"), done())
    d.call("workspace.open", {"agent_id": "bob"})
    job = wait_job(d, job_id, agent="bob")
    assert job["state"] == "succeeded", job
    assert len(notes(bob)) == 1 and "green tea" in notes(bob)[0].read_text()
    assert not notes(alice)


def test_a_held_job_of_a_closed_workspace_is_listed_and_cancelled(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # While its workspace was closed, jobs.list, jobs.get and jobs.cancel answered
    # "workspace 'bob' is not open": its held job could be neither seen nor cancelled, and
    # ran at the next open whatever the operator wanted.
    text = two_agents(tmp_path, fake)
    d = daemon_factory(text)
    held = fake.gate(lambda body: True)
    job_id = flush(d, "bob", "I drink green tea.")
    assert held.entered.wait(30)
    d.call("workspace.close", {"agent_id": "bob"})
    held.open()
    listed = d.call("jobs.list", {"agent_id": "bob"})["jobs"]
    assert [(j["job_id"], j["state"]) for j in listed] == [(job_id, "queued")]
    assert listed[0]["params"]["session_id"] == "s1"  # its owner sees it whole
    alice_sees = d.call("jobs.list", {"agent_id": "alice"})["jobs"]
    assert job_id not in [j["job_id"] for j in alice_sees]
    cancelled = d.call("jobs.cancel", {"agent_id": "bob", "job_id": job_id})
    assert cancelled["state"] == "cancelled", cancelled
    asked = sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))

    assert d.stop() == 0  # a restart runs no cancelled job either
    d = daemon_factory(text, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert d.call("workspace.open", {"agent_id": "bob"})["state"] == "ready"
    job = d.call("jobs.get", {"agent_id": "bob", "job_id": job_id})
    assert job["state"] == "cancelled" and not job["resumed"], job
    jobs = d.call("daemon.status")["queues"]["jobs"]
    assert (jobs["running"], jobs["queued"]) == (0, 0), jobs
    assert sum(1 for r in fake.requests if r.path.endswith("/chat/completions")) == asked
    assert not notes(tmp_path / "bob")
    # Its turns wait for the next run.
    pending = d.call("memory.add_turns", {"agent_id": "bob", "session_id": "s1",
                                          "messages": []})
    assert pending["pending_turns"] == 1, pending
    # An agent that has no workspace and never had a job is still unknown.
    with pytest.raises(errors.UnknownWorkspace):
        d.call("jobs.list", {"agent_id": "carol"})


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def bob_dream_held(d: DaemonHandle, fake: FakeProvider,
                   tmp_path: Path) -> tuple[Path, Path, Gate]:
    """alice's workspace (one note, committed) and bob's (two notes, the chat model) open
    on ``d``: a dream of bob's is held at its second note until the gate opens. Returns
    alice's folder, bob's folder and the gate."""
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    write(alice, "memory/2026-11-20/x.md", "# Alice\n\nThe quokka password.\n")
    d.call("workspace.open", {"agent_id": "alice", "path": str(alice),
                              "config": {"dream_cron_enabled": False}})
    model = ScriptedModel(fake)
    first, second = "memory/2026-11-20/a.md", "memory/2026-11-21/b.md"
    write(bob, first, "# Monday\n\nThe user prefers tea.\n")
    write(bob, second, "# Tuesday\n\nDeploy with make.\n")
    d.call("workspace.open", {"agent_id": "bob", "path": str(bob), "config": {
        "dream_cron_enabled": False, "chat_model_config": chat_config(fake)}})
    model.plan[first] = [[("integrate", {
        "action": "CREATE", "bucket": "personal", "name": "Tea", "description": "drink",
        "content": "- prefers tea", "sources": [first], "reason": "stated"})]]
    held = fake.gate(lambda body: f"Daily note {second}" in str(body))
    wait_committed(d, "alice")  # its own first commit is no write of bob's
    return alice, bob, held


def link_in_place_of_bob(d: DaemonHandle, held: Gate, tmp_path: Path, job_id: str) -> None:
    """With bob's job held at the gate: bob's folder moved to ``bob.old`` and a link to
    alice's put in its place. The workspace fails at once; the job, let go, stops and is
    queued again."""
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    assert held.entered.wait(30)
    os.rename(bob, tmp_path / "bob.old")
    os.symlink(alice, bob)
    assert workspace_status(d, "bob")["state"] == "failed"  # type: ignore[index]
    held.open()
    state = wait_value(lambda: job_state(d, "bob", job_id), lambda s: s != "running",
                       "bob's job stopped", 60)
    assert state == "queued"


def test_a_dream_cut_short_by_a_link_in_place_of_its_folder_writes_nothing_there(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Stopped once a link took its folder's place, the dream saved its catalog and wrote
    # its run's record on its way out by path: through the link, into alice's metadata.
    d = daemon_factory(None)
    alice, bob, held = bob_dream_held(d, fake, tmp_path)
    alice_before = files(alice)
    job_id = d.call("jobs.submit", {"agent_id": "bob", "kind": "auto_dream"})["job_id"]
    link_in_place_of_bob(d, held, tmp_path, job_id)
    assert files(alice) == alice_before

    os.unlink(bob)
    os.rename(tmp_path / "bob.old", bob)
    d.call("workspace.open", {"agent_id": "bob"})
    job = wait_job(d, job_id, agent="bob")
    assert job["state"] == "succeeded", job
    assert (bob / "digest" / "personal" / "tea.md").exists()
    assert files(alice) == alice_before


def test_auto_memory_cut_short_by_a_link_in_place_of_its_folder_writes_nothing_there(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The run had written bob's note when the link came: cut short, it wrote its change
    # log record by path, through the link, into alice's metadata.
    d = daemon_factory(two_agents(tmp_path, fake))
    alice = tmp_path / "alice"
    d.call("workspace.open", {"agent_id": "alice"})
    wait_committed(d, "alice")  # its own first commit is no write of bob's
    alice_before = files(alice)
    held = fake.gate(lambda body: any(m.get("role") == "tool"
                                      for m in body.get("messages", [])))
    fake.script(write_note("tea", "- Bob drinks green tea"), done())
    job_id = flush(d, "bob", "I drink green tea.")
    link_in_place_of_bob(d, held, tmp_path, job_id)
    assert files(alice) == alice_before
    assert len(notes(tmp_path / "bob.old")) == 1  # written before the link came
