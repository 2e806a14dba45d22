"""The RPC server and one connection in process, with test-only methods: handler errors,
call slots and immediate calls, graceful shutdown, slow subscribers, EMFILE on accept.

A connection moves bytes on its socket's descriptor (ADR 0018), so the nearest thing to an
in-memory stream it can run on is a socket pair: no path, no listener, no accept, no peer
check. The tests of the server itself (draining, the grace period, accept failures) run
it on a real listening socket.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from recalld.daemon.config import DaemonConfig
from recalld.daemon.rpc.calls import CallCounters
from recalld.daemon.rpc.connection import Connection
from recalld.daemon.rpc.connection_events import EVENT_QUEUE_SIZE, MAX_TOPIC_PATTERNS
from recalld.daemon.rpc.dispatch import DaemonState, Dispatcher, Methods
from recalld.daemon.rpc.listener import bind_listener
from recalld.daemon.rpc.methods import build_methods
from recalld.daemon.rpc.server import RpcServer
from recalld.daemon.services import build_daemon_services
from recalld.ipc import errors
from recalld.ipc.protocol import Request


class LineClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, message: Any) -> None:
        await self.stream.send_all(orjson.dumps(message) + b"\n")

    async def recv(self) -> Any:
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some(1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return orjson.loads(line)

    async def aclose(self) -> None:
        await self.stream.aclose()


class InProcess:
    """The real API plus test methods, for an :class:`RpcServer` on a real socket
    (:meth:`connect`) or one :class:`Connection` on a socket pair (:meth:`connection`)."""

    def __init__(self, short: Path, **limits: Any) -> None:
        self.config = DaemonConfig(socket_path=short / "s.sock", data_dir=short / "data",
                                   config_path=short / "none.toml", **limits)
        self.release = trio.Event()
        self.started: list[int] = []
        self.finished: list[int] = []
        self._block_started = trio.Event()
        test_methods = Methods()

        @test_methods.add("test.block")
        async def block(ctx: Any, params: dict[str, Any]) -> Any:
            self.started.append(params["n"])
            self._block_started.set()
            await self.release.wait()
            self.finished.append(params["n"])
            return params["n"]

        @test_methods.add("test.maybe",
                          immediate_when=lambda state, params: params.get("now") is True)
        async def maybe(ctx: Any, params: dict[str, Any]) -> Any:
            return params["n"]

        @test_methods.add("test.echo")
        async def echo(ctx: Any, params: dict[str, Any]) -> Any:
            await trio.lowlevel.checkpoint()  # a call task that really yields
            return params["n"]

        @test_methods.add("test.boom")
        async def boom(ctx: Any, params: dict[str, Any]) -> Any:
            raise RuntimeError("secret detail /home/someone/.ssh")

        @test_methods.add("test.publish")
        async def publish(ctx: Any, params: dict[str, Any]) -> Any:
            for i in range(params["count"]):
                ctx.state.events.publish("job.progress", {"i": i})
            return True

        self.state = DaemonState(services=build_daemon_services(self.config),
                                 methods=build_methods([test_methods]))
        self.dispatch = Dispatcher(self.state)
        self.counters = CallCounters()

    async def wait_started(self, count: int) -> None:
        """Until ``count`` test.block calls have started."""
        while len(self.started) < count:
            self._block_started = trio.Event()
            await self._block_started.wait()

    async def connect(self) -> LineClient:
        return LineClient(await trio.open_unix_socket(str(self.config.socket_path)))

    async def serve(self, nursery: trio.Nursery) -> trio.CancelScope:
        """An :class:`RpcServer` started in ``nursery``; cancelling the scope returned stops
        it as a daemon's stop does (its connections drain) while the nursery runs on."""
        scope = trio.CancelScope()

        async def run_server(*, task_status: trio.TaskStatus[None]) -> None:
            with scope:
                await RpcServer(self.config, self.dispatch).run(task_status=task_status)

        await nursery.start(run_server)
        return scope

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[LineClient]:
        """A :class:`Connection` serving one end of a socket pair; the client the other."""
        async with self.serving() as (client, _served):
            yield client

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[tuple[LineClient, trio.Event]]:
        """As :meth:`connection`, with the event set once the connection's ``serve``
        returned."""
        ours, theirs = trio.socket.socketpair()
        stream = trio.SocketStream(ours)
        conn = Connection(stream, connection_id=1, peer_pid=None, config=self.config,
                          dispatch=self.dispatch, answers_now=self.dispatch.is_immediate,
                          counters=self.counters)
        client = LineClient(trio.SocketStream(theirs))
        served = trio.Event()

        async def serve() -> None:
            await conn.serve()
            served.set()

        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            try:
                yield client, served
            finally:
                await client.aclose()
                nursery.cancel_scope.cancel()


