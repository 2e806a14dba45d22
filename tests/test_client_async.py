"""The async client against the fake daemon, each test under trio and under asyncio:
concurrent and large calls, typed errors, events, reconnects, timeouts, cancellation,
closing; and a plain asyncio program."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from fakes.rpc_daemon import FakeDaemon, fake, sockdir
from waits import wait_for

from recalld.ipc import _core, errors
from recalld.ipc.aclient import AsyncClient

__all__ = ["fake", "sockdir"]  # fixtures, used by name


# One client for trio and asyncio programs: every test body runs under each event loop's
# own runner, as an application would run it.

BACKENDS = ["trio", "asyncio"]


def each_loop(body: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """A test that runs the async ``body`` once under ``trio.run`` and once under
    ``asyncio.run``, with ``body``'s fixtures."""

    def test(backend: str, **fixtures: Any) -> None:
        if backend == "trio":
            trio.run(functools.partial(body, **fixtures))
        else:
            asyncio.run(body(**fixtures))

    params = inspect.signature(body).parameters.values()
    test.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("backend", inspect.Parameter.POSITIONAL_OR_KEYWORD), *params])
    test.__name__ = test.__qualname__ = body.__name__
    return pytest.mark.parametrize("backend", BACKENDS)(test)


async def until(cond: Callable[[], object], what: str) -> None:
    """Wait (off the event loop) until ``cond()`` holds, with the suite's generous cap."""
    await anyio.to_thread.run_sync(lambda: wait_for(cond, what))


