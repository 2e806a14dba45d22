"""One async client across event loops: a ``trio.run`` and later ``asyncio.run`` calls (and
back), loops of two threads at once, and a child forked while a loop runs; and its bound
of events."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from fakes.rpc_daemon import FakeDaemon, fake, sockdir

from recalld.ipc import errors
from recalld.ipc.aclient import AsyncClient

__all__ = ["fake", "sockdir"]  # fixtures, used by name


def test_one_client_serves_trio_and_asyncio_runs_in_turn(fake: FakeDaemon) -> None:
    # Each run's connection, lock and event were the first run's: every call of a later
    # run failed ("must be called from async context", "no running event loop").
    client = AsyncClient(fake.path, timeout_s=10)

    async def calls(value: int) -> list[Any]:
        return [await client.ping(), await client.call("test.sleep", {"s": 0, "value": value})]

    assert trio.run(calls, 1) == [{"pong": True}, 1]
    assert asyncio.run(calls(2)) == [{"pong": True}, 2]
    assert asyncio.run(calls(3)) == [{"pong": True}, 3]
    assert trio.run(calls, 4) == [{"pong": True}, 4]

    async def subscribe_and_emit() -> None:
        await client.subscribe(["job.*"])
        await client.call("test.emit", {"count": 2})  # read before the answer, not taken

    async def take_events() -> list[Any]:
        taken = [(await client.next_event(5)).data, (await client.next_event(5)).data]
        with pytest.raises(errors.ConnectionLost, match="event loop run that read it has ended"):
            await client.next_event(5)
        await client.call("test.emit", {"count": 1})  # subscribed again on this loop's
        taken.append((await client.next_event(5)).data)
        await client.aclose()
        return taken

    trio.run(subscribe_and_emit)
    assert asyncio.run(take_events()) == [{"i": 0}, {"i": 1}, {"i": 0}]
    assert fake.methods().count("events.subscribe") == 2

    # A client that keeps no events is told nothing: its bound holds that marker too.
    client = AsyncClient(fake.path, timeout_s=10, max_events=0)
    trio.run(client.subscribe, ["job.*"])
    assert asyncio.run(client.next_event(0)) is None
    asyncio.run(client.aclose())


def test_loops_of_two_threads_share_one_client(fake: FakeDaemon) -> None:
    client = AsyncClient(fake.path, timeout_s=10)
    both_connected = threading.Barrier(2, timeout=10)
    got: dict[str, object] = {}

    async def calls(name: str) -> None:
        await client.ping()
        await anyio.to_thread.run_sync(both_connected.wait)  # the other loop's is open too
        results: list[object] = []

        async def one(i: int) -> None:
            results.append(await client.call("test.sleep", {"s": 0.001 * (i % 3), "value": i}))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
        await client.aclose()
        got[name] = sorted(results)  # type: ignore[type-var]

    def run(name: str) -> None:
        try:
            if name == "trio":
                trio.run(calls, name)
            else:
                asyncio.run(calls(name))
        except BaseException as exc:
            got[name] = exc

    threads = [threading.Thread(target=run, args=(name,)) for name in ("trio", "asyncio")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert got == {"trio": list(range(20)), "asyncio": list(range(20))}


@pytest.mark.parametrize("value", [-1, 2.5, "5", None, True])
def test_a_bound_of_events_that_is_no_count_is_refused_at_once(value: object) -> None:
    # -1 dropped every event; "5" or None raised a TypeError at some later call (aclose).
    with pytest.raises(ValueError, match=r"^max_events must be a whole number, 0 or more"):
        AsyncClient("/tmp/unused.sock", max_events=value)  # type: ignore[arg-type]


def _clients_of(path: Path) -> int:
    """How many of this process's descriptors are client sockets connected to ``path``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # closed meanwhile, or not a socket
        with sock:
            with contextlib.suppress(OSError):
                count += sock.family == socket.AF_UNIX and sock.getpeername() == str(path)
    return count


def test_a_child_forked_while_a_loop_runs_lets_its_parents_connection_go(
        fake: FakeDaemon) -> None:
    # The child kept its copy of the parent's connection open (and the client's state
    # for the parent's loop with it) for as long as it lived.
    client = AsyncClient(fake.path, timeout_s=10)

    async def parent() -> None:
        assert await client.call("test.peer") == os.getpid()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: say what it found, and never return
            try:
                said = repr([_clients_of(fake.path),
                             trio.run(client.call, "test.peer"), _clients_of(fake.path)])
            except BaseException as exc:
                said = repr(exc)
            finally:
                os.write(write, said.encode())
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = (await asyncio.to_thread(pipe.read)).decode()
        await asyncio.to_thread(os.waitpid, pid, 0)
        assert said == repr([0, pid, 1])
        assert await client.call("test.peer") == os.getpid()  # as it was: not shut down
        await client.aclose()

    asyncio.run(parent())
