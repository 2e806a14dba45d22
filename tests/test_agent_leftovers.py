"""What a daemon keeps of an agent once its workspace is closed: nothing.

The registry kept a lock for every agent id a ``workspace.open`` or ``workspace.close``
ever named, a close of an id that has no workspace included, and the file locks and
configured place of every agent that ever opened: a client closing made-up ids grew the
daemon by a few hundred bytes a call, without end. A registry in process (its workspaces'
one service a stand-in), with tracemalloc counting what the calls leave behind.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from recalld.daemon.config import DaemonConfig
from recalld.daemon.events import EventBus
from recalld.daemon.registry import WorkspaceRegistry
from recalld.daemon.services import AgentLocks
from recalld.daemon.workspaces import Workspace
from recalld.ipc import errors

#: Far below what the calls kept before (over 300 bytes each), above the allocator's noise.
LEFT_BEHIND_BYTES = 32 * 1024


@contextmanager
def growth() -> Iterator[Callable[[], int]]:
    """The bytes allocated inside the block and still held at its end (after a full
    collection), as a callable to read once the block is left."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    grown: list[int] = []
    try:
        yield lambda: grown[0]
    finally:
        gc.collect()
        grown.append(tracemalloc.get_traced_memory()[0] - before)
        tracemalloc.stop()


async def test_closing_agents_that_have_no_workspace_leaves_nothing_behind(
        tmp_path: Path) -> None:
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "data",
                       config_path=tmp_path / "c.toml")

    async def service(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def start(ws: Workspace, nursery: trio.Nursery) -> None:
        await nursery.start(service)

    registry = WorkspaceRegistry(lambda: cfg, EventBus(), start)
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        await registry.open("stays", tmp_path / "stays")
        # One round first: what the first calls of a kind allocate once is not per agent.
        await registry.open("warm", tmp_path / "warm")
        await registry.close("warm", forget=True)
        with growth() as grown:
            for n in range(500):
                with pytest.raises(errors.UnknownWorkspace):
                    await registry.close(f"nobody-{n}", forget=n % 2 == 0)
            for n in range(5):
                await registry.open(f"came-{n}", tmp_path / f"came-{n}")
                await registry.close(f"came-{n}", forget=True)
        assert grown() < LEFT_BEHIND_BYTES, grown()
        assert registry.get("stays").state == "ready"
        nursery.cancel_scope.cancel()


def test_file_locks_are_kept_while_in_use_and_not_after() -> None:
    locks = AgentLocks()
    # A call that holds them while the workspace closes and opens again: the reopened
    # workspace gets the very locks it waits on.
    held = locks.of("busy")
    assert locks.of("busy").write is held.write
    assert locks.of("busy").note is held.note
    with growth() as grown:
        for n in range(500):
            locks.of(f"came-{n}")  # each workspace that opened and closed since
    assert grown() < LEFT_BEHIND_BYTES, grown()
    assert locks.of("busy").write is held.write


async def test_a_forgotten_agent_leaves_no_jobs_behind(tmp_path: Path,
                                                      autojump_clock: object) -> None:
    """Its finished jobs (params, results) stayed listed, in memory and in the journal,
    for whatever agent opened under its id next; every agent that once ran a job kept a
    zero count of running ones."""
    from recalld.daemon.jobrecords import JobContext
    from recalld.daemon.jobs import JobManager

    async def reindex(job: JobContext) -> dict[str, object]:
        return {"secret": f"result of {job.agent_id}"}

    journal = tmp_path / "jobs.jsonl"
    manager = JobManager(journal_path=journal)
    manager.register("reindex", reindex)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        for agent in ("stays", "warm"):
            await manager.wait(agent, await manager.submit(agent, "reindex", {"x": 1}))
        await manager.forget("warm", "forgotten")
        with growth() as grown:
            for n in range(25):
                await manager.wait(f"came-{n}", await manager.submit(f"came-{n}", "reindex"))
                await manager.forget(f"came-{n}", "forgotten")
        assert grown() < LEFT_BEHIND_BYTES, grown()
        assert manager.list("warm") == [] and manager.list("came-0") == []
        assert [j["agent_id"] for j in manager.list()] == ["stays"]
        nursery.cancel_scope.cancel()
    # Not back after a restart either: the journal no longer holds them.
    again = JobManager(journal_path=journal)
    again.register("reindex", reindex)
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run)
        assert [j["agent_id"] for j in again.list()] == ["stays"]
        nursery.cancel_scope.cancel()
