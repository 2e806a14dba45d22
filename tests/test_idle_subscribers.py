"""A connection that only waits for its events (or for a long call) is not idle, and
costs no timer meanwhile: an idle daemon with subscribed clients uses no CPU.

Its idle watch used to wake every ``idle_timeout_s`` for as long as the subscription
lasted, find the connection busy and sleep again: one wake-up per subscriber and period,
while nothing happened. Under trio with a mock clock: once the watch has seen the
subscription, no deadline of the connection is left; a half sent frame, the end of the
subscription or of the call arms it again.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio
import trio.testing
from test_server_half_close import SUBSCRIBE, half_closed_subscriber
from test_server_in_process import InProcess

from recalld.daemon.events import DROPPED_TOPIC
from recalld.daemon.rpc.connection_events import EVENT_QUEUE_SIZE

IDLE_S = 10.0


def next_wakeup_s() -> float:
    """Seconds until the nearest deadline of any task."""
    return trio.lowlevel.current_statistics().seconds_to_next_deadline


async def settled() -> float:
    await trio.testing.wait_all_tasks_blocked()
    return next_wakeup_s()


async def test_a_subscriber_waiting_for_events_costs_no_timer_until_it_sends_half_a_frame(
        short_dir: Path, mock_clock: trio.testing.MockClock) -> None:
    app = InProcess(short_dir, idle_timeout_s=IDLE_S)
    async with app.serving() as (client, served):
        await client.send(SUBSCRIBE)
        assert (await client.recv())["result"]["subscribed"] == ["job.*"]
        assert await settled() == pytest.approx(IDLE_S)  # the watch has not looked yet
        mock_clock.jump(IDLE_S)
        assert await settled() == math.inf  # it looked, found a subscriber, and sleeps
        # Events still come, and calls are answered.
        app.state.events.publish("job.progress", {"i": 1})
        assert (await client.recv())["method"] == "event"
        await client.send({"jsonrpc": "2.0", "method": "daemon.ping", "id": 2})
        assert (await client.recv())["id"] == 2
        assert await settled() == math.inf
        # A half sent frame is idleness, subscriber or not: cut off after the period.
        await client.stream.send_all(b'{"jsonrpc": "2.0", "meth')
        assert await settled() == pytest.approx(IDLE_S)
        assert not served.is_set()
        mock_clock.jump(IDLE_S)
        with trio.fail_after(1):
            await served.wait()


async def test_a_connection_waits_for_its_long_call_with_no_timer_then_idles_again(
        short_dir: Path, mock_clock: trio.testing.MockClock) -> None:
    app = InProcess(short_dir, idle_timeout_s=IDLE_S)
    async with app.serving() as (client, served):
        await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": 1},
                           "id": 1})
        await app.wait_started(1)
        mock_clock.jump(IDLE_S)
        assert await settled() == math.inf  # the call runs: nothing to watch
        app.release.set()
        assert (await client.recv())["result"] == 1
        # The call's end arms the watch again: a full period from then on.
        assert await settled() == pytest.approx(IDLE_S)
        mock_clock.jump(IDLE_S)
        with trio.fail_after(1):
            await served.wait()
        assert app.counters.timeouts_total == 1


async def test_a_subscription_that_ends_lets_the_connection_idle_out(
        short_dir: Path, mock_clock: trio.testing.MockClock) -> None:
    app = InProcess(short_dir, idle_timeout_s=IDLE_S)
    async with app.serving() as (client, served):
        await client.send(SUBSCRIBE)
        await client.recv()
        mock_clock.jump(IDLE_S)
        assert await settled() == math.inf
        # The subscriber falls behind (more events at once than its queue holds): its
        # subscription ends, so nothing is awaited any more and the connection can idle.
        for i in range(2 * EVENT_QUEUE_SIZE):
            app.state.events.publish("job.progress", {"i": i})
        topics = [(await client.recv())["params"]["topic"]]
        while topics[-1] != DROPPED_TOPIC:
            topics.append((await client.recv())["params"]["topic"])
        assert EVENT_QUEUE_SIZE < len(topics) < 2 * EVENT_QUEUE_SIZE
        assert await settled() == pytest.approx(IDLE_S)
        mock_clock.jump(IDLE_S)
        with trio.fail_after(1):
            await served.wait()
    assert app.counters.timeouts_total == 1


async def test_a_half_closed_subscriber_costs_no_timer(
        short_dir: Path, mock_clock: trio.testing.MockClock) -> None:
    # Nothing more is read from it, so there is no idleness to watch: the watch woke
    # every period for as long as the subscriber stayed.
    app = InProcess(short_dir, idle_timeout_s=IDLE_S)
    async with half_closed_subscriber(app) as (client, served):
        assert await settled() == math.inf
        app.state.events.publish("job.progress", {"i": 1})
        assert (await client.recv())["params"] == {
            "topic": "job.progress", "i": 1, "stream": app.state.events.stream, "seq": 1}
        assert await settled() == math.inf
        assert not served.is_set()
