"""The JSON-RPC server: a thin trio adapter over the sans-IO core in ``recalld.ipc.protocol``.

:class:`RpcServer` owns the listening socket (bound by :mod:`recalld.daemon.listener`,
or passed by systemd), an accept loop, and one task per connection in a nursery of its
own. Each :class:`Connection` reads frames, runs calls concurrently (bounded per
connection), writes answers and ``event`` notifications through one lock, and enforces
the frame, idle and write limits of RELIABILITY 16-17.

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

Dispatch = Callable[[Request, "Connection"], Awaitable[Any]]


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
        self._id = cid
        self._cred = cred
        self._protocol = ServerProtocol(max_batch=self.config.max_batch)
        self._write_lock = trio.Lock()
        self._slots = trio.Semaphore(self.config.max_concurrent_calls_per_connection)
        self._in_flight = 0
        self._calls_done = trio.Event()
        self._calls_done.set()
        self._nursery: trio.Nursery | None = None
        self._read_scope = trio.CancelScope()
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
        self._read_scope.cancel()

    def abort(self) -> None:
        """Close at once: stop reading, cancel running calls and the event pump."""
        self._read_scope.cancel()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            graceful = False
            with self._read_scope:
                graceful = await self._read_loop(nursery)
            if graceful or self._read_scope.cancelled_caught:
                # EOF or server draining: let running calls answer, then close.
                await self._calls_done.wait()
            nursery.cancel_scope.cancel()

    async def _read_loop(self, nursery: trio.Nursery) -> bool:
        """Read frames until EOF (returns True) or a reason to close at once (False)."""
        framer = LineFramer(self.config.max_request_bytes)
        last_frame = trio.current_time()
        while True:
            with trio.move_on_at(last_frame + self.config.idle_timeout_s) as idle:
                try:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return False
            if idle.cancelled_caught:
                busy = self._in_flight > 0 or self.subscription is not None
                if framer.pending_bytes == 0 and busy:
                    # Waiting for a long call or for events is not idleness.
                    last_frame = trio.current_time()
                    continue
                self.server.timeouts_total += 1
                log.info("connection %d: idle for %.1f s, closing",
                         self._id, self.config.idle_timeout_s)
                return False
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
                last_frame = trio.current_time()
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
                await self._slots.acquire()
                self._in_flight += 1
                self._calls_done = trio.Event()
                nursery.start_soon(self._run_line, incoming)

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
            self._slots.release()
            if self._in_flight == 0:
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
            metrics.count("recalld_rpc_errors_total", labels={"method": label})
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
                            {"method": label})
        return None if request.is_notification else response

    async def send(self, data: bytes) -> bool:
        """Write one frame; False (and the connection aborted) if the client is gone or stuck.

        A client that does not read for ``write_timeout_s`` is cut off, so it cannot hold
        a call slot, an event queue or the write lock for long (RELIABILITY 17).
        """
        async with self._write_lock:
            if self._broken:
                return False
            with trio.move_on_after(self.config.write_timeout_s) as stuck:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._broken = True
            if stuck.cancelled_caught:
                self.server.timeouts_total += 1
                log.info("connection %d: client did not read for %.1f s, closing",
                         self._id, self.config.write_timeout_s)
                self._broken = True
            if self._broken:
                self.abort()
                return False
            return True

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
