"""The trio client: many concurrent calls over one connection, typed methods, events.

Use it as ``async with AsyncClient() as client:``. Entering opens a nursery that holds one
reader task per connection; the reader routes answers by id to the waiting calls and
``event`` notifications into a bounded channel (:meth:`AsyncClient.events`). Leaving
cancels the reader and closes the socket.

A connection found dead before a request is sent is replaced once, transparently (the
daemon restarted); calls in flight when it dies raise :class:`ConnectionLost`, and the next
call reconnects and subscribes to the same topics again. Every call runs under
``trio.fail_after(timeout_s)`` and raises :class:`TimeoutError` when it expires; a
cancelled call leaves the connection usable (its late answer is dropped).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import trio

from recalld.ipc import _core, _methods, errors, paths
from recalld.ipc._methods import Call
from recalld.ipc.answers import Subscribed
from recalld.ipc.protocol import ClientProtocol, LineFramer, Notification, Response
from recalld.ipc.types import Event

T = TypeVar("T")
DEFAULT_MAX_EVENTS = 1024


@dataclass(eq=False)
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    response: Response | None = None
    error: errors.RecalldError | None = None


@dataclass(eq=False)
class _Connection:
    stream: trio.SocketStream
    pending: dict[int, _Waiter] = field(default_factory=dict)
    send_lock: trio.Lock = field(default_factory=trio.Lock)
    closed: bool = False
    fatal: Response | None = None

    def fail_all(self) -> None:
        self.closed = True
        for waiter in self.pending.values():
            waiter.error = _core.lost(self.fatal)
            waiter.done.set()
        self.pending.clear()


class _Lost:
    """Marker put on the event channel when a subscribed connection dies."""


class AsyncClient(_methods.AsyncMethods):
    """trio JSON-RPC client of the recalld daemon; see the module docstring."""

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        autostart: bool = False,
        max_events: int = DEFAULT_MAX_EVENTS,
    ) -> None:
        self.socket_path = paths.socket_path(socket_path)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.autostart = autostart
        #: Events dropped because nobody read the channel fast enough.
        self.events_dropped = 0
        self._protocol = ClientProtocol()
        self._conn: _Connection | None = None
        self._connect_lock = trio.Lock()
        self._topics: list[str] = []
        self._topics_agent: str | None = None
        self._event_send, self._event_recv = trio.open_memory_channel[Event | _Lost](max_events)
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> AsyncClient:
        stack = contextlib.AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        assert self._stack is not None
        stack, self._stack, self._nursery = self._stack, None, None
        return await stack.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close the connection and stop its reader (idempotent)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail_all()
            # Closing the stream ends its reader (receive_some raises ClosedResourceError);
            # the nursery is not cancelled, as its scope also covers the caller's block.
            await conn.stream.aclose()

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def _connection(self) -> _Connection:
        async with self._connect_lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
            if self._nursery is None:
                raise RuntimeError("use the client as: async with AsyncClient() as client")
            try:
                stream = await self._open_stream()
            except errors.DaemonNotRunning:
                if not self.autostart:
                    raise
                stream = await self._start_daemon()
            conn = _Connection(stream)
            await self._nursery.start(self._reader, conn)
            self._conn = conn
            if self._topics:
                await self._call_on(conn, _methods.subscribe(
                    self._topics, self._topics_agent))
            return conn

    async def _open_stream(self) -> trio.SocketStream:
        try:
            with trio.fail_after(self.connect_timeout_s):
                return await trio.open_unix_socket(str(self.socket_path))
        except trio.TooSlowError:
            raise TimeoutError(f"connecting to {self.socket_path} timed out") from None
        except OSError as exc:
            raise _core.connect_error(self.socket_path, exc) from None

    async def _start_daemon(self) -> trio.SocketStream:
        await trio.to_thread.run_sync(_core.spawn_daemon, self.socket_path)
        deadline = trio.current_time() + _core.AUTOSTART_WAIT_S
        while True:
            try:
                return await self._open_stream()
            except errors.DaemonNotRunning:
                failed = _core.autostart_gave_up(self.socket_path, trio.current_time() >= deadline)
                if failed is not None:
                    raise failed from None
                await trio.sleep(_core.AUTOSTART_POLL_S)

    async def _reader(
        self, conn: _Connection, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Route everything the daemon sends until EOF; then fail the calls still waiting."""
        framer = LineFramer(_core.CLIENT_MAX_FRAME_BYTES)
        task_status.started()
        try:
            while True:
                data = await conn.stream.receive_some(_core.READ_CHUNK_BYTES)
                if not data:
                    break
                for line in framer.feed(data):
                    for message in self._protocol.receive_line(line):
                        self._route(conn, message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, errors.ParseError):
            pass
        finally:
            conn.fail_all()
            if self._topics:
                with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                    self._event_send.send_nowait(_Lost())
            with trio.CancelScope(shield=True):
                await conn.stream.aclose()

    def _route(self, conn: _Connection, message: Response | Notification) -> None:
        if isinstance(message, Notification):
            if message.method == "event":
                try:
                    self._event_send.send_nowait(Event.from_params(message.params))
                except trio.WouldBlock:
                    # The reader must never wait for a slow consumer: answers would stall.
                    self.events_dropped += 1
            return
        if message.id is None:
            conn.fatal = message  # sent just before the daemon closes this connection
            return
        waiter = conn.pending.pop(message.id, None) if isinstance(message.id, int) else None
        if waiter is not None:
            waiter.response = message
            waiter.done.set()

    # -------------------------------------------------------------------- calls

    async def call(self, method: str, params: Mapping[str, object] | None = None) -> Any:
        """Call ``method`` with ``params``; return the raw result or raise its typed error."""
        return await self._run(_methods.raw_call(method, params))

    async def _run(self, call: Call[T]) -> T:
        try:
            with trio.fail_after(self.timeout_s):
                for attempt in range(2):
                    conn = await self._connection()
                    try:
                        return await self._call_on(conn, call)
                    except _NotSent:
                        if attempt:
                            raise errors.ConnectionLost(
                                "the daemon closed the connection"
                            ) from None
                raise AssertionError("unreachable")
        except trio.TooSlowError:
            raise TimeoutError(f"{call.method}: no answer within {self.timeout_s} s") from None

    async def _call_on(self, conn: _Connection, call: Call[T]) -> T:
        id_, frame = self._protocol.request(call.method, call.params)
        _core.check_request_size(frame)
        waiter = _Waiter()
        conn.pending[id_] = waiter
        try:
            async with conn.send_lock:
                try:
                    await conn.stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    conn.closed = True
                    raise _NotSent from None
                except BaseException:
                    # Cancelled or timed out mid-frame: the stream may hold half a
                    # request, so it cannot carry another. Close it; the next call
                    # reconnects.
                    conn.closed = True
                    with trio.CancelScope(shield=True):
                        await conn.stream.aclose()
                    raise
            await waiter.done.wait()
        finally:
            conn.pending.pop(id_, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.response is not None
        return _core.finish(call, waiter.response)

    # ------------------------------------------------------------------- events

    async def subscribe(self, topics: Sequence[str],
                        agent_id: str | None = None) -> Subscribed:
        """Subscribe to ``event`` notifications of ``topics`` (kept across reconnects), of
        the workspaces ``agent_id`` may read (the default agent's without one)."""
        result = await self._run(_methods.subscribe(topics, agent_id))
        self._topics = list(topics)
        self._topics_agent = agent_id
        return result

    async def next_event(self, timeout_s: float | None = None) -> Event | None:
        """The next event, or None after ``timeout_s`` without one.

        Raises :class:`ConnectionLost` when the subscribed connection dies; the next call
        reconnects and subscribes again.
        """
        with trio.move_on_after(math.inf if timeout_s is None else timeout_s):
            item = await self._event_recv.receive()
            if isinstance(item, _Lost):
                raise errors.ConnectionLost("the daemon closed the connection")
            return item
        return None

    async def events(self, timeout_s: float | None = None) -> AsyncIterator[Event]:
        """Yield events until ``timeout_s`` passes without one (None: forever)."""
        while True:
            event = await self.next_event(timeout_s)
            if event is None:
                return
            yield event



class _NotSent(Exception):
    """The request never reached a live daemon; it is safe to send again."""

