"""Waiting on a condition in tests: poll until it holds, with a generous cap (never a
fixed sleep standing in for the condition); and daemon calls made in threads of their own,
for a test that holds the daemon while they wait (:class:`CallsInThreads`)."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from recalld.ipc.errors import RecalldError

T = TypeVar("T")

#: Job states that are not finished yet.
ACTIVE = ("queued", "running")

#: How often a condition is polled (under trio: in process, so more often).
POLL_S = 0.05
ASYNC_POLL_S = 0.01


def _describe(cond: Callable[..., Any]) -> str:
    """The condition's source, for a failure that says what was awaited."""
    try:
        return inspect.getsource(cond).strip()
    except (OSError, TypeError):
        return repr(cond)


def wait_value(get: Callable[[], T], ok: Callable[[T], Any], what: str = "",
               deadline_s: float = 120.0, poll_s: float = POLL_S) -> T:
    """The first value of ``get()`` that ``ok`` accepts; fail naming ``what`` (or
    ``get``'s source) and the last value seen after ``deadline_s``. ``poll_s``: shorter
    only to act inside a brief window the condition opens."""
    end = time.monotonic() + deadline_s
    while not ok(value := get()):
        assert time.monotonic() < end, (
            f"timed out waiting for {what or _describe(get)}; last: {value!r:.2000}")
        time.sleep(poll_s)
    return value


def wait_for(cond: Callable[[], T], what: str = "", deadline_s: float = 120.0,
             poll_s: float = POLL_S) -> T:
    """The first true value of ``cond()``; fail naming ``what`` (or the condition's
    source) after ``deadline_s``."""
    return wait_value(cond, bool, what, deadline_s, poll_s)


async def until(cond: Callable[[], object], what: str = "", deadline_s: float = 120.0,
                ) -> None:
    """Under trio: return once ``cond()`` is true; fail naming ``what`` (or the
    condition's source) after ``deadline_s``."""
    with trio.move_on_after(deadline_s):
        while not cond():
            await trio.sleep(ASYNC_POLL_S)
        return
    raise AssertionError(f"timed out waiting for {what or _describe(cond)}")


def wait_job(d: Any, job_id: str, *, agent: str = "w", deadline_s: float = 120.0,
             ) -> dict[str, Any]:
    """The job ``job_id`` of ``agent`` once it has finished (any end state)."""
    job: dict[str, Any] = wait_value(
        lambda: d.call("jobs.get", {"agent_id": agent, "job_id": job_id}),
        lambda job: job["state"] not in ACTIVE, f"job {job_id} of {agent}", deadline_s)
    return job


def workspace_status(d: Any, agent: str) -> dict[str, Any] | None:
    """``agent``'s entry in ``daemon.status`` (None while it is not open)."""
    status: dict[str, Any] = d.call("daemon.status")
    return next((w for w in status["workspaces"] if w["agent_id"] == agent), None)


def wait_committed(d: Any, agent: str, deadline_s: float = 120.0) -> dict[str, Any]:
    """``agent``'s index status once every change made before the call is indexed and
    committed: its derived files stay as they are until something changes again."""
    d.call("index.sync", {"agent_id": agent})  # the changes are counted once applied
    index: dict[str, Any] = wait_value(
        lambda: (workspace_status(d, agent) or {}).get("index", {}),
        lambda index: index and not index["uncommitted_changes"],
        f"{agent}'s index committed", deadline_s)
    return index


def wait_status(d: Any, ok: Callable[[dict[str, Any]], Any], what: str,
                deadline_s: float = 120.0) -> dict[str, Any]:
    """``daemon.status`` once ``ok(status)`` holds."""
    status: dict[str, Any] = wait_value(lambda: d.call("daemon.status"), ok, what, deadline_s)
    return status


def wait_log(path: Path, text: str, what: str, deadline_s: float = 120.0) -> str:
    """The log at ``path`` once it holds ``text``."""
    log: str = wait_value(lambda: path.read_text() if path.exists() else "",
                          lambda log: text in log, what, deadline_s)
    return log


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, what: str, deadline_s: float = 120.0) -> None:
    """Return once process ``pid`` has exited."""
    wait_for(lambda: not alive(pid), what, deadline_s)


class CallsInThreads:
    """Daemon calls, each made in a thread of its own: ``results[key]`` is a call's answer,
    or the RecalldError it raised, once it came."""

    def __init__(self, d: Any) -> None:
        self.d = d
        self.results: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def start(self, key: str, method: str, params: dict[str, Any]) -> threading.Thread:
        def run() -> None:
            try:
                self.results[key] = self.d.call(method, params)
            except RecalldError as exc:
                self.results[key] = exc
        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        return thread

    def answered_or_waiting(self, in_flight: int, key: str | None = None) -> Callable[[], bool]:
        """A condition for :func:`wait_for`: ``key`` answered (any call, without one), or
        at least ``in_flight`` calls in flight (this status call among them) at two looks
        in a row: the calls wait."""
        seen: list[bool] = []

        def check() -> bool:
            status = self.d.call("daemon.status")
            seen.append(status["queues"]["server"]["calls_in_flight"] >= in_flight)
            answered = key in self.results if key is not None else bool(self.results)
            return answered or seen[-2:] == [True, True]
        return check

    def join(self) -> None:
        for thread in self.threads:
            thread.join()