async def test_handler_exceptions_do_not_leak(short_dir: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    app = InProcess(short_dir)
    async with app.connection() as client:
        await client.send({"jsonrpc": "2.0", "method": "test.boom", "id": 7})
        reply = await client.recv()
        assert reply == {"jsonrpc": "2.0", "id": 7,
                         "error": {"code": errors.INTERNAL_ERROR, "message": "internal error"}}
        assert "secret detail" in caplog.text  # logged for the operator, not sent


async def test_a_frame_that_does_not_parse_leaves_the_connection_serving(
        short_dir: Path) -> None:
    # A lone surrogate sends the frame to the fallback parser, where an integer past a
    # double's range raised OverflowError: the connection died unanswered, and the
    # request pipelined after it with it.
    app = InProcess(short_dir)
    huge = b"9" * 400
    async with app.connection() as client:
        await client.stream.send_all(
            b'{"jsonrpc":"2.0","method":"daemon.ping","params":{"q":"\\ud800","n":'
            + huge + b'},"id":1}\n{"jsonrpc":"2.0","method":"daemon.ping","id":2}\n')
        with trio.fail_after(5):
            refused, pong = await client.recv(), await client.recv()
        assert refused["id"] is None and refused["error"]["code"] == errors.PARSE_ERROR
        assert "number is infinity when parsed as double" in refused["error"]["message"]
        assert pong["id"] == 2 and pong["result"]["pong"] is True


async def test_calls_run_concurrently_within_the_limit(short_dir: Path) -> None:
    app = InProcess(short_dir, max_concurrent_calls_per_connection=2)
    async with app.connection() as client:
        for n in (1, 2, 3):
            await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": n},
                               "id": n})
        await client.send({"jsonrpc": "2.0", "method": "daemon.ping", "id": 4})
        with trio.fail_after(5):
            await app.wait_started(2)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(app.started) == [1, 2]  # the third waits for a slot
        app.release.set()
        with trio.fail_after(5):
            replies = [await client.recv() for _ in range(4)]
        assert sorted(r["id"] for r in replies) == [1, 2, 3, 4]
        assert all(r["result"] == r["id"] for r in replies if r["id"] != 4)


async def test_immediate_calls_answer_while_every_slot_is_busy(short_dir: Path) -> None:
    # daemon.ping is marked immediate: it runs on the reader and needs no call slot.
    app = InProcess(short_dir, max_concurrent_calls_per_connection=2)
    assert app.dispatch.is_immediate(Request("daemon.ping", {}, 1))
    assert not app.dispatch.is_immediate(Request("test.block", {}, 1))
    assert not app.dispatch.is_immediate(Request("no.such.method", {}, 1))
    async with app.connection() as client:
        for n in (1, 2):
            await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": n},
                               "id": n})
        with trio.fail_after(10):
            await app.wait_started(2)
        # Both slots are held until release: the batch must not need one.
        await client.send([{"jsonrpc": "2.0", "method": "daemon.ping", "id": 3},
                           {"jsonrpc": "2.0", "method": "daemon.status", "id": 4}])
        with trio.fail_after(10):
            batch = await client.recv()
        assert sorted(r["id"] for r in batch) == [3, 4]
        # A method immediate only when its predicate says so: runs now, or waits for a slot.
        assert app.dispatch.is_immediate(Request("test.maybe", {"now": True}, 5))
        assert not app.dispatch.is_immediate(Request("test.maybe", [True], 5))
        await client.send({"jsonrpc": "2.0", "method": "test.maybe",
                           "params": {"now": True, "n": 5}, "id": 5})
        with trio.fail_after(10):
            assert (await client.recv())["result"] == 5
        await client.send({"jsonrpc": "2.0", "method": "test.maybe",
                           "params": {"now": False, "n": 6}, "id": 6})
        with trio.move_on_after(0.2) as waiting:
            await client.recv()
        assert waiting.cancelled_caught  # no slot free: not answered yet
        assert not app.release.is_set()
        app.release.set()
        with trio.fail_after(5):
            replies = [await client.recv() for _ in range(3)]
        assert sorted((r["id"], r["result"]) for r in replies) == [(1, 1), (2, 2), (6, 6)]


