"""The three client flavours against a small trio JSON-RPC server on a real Unix socket.

The server runs in its own thread (its own trio loop) and is built on the same
ServerProtocol as the daemon, so the sync, trio and asyncio clients all talk to it the
same way. It has a few test-only methods: ``test.emit`` sends events before answering,
``test.sleep`` answers late, ``test.drop`` closes the connection without an answer,
``test.emit_later`` answers first and sends its events once the test sets ``emit_now``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from waits import wait_for

from recalld.ipc import errors
from recalld.ipc._methods import METHODS
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client
from recalld.ipc.protocol import (
    FrameTooLarge,
    LineFramer,
    Request,
    ServerProtocol,
    encode,
    error_response,
    event_notification,
    result_response,
)
from recalld.ipc.types import SearchResult, render_result

Send = Callable[[bytes], Awaitable[None]]


class _Dropped(Exception):
    pass


class FakeDaemon:
    """A JSON-RPC server on ``path``, run in a thread; ``restart()`` replaces it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: list[tuple[str, Any]] = []
        #: Events sent by ``test.emit_later`` so far; it sends them once this is set.
        self.events_sent = 0
        self.emit_now = threading.Event()
        # Methods answered with a bare string instead of their documented shape.
        self.misshapen: set[str] = set()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main, ready), daemon=True)
        self._thread.start()
        assert ready.wait(10), "fake daemon did not start"

    def stop(self) -> None:
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        assert self._thread is not None
        self._thread.join(10)
        self.path.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    async def _main(self, ready: threading.Event) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.path.unlink(missing_ok=True)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        sock.listen(64)
        with trio.CancelScope() as scope:
            self._scope = scope
            ready.set()
            await trio.serve_listeners(self._handle, [trio.SocketListener(sock)])

    async def _handle(self, stream: trio.SocketStream) -> None:
        framer, protocol, lock = LineFramer(), ServerProtocol(), trio.Lock()

        async def send(data: bytes) -> None:
            async with lock:
                await stream.send_all(data)

        async with stream, trio.open_nursery() as nursery:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                try:
                    lines = framer.feed(data)
                except FrameTooLarge:
                    await send(encode(error_response(
                        None, errors.REQUEST_TOO_LARGE, "frame too large")))
                    break
                for line in lines:
                    nursery.start_soon(self._serve_line, protocol, line, send, stream)

    async def _serve_line(self, protocol: ServerProtocol, line: bytes, send: Send,
                          stream: trio.SocketStream) -> None:
        incoming = protocol.receive_line(line)
        answers: list[dict[str, Any] | None] = []
        try:
            for call in incoming.calls:
                answers.append(await self._answer(call, send, stream))
            reply = protocol.reply(incoming, answers)
            if reply is not None:
                await send(reply)
        except (_Dropped, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _answer(self, call: Request, send: Send,
                      stream: trio.SocketStream) -> dict[str, Any] | None:
        self.calls.append((call.method, call.params))
        if call.method == "test.emit_later":
            count = call.params.get("count", 1)
            await send(encode(result_response(call.id, {"later": count})))
            # Until the test has its answer back and the client is idle.
            await trio.to_thread.run_sync(self.emit_now.wait, 30.0)
            for i in range(count):
                await send(event_notification("job.progress", {"i": i}))
                self.events_sent += 1
            raise _Dropped  # answered above
        try:
            result = await self._method(call.method, dict(call.params), send, stream)
        except errors.RecalldError as exc:
            return error_response(call.id, exc.code, exc.message, exc.data)
        return None if call.is_notification else result_response(call.id, result)

    async def _method(self, method: str, params: dict[str, Any], send: Send,
                      stream: trio.SocketStream) -> Any:
        if method in self.misshapen:
            return f"not what {method} answers"
        if method == "daemon.ping":
            return {"pong": True}
        if method == "daemon.status":
            return {"version": "0.1.0", "pid": os.getpid(), "uptime_s": 1.5,
                    "workspaces": [{"agent_id": "default", "state": "ready", "path": "/w"}]}
        if method == "events.subscribe":
            return {"subscribed": params["topics"]}
        if method == "test.emit":
            for i in range(params.get("count", 1)):
                await send(event_notification(params.get("topic", "job.progress"), {"i": i}))
            return {"sent": params.get("count", 1)}
        if method == "test.sleep":
            await trio.sleep(params["s"])
            return params.get("value")
        if method == "test.drop":
            await stream.aclose()
            raise _Dropped
        if method == "workspace.open":
            if params["agent_id"] == "ghost":
                raise errors.UnknownWorkspace("unknown workspace: ghost", {"agent_id": "ghost"})
            return {"agent_id": params["agent_id"], "path": params.get("path", "/w"),
                    "state": "ready"}
        if method == "workspace.list":
            return {"workspaces": [{"agent_id": "default", "state": "ready"}]}
        if method == "memory.read":
            if ".." in params["path"]:
                raise errors.PathOutsideWorkspace("path leaves the workspace")
            return {"path": params["path"], "text": "hello\n", "start_line": 1, "end_line": 1}
        if method == "memory.search":
            hits = [
                {"path": f"memory/n{i}.md", "start_line": 1, "end_line": 3,
                 "text": params["query"], "score": 1.0 / (i + 1), "vector": None,
                 "keyword": 2.5, "links": []}
                for i in range(params.get("max_results", 5))
            ]
            linked = {"path": "digest/wiki/x.md", "start_line": 2, "end_line": 2, "text": "x",
                      "score": 0.0, "vector": None, "keyword": None}
            return {"results": hits, "expanded": [linked], "mode": "keyword",
                    "rendered": "\n\n".join(render_result(h, hybrid=False) for h in hits),
                    "vector_hits": 0, "keyword_hits": len(hits), "took_ms": 0.5}
        raise errors.MethodNotFound(f"method not found: {method}")


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake(sockdir: Path) -> Iterator[FakeDaemon]:
    daemon = FakeDaemon(sockdir / "d.sock")
    daemon.start()
    yield daemon
    daemon.stop()


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


# ----------------------------------------------------------------------- async
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
        assert [e.data async for e in client.events(timeout_s=0.2)] == [{"i": 0}, {"i": 1}]
        assert client.events_dropped == 3


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
