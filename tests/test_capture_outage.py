"""A chat provider down for longer than the retries of a session take: its turns are
written once it answers again, whatever the outage's length.

A real daemon, a real socket, a scripted OpenAI-compatible chat server on 127.0.0.1 that
refuses (503, 429 with Retry-After, a dropped connection) until the test lets it answer.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply
from test_auto_memory import add, done, turn, write_note
from test_capture import chat_requests, config, health, memory_jobs, notes
from waits import ACTIVE, wait_for

from recalld.daemon.memory.capture import MAX_FAILED_RUNS


@pytest.mark.slow
def test_failed_runs_of_an_outage_do_not_stop_the_retries(daemon_factory: Any,
                                                         fake: FakeProvider,
                                                         tmp_path: Path) -> None:
    # Every run while the provider was down counted as a failed run: after six (a few
    # hours at the default idle time) the session was never tried again, and its turns
    # stayed pending after the provider came back.
    # The runs during an outage are few (the breaker's probes): here the runs before
    # it failed on answers that count, one short of the limit.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0.02, breaker_s=1.0))
    refusals = itertools.chain([Reply(status=400)] * (MAX_FAILED_RUNS - 1), itertools.cycle(
        [Reply(status=503), Reply(drop=True), Reply(status=429, headers={"Retry-After": "0"})]))
    fake.reply_for = lambda body: next(refusals)
    add(d, "s1", turn("Mi abuela vive en Valparaíso."))

    def failed() -> list[dict[str, Any]]:
        return [j for j in memory_jobs(d) if j["state"] == "failed"]

    def stopped() -> list[str]:
        return [r for r in health(d)["reasons"] if "not tried again" in r]

    wait_for(lambda: len(failed()) > MAX_FAILED_RUNS or stopped(),
             "more failed runs than the limit, or the retries stopped")
    assert sum("HTTP 400" in str(j["error"]) for j in failed()) == MAX_FAILED_RUNS - 1
    assert not stopped(), stopped()
    assert any("next try in" in r for r in health(d)["reasons"]), health(d)["reasons"]
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")
    assert ws["capture"]["retries_stopped"] == 0, ws["capture"]

    # The provider answers again; nobody adds a turn or flushes.
    fake.script(write_note("abuela", "- Su abuela vive en Valparaíso"), done())
    fake.reply_for = None
    note = wait_for(lambda: notes(root), "the note written once the provider answers")
    assert "Valparaíso" in note[0].read_text()
    wait_for(lambda: all(j["state"] not in ACTIVE for j in memory_jobs(d)))
    assert [j["state"] for j in memory_jobs(d)].count("succeeded") == 1
    assert add(d, "s1", [])["pending_turns"] == 0
    dialog = (root / "mem_session/dialog/s1.jsonl").read_text().splitlines()
    assert sum("Valparaíso" in line for line in dialog) == 1


@pytest.mark.slow
def test_an_outage_leaves_no_refused_runs_and_ends_at_the_breakers_probe(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # While the breaker held the provider, the session's retries were still submitted:
    # each one a failed job in the journal, refused without being sent, their delay
    # doubling as if the provider had been paid for them.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0.02, breaker_s=1.0))
    fake.reply_for = lambda body: Reply(status=503)
    add(d, "s1", turn("Mi hermana enseña guaraní en Asunción."))

    def chat() -> dict[str, Any]:
        listed = d.call("workspace.list")["workspaces"]
        view: dict[str, Any] = next(w for w in listed if w["agent_id"] == "w")["chat"]
        return view

    # Two half-open probes failed (the breaker's open time doubled twice from the
    # configured second: the default's five would make it 20).
    wait_for(lambda: chat()["breaker"]["open_for_s"] >= 4, "two failed probes")
    assert math.log2(chat()["breaker"]["open_for_s"]).is_integer(), chat()["breaker"]
    failed = [j for j in memory_jobs(d) if j["state"] == "failed"]
    refused = [j["error"] for j in failed if "circuit open" in str(j["error"])]
    assert not refused, refused
    # The first run (its attempts opened the breaker), then at most one run per probe.
    assert 1 <= len(failed) <= 4, [j["error"] for j in failed]
    assert chat_requests(fake) <= 5 + 3, chat_requests(fake)

    # The provider answers again; nobody adds a turn or flushes: the session's next run
    # is the breaker's next probe, not a doubled delay later.
    fake.script(write_note("hermana", "- Su hermana enseña guaraní en Asunción"), done())
    fake.reply_for = None
    hold_s = chat()["wait_s"] or 0.0
    note = wait_for(lambda: notes(root), "the note written at the breaker's next probe",
                    deadline_s=hold_s + 20.0)
    assert "Asunción" in note[0].read_text()
    wait_for(lambda: all(j["state"] not in ACTIVE for j in memory_jobs(d)))
    assert [j["state"] for j in memory_jobs(d)].count("succeeded") == 1
    assert add(d, "s1", [])["pending_turns"] == 0