@each_loop
async def test_async_concurrent_calls_route_by_id(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        got: dict[int, Any] = {}

        async def one(i: int, delay: float) -> None:
            got[i] = await client.call("test.sleep", {"s": delay, "value": i})

        delays = [0.3, 0.1, 0.2, 0.0, 0.15] + [0.0] * 50
        async with anyio.create_task_group() as tg:
            for i, delay in enumerate(delays):
                tg.start_soon(one, i, delay)
        assert got == {i: i for i in range(len(delays))}
        results = await client.search("a", "q", max_results=3)
        assert [r.path for r in results] == [f"memory/n{i}.md" for i in range(3)]
        assert [r.text for r in results] == ["q"] * 3


@each_loop
async def test_async_large_requests_stay_whole(fake: FakeDaemon) -> None:
    # Requests larger than the socket buffer go out in pieces while small ones from other
    # tasks wait their turn: every request reaches the daemon whole and in one piece.
    async with AsyncClient(fake.path) as client:
        got: dict[int, Any] = {}

        async def one(i: int) -> None:
            value = f"{i}:" + "x" * (600_000 if i % 3 == 0 else 10)
            got[i] = await client.call("test.sleep", {"s": 0, "value": value})

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        assert {i: len(v) for i, v in got.items()} == {
            i: len(f"{i}:") + (600_000 if i % 3 == 0 else 10) for i in range(12)}
        assert all(v.startswith(f"{i}:") for i, v in got.items())


@each_loop
async def test_async_typed_calls_and_errors(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        with pytest.raises(errors.UnknownWorkspace) as info:
            await client.workspace_open("ghost")
        assert info.value.code == errors.UNKNOWN_WORKSPACE
        assert info.value.data == {"agent_id": "ghost"}
        with pytest.raises(errors.PathOutsideWorkspace):
            await client.read("a", "../../etc/passwd")
        with pytest.raises(errors.MethodNotFound):
            await client.jobs_list()
        with pytest.raises(errors.RequestTooLarge):  # refused before sending
            await client.call("daemon.ping", {"blob": "x" * (2 << 20)})
        fake.misshapen.add("workspace.list")
        with pytest.raises(errors.InternalError):
            await client.workspace_list()
        fake.misshapen.clear()
        assert (await client.ping())["pong"]  # errors leave the connection usable
        assert (await client.status())["workspaces"][0]["agent_id"] == "default"
        assert (await client.read("a1", "memory/x.md"))["text"] == "hello\n"
    assert not client.connected


@each_loop
async def test_async_not_running(sockdir: Path) -> None:
    stale = sockdir / "stale.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(stale))  # bound, never listening: what a killed daemon leaves
    sock.close()
    for path in (sockdir / "none.sock", stale):
        async with AsyncClient(path) as client:
            with pytest.raises(errors.DaemonNotRunning) as info:
                await client.ping()
            assert str(path) in info.value.message


@each_loop
async def test_async_events_and_lost_connection(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        await client.subscribe(["job.*"])
        await client.call("test.emit", {"count": 2})
        assert [e.data async for e in client.events(timeout_s=0.5)] == [{"i": 0}, {"i": 1}]
        assert await client.next_event(timeout_s=0.05) is None

        async def in_flight() -> None:
            with pytest.raises(errors.ConnectionLost):
                await client.call("test.sleep", {"s": 5})

        async with anyio.create_task_group() as tg:
            tg.start_soon(in_flight)
            await until(lambda: "test.sleep" in fake.methods(), "the first call sent")
            with pytest.raises(errors.ConnectionLost):
                await client.call("test.drop")
        with pytest.raises(errors.ConnectionLost):
            await client.next_event(timeout_s=1)  # subscribers learn the stream broke
        assert (await client.ping())["pong"]
        assert fake.methods().count("events.subscribe") == 2, "subscribed again"


@each_loop
async def test_async_events_sent_between_calls_wait_to_be_read(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        await client.subscribe(["job.*"])
        assert await client.call("test.emit_later", {"count": 3}) == {"later": 3}
        fake.emit_now.set()
        await until(lambda: fake.events_sent == 3, "the events sent after the answer")
        events = [e async for e in client.events(timeout_s=0.5)]
        assert [(e.topic, e.data) for e in events] == [
            ("job.progress", {"i": i}) for i in range(3)]


@each_loop
async def test_async_event_buffer_is_bounded(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path, max_events=2) as client:
        await client.subscribe(["job.*"])
        assert await client.call("test.emit", {"count": 5}) == {"sent": 5}
        kept: list[Any] = []
        with pytest.raises(errors.EventsMissed) as missed:  # told, after the events kept
            async for event in client.events(timeout_s=0.2):
                kept.append(event.data)
        assert kept == [{"i": 0}, {"i": 1}]
        assert missed.value.missed == client.events_dropped == 3
        assert await client.next_event(timeout_s=0) is None  # told once


@each_loop
async def test_async_waiting_for_events_reads_answers_of_calls(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        await client.subscribe(["job.*"])
        got: list[Any] = []

        async def listen() -> None:
            got.append(await client.next_event(timeout_s=30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            assert await client.call("test.sleep", {"s": 0.1, "value": 7}) == 7
            await client.call("test.emit", {"count": 1})
        assert [e.data for e in got] == [{"i": 0}]


@each_loop
async def test_async_reconnect_after_restart(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        await client.subscribe(["job.*"])
        assert (await client.ping())["pong"]
        await anyio.to_thread.run_sync(fake.restart)
        assert (await client.ping())["pong"], "the first call after a restart must work"
        assert fake.methods().count("events.subscribe") == 2, "subscribed again"
        with pytest.raises(errors.ConnectionLost):  # events may have been missed
            await client.next_event(timeout_s=1)
        await client.call("test.emit", {"count": 1})
        assert [e.data for e in [await client.next_event(timeout_s=2)] if e] == [{"i": 0}]


@each_loop
async def test_async_subscriber_alone_reconnects_after_restart(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        await client.subscribe(["job.*"])
        await anyio.to_thread.run_sync(fake.restart)
        with pytest.raises(errors.ConnectionLost):  # events may have been missed
            await client.next_event(timeout_s=1)
        # No call is made: waiting for events reconnects and subscribes again.
        assert await client.next_event(timeout_s=0.2) is None
        assert fake.methods().count("events.subscribe") == 2
        assert client.connected


@each_loop
async def test_async_timeout_keeps_connection(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path, timeout_s=0.1) as client:
        with pytest.raises(TimeoutError, match="no answer within"):
            await client.call("test.sleep", {"s": 0.5, "value": "late"})
        client.timeout_s = 5
        # The late answer arrives on the same connection and is dropped, not mistaken.
        assert await client.call("test.sleep", {"s": 0.6, "value": "mine"}) == "mine"
        assert fake.methods().count("test.sleep") == 2 and client.connected


@each_loop
async def test_async_cancelling_the_reading_call_hands_reading_on(fake: FakeDaemon) -> None:
    async with AsyncClient(fake.path) as client:
        got: list[Any] = []
        first_scope = anyio.CancelScope()

        async def first() -> None:
            with first_scope:
                await client.call("test.sleep", {"s": 30, "value": "first"})

        async def second() -> None:
            got.append(await client.call("test.sleep", {"s": 0.3, "value": "second"}))

        async with anyio.create_task_group() as tg:
            # The first call reads the socket; the second waits for it to route.
            tg.start_soon(first)
            await until(lambda: fake.methods().count("test.sleep") == 1, "first sent")
            tg.start_soon(second)
            await until(lambda: fake.methods().count("test.sleep") == 2, "second sent")
            first_scope.cancel()
        assert got == ["second"], "another waiting call took over the reading"
        assert (await client.ping())["pong"] and client.connected


@each_loop
async def test_async_a_call_cancelled_while_sending_leaves_the_others_be(
        fake: FakeDaemon) -> None:
    # A request larger than the socket buffer, cancelled once part of it is out: the
    # rest still goes out, so the connection stays whole for the calls of other tasks.
    async with AsyncClient(fake.path) as client:
        got: list[Any] = []

        async def other() -> None:
            got.append(await client.call("test.sleep", {"s": 0.5, "value": "other"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            await until(lambda: fake.methods().count("test.sleep") == 1, "other sent")
            with anyio.CancelScope() as scope:
                scope.cancel()
                await client.call("test.sleep", {"s": 0, "value": "x" * 900_000})
            assert scope.cancelled_caught
        assert got == ["other"]
        assert (await client.ping())["pong"] and client.connected
        assert fake.methods().count("test.sleep") == 2  # the cancelled one arrived whole


def test_asyncio_cancelling_a_call_while_sending_leaves_the_others_be(
        fake: FakeDaemon) -> None:
    # The same cancelled by asyncio itself (Task.cancel, as asyncio.timeout and
    # asyncio.wait_for do), which goes through anyio's shield: the rest of the request
    # was left unsent, and the next request, glued to its first half, never answered.
    async def scenario() -> None:
        async with AsyncClient(fake.path, timeout_s=60) as client:
            await client.ping()
            for steps in range(1, 6):
                big = asyncio.ensure_future(
                    client.call("test.sleep", {"s": 0, "value": "x" * 900_000}))
                for _ in range(steps):
                    await asyncio.sleep(0)
                big.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await big
                assert await client.call("test.sleep", {"s": 0, "value": steps}) == steps
            assert client.connected

    asyncio.run(scenario())


@each_loop
async def test_async_works_without_async_with(fake: FakeDaemon) -> None:
    client = AsyncClient(fake.path)
    assert (await client.ping())["pong"] and client.connected
    await client.aclose()
    assert not client.connected
    assert (await client.ping())["pong"], "a closed client reconnects"
    await client.aclose()
    await client.aclose()  # idempotent


@each_loop
async def test_async_aclose_fails_calls_in_flight(fake: FakeDaemon) -> None:
    client = AsyncClient(fake.path)
    lost: list[BaseException] = []

    async def in_flight() -> None:
        with pytest.raises(errors.ConnectionLost) as info:
            await client.call("test.sleep", {"s": 30})
        lost.append(info.value)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(in_flight)
        await until(lambda: fake.methods().count("test.sleep") == 3, "the calls sent")
        await client.aclose()
    # One exception each: a shared one would carry every task's traceback.
    assert len({id(e) for e in lost}) == 3


def test_plain_asyncio_program(fake: FakeDaemon, sockdir: Path) -> None:
    # asyncio.gather and asyncio.timeout: native asyncio tasks and cancellation, no anyio.
    async def scenario() -> None:
        async with AsyncClient(fake.path) as client:
            results = await asyncio.gather(*(
                client.call("test.sleep", {"s": d, "value": i})
                for i, d in enumerate([0.2, 0.0, 0.1])
            ))
            assert results == [0, 1, 2]
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await client.call("test.sleep", {"s": 0.5})
            await client.subscribe(["job.*"])
            await client.call("test.emit", {"count": 2})
            assert [e.data async for e in client.events(timeout_s=0.5)] == [{"i": 0}, {"i": 1}]
            with pytest.raises(errors.ConnectionLost):
                await client.call("test.drop")
            assert (await client.search("a", "q", max_results=1))[0].text == "q"

    asyncio.run(scenario())


@each_loop
async def test_async_answer_over_the_frame_limit_ends_the_connection(
        fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_core, "CLIENT_MAX_FRAME_BYTES", 1 << 20)
    async with AsyncClient(fake.path) as client:
        with pytest.raises(errors.ConnectionLost):
            await client.call("test.huge", {"bytes": 2 << 20})
        assert (await client.ping())["pong"]
        assert await client.call("test.huge", {"bytes": 1000}) == "x" * 1000
