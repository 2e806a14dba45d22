"""A workspace opened again right after it failed: the failed one's services may still
be stopping, and its folder's lock is theirs until they have.

``workspace.open`` started the new workspace at once, whose lock was refused: "recalld
is already running for workspace ..." (this very daemon), while the user had done what
the failure asked (put the folder back, open it again). Now the open waits for the failed
workspace to have stopped. A registry in process whose workspace's one service holds its
stop until the test lets it go.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio
from waits import until

from recalld.daemon.config import DaemonConfig
from recalld.daemon.events import EventBus
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.workspaces import Workspace
from recalld.ipc import errors


async def test_a_workspace_opened_again_while_its_failed_one_stops_waits_for_it(
        tmp_path: Path) -> None:
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "data",
                       config_path=tmp_path / "c.toml")
    stopping, let_go = trio.Event(), trio.Event()
    started: list[Workspace] = []

    async def service(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):  # a last save, as the index makes
                stopping.set()
                await let_go.wait()

    async def start(ws: Workspace, nursery: trio.Nursery) -> None:
        started.append(ws)
        await nursery.start(service)

    registry = WorkspaceRegistry(lambda: cfg, EventBus(), start)
    bob, other = tmp_path / "bob", tmp_path / "other"
    other.mkdir()
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        first = await registry.open("bob", bob)
        os.rename(bob, tmp_path / "bob.old")
        os.symlink(other, bob)
        try:
            registry.get("bob")
            raise AssertionError("bob served through a link")
        except errors.UnknownWorkspace:
            pass
        await stopping.wait()
        assert first.state == "failed"
        os.unlink(bob)
        os.rename(tmp_path / "bob.old", bob)  # put back, as the failure asks
        opened: list[Workspace] = []
        refused: list[errors.RecalldError] = []
        done = trio.Event()

        async def open_again() -> None:
            try:
                opened.append(await registry.open("bob", bob))
            except errors.RecalldError as exc:
                refused.append(exc)
            done.set()

        nursery.start_soon(open_again)
        # Until it answered, or waits for the failed workspace to have stopped.
        try:  # the failed workspace is let go of before the registry stops
            await until(lambda: done.is_set() or first._finished.statistics().tasks_waiting,
                        "the open answered or waits")
            assert not refused, refused[0].message
            assert not opened and len(started) == 1
        finally:
            let_go.set()
        with trio.fail_after(30):
            await done.wait()
        assert not refused, refused[0].message
        assert opened[0] is not first and opened[0].state == "ready"
        assert registry.get("bob") is opened[0]
        nursery.cancel_scope.cancel()
