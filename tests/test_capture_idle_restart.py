"""A session idle while the daemon was down is written soon after the start.

The idle time of turns found on disk when a workspace opens (at a start, or reopened)
is counted from the time recorded with the last turn, never from a time ahead of the
clock. A real daemon whose workspace is closed, its pending-turns log given other turn
times (as if it had been down for hours, or the clock set back since), and opened again;
a scripted chat server on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from test_auto_memory import add, done, turn, write_note
from test_capture import config, memory_jobs, notes
from waits import ACTIVE, wait_for

from recalld.daemon.store import applog

HOUR_S = 3600.0


def shift_turn_times(log: Path, by_session: dict[str, float]) -> None:
    """Move the recorded times of the turns of each session by its seconds."""
    records, report, _ = applog.parse(log.read_bytes())
    assert not report.bad_lines
    for rec in records:
        shift = by_session.get(str(rec.get("session_id")))
        if shift is None or rec.get("op") != "turns":
            continue
        for stamped in (rec, *rec["messages"]):
            if "at" in stamped:
                stamped["at"] = float(stamped["at"]) + shift
    log.write_bytes(applog.encode(records))


def test_a_session_idle_while_its_workspace_was_closed_is_written_at_the_opening(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, fake, idle_s=HOUR_S, interval=0)
    d = daemon_factory(cfg)
    add(d, "idle-2h", turn("Le train de Zoë part à 6 h 12."))
    add(d, "ahead", turn("The clock was set back after this one."))
    add(d, "fresh", turn("Said a minute before the stop."))
    # Closed (as by a stop) while its turns wait: the flusher reads them as at a start.
    d.call("workspace.close", {"agent_id": "w"})
    shift_turn_times(root / "mem_metadata/sessions/pending.jsonl",
                     {"idle-2h": -2 * HOUR_S, "ahead": 2 * HOUR_S, "fresh": -60.0})
    fake.script(write_note("train", "- Zoë's train leaves at 6:12"), done())
    d.call("workspace.open", {"agent_id": "w"})
    note = wait_for(lambda: notes(root), "the idle flush of the session idle for 2 h "
                    "(not an hour after the start)")
    assert "6:12" in note[0].read_text()
    jobs = wait_for(lambda: [j for j in memory_jobs(d) if j["state"] not in ACTIVE],
                    "the job to end")
    assert [(j["params"]["session_id"], j["params"]["trigger"], j["state"])
            for j in memory_jobs(d)] == [("idle-2h", "idle", "succeeded")], jobs
    # Idle for less than the hour by their times (one counted from the start, its time
    # lying ahead): still waiting.
    assert add(d, "ahead", [])["pending_turns"] == add(d, "fresh", [])["pending_turns"] == 1
    assert add(d, "idle-2h", [])["pending_turns"] == 0
