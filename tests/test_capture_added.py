"""What an agent wrote with ``memory.add_note`` into its conversation's note survives the
conversation's auto_memory: a model rewrite that leaves a line of it out, bullet or
prose, is refused and the line is put back (a real daemon and a scripted chat server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider
from test_capture import add, config, done, notes, turn, write_note
from waits import wait_job


@pytest.fixture
def fake() -> Any:
    with FakeProvider() as provider:
        yield provider


def test_a_prose_line_added_by_the_agent_is_not_dropped_by_a_rewrite(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The loss guard read only list items: a fact the agent had added as a sentence (the
    # MCP tool and the Python clients pass content as it is) was gone after the model
    # wrote the note again with bullet points of its own.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    added = d.call("memory.add_note", {
        "agent_id": "w", "session_id": "trip", "content":
        "The user's passport expires in March 2027.\n\nAlways book aisle seats."})
    fake.script(write_note("trip", "- Flies to Lisbon on 14 May"), done())
    job = wait_job(d, add(d, "trip", turn("I fly to Lisbon on 14 May."), flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    (note,) = notes(root)
    assert note.relative_to(root).as_posix() == added["path"]
    text = note.read_text()
    assert "Flies to Lisbon on 14 May" in text
    assert "passport expires in March 2027" in text and "aisle seats" in text, text
    assert job["result"]["refused"][0]["dropped"] == [
        "The user's passport expires in March 2027.", "Always book aisle seats."]
    # Kept in other words (as a bullet, with detail added): nothing is refused.
    fake.script(write_note("trip", "- Flies to Lisbon on 14 May\n"
                                   "- The user's passport expires in March 2027\n"
                                   "- Always book aisle seats, near the front"), done())
    job = wait_job(d, add(d, "trip", turn("Seats near the front, please."),
                          flush=True)["job_id"])
    assert job["state"] == "succeeded" and job["result"]["refused"] == [], job
    assert "near the front" in note.read_text()
