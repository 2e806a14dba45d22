"""A subscriber dropped for falling behind, that subscribes again at once, gets the
events its old subscription had queued, then ``events.dropped``, and only then the
events of its new subscription: events are delivered in order per connection, and a
client that reads ``events.dropped`` can take it for the old subscription's end.

The new subscription's pump used to start beside the old one while that one was still
writing what it had queued, and its events went out before ``events.dropped``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_server_in_process import InProcess
from waits import until

from recalld.daemon.events import DROPPED_TOPIC
from recalld.daemon.rpc.connection_events import EVENT_QUEUE_SIZE

#: Enough per event that the old subscription's queue outgrows the socket's buffers:
#: its pump is still writing when the new subscription's event comes.
FILLER = "x" * 8192


async def test_a_new_subscriptions_events_follow_the_dropped_ones_notice(
        short_dir: Path) -> None:
    app = InProcess(short_dir)
    bus = app.state.events
    async with app.serving() as (client, _served):
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.progress"]}, "id": 1})
        assert (await client.recv())["id"] == 1
        for i in range(2 * EVENT_QUEUE_SIZE):  # at once: the queue overflows
            bus.publish("job.progress", {"i": i, "filler": FILLER})
        assert bus.statistics().dropped_subscriptions_total == 1
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.state"]}, "id": 2})
        await until(lambda: bus.statistics().subscriptions == 1, "the new subscription")
        bus.publish("job.state", {"state": "queued"})
        seen: list[str] = []
        while "job.state" not in seen:
            message: dict[str, Any] = await client.recv()
            if message.get("method") == "event":
                seen.append(message["params"]["topic"])
        assert seen[-2:] == [DROPPED_TOPIC, "job.state"], seen[-3:]
        # (one more when the pump already waited for the first: it took it unqueued)
        assert seen.count("job.progress") in (EVENT_QUEUE_SIZE, EVENT_QUEUE_SIZE + 1)


async def test_the_drop_notice_counts_every_event_the_subscriber_missed(
        short_dir: Path) -> None:
    # The events lost when the queue overflowed, and those published while the queue
    # was still being sent, are all counted: what was read plus what was missed is what
    # was published.
    app = InProcess(short_dir)
    bus = app.state.events
    async with app.serving() as (client, _served):
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.*"]}, "id": 1})
        assert (await client.recv())["id"] == 1
        published = EVENT_QUEUE_SIZE + 100
        for i in range(published):  # at once: the queue overflows
            bus.publish("job.progress", {"i": i, "filler": FILLER})
        first: dict[str, Any] = await client.recv()
        # Its queue is far from sent (the socket holds a few of them): still missing.
        for i in range(7):
            bus.publish("job.state", {"i": i})
            bus.publish("workspace.opened", {"agent_id": "default"})  # not subscribed
        published += 7
        read = [first]
        while read[-1]["params"]["topic"] != DROPPED_TOPIC:
            read.append(await client.recv())
        notice = read.pop()["params"]
        assert notice["missed"] == published - len(read) >= 100, (notice, len(read))
        assert [m["params"]["i"] for m in read] == list(range(len(read)))
        assert bus.statistics().subscriptions == 0
