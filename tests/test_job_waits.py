"""A job that waits for its workspace (to open, to start its inbox) sleeps until the
workspace moves on, with no timer in between: an idle daemon uses no CPU.

Under trio with a mock clock: the only deadline left while such a job waits is its bound.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.events import EventBus
from recalld.daemon.memory.inbox import INBOX_WAIT_S, Inbox, push_inbox
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.workspaces import RESUMED_JOB_WAIT_S, Workspace, workspace_of_job
from recalld.ipc import errors


def next_wakeup_s() -> float:
    """Seconds until the nearest deadline of any task."""
    return trio.lowlevel.current_statistics().seconds_to_next_deadline


def registry_with_gated_start(tmp_path: Path) -> tuple[WorkspaceRegistry, trio.Event,
                                                       trio.Event]:
    """A registry whose workspaces stop opening until ``go`` (``starting``: one got
    there)."""
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "data",
                       config_path=tmp_path / "c.toml")
    starting, go = trio.Event(), trio.Event()

    async def start(ws: Workspace, nursery: trio.Nursery) -> None:
        starting.set()
        await go.wait()

    return WorkspaceRegistry(lambda: cfg, EventBus(), start), starting, go


async def test_a_job_waits_for_its_workspace_to_open_with_no_timer(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    # It looked every 0.1 s, for 30 s, whatever happened meanwhile.
    registry, starting, go = registry_with_gated_start(tmp_path)
    found: list[Workspace] = []
    done = trio.Event()

    async def job() -> None:
        found.append(await workspace_of_job(registry.get, "alpha", registry.wait_changed))
        done.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        nursery.start_soon(job)
        await trio.testing.wait_all_tasks_blocked()
        assert next_wakeup_s() == pytest.approx(RESUMED_JOB_WAIT_S)
        nursery.start_soon(registry.open, "alpha")
        await starting.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert not found  # opening: not yet
        assert next_wakeup_s() == pytest.approx(RESUMED_JOB_WAIT_S)
        mock_clock.autojump_threshold = 0  # from here, a missed wake-up ends at the bound
        go.set()
        with trio.fail_after(1):
            await done.wait()
        assert found == [registry.get("alpha")]
        nursery.cancel_scope.cancel()


async def test_a_job_whose_workspace_never_opens_fails_at_the_bound_saying_why(
        tmp_path: Path, autojump_clock: object) -> None:
    registry, _, _ = registry_with_gated_start(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        began = trio.current_time()
        with pytest.raises(errors.UnknownWorkspace, match="'alpha' is not open"):
            await workspace_of_job(registry.get, "alpha", registry.wait_changed)
        assert trio.current_time() - began == pytest.approx(RESUMED_JOB_WAIT_S)
        nursery.cancel_scope.cancel()


async def test_an_inbox_item_waits_for_the_inbox_with_no_timer(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    # A job that ended while its workspace opened looked for the inbox every 0.05 s.
    ws = Workspace("alpha", tmp_path, WorkspaceSettings())
    inbox = Inbox(tmp_path / "inbox.jsonl", "alpha")
    ws.provide(cast(Any, SimpleNamespace(inbox=inbox)))
    pushed: list[bool] = []
    done = trio.Event()

    async def tell() -> None:
        pushed.append(await push_inbox(ws, "auto_memory", "wrote a.md", ["a.md"],
                                       job_id="j1", details={}))
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tell)
        await trio.testing.wait_all_tasks_blocked()
        assert next_wakeup_s() == pytest.approx(INBOX_WAIT_S)
        await inbox.open()
        ws.changed()  # as a workspace's start does once each service started
        mock_clock.rate = 1.0  # a cap in case it is not woken (the push uses a thread)
        with trio.fail_after(INBOX_WAIT_S / 2):
            await done.wait()
    assert pushed == [True]
    assert [i["job_id"] for i in inbox.list()] == ["j1"]


async def test_an_inbox_item_is_only_logged_once_the_workspace_stops_opening(
        tmp_path: Path, autojump_clock: object) -> None:
    ws = Workspace("alpha", tmp_path, WorkspaceSettings())
    ws.provide(cast(Any, SimpleNamespace(inbox=Inbox(tmp_path / "inbox.jsonl", "alpha"))))
    pushed: list[bool] = []

    async with trio.open_nursery() as nursery:
        async def tell() -> None:
            pushed.append(await push_inbox(ws, "auto_memory", "wrote a.md", ["a.md"],
                                           job_id="j1", details={}))

        nursery.start_soon(tell)
        await trio.testing.wait_all_tasks_blocked()
        began = trio.current_time()
        ws.state = "failed"
    assert pushed == [False]
    assert trio.current_time() - began < INBOX_WAIT_S  # not kept to the bound
