"""The Python clients tell a subscriber how many events it missed where its subscription
had a gap, counted by the daemon from where its events stood (``stream``, ``seq``):
after a drop notice, those published before it subscribed again; across a restart, the
new run's before the subscription was made again (one ConnectionLost, now with a count).
Real sockets: a server in process where the test must publish faster than a client reads,
real daemons across a restart."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import trio
from conftest import DaemonFactory
from test_client_event_gaps import restarted
from test_event_resubscribe import FILLER
from test_event_stream import reindexed
from test_server_in_process import InProcess

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client
from recalld.ipc.errors import ConnectionLost, EventsMissed

DROPPED = "events.dropped"


def _overflow(app: InProcess) -> int:
    """Publish more events at once than a subscription's queue holds; how many."""
    count = 600
    for i in range(count):
        app.state.events.publish("job.progress", {"i": i, "filler": FILLER})
    return count


def _between(app: InProcess) -> None:
    """Five events of the subscription's topics and five of others."""
    for i in range(5):
        app.state.events.publish("job.state", {"i": i})
        app.state.events.publish("workspace.opened", {"agent_id": "default"})


async def test_an_async_subscriber_is_told_what_came_between_the_drop_and_its_new_subscription(
        short_dir: Path) -> None:
    app = InProcess(short_dir)
    async with trio.open_nursery() as nursery:
        server = await app.serve(nursery)
        async with AsyncClient(app.config.socket_path) as client:
            await client.subscribe(["job.*"])
            published = _overflow(app)
            read = 0
            while (event := await client.next_event(timeout_s=30)) is not None \
                    and event.topic != DROPPED:
                assert event.seq == read + 1 and event.stream == app.state.events.stream
                read += 1
            assert event is not None and event.seq == published
            assert read + event.data["missed"] == published
            assert "seq" not in event.data and "stream" not in event.data
            _between(app)
            assert (await client.subscribe(["job.*"]))["missed"] == 5
            with pytest.raises(EventsMissed) as missed:
                await client.next_event(timeout_s=0)
            assert missed.value.missed == 5 and "dropped" in str(missed.value)
            app.state.events.publish("job.state", {"i": 5})
            after = await client.next_event(timeout_s=30)
            assert after is not None and after.data == {"i": 5}
            assert after.seq == published + 11
        server.cancel()


async def test_a_blocking_subscriber_is_told_what_came_between_the_drop_and_its_new_subscription(
        short_dir: Path) -> None:
    app = InProcess(short_dir)
    async with trio.open_nursery() as nursery:
        server = await app.serve(nursery)
        with Client(app.config.socket_path) as client:
            await trio.to_thread.run_sync(client.subscribe, ["job.*"])
            _overflow(app)

            def until_dropped() -> int:
                for read, event in enumerate(client.events(timeout_s=30)):
                    if event.topic == DROPPED:
                        return read
                raise AssertionError("no drop notice")

            assert await trio.to_thread.run_sync(until_dropped) >= 256
            _between(app)
            again = await trio.to_thread.run_sync(client.subscribe, ["job.*"])
            assert again["missed"] == 5

            def gap() -> int:
                with pytest.raises(EventsMissed) as missed:
                    next(client.events(timeout_s=0))
                return missed.value.missed

            assert await trio.to_thread.run_sync(gap) == 5
        server.cancel()


def test_a_blocking_subscriber_is_told_once_what_a_restart_cost_it(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    first = daemon_factory(RECALLD_SOCKET=str(short_dir / "r.sock"))
    with Client(first.socket_path) as client:
        client.subscribe(["job.state"])
        reindexed(first)
        seen = [e.seq for e in itertools.islice(client.events(timeout_s=60), 3)]
        assert len(seen) == 3 and seen == sorted(set(seen))
        second = restarted(daemon_factory, first)
        reindexed(second)  # before the client subscribes there: 3 job.state events
        assert client.ping()["pong"]  # reconnects and subscribes again
        with pytest.raises(ConnectionLost) as lost:  # one exception for the gap
            next(client.events(timeout_s=0))
        assert isinstance(lost.value, EventsMissed) and lost.value.missed == 3
        assert "restarted" in str(lost.value)
        reindexed(second)
        states = [e.data["state"] for e in itertools.islice(client.events(timeout_s=60), 3)]
        assert states == ["queued", "running", "succeeded"]
