"""A subscriber that ends its side of the connection (``shutdown(SHUT_WR)``, as ``nc -U``
does at the end of its input) still reads: its events keep coming until it is gone (it
closes, or shuts down its reading), its subscription ends, or the daemon stops."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
import trio
import trio.testing
from test_server_in_process import InProcess, LineClient

from recalld.daemon.rpc.connection_events import EVENT_QUEUE_SIZE

SUBSCRIBE = {"jsonrpc": "2.0", "method": "events.subscribe", "params": {"topics": ["job.*"]},
             "id": 1}


@asynccontextmanager
async def half_closed_subscriber(app: InProcess) -> AsyncIterator[tuple[LineClient, trio.Event]]:
    """A :class:`Connection` on a socket pair whose client sent ``events.subscribe`` as its
    last frame, without a newline, and ended its side; and the event set when it ends."""
    async with app.serving() as (client, served):
        await client.stream.send_all(orjson.dumps(SUBSCRIBE))
        await client.stream.send_eof()
        with trio.fail_after(5):
            assert (await client.recv())["result"]["subscribed"] == ["job.*"]
        await trio.testing.wait_all_tasks_blocked()
        yield client, served


@pytest.mark.parametrize("gone", ["close", "shutdown_rd"])
async def test_a_half_closed_subscriber_gets_events_until_it_is_gone(short_dir: Path,
                                                                     gone: str) -> None:
    app = InProcess(short_dir)
    async with half_closed_subscriber(app) as (client, served):
        for i in range(3):
            app.state.events.publish("job.progress", {"i": i})
            with trio.fail_after(5):
                assert (await client.recv())["params"] == {
                    "topic": "job.progress", "i": i, "stream": app.state.events.stream,
                    "seq": i + 1}
        await trio.testing.wait_all_tasks_blocked()
        assert not served.is_set()
        assert app.state.events.statistics().subscriptions == 1
        # Gone without a write to fail on: the daemon sees the hangup, and closes.
        if gone == "close":
            client.stream.socket.close()
        else:
            client.stream.socket.shutdown(socket.SHUT_RD)
        with trio.fail_after(5):
            await served.wait()
    assert app.state.events.statistics().subscriptions == 0


async def test_a_half_closed_subscriber_dropped_for_falling_behind_is_closed(
        short_dir: Path) -> None:
    # It cannot subscribe again: after the drop, nothing more will come, so it ends.
    app = InProcess(short_dir)
    async with half_closed_subscriber(app) as (client, served):
        for i in range(EVENT_QUEUE_SIZE + 50):
            app.state.events.publish("job.progress", {"i": i})
        with trio.fail_after(5):
            topics = []
            while not topics or topics[-1] != "events.dropped":
                topics.append((await client.recv())["params"]["topic"])
            await served.wait()
    assert app.state.events.statistics().subscriptions == 0


async def test_a_half_closed_subscriber_is_closed_when_the_daemon_stops(short_dir: Path) -> None:
    app = InProcess(short_dir)
    async with trio.open_nursery() as nursery:
        server = await app.serve(nursery)
        client = await app.connect()
        await client.stream.send_all(orjson.dumps(SUBSCRIBE) + b"\n")
        await client.stream.send_eof()
        with trio.fail_after(5):
            assert (await client.recv())["id"] == 1
            app.state.events.publish("job.progress", {"i": 0})
            assert (await client.recv())["params"]["i"] == 0
            server.cancel()
            with pytest.raises(EOFError):
                await client.recv()
        await client.aclose()
