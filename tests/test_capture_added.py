"""What an agent wrote with ``memory.add_note`` into its conversation's note survives the
conversation's auto_memory: a model rewrite that leaves a line of it out, bullet or
prose, is refused and the line is put back (a real daemon and a scripted chat server)."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, chat_answer, tool_call
from test_capture import add, config, done, memory_jobs, notes, turn, write_note
from waits import ACTIVE, wait_for, wait_job


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


def note_added(d: Any, content: str) -> None:
    d.call("memory.add_note", {"agent_id": "w", "session_id": "trip", "content": content})


def test_a_note_the_agent_adds_to_during_the_run_keeps_the_runs_facts(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The model, shown the note before the agent added a line to it, wrote it again
    # without that line: refused. It stopped there, and the run ended by writing its
    # refused version with the line put back, but only if the note had not changed since
    # the refusal: the agent had added another line meanwhile, so nothing was written,
    # the turns were committed, and the run's new fact was in no note.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    note_added(d, "- Keeps bees in the garden")
    first = fake.gate(lambda body: not any(m["role"] == "tool" for m in body["messages"]))
    fake.script(write_note("trip", "- Keeps bees in the garden\n- Drinks green tea"), done())
    job_id = add(d, "trip", turn("I drink green tea."), flush=True)["job_id"]
    assert first.entered.wait(30)
    note_added(d, "- Owns a red kayak")  # the model was not shown it
    after = fake.gate(lambda body: any(m["role"] == "tool" for m in body["messages"]))
    first.open()
    assert after.entered.wait(30)  # the model heard of the refusal
    note_added(d, "- Paddles on Sundays")
    after.open()
    job = wait_job(d, job_id)
    assert job["state"] == "succeeded", job
    assert job["result"]["refused"][0]["dropped"] == ["- Owns a red kayak"]
    (note,) = notes(root)
    body = note.read_text().split("---\n", 2)[2]
    assert [ln for ln in body.splitlines() if ln] == [
        "- Keeps bees in the garden", "- Owns a red kayak", "- Paddles on Sundays",
        "- Drinks green tea"], body


FACT = re.compile(r"(?:turn|added)-\d+")


def merging_model(req: Any) -> dict[str, Any]:
    """Writes the note again with every fact it was shown (the note and the turns)."""
    messages = req["messages"]
    if messages[-1]["role"] == "tool":
        return chat_answer("saved")
    facts = sorted(set(FACT.findall("\n".join(str(m.get("content")) for m in messages))))
    return chat_answer(None, [tool_call("daily_write", {
        "name": "trip", "content": "".join(f"- {f} kept\n" for f in facts)})])


def test_notes_added_while_runs_write_the_note_lose_nothing(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # memory.add_note read the note, then wrote it back with its line appended; a run's
    # model wrote the note between the two (its check of what it dropped read the note
    # before the append): whichever wrote last lost the other's lines.
    fake.chat_default = merging_model
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0, interval=1))
    note_added(d, "- added-0 by the agent")

    def agent() -> None:
        with d.connect() as conn:
            for i in range(1, 60):  # reworded by the model: refused rewrites, merged
                conn.call("memory.add_note", {"agent_id": "w", "session_id": "trip",
                                              "content": f"- added-{i} by the agent"})

    adding = threading.Thread(target=agent)
    adding.start()
    for i in range(40):
        add(d, "trip", turn(f"Remember turn-{i}."))
    adding.join()
    add(d, "trip", [], flush=True)
    wait_for(lambda: all(j["state"] not in ACTIVE for j in memory_jobs(d)), "runs done", 300)
    (note,) = notes(root)
    text = note.read_text()
    lost = [f for f in [*(f"added-{i}" for i in range(60)), *(f"turn-{i}" for i in range(40))]
            if not re.search(rf"\b{f}\b", text)]
    assert not lost, (lost, text)
