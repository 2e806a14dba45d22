"""Jobs cut short by a close, a forget or a stop lose no work and say what happened.

A real daemon, a real socket, a scripted OpenAI-compatible chat server on 127.0.0.1; every
wait is on a condition (the fake's gate, the daemon's answers) with a generous cap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider
from test_capture import add, chat_requests, config, done, notes, turn, write_note
from waits import wait_job

from recalld.ipc.client import Client
from recalld.ipc.errors import NotFound


def answered_a_tool(body: Any) -> bool:
    """A chat request that carries the answer of a tool the model called."""
    return any(m.get("role") == "tool" for m in body.get("messages", []))


def test_a_job_cut_short_after_it_wrote_the_note_tells_the_inbox(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The close stopped the job after the model wrote the note, before the model's last
    # answer: the note stayed written but nothing told of it (no inbox item, no change
    # log), and the run again, finding the note as the model would write it, changed
    # nothing and told nothing either.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=600))
    held = fake.gate(answered_a_tool)
    fake.script(write_note("dog", "- Dog named Rex"), write_note("dog", "- Dog named Rex"),
                done())
    first = add(d, "s1", turn("My dog is called Rex."), flush=True)
    assert held.entered.wait(30)
    d.call("workspace.close", {"agent_id": "w"})
    (note,) = notes(root)
    assert "Rex" in note.read_text()
    held.open()
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    job = wait_job(d, first["job_id"])
    assert job["state"] == "succeeded", job
    assert add(d, "s1", [])["pending_turns"] == 0
    items = d.call("inbox.list", {"agent_id": "w"})["items"]
    assert [(i["job_id"], i["changes"]) for i in items if i["kind"] == "auto_memory"] == [
        (first["job_id"], [str(note.relative_to(root)), f"{note.parent.relative_to(root)}"
                                                        "/index.md"])], items
    assert "cut short" in items[0]["summary"]
    assert list((root / "mem_metadata" / "auto_memory" / "runs").iterdir()), \
        "the cut run's change log"


def test_a_forget_cancels_the_jobs_held_for_the_workspace_saying_why(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Forgotten, a workspace never opens again by itself, yet its jobs were held for it:
    # journaled queued, they were resumed at the next start to wait 30 s for a workspace
    # that never came, and ran, long after, on a workspace opened anew at that folder.
    # Then, cancelled, they were kept with their params and results (and journaled so
    # across restarts) for whatever agent opened a workspace under that id next.
    root = tmp_path / "ws"
    text = config(root, fake, idle_s=600)
    d = daemon_factory(text)
    held = fake.gate(lambda body: True)
    first = add(d, "s1", turn("My dog is called Rex."), flush=True)
    assert held.entered.wait(30)
    with Client(d.socket_path) as watcher:
        watcher.subscribe(["job.state"], "w")
        d.call("workspace.close", {"agent_id": "w", "forget": True})
        ended = next(e.data for e in watcher.events(timeout_s=60)
                     if e.data.get("job_id") == first["job_id"]
                     and e.data.get("state") == "cancelled")
    assert "closed with forget" in ended["error"], ended
    held.open()
    assert d.stop() == 0
    d2 = daemon_factory(text, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    d2.call("workspace.open", {"agent_id": "w", "path": str(root)})
    with pytest.raises(NotFound):
        d2.call("jobs.get", {"agent_id": "w", "job_id": first["job_id"]})
    assert d2.call("jobs.list", {"agent_id": "w"})["jobs"] == []
    assert chat_requests(fake) == 1 and not notes(root)
