"""Waiting on a condition in tests: poll until it holds, with a generous cap (never a
fixed sleep standing in for the condition)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Job states that are not finished yet.
ACTIVE = ("queued", "running")


def wait_for(cond: Callable[[], bool], what: str, deadline_s: float = 120.0) -> None:
    """Return once ``cond()`` holds; fail naming ``what`` after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_job(d: Any, job_id: str, *, agent: str = "w", deadline_s: float = 60.0,
             ) -> dict[str, Any]:
    """The job ``job_id`` of ``agent`` once it has finished (any end state)."""
    end = time.monotonic() + deadline_s
    while True:
        job: dict[str, Any] = d.call("jobs.get", {"agent_id": agent, "job_id": job_id})
        if job["state"] not in ACTIVE:
            return job
        assert time.monotonic() < end, job
        time.sleep(0.05)
