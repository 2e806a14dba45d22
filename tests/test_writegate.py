"""The gate between an agent's writes and a restore of its files, in memory."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from recalld.daemon.writegate import RESTORE_WAIT_S, WriteGates
from recalld.ipc.errors import UnknownWorkspace


async def test_a_restore_waits_for_the_writes_under_way_and_holds_new_ones() -> None:
    gates = WriteGates()
    order: list[str] = []
    first_in, first_out = trio.Event(), trio.Event()

    async def first_write() -> None:
        async with gates.writing("w"):
            first_in.set()
            await first_out.wait()
            order.append("first write")

    async def restore() -> None:
        async with gates.closed("w"):
            order.append("restore")

    async def later_write() -> None:
        async with gates.writing("w"):
            order.append("later write")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_write)
        await first_in.wait()
        nursery.start_soon(restore)
        await trio.testing.wait_all_tasks_blocked()
        assert gates.is_closed("w") and order == []  # the restore waits for the write
        nursery.start_soon(later_write)
        async with gates.writing("other"):  # another agent's writes pass
            order.append("other agent")
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["other agent"]
        first_out.set()
    assert order == ["other agent", "first write", "restore", "later write"]
    assert not gates.is_closed("w")


async def test_a_write_waits_for_a_restore_only_so_long(
        autojump_clock: trio.testing.MockClock) -> None:
    gates = WriteGates()
    restoring, done = trio.Event(), trio.Event()

    async def restore() -> None:
        async with gates.closed("w"):
            restoring.set()
            await done.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(restore)
        await restoring.wait()
        start = trio.current_time()
        with pytest.raises(UnknownWorkspace, match="being restored from a backup, still "
                           "after 25 s: nothing was written"):
            async with gates.writing("w"):
                pytest.fail("passed a closed gate")
        assert trio.current_time() - start == pytest.approx(RESTORE_WAIT_S)
        done.set()
    async with gates.writing("w"):  # open again
        pass


async def test_a_cancelled_restore_opens_the_gate_again() -> None:
    gates = WriteGates()
    with trio.move_on_after(0) as scope:
        async with gates.closed("w"):
            await trio.sleep_forever()
    assert scope.cancelled_caught and not gates.is_closed("w")
    async with gates.writing("w"):
        pass
