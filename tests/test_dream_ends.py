"""How a dream's end is reported: a cancelled run keeps its summary as its job's result."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import (
    AGENT,
    dream_until_the_second_note,
)

STEPS = 12  # DreamConfig.max_steps_per_note


def test_a_cancelled_dream_keeps_what_it_did_as_its_result(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    _model, job_id = dream_until_the_second_note(daemon, fake, tmp_path / "ws")
    daemon.call("jobs.cancel", {"agent_id": AGENT, "job_id": job_id})
    job = daemon.call("jobs.get", {"agent_id": AGENT, "job_id": job_id})
    assert job["state"] == "cancelled", job
    result = job["result"]
    assert result is not None, job
    assert result["actions"]["CREATE"] == 1 and result["changed"] is True, result
    assert "digest/personal/cat.md" in result["files_changed"], result
    assert result["notes"] == 2 and result["run_id"], result