async def test_call_tasks_are_reused_and_stay_concurrent(short_dir: Path) -> None:
    app = InProcess(short_dir, max_concurrent_calls_per_connection=3)
    async with app.connection() as client:
        # A pipelined burst far above the slot limit: every call answered exactly once.
        await client.stream.send_all(b"".join(
            orjson.dumps({"jsonrpc": "2.0", "method": "test.echo", "params": {"n": n},
                          "id": n}) + b"\n"
            for n in range(300)
        ))
        with trio.fail_after(20):
            burst = [await client.recv() for _ in range(300)]
        assert sorted(r["result"] for r in burst) == list(range(300))
        assert all(r["id"] == r["result"] for r in burst)
        # The (now idle) call tasks still run blocking calls side by side, round after round.
        for round_ in range(3):
            app.release = trio.Event()
            app.started.clear()
            ids = [10 * round_ + k for k in range(3)]
            for n in ids:
                await client.send({"jsonrpc": "2.0", "method": "test.block",
                                   "params": {"n": n}, "id": n})
            with trio.fail_after(5):
                await app.wait_started(3)
            app.release.set()
            with trio.fail_after(5):
                replies = [await client.recv() for _ in range(3)]
            assert sorted(r["result"] for r in replies) == ids


async def test_graceful_shutdown_answers_in_flight_calls(short_dir: Path) -> None:
    app = InProcess(short_dir, graceful_timeout_s=5.0)
    async with trio.open_nursery() as nursery:
        server_scope = await app.serve(nursery)
        client = await app.connect()
        await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": 9},
                           "id": 1})
        with trio.fail_after(5):
            await app.wait_started(1)
        # Stop the server while the call runs; the call still answers.
        server_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert not app.config.socket_path.exists()  # no longer accepting
        with pytest.raises(OSError):
            await trio.open_unix_socket(str(app.config.socket_path))
        app.release.set()
        with trio.fail_after(5):
            assert await client.recv() == {"jsonrpc": "2.0", "result": 9, "id": 1}
            with pytest.raises(EOFError):
                await client.recv()
        await client.aclose()


async def test_grace_period_is_bounded(short_dir: Path) -> None:
    app = InProcess(short_dir, graceful_timeout_s=0.2)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(RpcServer(app.config, app.dispatch).run)
            client = await app.connect()
            await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": 1},
                               "id": 1})
            await app.wait_started(1)
            nursery.cancel_scope.cancel()  # the call never ends: cut after 0.2 s
        cut = await client.recv()  # answered that the stop cut it, then the close
        assert cut["id"] == 1 and cut["error"]["code"] == errors.SHUTTING_DOWN, cut
        with pytest.raises(EOFError):
            await client.recv()
        await client.aclose()


async def test_requests_sent_while_draining_are_each_refused_once(short_dir: Path) -> None:
    # The refusals are written by a task that waits for the client's next bytes: woken,
    # it answered the lines it had read before once more, so a client that sent one
    # request at a time got the previous refusal again instead of the new one's.
    app = InProcess(short_dir, graceful_timeout_s=60.0)
    async with trio.open_nursery() as nursery:
        server_scope = await app.serve(nursery)
        client = await app.connect()
        await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": 1},
                           "id": 1})
        with trio.fail_after(5):
            await app.wait_started(1)
        server_scope.cancel()  # draining: the call runs on, the reader stops
        try:
            for n in (2, 3, 4):
                # Sent once the connection waits for the client's next bytes.
                await trio.testing.wait_all_tasks_blocked()
                await client.send({"jsonrpc": "2.0", "method": "daemon.ping", "id": n})
                with trio.fail_after(5):
                    refused = await client.recv()
                assert refused["id"] == n, refused
                assert refused["error"]["code"] == errors.SHUTTING_DOWN, refused
        finally:
            app.release.set()  # the drain ends with the call, whatever happened
        with trio.fail_after(5):
            assert await client.recv() == {"jsonrpc": "2.0", "result": 1, "id": 1}
            with pytest.raises(EOFError):
                await client.recv()
        await client.aclose()


async def test_requests_waiting_for_a_slot_when_the_daemon_stops_are_refused(
        short_dir: Path) -> None:
    # Read, but waiting for a call slot (and those after them in the same read): the stop
    # cancelled that wait and the lines were lost, neither run nor answered.
    app = InProcess(short_dir, graceful_timeout_s=60.0, max_concurrent_calls_per_connection=1)
    async with trio.open_nursery() as nursery:
        server_scope = await app.serve(nursery)
        client = await app.connect()
        await client.stream.send_all(b"".join(orjson.dumps(
            {"jsonrpc": "2.0", "method": method, "params": params, "id": n}) + b"\n"
            for n, method, params in [(1, "test.block", {"n": 1}), (2, "test.block", {"n": 2}),
                                      (3, "daemon.ping", {})]))
        with trio.fail_after(5):
            await app.wait_started(1)
        await trio.testing.wait_all_tasks_blocked()  # the second waits for the slot
        server_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        app.release.set()
        with trio.fail_after(5):
            replies = [await client.recv() for _ in range(3)]
            with pytest.raises(EOFError):
                await client.recv()
        await client.aclose()
    assert sorted((r["id"], r.get("result", r.get("error", {}).get("code"))) for r in replies) \
        == [(1, 1), (2, errors.SHUTTING_DOWN), (3, errors.SHUTTING_DOWN)]
    assert app.started == [1]


