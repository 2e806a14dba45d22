"""The async client, for trio and asyncio programs alike: many concurrent calls over one
connection, typed methods, events.

Written on anyio, it runs on the event loop of whoever calls it. It starts no task: the
tasks that wait read. One waiting task at a time reads the socket and routes what
arrives, answers by id to the calls that wait for them and ``event`` notifications into
a bounded buffer (:meth:`AsyncClient.next_event`); once it has its own answer, or is
cancelled, another waiting task takes over the reading. So the client needs no task
group of its own: ``async with AsyncClient() as client:`` closes the connection at the
end, and a client kept in an object without a block is closed with :meth:`aclose`.

A connection found dead before a request is sent is replaced once, transparently (the
daemon restarted); calls in flight when it dies raise :class:`ConnectionLost`, and the
next call (or wait for events) reconnects and subscribes to the same topics again.
Every call runs under a
``timeout_s`` deadline and raises :class:`TimeoutError` when it passes. A cancelled call
leaves the connection usable for the calls of other tasks (its late answer is dropped):
one cancelled while its request is being sent (by trio, anyio or asyncio itself:
``asyncio.timeout``, ``Task.cancel``) first sends the rest of it (within ``timeout_s``;
past that the connection, holding half a request, is closed).

The client belongs to no event loop: each loop run that uses it (a ``trio.run``, an
``asyncio.run``, a loop in another thread) gets a connection of its own, made on first
use; the connection of a run that has ended is closed by the next run that comes. A
client copied into a child by ``os.fork`` lets go of its parent's connections (closing
its copies of them only), as the blocking client does; its next call connects anew.

Events are read while some task waits (for an answer, or in :meth:`next_event`); the
ones that arrive in between wait in the socket until then. A subscriber keeps reading
its events: the daemon cuts off a client that leaves its socket full for its
``write_timeout_s``.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import anyio

from recalld.ipc import _call, _core, _flavours, _methods, errors, paths
from recalld.ipc._aconn import Connection, NotSent, Run, Waiter, current_loop, to_the_end
from recalld.ipc._call import Call
from recalld.ipc._core import Lost
from recalld.ipc._place import DROPPED_TOPIC
from recalld.ipc.answers import Subscribed
from recalld.ipc.protocol import ClientProtocol, FrameTooLarge, Notification, Response
from recalld.ipc.types import Event

if TYPE_CHECKING:
    from anyio.abc import SocketStream

T = TypeVar("T")
DEFAULT_MAX_EVENTS = 1024
_RUN_ENDED = ("the subscribed connection was closed: the event loop run that read it has "
              "ended (the next call or next_event subscribes again)")


class AsyncClient(_flavours.AsyncMethods):
    """Async JSON-RPC client of the recalld daemon, for trio and asyncio; see the module
    docstring.

    ``timeout_s`` bounds each call (raising :class:`TimeoutError`), ``connect_timeout_s``
    each connect. With ``autostart=True`` a missing daemon is started with
    ``recalld serve`` in the background and waited for. At most ``max_events`` events
    wait to be read; more are dropped and counted in ``events_dropped``, and
    :meth:`next_event` raises :class:`EventsMissed` (how many) where they would have come.
    """

    #: Every client of this process, for a child forked from it (:meth:`_forget_inherited`).
    _living: ClassVar[weakref.WeakSet[AsyncClient]] = weakref.WeakSet()

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        autostart: bool = False,
        max_events: int = DEFAULT_MAX_EVENTS,
    ) -> None:
        self.socket_path = paths.socket_path(socket_path, lenient=True, named=paths.ARG_SOCKET)
        self._request_limit = _core.request_limit()
        self.timeout_s = _core.checked_timeout(timeout_s, "timeout_s")
        self.connect_timeout_s = _core.checked_timeout(connect_timeout_s, "connect_timeout_s")
        self.autostart = autostart
        #: Events dropped because nobody read them fast enough.
        self.events_dropped = 0
        self._max_events = _core.checked_max_events(max_events)
        self._protocol = ClientProtocol()
        #: The state of each event loop run using the client, and of the one used last.
        self._runs: list[Run] = []
        self._last: Run | None = None
        self._runs_lock = threading.Lock()
        self._topics: list[str] = []
        self._topics_agent: str | None = None
        AsyncClient._living.add(self)

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (idempotent): calls waiting on it raise
        :class:`ConnectionLost`. The client can still be used: it reconnects."""
        run = self._here()
        conn, run.conn = run.conn, None
        if conn is not None:
            await self._close(conn)

    @property
    def connected(self) -> bool:
        """Whether the event loop run that used the client last has a connection."""
        run = self._last
        return run is not None and run.conn is not None and not run.conn.closed

    @property
    def request_limit(self) -> int:
        """The largest request the daemon takes, in bytes of JSON (``max_request_bytes``)."""
        return self._request_limit

    def _here(self) -> Run:
        """The client's state in the calling task's event loop run."""
        loop = current_loop()
        run = self._last
        if run is None or run.loop is not loop:
            run = self._last = self._enter(loop)
        return run

    def _enter(self, loop: object) -> Run:
        with self._runs_lock:  # loops in other threads may use the client too
            for run in self._runs:
                if run.loop is loop:
                    return run
            run = Run(loop)
            for old in [old for old in self._runs if old.ended()]:
                self._runs.remove(old)
                lost = old.conn is not None and not old.conn.closed
                old.drop()  # (no task of an ended loop is left to tell)
                run.events.extend(old.events)  # read, and not yet taken
                run.place = old.place
                if lost and self._topics:
                    run.place.end(_core.mark_lost(run.events, Lost(_RUN_ENDED))
                                  if self._max_events else None)
            self._runs.append(run)
            return run

    @classmethod
    def _forget_inherited(cls) -> None:
        """In a child just forked: every client's connections are the parent's."""
        for client in list(cls._living):
            client._runs_lock = threading.Lock()  # a thread of the parent may hold it
            for run in client._runs:
                run.drop()
            client._runs, client._last = [], None

    async def _connection(self) -> Connection:
        run = self._here()
        conn = run.conn
        if conn is not None and not conn.closed:
            return conn  # the usual case: no lock, no checkpoint
        async with run.connect_lock:
            if run.conn is not None and not run.conn.closed:
                return run.conn
            try:
                stream = await self._open_stream()
            except errors.DaemonNotRunning:
                if not self.autostart:
                    raise
                stream = await self._start_daemon()
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 (not Django)
            conn = run.conn = Connection(stream, raw, run.events, run.place)
            run.opened.set()
            run.opened = anyio.Event()
            if self._topics:
                try:
                    self._resubscribed(run, await self._call_on(conn, _methods.subscribe(
                        self._topics, self._topics_agent,
                        run.place.after(self._topics, self._topics))))
                except errors.ConnectionLost:
                    # Closed before it answered the subscription (a daemon that was dying
                    # took the connection): the caller's call was not sent on it.
                    raise NotSent(conn.fatal) from None
            return conn

    async def _open_stream(self) -> SocketStream:
        try:
            with anyio.fail_after(self.connect_timeout_s):
                return await anyio.connect_unix(self.socket_path)
        except TimeoutError:
            raise TimeoutError(f"connecting to {self.socket_path} timed out") from None
        except OSError as exc:
            raise _core.connect_error(self.socket_path, exc) from None

    async def _start_daemon(self) -> SocketStream:
        spawned = await anyio.to_thread.run_sync(_core.spawn_daemon, self.socket_path)
        deadline = anyio.current_time() + _core.AUTOSTART_WAIT_S
        try:
            while True:
                # Read before the connect (see Client._start_daemon).
                exited = spawned.exited()
                try:
                    return await self._open_stream()
                except errors.DaemonNotRunning:
                    failed = _core.autostart_gave_up(
                        self.socket_path, anyio.current_time() >= deadline, exited)
                    if failed is not None:
                        raise failed from None
                    await anyio.sleep(_core.AUTOSTART_POLL_S)
        finally:
            spawned.close()

    async def _close(self, conn: Connection) -> None:
        """End ``conn``: fail the calls waiting on it, tell subscribers, close the stream."""
        if not conn.closed:
            conn.closed = True
            for waiter in conn.pending.values():
                # One exception object each: a shared one would gather every task's frames.
                waiter.error = _core.lost(conn.fatal)
                waiter.wake.set()
            conn.pending.clear()
            for waiter in conn.idle:
                waiter.wake.set()
            if self._topics:  # (a client keeping none is told none)
                conn.place.end(_core.mark_lost(conn.events, Lost())
                               if self._max_events else None)
        with anyio.CancelScope(shield=True):
            await conn.stream.aclose()

    # ------------------------------------------------------------------ reading

    async def _wait(self, conn: Connection, waiter: Waiter,
                    ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` or ``conn`` has ended: read the connection, or sleep
        while another task reads it and routes to ``waiter``.

        Cancelled, it hands the reading on like any reader that leaves.
        """
        try:
            while not ready() and not conn.closed:
                if conn.reading:
                    waiter.wake = anyio.Event()
                    conn.idle[waiter] = None
                    try:
                        await waiter.wake.wait()
                    finally:
                        del conn.idle[waiter]
                    continue
                conn.reading = True
                try:
                    await self._read_some(conn)
                finally:
                    conn.reading = False
        finally:
            if not conn.reading and conn.idle:
                next(iter(conn.idle)).wake.set()

    async def _read_some(self, conn: Connection) -> None:
        """Read what has arrived and route it; at EOF or garbage, end the connection."""
        try:
            data = await conn.stream.receive(_core.READ_CHUNK_BYTES)
            for line in conn.framer.feed(data):
                for message in self._protocol.receive_line(line):
                    self._route(conn, message)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError,
                errors.ParseError, FrameTooLarge):
            await self._close(conn)

    def _route(self, conn: Connection, message: Response | Notification) -> None:
        if isinstance(message, Notification):
            if message.method == "event":
                event = Event.from_params(message.params)
                conn.place.saw(event)
                if len(conn.events) >= self._max_events:
                    self.events_dropped += 1
                    if self._max_events:
                        _core.mark_missed(conn.events)
                else:
                    conn.events.append(event)
                    for idle in conn.idle:
                        if idle.answer_id is None:
                            idle.wake.set()
                if event.topic == DROPPED_TOPIC and event.seq is not None:
                    conn.place.end(conn.events[-1] if conn.events else None)
            return
        if message.id is None:
            conn.fatal = message  # sent just before the daemon closes this connection
            return
        waiter = conn.pending.pop(message.id, None) if isinstance(message.id, int) else None
        if waiter is not None:
            waiter.response = message
            waiter.wake.set()

    # -------------------------------------------------------------------- calls

    async def call(self, method: str, params: _call.Params | None = None) -> Any:
        """Call ``method`` with ``params`` (named: a mapping; positional, for the methods
        that take them: a list or a tuple); return the raw result or raise its typed
        error. TypeError for other params."""
        return await self._run(_call.raw_call(method, params))

    async def _run(self, call: Call[T]) -> T:
        with anyio.move_on_after(self.timeout_s):
            for attempt in range(2):
                try:
                    # (A reconnect's re-subscription can meet a closed connection too.)
                    return await self._call_on(await self._connection(), call)
                except NotSent as exc:
                    if attempt:  # what the daemon said as it closed (overloaded), if it did
                        raise _core.lost(exc.fatal, "the daemon closed the connection") from None
        raise TimeoutError(f"{call.method}: no answer within {self.timeout_s} s")

    async def _call_on(self, conn: Connection, call: Call[T]) -> T:
        id_, frame = self._protocol.request(call.method, call.params)
        _core.check_request_size(frame, self._request_limit)
        waiter = Waiter(id_)
        conn.pending[id_] = waiter
        try:
            await self._send(conn, frame)
            await self._wait(conn, waiter, waiter.answered)
        finally:
            conn.pending.pop(id_, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.response is not None
        return _core.finish(call, waiter.response)

    async def _send(self, conn: Connection, frame: bytes) -> None:
        """Send one whole request; :class:`NotSent` if ``conn`` is found dead first.

        Most requests fit the socket buffer: while no other request is half sent, one
        non-blocking ``send`` writes it without a wait, so the requests of many tasks
        leave together and their answers come back together. The rest of a request
        that does not fit is sent under the lock, which keeps requests whole and in order.
        Once a request is being sent, it is sent whole even if its call is cancelled
        meanwhile: half a request would garble the next one, and the connection is
        shared by the calls of other tasks.
        """
        if conn.closed:
            raise NotSent(conn.fatal)
        if not conn.send_lock.locked():
            try:
                sent = conn.sock.send(frame)
            except BlockingIOError:
                sent = 0
            except OSError:
                await self._closed_by_daemon(conn)
                raise NotSent(conn.fatal) from None
            if sent == len(frame):
                return
            if sent:
                # Part of it is out: no wait since the check, so the lock is free.
                with anyio.CancelScope(shield=True):  # taking the lock checks for one
                    await conn.send_lock.acquire()
                try:
                    await to_the_end(self._send_whole(conn, frame[sent:]))
                finally:
                    conn.send_lock.release()
                return
        async with conn.send_lock:  # a cancellation while waiting for it sends nothing
            if conn.closed:
                raise NotSent(conn.fatal)
            await to_the_end(self._send_whole(conn, frame))

    async def _send_whole(self, conn: Connection, data: bytes) -> None:
        """Send ``data`` (a request, or its rest) with the send lock held and shielded
        from the caller's cancellation, within ``timeout_s``: a daemon that takes no
        more of it by then leaves half a request in ``conn``, which is closed."""
        with anyio.move_on_after(self.timeout_s):
            try:
                await conn.stream.send(data)
                return
            except anyio.BrokenResourceError:
                await self._closed_by_daemon(conn)
                raise NotSent(conn.fatal) from None
            except anyio.ClosedResourceError:
                await self._close(conn)  # closed here meanwhile (aclose)
                raise NotSent(conn.fatal) from None
        await self._close(conn)
        raise TimeoutError(f"sending a request to {self.socket_path} timed out")

    async def _closed_by_daemon(self, conn: Connection) -> None:
        """End ``conn``, found closed by the daemon (it restarted) while sending, once
        what the daemon sent before closing (events, a last error) has been read."""
        try:
            with anyio.move_on_after(self.connect_timeout_s):
                await self._wait(conn, Waiter(), lambda: False)
        finally:
            await self._close(conn)

    # ------------------------------------------------------------------- events

    async def subscribe(self, topics: Sequence[str],
                        agent_id: str | None = None) -> Subscribed:
        """Add ``topics`` to the ``event`` notifications subscribed (every topic is kept
        across reconnects), of the workspaces ``agent_id`` may read (the default agent's
        without one)."""
        run = self._here()
        # After a drop notice: made again from where it ended (a reconnect does that
        # itself, and then this adds nothing).
        after = (run.place.after(list(topics), self._topics)
                 if run.conn is not None and not run.conn.closed
                 and agent_id == self._topics_agent else None)
        result = self._resubscribed(run, await self._run(
            _methods.subscribe(topics, agent_id, after)))
        # Every pattern of the connection, not only these: a subscription adds to it.
        self._topics = list(result["subscribed"])
        self._topics_agent = agent_id
        return result

    def _resubscribed(self, run: Run, answer: Subscribed) -> Subscribed:
        """``answer`` to an ``events.subscribe`` of ``run``, noted: where its events
        stand, and the count of those missed in the gap before it."""
        run.place.subscribed(answer, run.events if self._max_events else None)
        return answer

    async def next_event(self, timeout_s: float | None = None) -> Event | None:
        """The next event, or None after ``timeout_s`` without one.

        Raises :class:`ConnectionLost` when the subscribed connection dies; the next call,
        or the next ``next_event``, reconnects and subscribes again. Raises
        :class:`EventsMissed` (a ConnectionLost) once where events were left out of a
        full buffer (``max_events``), saying how many; the connection goes on.
        Cancelled, it takes no event. ValueError unless ``timeout_s`` is None or seconds,
        0 or more.
        """
        timeout_s = _core.checked_wait(timeout_s, "timeout_s")
        with anyio.move_on_after(math.inf if timeout_s is None else timeout_s):
            waiter = Waiter()
            run = self._here()
            events = run.events
            while not events:
                conn = run.conn
                if (conn is None or conn.closed) and self._topics:
                    # A subscriber reconnects itself (and subscribes again), as the
                    # blocking client's events() does: no call may ever come.
                    with anyio.fail_after(self.timeout_s), contextlib.suppress(NotSent):
                        await self._connection()  # else its end is in ``events``
                elif conn is None or conn.closed:
                    await run.opened.wait()  # nothing arrives until a call connects
                else:
                    await self._wait(conn, waiter, lambda: bool(events))
            return _core.unmarked(events.popleft())
        return None

    def events(self, timeout_s: float | None = None) -> AsyncIterator[Event]:
        """Yield events until ``timeout_s`` passes without one (None: forever).
        ValueError at once unless ``timeout_s`` is None or seconds, 0 or more."""
        return self._yield_events(_core.checked_wait(timeout_s, "timeout_s"))

    async def _yield_events(self, timeout_s: float | None) -> AsyncIterator[Event]:
        while True:
            event = await self.next_event(timeout_s)
            if event is None:
                return
            yield event


os.register_at_fork(after_in_child=AsyncClient._forget_inherited)
