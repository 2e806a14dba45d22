"""The JSON-RPC server: a thin trio adapter over the sans-IO core in ``recalld.ipc.protocol``.

:class:`RpcServer` owns the listening socket (bound by :mod:`recalld.daemon.listener`,
or passed by systemd), an accept loop, and one task per connection in a nursery of its
own. Each :class:`Connection` reads frames, runs calls concurrently (bounded per
connection), writes answers and ``event`` notifications through one lock, and enforces
the frame, idle and write limits of RELIABILITY 16-17.

Per-request cost matters (many agents ping and search on one socket). Methods the API
marks immediate (they answer without waiting: ``daemon.ping``, ``daemon.status``...) run
on the connection's reader itself; other calls go to call tasks that the connection
keeps and reuses instead of spawning one per call; the write lock is taken without a
scheduler round trip when nobody holds it. Bytes move with plain non-blocking
``os.read``/``os.write`` on the connection's descriptor, waiting through
``trio.lowlevel.wait_readable``/``wait_writable`` only when the socket is not ready:
``SocketStream``'s per-call context managers and its extra checkpoint after every
successful send cost a ping more than the rest of its handling.

Stopping: when :meth:`RpcServer.run` is cancelled it stops accepting, closes the
listener, tells every connection to stop reading, gives calls already running
``graceful_timeout_s`` to answer, then cancels whatever is left. The connection tasks
live under a shielded scope so the outer cancellation does not cut them short; only the
server decides when they end.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from recalld.daemon import metrics
from recalld.daemon.config import DaemonConfig
from recalld.daemon.events import DROPPED_TOPIC, EventBus, Subscription
from recalld.daemon.listener import BoundSocket, bind_listener
from recalld.ipc import errors
from recalld.ipc.protocol import (
    FrameTooLarge,
    Incoming,
    LineFramer,
    Request,
    ServerProtocol,
    encode,
    error_response,
    event_notification,
    result_response,
)

log = logging.getLogger(__name__)

# Accept failures that mean "out of a resource": keep serving, just slow down.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_BACKOFF_MIN_S = 0.01
ACCEPT_BACKOFF_MAX_S = 1.0
RECEIVE_SIZE = 1 << 16
EVENT_QUEUE_SIZE = 256

# ``await dispatch(request, connection)`` runs one call. A dispatcher may also have an
# ``is_immediate(method) -> bool`` method (recalld.daemon.api.Dispatcher has): calls to
# methods it names never wait, so the server runs them inline on the connection's reader.
Dispatch = Callable[[Request, "Connection"], Awaitable[Any]]


def _never_immediate(method: str) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


def peer_credentials(sock: Any) -> PeerCredentials:
    """SO_PEERCRED of a connected Unix socket (stdlib or trio socket)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)


def peer_allowed(cred: PeerCredentials | None, own_uid: int) -> bool:
    """Only processes of the daemon's own user may talk to it."""
    return cred is not None and cred.uid == own_uid


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    connections_open: int
    connections_total: int
    calls_in_flight: int
    requests_total: int
    errors_total: int
    rejected_overloaded_total: int
    rejected_peer_total: int
    timeouts_total: int
    accept_errors_total: int