@pytest.mark.parametrize("last", ["answer", "error", "event"])
async def test_a_call_whose_client_is_gone_runs_to_its_end(short_dir: Path, last: str) -> None:
    # As the client says (ipc/progress.following): a call it stopped waiting for ends in
    # the daemon, as it does after a plain EOF. Something else written to the gone client
    # (the answer of a later request, the error of a bad line, an event) must not cut it.
    app = InProcess(short_dir)
    async with app.serving() as (client, served):
        if last == "event":
            await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                               "params": {"topics": ["job.*"]}, "id": 1})
            assert (await client.recv())["id"] == 1
        await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": 7},
                           "id": 2})
        with trio.fail_after(5):
            await app.wait_started(1)
        # Sent and closed with no checkpoint between: the daemon reads it once it is gone.
        os.write(client.stream.socket.fileno(), {
            "answer": b'{"jsonrpc":"2.0","method":"daemon.ping","id":3}\n',
            "error": b"not json\n", "event": b""}[last])
        client.stream.socket.close()
        await trio.testing.wait_all_tasks_blocked()
        if last == "event":
            app.state.events.publish("job.progress", {"i": 1})
            await trio.testing.wait_all_tasks_blocked()
        assert not served.is_set()  # the call still runs
        app.release.set()
        with trio.fail_after(5):
            await served.wait()
    assert app.finished == [7]


async def test_slow_subscriber_gets_dropped_event(short_dir: Path) -> None:
    app = InProcess(short_dir)
    async with app.connection() as client:
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.*"]}, "id": 1})
        assert (await client.recv())["result"]["subscribed"] == ["job.*"]
        # One handler publishes more than the queue holds without yielding in between.
        await client.send({"jsonrpc": "2.0", "method": "test.publish",
                           "params": {"count": EVENT_QUEUE_SIZE + 50}, "id": 2})
        seen: list[int] = []
        with trio.fail_after(10):
            while True:
                msg = await client.recv()
                if msg.get("id") == 2:
                    continue
                if msg["params"]["topic"] == "events.dropped":
                    break
                seen.append(msg["params"]["i"])
        # A prefix in order (one event may go straight to the waiting pump), then the drop.
        assert seen == list(range(len(seen)))
        assert EVENT_QUEUE_SIZE <= len(seen) < EVENT_QUEUE_SIZE + 50
        assert app.state.events.statistics().subscriptions == 0
        # The client can subscribe again and keeps working.
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.*"]}, "id": 3})
        assert (await client.recv())["id"] == 3


async def test_topic_patterns_per_connection_are_bounded(short_dir: Path) -> None:
    app = InProcess(short_dir)
    half = MAX_TOPIC_PATTERNS // 2
    async with app.connection() as client:
        for n, topics in enumerate(([f"a{i}.*" for i in range(half)],
                                    [f"b{i}.*" for i in range(half)],
                                    ["a0.*", "b0.*"],  # already there: no more patterns
                                    ["c.*"]), 1):
            await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                               "params": {"topics": topics}, "id": n})
            answer = await client.recv()
        assert answer["error"]["code"] == errors.INVALID_PARAMS, answer
        assert "at most 256 topic patterns" in answer["error"]["message"]
        # Refused as a whole: the subscription keeps what it had.
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["a1.*"]}, "id": 6})
        assert len((await client.recv())["result"]["subscribed"]) == MAX_TOPIC_PATTERNS

class FlakyListener(trio.abc.Listener[trio.SocketStream]):
    """A real listener whose first accepts fail with EMFILE."""

    def __init__(self, inner: trio.SocketListener, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def accept(self) -> trio.SocketStream:
        if self.failures:
            self.failures -= 1
            await trio.sleep(0)
            raise OSError(errno.EMFILE, "Too many open files")
        return await self.inner.accept()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_emfile_in_process_backs_off_and_recovers(short_dir: Path) -> None:
    app = InProcess(short_dir)
    bound = bind_listener(app.config.socket_path)
    listener = FlakyListener(trio.SocketListener(trio.socket.from_stdlib_socket(bound.sock)), 4)
    server = RpcServer(app.config, app.dispatch, listener=listener)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            with trio.fail_after(5):
                client = await app.connect()
                await client.send({"jsonrpc": "2.0", "method": "daemon.ping", "id": 1})
                assert (await client.recv())["result"]["pong"] is True
            assert server.statistics().accept_errors_total == 4
            await client.aclose()
            nursery.cancel_scope.cancel()
    finally:
        bound.close()
