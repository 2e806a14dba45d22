"""Conflict copies in the daily folder (``note.sync-conflict-<date>-<time>-<host>.md``,
as a shared workspace's replica and Syncthing name them): each holds a version of a note
that lost to another, so the dream does not read it as a daily note, the day index does
not list it, and auto_memory does not take it for its conversation's note. A real daemon,
a real socket and a scripted model on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider
from test_auto_memory import config, done, today, turn, write_note
from test_dream import ScriptedModel, dream, open_ws, write
from waits import wait_job

NOTE = "---\nsession_id: s1\ndescription: {what}\n---\n- {what}\n"


def dreamed(fake: FakeProvider) -> list[str]:
    """The daily notes the model was asked about."""
    asked = []
    for r in fake.requests:
        if r.path.endswith("/chat/completions"):
            user = next(m["content"] for m in r.json["messages"] if m["role"] == "user")
            if user.startswith("Daily note "):
                asked.append(user.split(":", 1)[0].removeprefix("Daily note "))
    return asked


def test_the_dream_reads_no_conflict_copy_as_a_daily_note(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    ScriptedModel(fake)
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    write(root, "memory/2026-04-01/Ölwechsel.md", NOTE.format(what="Ölwechsel im April"))
    copies = ["memory/2026-04-01/Ölwechsel.sync-conflict-20260401-081500-werkstatt.md",
              "memory/2026-04-01/index.sync-conflict-20260401-081501-hostb.md",
              "memory/2026-04-02.sync-conflict-20260402-230000-laptop-2.md"]
    for copy in copies:
        write(root, copy, NOTE.format(what="eine ältere Fassung"))
    dream(daemon)
    assert sorted(set(dreamed(fake))) == ["memory/2026-04-01/Ölwechsel.md"], dreamed(fake)


def test_auto_memory_neither_lists_nor_continues_a_conflict_copy(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=50))
    day = today()
    copy = f"memory/{day}/trip.sync-conflict-20261205-101010-hostb.md"
    write(root, copy, NOTE.format(what="a trip to Lisbon, as another host wrote it"))
    fake.script(write_note("Trip", "- flies to Lisbon on Friday", description="the trip"),
                done())
    added = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1",
                                        "messages": turn("I fly to Lisbon on Friday."),
                                        "flush": True})
    job = wait_job(d, added["job_id"])
    assert job["state"] == "succeeded", job
    assert job["result"]["note"] == f"memory/{day}/trip.md", job
    index = (root / f"memory/{day}/index.md").read_text(encoding="utf-8")
    assert "(trip.md): the trip" in index and "sync-conflict" not in index, index
    # The model was told the conversation had no note yet, not shown the copy as its note.
    first = next(r for r in fake.requests if r.path.endswith("/chat/completions"))
    asked = next(m["content"] for m in first.json["messages"] if m["role"] == "user")
    assert "has no note" in asked and "another host wrote" not in asked, asked
