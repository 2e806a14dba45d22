"""The asyncio client: the trio client's API on stdlib asyncio, for asyncio programs.

``async with AsyncioClient() as client:`` starts one reader task per connection that
routes answers by id to futures and ``event`` notifications into a bounded queue. The same
reconnect rules as the other flavours hold: a connection found dead before sending is
replaced once; calls in flight when it dies raise :class:`ConnectionLost`. Each call runs
under ``asyncio.timeout(timeout_s)`` and raises :class:`TimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from recalld.ipc import _core, _methods, errors, paths
from recalld.ipc._methods import Call
from recalld.ipc.answers import Subscribed
from recalld.ipc.protocol import ClientProtocol, LineFramer, Notification, Response
from recalld.ipc.types import Event

T = TypeVar("T")
DEFAULT_MAX_EVENTS = 1024


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pending: dict[int, asyncio.Future[Response]] = field(default_factory=dict)
    closed: bool = False
    fatal: Response | None = None
    task: asyncio.Task[None] | None = None

    def fail_all(self) -> None:
        self.closed = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(_core.lost(self.fatal))
        self.pending.clear()


class _Lost:
    """Marker put on the event queue when a subscribed connection dies."""


class AsyncioClient(_methods.AsyncMethods):
    """asyncio JSON-RPC client of the recalld daemon; see the module docstring."""

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
        self.events_dropped = 0
        self._protocol = ClientProtocol()
        self._conn: _Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._topics: list[str] = []
        self._topics_agent: str | None = None
        self._events: asyncio.Queue[Event | _Lost] = asyncio.Queue(max_events)

    async def __aenter__(self) -> AsyncioClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection and stop its reader task (idempotent)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.fail_all()
        conn.writer.close()
        with contextlib.suppress(OSError):
            await conn.writer.wait_closed()
        if conn.task is not None:
            conn.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await conn.task

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def _connection(self) -> _Connection:
        async with self._connect_lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
            try:
                reader, writer = await self._open()
            except errors.DaemonNotRunning:
                if not self.autostart:
                    raise
                reader, writer = await self._start_daemon()
            old, conn = self._conn, _Connection(reader, writer)
            if old is not None and old.task is not None and not old.task.done():
                old.task.cancel()
            conn.task = asyncio.create_task(self._read_loop(conn))
            self._conn = conn
            if self._topics:
                await self._call_on(conn, _methods.subscribe(
                    self._topics, self._topics_agent))
            return conn

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await asyncio.open_unix_connection(
                    str(self.socket_path), limit=_core.CLIENT_MAX_FRAME_BYTES
                )
        except TimeoutError:
            raise TimeoutError(f"connecting to {self.socket_path} timed out") from None
        except OSError as exc:
            raise _core.connect_error(self.socket_path, exc) from None

    async def _start_daemon(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        await asyncio.to_thread(_core.spawn_daemon, self.socket_path)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _core.AUTOSTART_WAIT_S
        while True:
            try:
                return await self._open()
            except errors.DaemonNotRunning:
                failed = _core.autostart_gave_up(self.socket_path, loop.time() >= deadline)
                if failed is not None:
                    raise failed from None
                await asyncio.sleep(_core.AUTOSTART_POLL_S)

    async def _read_loop(self, conn: _Connection) -> None:
        framer = LineFramer(_core.CLIENT_MAX_FRAME_BYTES)
        try:
            while True:
                data = await conn.reader.read(_core.READ_CHUNK_BYTES)
                if not data:
                    break
                for line in framer.feed(data):
                    for message in self._protocol.receive_line(line):
                        self._route(conn, message)
        except (OSError, errors.ParseError):
            pass
        finally:
            conn.fail_all()
            if self._topics:
                with contextlib.suppress(asyncio.QueueFull):
                    self._events.put_nowait(_Lost())
            conn.writer.close()

    def _route(self, conn: _Connection, message: Response | Notification) -> None:
        if isinstance(message, Notification):
            if message.method == "event":
                try:
                    self._events.put_nowait(Event.from_params(message.params))
                except asyncio.QueueFull:
                    self.events_dropped += 1
            return
        if message.id is None:
            conn.fatal = message
            return
        future = conn.pending.pop(message.id, None) if isinstance(message.id, int) else None
        if future is not None and not future.done():
            future.set_result(message)

    async def call(self, method: str, params: Mapping[str, object] | None = None) -> Any:
        """Call ``method`` with ``params``; return the raw result or raise its typed error."""
        return await self._run(_methods.raw_call(method, params))

    async def _run(self, call: Call[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
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
        except TimeoutError:
            raise TimeoutError(f"{call.method}: no answer within {self.timeout_s} s") from None

    async def _call_on(self, conn: _Connection, call: Call[T]) -> T:
        id_, frame = self._protocol.request(call.method, call.params)
        _core.check_request_size(frame)
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        if conn.closed or conn.writer.is_closing():
            conn.closed = True
            raise _NotSent
        conn.pending[id_] = future
        try:
            try:
                conn.writer.write(frame)
                await conn.writer.drain()
            except (ConnectionError, OSError):
                conn.closed = True
                raise _NotSent from None
            response = await future
        finally:
            conn.pending.pop(id_, None)
        return _core.finish(call, response)

    async def subscribe(self, topics: Sequence[str],
                        agent_id: str | None = None) -> Subscribed:
        """Subscribe to ``event`` notifications of ``topics`` (kept across reconnects), of
        the workspaces ``agent_id`` may read (the default agent's without one)."""
        result = await self._run(_methods.subscribe(topics, agent_id))
        self._topics = list(topics)
        self._topics_agent = agent_id
        return result

    async def next_event(self, timeout_s: float | None = None) -> Event | None:
        """The next event, or None after ``timeout_s`` without one."""
        try:
            async with asyncio.timeout(timeout_s):
                item = await self._events.get()
        except TimeoutError:
            return None
        if isinstance(item, _Lost):
            raise errors.ConnectionLost("the daemon closed the connection")
        return item

    async def events(self, timeout_s: float | None = None) -> AsyncIterator[Event]:
        """Yield events until ``timeout_s`` passes without one (None: forever)."""
        while True:
            event = await self.next_event(timeout_s)
            if event is None:
                return
            yield event



class _NotSent(Exception):
    """The request never reached a live daemon; it is safe to send again."""

