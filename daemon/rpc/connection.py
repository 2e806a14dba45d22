"""One client connection of the JSON-RPC server: read frames, run calls, write answers.

:class:`Connection` owns, for one accepted client: the sans-IO protocol state and line
framer, a write lock, a small pool of call workers, an idle watch and, once the client
calls ``events.subscribe``, an event subscription with its pump. It starts all of those
tasks in a nursery of its own, opened by :meth:`Connection.serve`; the descriptor and the
task that runs ``serve`` belong to :class:`recalld.daemon.server.RpcServer`, which accepts,
counts, caps and drains connections. The connection reads frames, runs calls concurrently
(bounded per connection), writes answers and ``event`` notifications through one lock,
and enforces the frame, idle and write limits of RELIABILITY 16-17.

Per-request cost matters (many agents ping and search on one socket). Methods the API
marks immediate (they answer without waiting: ``daemon.ping``, ``daemon.status``...) run
on the connection's reader itself; other calls go to call tasks that the connection
keeps and reuses instead of spawning one per call; the write lock is taken without a
scheduler round trip when nobody holds it. Bytes move with plain non-blocking
``os.read``/``os.write`` on the connection's descriptor, waiting through
``trio.lowlevel.wait_readable``/``wait_writable`` only when the socket is not ready:
``SocketStream``'s per-call context managers and its extra checkpoint after every
successful send cost a ping more than the rest of its handling.

Stopping: :meth:`Connection.serve` returns at EOF, after :meth:`Connection.stop_reading`
(the server draining) once running calls have answered, or at once after a fatal frame,
an idle timeout, a client that stops reading, or :meth:`Connection.abort`; returning
cancels the workers and the event pump. Cancelling ``serve`` cancels all of them too.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
import trio

from recalld.daemon import metrics
from recalld.daemon.events import DROPPED_TOPIC, EventBus, Subscription
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

if TYPE_CHECKING:
    from recalld.daemon.rpc.server import PeerCredentials, RpcServer

log = logging.getLogger(__name__)

RECEIVE_SIZE = 1 << 16
EVENT_QUEUE_SIZE = 256


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
            if not immediate(call):
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
