"""The blocking client against the fake daemon: typed calls and errors, no daemon running,
reconnects, events, timeouts, requests too large, answers of the wrong shape; and the
one method table every client flavour is built from."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import DaemonHandle
from fakes.rpc_daemon import FakeDaemon, fake, sockdir
from waits import wait_for

from recalld.ipc import _core, errors
from recalld.ipc._methods import METHODS
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client
from recalld.ipc.types import SearchResult

__all__ = ["fake", "sockdir"]  # fixtures, used by name


# ------------------------------------------------------------------ method table


def test_one_table_drives_every_flavour() -> None:
    assert METHODS["search"] == "memory.search" and METHODS["ping"] == "daemon.ping"
    for name in METHODS:
        for cls in (Client, AsyncClient):
            assert callable(getattr(cls, name, None)), (
                f"{cls.__name__} lacks {name}: add `{name} = sync_method({name})` to "
                "_flavours.SyncMethods and `async_method(...)` to _flavours.AsyncMethods")
        assert getattr(Client, name).__doc__ == getattr(AsyncClient, name).__doc__


# ------------------------------------------------------------------------ sync


def test_sync_typed_calls(fake: FakeDaemon) -> None:
    with Client(fake.path) as client:
        assert client.ping() == {"pong": True}
        status = client.status()
        assert status["workspaces"][0]["agent_id"] == "default"
        assert client.workspace_open("a1", path="/x")["path"] == "/x"
        assert [w["agent_id"] for w in client.workspace_list()] == ["default"]
        assert client.read("a1", "memory/x.md", start_line=1)["text"] == "hello\n"
        results = client.search("a1", "commute", max_results=2)
        assert connected_after(client)
    assert not client.connected
    assert [type(r) for r in results] == [SearchResult, SearchResult]
    assert results[0].path == "memory/n0.md" and results[1].score == 0.5
    assert results[0].vector is None and results[0].keyword == 2.5
    assert results[0].extra == {"links": []}
    assert len(results) == 2 and results[:1] == (results[0],)
    assert [r.path for r in results.expanded] == ["digest/wiki/x.md"]
    assert results.expanded[0].keyword is None and results.mode == "keyword"
    assert results.keyword_hits == 2 and results.vector_hits == 0 and results.took_ms == 0.5
    assert results.rendered.startswith("========== memory/n0.md:1-3 [score=1.0000] ======")
    # The daemon sends the text form once; the client renders each hit from its fields.
    assert [r.rendered for r in results] == results.rendered.split("\n\n")
    assert results.expanded[0].rendered == ""
    assert results.to_dict()["results"][1]["score"] == 0.5
    # None-valued optionals are not sent, so the daemon's defaults apply.
    assert ("memory.read", {"agent_id": "a1", "path": "memory/x.md", "start_line": 1}) \
        in fake.calls
    assert ("memory.search", {"agent_id": "a1", "query": "commute", "max_results": 2}) \
        in fake.calls



def test_sync_an_empty_config_is_sent(fake: FakeDaemon) -> None:
    # config={} asks for the config file's settings alone; left out, the recorded ones.
    with Client(fake.path) as client:
        client.workspace_open("a1", config={})
        client.workspace_open("a2")
    assert ("workspace.open", {"agent_id": "a1", "config": {}}) in fake.calls
    assert ("workspace.open", {"agent_id": "a2"}) in fake.calls


def connected_after(client: Client) -> bool:
    return client.connected


def test_sync_typed_errors(fake: FakeDaemon) -> None:
    with Client(fake.path) as client:
        with pytest.raises(errors.UnknownWorkspace) as info:
            client.workspace_open("ghost")
        assert info.value.code == errors.UNKNOWN_WORKSPACE and info.value.data == {
            "agent_id": "ghost"}
        with pytest.raises(errors.PathOutsideWorkspace) as outside:
            client.read("a", "../../etc/passwd")
        assert isinstance(outside.value, errors.InvalidParams)
        with pytest.raises(errors.MethodNotFound):
            client.jobs_list()
        assert client.ping()["pong"] is True  # errors leave the connection usable


def test_sync_not_running_missing_socket(sockdir: Path) -> None:
    path = sockdir / "nothing.sock"
    with pytest.raises(errors.DaemonNotRunning) as info:
        Client(path).ping()
    assert str(path) in info.value.message and "recalld serve" in info.value.message


def test_sync_not_running_stale_socket(sockdir: Path) -> None:
    path = sockdir / "stale.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # bound, never listening: what a killed daemon leaves
    stale.close()
    with pytest.raises(errors.DaemonNotRunning):
        Client(path).call("daemon.ping")


def test_sync_connection_lost_then_reconnect(fake: FakeDaemon) -> None:
    with Client(fake.path) as client:
        with pytest.raises(errors.ConnectionLost):
            client.call("test.drop")
        assert not client.connected
        assert client.ping() == {"pong": True}


def test_sync_transparent_reconnect_after_restart(fake: FakeDaemon) -> None:
    with Client(fake.path) as client:
        client.subscribe(["job.*"])
        assert client.ping()["pong"]
        fake.restart()
        assert client.ping()["pong"], "the first call after a restart must just work"
        assert fake.methods().count("events.subscribe") == 2, "subscribed again"
        client.call("test.emit", {"count": 1})
        with pytest.raises(errors.ConnectionLost):  # the events sent meanwhile are gone
            next(client.events(timeout_s=2))
        assert [e.data for e in itertools.islice(client.events(timeout_s=2), 1)] == [{"i": 0}]


def test_sync_events_arriving_during_a_call_are_queued(fake: FakeDaemon) -> None:
    with Client(fake.path) as client:
        assert client.subscribe(["job.*"]) == {"subscribed": ["job.*"]}
        assert client.call("test.emit", {"count": 3, "topic": "job.progress"}) == {"sent": 3}
        events = list(client.events(timeout_s=0.3))
    assert [(e.topic, e.data) for e in events] == [("job.progress", {"i": i}) for i in range(3)]


def test_sync_events_wait_for_new_ones(fake: FakeDaemon) -> None:
    with Client(fake.path) as client, Client(fake.path) as other:
        client.subscribe(["job.*"])
        client.call("test.emit", {"count": 1})
        first = next(client.events(timeout_s=2))
        assert first.topic == "job.progress" and first.data == {"i": 0}
        # No events: the iterator ends after its timeout instead of blocking.
        assert list(client.events(timeout_s=0.05)) == []
        assert other.ping()["pong"]


def test_sync_timeout_keeps_connection(fake: FakeDaemon) -> None:
    with Client(fake.path, timeout_s=0.2) as client:
        with pytest.raises(TimeoutError):
            client.call("test.sleep", {"s": 0.5, "value": "late"})
        client.timeout_s = 5
        # The late answer arrives on the same connection and is dropped, not mistaken.
        assert client.call("test.sleep", {"s": 0.6, "value": "mine"}) == "mine"


def test_sync_request_too_large_refused_locally(fake: FakeDaemon) -> None:
    with Client(fake.path) as client:
        with pytest.raises(errors.RequestTooLarge):
            client.call("daemon.ping", {"blob": "x" * (2 << 20)})
        assert client.ping()["pong"]


def test_sync_unexpected_result_shape_is_a_typed_error(fake: FakeDaemon) -> None:
    fake.misshapen.add("workspace.list")  # a bare string where a list of workspaces is due
    with Client(fake.path) as client:
        with pytest.raises(errors.InternalError):
            client.workspace_list()
        assert client.ping()["pong"]


def test_sync_answer_over_the_frame_limit_ends_the_connection(
        fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_core, "CLIENT_MAX_FRAME_BYTES", 1 << 20)
    with Client(fake.path) as client:
        with pytest.raises(errors.ConnectionLost, match="over 1048576 bytes"):
            client.call("test.huge", {"bytes": 2 << 20})
        assert not client.connected
        # The rest of the oversize line is not read as the next answer: a new connection.
        assert client.ping() == {"pong": True}
        assert client.call("test.huge", {"bytes": 1000}) == "x" * 1000


def held_by_a_thread(client: Client) -> threading.Thread:
    """A thread of this process that holds ``client`` (in ``events()``, for 3 s)."""
    client.subscribe(["job.*"])
    holder = threading.Thread(target=lambda: list(client.events(timeout_s=3)), daemon=True)
    holder.start()

    wait_for(client.held_elsewhere, "events() to hold the client")
    return holder


def test_sync_call_waiting_for_another_thread_still_times_out(fake: FakeDaemon) -> None:
    with Client(fake.path, timeout_s=0.5) as client:
        holder = held_by_a_thread(client)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="another thread held the client"):
            client.ping()
        assert time.monotonic() - started < 2.5
        holder.join(5)
        assert client.ping() == {"pong": True}


def test_sync_a_forked_child_lets_its_parents_connection_and_lock_go(fake: FakeDaemon) -> None:
    # A child sharing its parent's connection reads answers meant for either (their ids
    # run the same), and a lock held by a thread of the parent at the fork is held for
    # good in the child: each call of the child timed out or took another's answer.
    with Client(fake.path, timeout_s=5) as client:
        assert client.call("test.peer") == os.getpid()
        holder = held_by_a_thread(client)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: say what its calls answered, and never return
            try:
                said = repr([client.call("test.peer"), client.ping()])
            except BaseException as exc:
                said = repr(exc)
            finally:
                os.write(write, said.encode())
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read().decode()
        os.waitpid(pid, 0)
        assert said == repr([pid, {"pong": True}])
        holder.join(5)
        # The parent's connection is as it was: not closed by the child, not replaced.
        assert client.call("test.peer") == os.getpid()
        assert fake.methods().count("events.subscribe") == 2  # the child's, and ours


async def test_raw_calls_send_positional_params_and_refuse_other_shapes(daemon: Any) -> None:
    # client.call("memory.search", ["default", "q"]) failed in dict() with a bare
    # ValueError; the protocol takes such an array for the methods it lists.
    daemon.call("memory.add_note", {"agent_id": "default", "content": "the heron at dawn"})
    named = daemon.call("memory.search", {"agent_id": "default", "query": "heron"})
    assert named["results"], named
    with Client(daemon.socket_path) as client:
        for params in (["default", "heron"], ("default", "heron")):
            assert client.call("memory.search", params)["results"] == named["results"]
        assert client.call("memory.list", ("default",))["agent_id"] == "default"
        with pytest.raises(errors.InvalidParams, match=r"daemon\.ping takes named params"):
            client.call("daemon.ping", [])  # sent as given: the daemon says why not
        for bad in ("default", {"default"}, 5, b"default"):
            with pytest.raises(TypeError, match=(
                    "memory.list: params must be a mapping of named params or a list "
                    rf"\(or tuple\) of positional ones, not {type(bad).__name__}")):
                client.call("memory.list", bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="the names of params must be strings"):
            client.call("memory.list", {1: "default"})  # type: ignore[dict-item]
    async with AsyncClient(daemon.socket_path) as aclient:
        got = await aclient.call("memory.search", ["default", "heron"])
        assert got["results"] == named["results"]
        with pytest.raises(TypeError, match="not str"):
            await aclient.call("memory.list", "default")  # type: ignore[arg-type]


def test_sync_events_past_max_events_are_counted_not_lost_silently(daemon: Any) -> None:
    # A subscriber busy with calls kept only the newest events and never learnt that older
    # ones were gone. Now it keeps those that came first, as the async client does, and
    # counts the rest in events_dropped.
    with Client(daemon.socket_path, max_events=2) as client:
        client.subscribe(["job.state"])
        job_id = client.jobs_submit("default", "reindex")["job_id"]
        wait_for(lambda: daemon.call("jobs.get", {"agent_id": "default",
                                                  "job_id": job_id})["state"] == "succeeded")
        # Calls read what has arrived; the job's last state is the third event at least.
        wait_for(lambda: client.ping() and client.events_dropped >= 1, "an event dropped")
        kept: list[str] = []
        with pytest.raises(errors.EventsMissed) as missed:  # told, after the events kept
            kept.extend(e.data["state"] for e in client.events(timeout_s=0))
        assert kept == ["queued", "running"]
        assert missed.value.missed == client.events_dropped >= 1
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=r"^max_events must be a whole number"):
            Client(daemon.socket_path, max_events=bad)  # type: ignore[arg-type]


def test_one_string_or_a_non_mapping_for_a_list_or_mapping_argument_is_refused(
        daemon: DaemonHandle) -> None:
    """``inbox_ack(agent, "12")`` marked items 1 and 2 seen, not item 12, and
    ``search(..., agents="ab")`` searched workspaces a and b: one string went as its
    characters. A list, tuple or other mapping argument of the wrong kind failed in
    ``dict()`` naming nothing the caller set."""
    with Client(daemon.socket_path) as c:
        c.workspace_open("default")
        calls: list[tuple[str, Any]] = [
            ("ids", lambda: c.inbox_ack("default", "12")),
            ("agents", lambda: c.search("default", "x", agents="ab")),
            ("topics", lambda: c.subscribe("job.*")),
            ("agents", lambda: c.backup_create(agents="default")),
            ("messages", lambda: c.add_turns("default", "s", "hello")),
            ("messages[0]", lambda: c.add_turns("default", "s", [("role", "user")])),
            ("config", lambda: c.workspace_open("default", config=[("a", 1)])),
            ("filters", lambda: c.search("default", "x", filters=["path"])),
            ("params", lambda: c.jobs_submit("default", "reindex", params="full")),
        ]
        for name, call in calls:
            with pytest.raises(TypeError, match=rf"^{re.escape(name)} must be a "):
                call()
        # The same as lists and mappings are sent as they are.
        assert c.inbox_ack("default", ("12",))["unknown"] == ["12"]
        assert c.subscribe(["job.*"]) is not None
        assert list(c.search("default", "x", agents=["default"])) == []

    async def main() -> None:
        async with AsyncClient(daemon.socket_path) as ac:
            with pytest.raises(TypeError, match=r"^ids must be a list, not one string"):
                await ac.inbox_ack("default", "12")

    trio.run(main)


def test_a_method_name_json_cannot_carry_is_refused_with_an_error_that_prints(
        daemon: DaemonHandle) -> None:
    """A method name holding a lone surrogate (bytes that were not UTF-8, as Python
    decodes them) was refused as "the params cannot be sent", quoting the name raw: the
    error itself could not be printed or logged. Now it is InvalidRequest, as the daemon
    answers such a name, quoting the name escaped."""
    bad = "memory.se\udc81rch"
    with Client(daemon.socket_path) as client:
        with pytest.raises(errors.InvalidRequest) as refused:
            client.call(bad, {"agent_id": "default", "query": "x"})
        said = str(refused.value)
        said.encode("utf-8")  # printable
        assert said.startswith("memory.se\\udc81rch: the method cannot be sent")
        with pytest.raises(errors.InvalidParams) as params:  # the params: as before
            client.call("memory.search", {"agent_id": "default", "query": "\ud800"})
        assert "memory.search: the params cannot be sent" in str(params.value)
        assert client.ping()["pong"] is True

    async def main() -> None:
        async with AsyncClient(daemon.socket_path) as ac:
            with pytest.raises(errors.InvalidRequest, match=r"udc81rch: the method"):
                await ac.call(bad)
            assert (await ac.ping())["pong"] is True

    trio.run(main)
