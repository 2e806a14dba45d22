"""A raw subscriber can tell which events it missed: every event notification carries the
daemon run's ``stream`` and its ``seq``, ``events.dropped`` the ``seq`` where its gap
ends, and ``events.subscribe`` with ``after`` (where the subscriber left off) answers
how many of the events since then it missed: after a drop (those published before it
subscribed again), on a new connection after one cut off, and across a restart (a
stream of its own). Real sockets; real daemons where the events are real ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle, RawConnection
from test_client_event_gaps import job_done, restarted
from test_event_resubscribe import FILLER
from test_server_in_process import InProcess
from waits import wait_for

from recalld.daemon.events import DROPPED_TOPIC, RECENT_EVENTS
from recalld.daemon.rpc.connection_events import EVENT_QUEUE_SIZE
from recalld.ipc.errors import InvalidParams


async def test_events_after_the_drop_notice_are_counted_when_subscribing_again(
        short_dir: Path) -> None:
    app = InProcess(short_dir)
    bus = app.state.events
    async with app.serving() as (client, _served):
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.*"]}, "id": 1})
        first = (await client.recv())["result"]
        assert (first["stream"], first["seq"]) == (bus.stream, 0)
        published = 2 * EVENT_QUEUE_SIZE
        for i in range(published):  # at once: the queue overflows
            bus.publish("job.progress", {"i": i, "filler": FILLER, "seq": "not ours"})
        read: list[dict[str, Any]] = [(await client.recv())["params"]]
        while read[-1]["topic"] != DROPPED_TOPIC:
            read.append((await client.recv())["params"])
        notice = read.pop()
        # Each event's place: consecutive, so a raw client sees there was no gap
        # before the notice, and the notice says where the gap ends.
        assert [e["seq"] for e in read] == list(range(1, len(read) + 1))
        assert {e["stream"] for e in read} == {bus.stream} == {notice["stream"]}
        assert notice["seq"] == published == len(read) + notice["missed"]
        # Published after the notice, before the subscriber subscribes again.
        for i in range(5):
            bus.publish("job.state", {"i": i})
            bus.publish("workspace.opened", {"agent_id": "default"})  # not subscribed
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe", "id": 2,
                           "params": {"topics": ["job.*"], "after": {
                               "stream": notice["stream"], "seq": notice["seq"]}}})
        again = (await client.recv())["result"]
        assert again == {"subscribed": ["job.*"], "stream": bus.stream,
                         "seq": published + 10, "missed": 5}
        bus.publish("job.state", {"i": 5})
        event = (await client.recv())["params"]
        assert (event["topic"], event["seq"], event["i"]) == ("job.state", published + 11, 5)


async def test_a_subscriber_is_told_when_its_place_is_no_longer_known(
        short_dir: Path) -> None:
    app = InProcess(short_dir)
    bus = app.state.events
    async with app.serving() as (client, _served):
        for i in range(RECENT_EVENTS + 1):
            bus.publish("job.progress", {"i": i})

        async def subscribe(after: object) -> dict[str, Any]:
            await client.send({"jsonrpc": "2.0", "method": "events.subscribe", "id": 1,
                               "params": {"topics": ["daemon.*"], "after": after}})
            message: dict[str, Any] = await client.recv()
            return message

        # Further back than the daemon keeps: not known (null), not a guess.
        assert (await subscribe({"stream": bus.stream, "seq": 0}))["result"]["missed"] is None
        assert (await subscribe({"stream": bus.stream, "seq": 1}))["result"]["missed"] == 0
        for bad in ({"stream": bus.stream, "seq": RECENT_EVENTS + 2},
                    {"stream": bus.stream, "seq": -1}, {"seq": 1}, "1",
                    {"stream": bus.stream, "seq": 1, "more": 1}):
            error = (await subscribe(bad))["error"]
            assert error["code"] == InvalidParams.code, bad
            assert error["message"].startswith("param 'after'"), error


def reindexed(daemon: DaemonHandle) -> None:
    job_id = daemon.call("jobs.submit", {"agent_id": "default", "kind": "reindex"})["job_id"]
    wait_for(lambda: job_done(daemon, job_id), "the reindex succeeded")


def _job_states(conn: RawConnection, count: int) -> list[dict[str, Any]]:
    """The next ``count`` events ``conn`` receives (all job.state)."""
    got = [conn.recv()["params"] for _ in range(count)]
    assert {e["topic"] for e in got} == {"job.state"}, got
    return got


def test_a_new_connection_is_told_what_the_one_cut_off_missed(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    with daemon.connect() as conn:
        answer = conn.call("events.subscribe", {"topics": ["job.state"]})
        reindexed(daemon)
        seen = _job_states(conn, 3)  # queued, running, succeeded
        assert [e["seq"] for e in seen] == sorted({e["seq"] for e in seen})
        assert {e["stream"] for e in seen} == {answer["stream"]}
        left_off = {"stream": seen[-1]["stream"], "seq": seen[-1]["seq"]}
    reindexed(daemon)  # nobody subscribed: 3 more
    # Another agent's own workspace: an event the default agent may not see, nor count.
    daemon.call("workspace.open", {"agent_id": "zed", "path": str(tmp_path / "zed")})
    with daemon.connect() as other:  # events the connection never had: none missed
        assert other.call("events.subscribe", {"topics": ["workspace.*"],
                                               "after": left_off})["missed"] == 0
    with daemon.connect() as zed:  # its own, counted for it
        assert zed.call("events.subscribe", {"topics": ["workspace.*"], "agent_id": "zed",
                                             "after": left_off})["missed"] == 1
    with daemon.connect() as conn:
        again = conn.call("events.subscribe", {"topics": ["job.state"], "after": left_off})
        assert again["missed"] == 3
        assert again["stream"] == left_off["stream"] and again["seq"] > left_off["seq"]


def test_a_subscriber_is_told_what_it_missed_across_a_restart(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    first = daemon_factory(RECALLD_SOCKET=str(short_dir / "r.sock"))
    with first.connect() as conn:
        conn.call("events.subscribe", {"topics": ["job.state"]})
        reindexed(first)
        last = _job_states(conn, 3)[-1]
    second = restarted(daemon_factory, first)
    reindexed(second)
    with second.connect() as conn:
        again = conn.call("events.subscribe", {
            "topics": ["job.state"], "after": {"stream": last["stream"], "seq": last["seq"]}})
        # A new stream: the old run's place says nothing in it; this run's events so far
        # are what the subscriber is known to have missed.
        assert again["stream"] != last["stream"]
        assert again["missed"] == 3
        with pytest.raises(InvalidParams):  # no such place in this stream
            conn.call("events.subscribe", {"topics": ["job.state"], "after": {
                "stream": again["stream"], "seq": again["seq"] + 1000}})


def test_a_topic_pattern_that_looks_like_a_credential_is_refused(daemon: DaemonHandle) -> None:
    """A key pasted as a topic pattern was subscribed to and sent back in clear (the
    answer's ``subscribed``, each drop notice's ``topics``): no topic is named so, and
    it is refused as every id that looks like a credential is, never echoed."""
    key = "ghp_" + "Lw3Rk8Tn2Vq7Xp4Zm9Bc6Hd1Jf5Gs0Ua2Ye8"
    with daemon.connect() as conn:
        for topics in ([key], ["job.*", f"{key}.*"], [key.lower()]):
            with pytest.raises(InvalidParams) as refused:
                conn.call("events.subscribe", {"topics": topics, "agent_id": "w"})
            assert refused.value.data == {"looks_like_a_credential": "topics"}, refused.value
            assert key[4:20].lower() not in str(refused.value).lower()
        ok = conn.call("events.subscribe", {"topics": ["job.*", "Workspace.opened", "*"],
                                            "agent_id": "w"})
        assert sorted(ok["subscribed"]) == ["*", "Workspace.opened", "job.*"], ok