class RpcServer:
    """Serves ``dispatch`` on a Unix socket until cancelled.

    ``sock`` is an already listening socket (systemd's fd 3), ``bound`` one bound early by
    the supervisor (the server then removes it when it stops); otherwise :meth:`run`
    binds ``config.socket_path`` itself. ``listener`` replaces the socket entirely
    (tests use it to inject accept failures).
    """

    def __init__(
        self,
        config: DaemonConfig,
        dispatch: Dispatch,
        *,
        sock: socket.socket | None = None,
        bound: BoundSocket | None = None,
        listener: trio.abc.Listener[trio.SocketStream] | None = None,
    ) -> None:
        self.config = config
        self._dispatch = dispatch
        self._is_immediate: Callable[[str], bool] = getattr(
            dispatch, "is_immediate", _never_immediate
        )
        self._sock = sock
        self._bound = bound
        self._listener = listener
        self._own_uid = os.getuid()
        self._connections: set[Connection] = set()
        self._draining = False
        self._all_closed: trio.Event | None = None
        self.listening = trio.Event()
        # counters for daemon.status
        self.connections_total = 0
        self.calls_in_flight = 0
        self.requests_total = 0
        self.errors_total = 0
        self.rejected_overloaded_total = 0
        self.rejected_peer_total = 0
        self.timeouts_total = 0
        self.accept_errors_total = 0

    def statistics(self) -> ServerStatistics:
        return ServerStatistics(
            connections_open=len(self._connections),
            connections_total=self.connections_total,
            calls_in_flight=self.calls_in_flight,
            requests_total=self.requests_total,
            errors_total=self.errors_total,
            rejected_overloaded_total=self.rejected_overloaded_total,
            rejected_peer_total=self.rejected_peer_total,
            timeouts_total=self.timeouts_total,
            accept_errors_total=self.accept_errors_total,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        bound = self._bound
        listener = self._listener
        if listener is None:
            sock = bound.sock if bound is not None else self._sock
            if sock is None:
                bound = bind_listener(self.config.socket_path)
                sock = bound.sock
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        try:
            connections_scope = trio.CancelScope(shield=True)
            async with trio.open_nursery() as outer:
                conn_nursery: trio.Nursery = await outer.start(
                    self._host_connections, connections_scope
                )
                try:
                    self.listening.set()
                    task_status.started()
                    await self._accept_loop(listener, conn_nursery)
                finally:
                    with trio.CancelScope(shield=True):
                        # Stop accepting and remove the socket file first, so new clients
                        # see "not running" at once instead of waiting in the backlog.
                        await trio.aclose_forcefully(listener)
                        if bound is not None:
                            bound.close()
                            bound = None
                        await self._drain(connections_scope)
        finally:
            if bound is not None:
                bound.close()

    async def _host_connections(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[trio.Nursery]
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                task_status.started(nursery)
                await trio.sleep_forever()

    async def _accept_loop(
        self, listener: trio.abc.Listener[trio.SocketStream], nursery: trio.Nursery
    ) -> None:
        backoff = ACCEPT_BACKOFF_MIN_S
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                # Out of descriptors or memory: the pending client stays in the backlog;
                # retry after a pause instead of spinning or dying (RELIABILITY 18).
                self.accept_errors_total += 1
                if backoff == ACCEPT_BACKOFF_MIN_S:
                    log.error("accept failed: %s; retrying with backoff", exc.strerror)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF_MAX_S)
                continue
            backoff = ACCEPT_BACKOFF_MIN_S
            nursery.start_soon(self._handle, stream)

    async def _drain(self, connections_scope: trio.CancelScope) -> None:
        self._draining = True
        self._all_closed = trio.Event()
        if not self._connections:
            self._all_closed.set()
        for conn in list(self._connections):
            conn.stop_reading()
        with trio.move_on_after(self.config.graceful_timeout_s) as grace:
            await self._all_closed.wait()
        if grace.cancelled_caught:
            log.warning("%d connection(s) still busy after %.1f s; closing them",
                        len(self._connections), self.config.graceful_timeout_s)
        connections_scope.cancel()

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One connection, start to end. Never raises: a bug here must not stop the server."""
        self.connections_total += 1
        cid = self.connections_total
        try:
            try:
                cred: PeerCredentials | None = peer_credentials(stream.socket)
            except OSError:
                cred = None
            if not peer_allowed(cred, self._own_uid):
                self.rejected_peer_total += 1
                log.warning("refused connection from uid %s", cred.uid if cred else "unknown")
                return
            if len(self._connections) >= self.config.max_connections or self._draining:
                self.rejected_overloaded_total += 1
                code = errors.SHUTTING_DOWN if self._draining else errors.OVERLOADED
                message = "shutting down" if self._draining else "too many connections"
                with trio.move_on_after(self.config.write_timeout_s):
                    await stream.send_all(encode(error_response(None, code, message)))
                return
            conn = Connection(self, stream, cid, cred)
            self._connections.add(conn)
            try:
                await conn.serve()
            finally:
                self._connections.discard(conn)
                if self._all_closed is not None and not self._connections:
                    self._all_closed.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            log.exception("connection %d failed", cid)
        finally:
            await trio.aclose_forcefully(stream)


class Connection:
    """One client connection: reader loop, concurrent calls, serialized writes, events."""

    def __init__(
        self, server: RpcServer, stream: trio.SocketStream, cid: int, cred: PeerCredentials | None
    ) -> None:
        self.server = server
        self.config = server.config
        self.stream = stream
        # The reader and the writers below use the descriptor directly; the stream only
        # owns it (closes it when the connection ends).
        self._fd = stream.socket.fileno()
        self._id = cid
        self._cred = cred
        self._protocol = ServerProtocol(max_batch=self.config.max_batch)
        self._write_lock = trio.Lock()
        self._max_calls = self.config.max_concurrent_calls_per_connection
        # Lines accepted for running (counted in _in_flight) that no worker took yet.
        self._queued: deque[Incoming] = deque()
        self._in_flight = 0
        # Call workers: started on demand up to _max_calls, then kept for the life of
        # the connection; idle ones park in _idle_lot. Starting a task per call cost
        # about a third of a ping's server time.
        self._workers = 0
        self._idle_workers = 0
        self._idle_lot = trio.lowlevel.ParkingLot()
        self._slot_lot = trio.lowlevel.ParkingLot()  # the reader, waiting for a free slot
        self._calls_done: trio.Event | None = None  # set up only while someone waits
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        self._idle_expired = False
        # Around the whole read loop, but cancelled only while the reader waits for
        # bytes (_waiting): stop_reading and the idle watch interrupt that wait and
        # nothing else, so a call the reader runs inline still answers. One scope per
        # connection, not one per wait: entering a scope costs as much as parsing.
        self._read_scope = trio.CancelScope()
        self._waiting = False
        self._framer = LineFramer(self.config.max_request_bytes)
        self._last_frame = 0.0
        self._broken = False
        self.subscription: Subscription | None = None

    @property
    def connection_id(self) -> int:
        return self._id

    @property
    def peer_pid(self) -> int | None:
        return self._cred.pid if self._cred else None

    def stop_reading(self) -> None:
        """Stop taking requests; answers to calls already running are still sent."""
        self._stopping = True
        self._wake_reader()
        self._slot_lot.unpark_all()

    def _wake_reader(self) -> None:
        # Only a reader blocked in (or just woken from) its wait sees this cancel: it
        # checks the flags right after the wait, before touching any bytes.
        if self._waiting:
            self._read_scope.cancel()

    def _stop_requested(self) -> bool:
        # A call, not the attribute: it changes while the reader awaits.
        return self._stopping

    def abort(self) -> None:
        """Close at once: stop reading, cancel running calls and the event pump."""
        self.stop_reading()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._last_frame = trio.current_time()
            nursery.start_soon(self._watch_idle)
            graceful = False
            with self._read_scope:
                graceful = await self._read_loop(nursery)
            if self._read_scope.cancelled_caught:
                graceful = not self._idle_expired
            if graceful and self._in_flight:
                # EOF or server draining: let running calls answer, then close.
                self._calls_done = trio.Event()
                await self._calls_done.wait()
            nursery.cancel_scope.cancel()

    def _runs_inline(self, calls: list[Request]) -> bool:
        immediate = self.server._is_immediate
        for call in calls:
            if not immediate(call.method):
                return False
        return True

    async def _read_loop(self, nursery: trio.Nursery) -> bool:
        """Read frames until EOF or stop_reading (True) or a reason to close at once (False)."""
        framer = self._framer
        fd = self._fd
        # Try to read before waiting? Only when the last read filled the buffer: after
        # a short read the client is most likely waiting for our answer, and a read
        # that fails costs a system call per request.
        ready = True
        while not self._stop_requested():
            if not ready:
                self._waiting = True
                try:
                    await trio.lowlevel.wait_readable(fd)
                except trio.ClosedResourceError:
                    return False
                finally:
                    self._waiting = False
                if self._idle_expired:
                    return False
                if self._stop_requested():
                    return True
            try:
                data = os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                ready = False
                continue
            except OSError:  # reset by the peer, or worse: nothing more to read
                return False
            if ready:
                # Read without waiting: still let other tasks run (and see
                # cancellation) between chunks, as a stream's receive would.
                await trio.lowlevel.checkpoint()
            ready = len(data) == RECEIVE_SIZE
            if not data:
                return True
            try:
                lines = framer.feed(data)
            except FrameTooLarge:
                self.server.errors_total += 1
                await self.send(encode(error_response(
                    None, errors.REQUEST_TOO_LARGE,
                    f"request larger than {self.config.max_request_bytes} bytes",
                )))
                return False
            if lines:
                self._last_frame = trio.current_time()
            for line in lines:
                incoming = self._protocol.receive_line(line)
                if not incoming.calls:
                    # Parse errors and invalid requests are answered in order; an
                    # oversize batch is answered once and closes the connection.
                    self.server.errors_total += 1
                    reply = self._protocol.reply(incoming, [])
                    if reply is not None and not await self.send(reply):
                        return False
                    fatal = incoming.fatal
                    if fatal is not None and fatal["error"]["code"] == errors.REQUEST_TOO_LARGE:
                        return False
                    continue
                if self._stop_requested():
                    return True
                if self._runs_inline(incoming.calls):
                    # Never waits (except to write the answer): no task, no slot.
                    self._in_flight += 1
                    await self._run_line(incoming)
                    continue
                while self._in_flight >= self._max_calls and not self._stop_requested():
                    await self._slot_lot.park()
                if self._stop_requested():
                    return True
                self._in_flight += 1
                self._queued.append(incoming)
                if self._idle_workers:
                    self._idle_workers -= 1
                    self._idle_lot.unpark()
                elif self._workers < self._max_calls:
                    self._workers += 1
                    nursery.start_soon(self._call_worker)
                # else every worker is busy or already woken, and looks at the queue
                # before it parks again.
        return True

    async def _watch_idle(self) -> None:
        """End the connection once its reader has waited ``idle_timeout_s`` for a frame.

        Waiting for a long call or for events is not idleness, but a half-sent frame
        is. Sleeps until the deadline (moved by every frame), so it wakes at most once
        per idle period instead of costing a timeout scope per read.
        """
        idle_s = self.config.idle_timeout_s
        while True:
            await trio.sleep_until(self._last_frame + idle_s)
            now = trio.current_time()
            if now < self._last_frame + idle_s:
                continue  # frames came meanwhile
            busy = self._in_flight > 0 or self.subscription is not None
            if not self._waiting or (busy and self._framer.pending_bytes == 0):
                self._last_frame = now
                continue
            self.server.timeouts_total += 1
            log.info("connection %d: idle for %.1f s, closing", self._id, idle_s)
            self._idle_expired = True
            self._wake_reader()
            return

    async def _call_worker(self) -> None:
        """Run queued lines one after another; park while there are none.

        There are never more workers than call slots. Every queued line is taken: a
        worker was started or unparked for it, or all workers are running lines or
        already unparked, and each of those looks at the queue before it parks.
        Workers end with the connection's nursery.
        """
        queued = self._queued
        while True:
            while queued:
                await self._run_line(queued.popleft())
            self._idle_workers += 1
            await self._idle_lot.park()

    async def _run_line(self, incoming: Incoming) -> None:
        try:
            # Members of a batch run one after another within one slot: bounded, and a
            # batch cannot starve the connection's other calls of slots.
            answers = [await self._call(call) for call in incoming.calls]
            try:
                reply = self._protocol.reply(incoming, answers)
            except orjson.JSONEncodeError:
                reply = self._protocol.reply(incoming, [_encodable(a) for a in answers])
            if reply is not None:
                await self.send(reply)
        finally:
            self._in_flight -= 1
            if self._slot_lot:  # the reader waits for a free slot
                self._slot_lot.unpark()
            if self._in_flight == 0 and self._calls_done is not None:
                self._calls_done.set()

    async def _call(self, request: Request) -> dict[str, Any] | None:
        server = self.server
        server.requests_total += 1
        server.calls_in_flight += 1
        started = time.perf_counter()
        label = request.method
        try:
            result = await server._dispatch(request, self)
        except Exception as exc:
            err = _as_recalld_error(exc)
            server.errors_total += 1
            if isinstance(err, errors.MethodNotFound):
                label = "unknown"  # made-up names must not grow the metric table
            metrics.count("recalld_rpc_errors_total", labels=_method_labels(label))
            if err is None:
                log.exception("method %s failed", request.method)
                response = error_response(request.id, errors.INTERNAL_ERROR, "internal error")
            else:
                response = error_response(request.id, err.code, err.message, err.data)
        else:
            response = result_response(request.id, result)
        finally:
            server.calls_in_flight -= 1
            metrics.observe("recalld_rpc_seconds", time.perf_counter() - started,
                            _method_labels(label))
        return None if request.is_notification else response

    async def send(self, data: bytes) -> bool:
        """Write one frame; False (and the connection aborted) if the client is gone or stuck.

        A client that does not read for ``write_timeout_s`` is cut off, so it cannot hold
        a call slot, an event queue or the write lock for long (RELIABILITY 17).
        """
        lock = self._write_lock
        try:
            # Uncontended (the usual case): no scheduler round trip for the lock. A
            # write that fits the socket buffer does not checkpoint either; every
            # caller checkpoints while it waits for its next piece of work.
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            if self._broken:
                return False
            try:
                sent = os.write(self._fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:  # EPIPE, ECONNRESET: the client is gone
                self._broken = True
                sent = 0
            if self._broken or sent == len(data):
                stuck = None
            else:
                # The socket buffer is full: wait, but not longer than write_timeout_s.
                with trio.move_on_after(self.config.write_timeout_s) as stuck:
                    await self._write_rest(memoryview(data)[sent:])
            if stuck is not None and stuck.cancelled_caught:
                self.server.timeouts_total += 1
                log.info("connection %d: client did not read for %.1f s, closing",
                         self._id, self.config.write_timeout_s)
                self._broken = True
            if self._broken:
                self.abort()
                return False
            return True
        finally:
            lock.release()

    async def _write_rest(self, view: memoryview) -> None:
        fd = self._fd
        while view and not self._broken:
            try:
                await trio.lowlevel.wait_writable(fd)
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except (OSError, trio.ClosedResourceError):
                self._broken = True

    def subscribe(self, bus: EventBus, patterns: Sequence[str]) -> list[str]:
        """Add ``patterns`` to this connection's subscription, starting its pump if new."""
        sub = self.subscription
        if sub is not None and not sub.closed:
            return sub.add(patterns)
        if self._nursery is None:
            raise errors.InternalError("connection is not serving")
        sub = bus.subscribe(patterns, max_queued=EVENT_QUEUE_SIZE)
        self.subscription = sub
        self._nursery.start_soon(self._pump_events, sub)
        return sorted(sub.patterns)

    async def _pump_events(self, sub: Subscription) -> None:
        try:
            async for event in sub.receive:
                payload = {k: v for k, v in event.payload.items() if k != "topic"}
                if not await self.send(event_notification(event.topic, payload)):
                    return
            if sub.dropped:
                await self.send(event_notification(DROPPED_TOPIC, {
                    "reason": "subscriber too slow: event queue overflowed",
                    "topics": sorted(sub.patterns),
                }))
        finally:
            sub.close()
            if self.subscription is sub:
                self.subscription = None


_METHOD_LABELS: dict[str, dict[str, str]] = {}
_METHOD_LABELS_MAX = 1024


def _method_labels(method: str) -> dict[str, str]:
    """The metric labels of ``method``, built once per name (bounded, never mutated)."""
    labels = _METHOD_LABELS.get(method)
    if labels is None:
        labels = {"method": method}
        if len(_METHOD_LABELS) < _METHOD_LABELS_MAX:
            _METHOD_LABELS[method] = labels
    return labels


def _as_recalld_error(exc: BaseException) -> errors.RecalldError | None:
    """The client-visible error in ``exc``, also inside a group of exactly one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, errors.RecalldError) else None


def _encodable(answer: dict[str, Any] | None) -> dict[str, Any] | None:
    if answer is None:
        return None
    try:
        orjson.dumps(answer)
    except orjson.JSONEncodeError:
        log.error("result of call %r is not JSON-serializable", answer.get("id"))
        return error_response(answer.get("id"), errors.INTERNAL_ERROR, "internal error")
    return answer
