"""One client connection of the JSON-RPC server: read frames, run calls, write answers.

:class:`Connection` owns, for one accepted client stream: the sans-IO protocol state and
line framer, a :class:`~recalld.daemon.rpc.frame_writer.FrameWriter` for its answers,
its running calls and, once the client calls
``events.subscribe``, an event subscription with its pump. Calls and the pump run in a
nursery of the connection's own, opened by :meth:`Connection.serve`; the stream and the
task that runs ``serve`` belong to :class:`recalld.daemon.rpc.server.RpcServer`, which accepts,
counts, caps and drains connections. The connection knows nothing of the server: it is
given the dispatch function, the predicate that says which calls answer at once, the
daemon settings and the counters it shares with the server's other connections.

Limits (RELIABILITY 16-17, ADR 0008 and 0018):

- a frame over ``max_request_bytes`` or a batch over ``max_batch``: one error, then close;
- a reader waiting ``idle_timeout_s`` for a frame closes the connection, unless the client
  is owed something (a call running, an event subscription) and sent no half frame;
- an answer that the client does not take within ``write_timeout_s`` aborts the connection;
- at most ``max_concurrent_calls_per_connection`` calls run at once; a batch is one call,
  whose requests after its answers passed
  :data:`~recalld.daemon.rpc.calls.MAX_BATCH_ANSWER_BYTES` are refused unrun;
- back pressure: a new call starts only while the answers waiting to be written, plus an
  estimate of each running call's answer, stay within :data:`MAX_UNSENT_BYTES`; until
  then nothing more is read, so the client's own writes block in its socket.

Calls that the API marks immediate (``daemon.ping``, ``daemon.status``...: they never
wait) run on the reader itself and take no call slot; every other call gets a task.

Stopping: :meth:`Connection.serve` returns at EOF (after a subscriber's half-close, once
it hangs up or its subscription ends), after a write that finds the client gone, or
after :meth:`Connection.stop_reading` (the server draining) once running calls have
answered (a client gone does not cut a call short: it was told that a call it
stopped waiting for ends in the daemon), or at once after a fatal frame,
an idle timeout, a client that stops reading, or :meth:`Connection.abort`; returning
cancels running calls and the event pump. Cancelling ``serve`` cancels all of them too.
While the server drains, requests read but not started, and those that come meanwhile,
are answered SHUTTING_DOWN without running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

import orjson
import trio

from recalld.daemon.config import DaemonConfig
from recalld.daemon.events import EventBus, Subscription, View
from recalld.daemon.rpc.calls import NOT_RUN, CallCounters, encodable, run_calls
from recalld.daemon.rpc.connection_events import (
    EVENT_QUEUE_SIZE,
    check_subscription,
    pump_events,
    wait_hangup,
)
from recalld.daemon.rpc.frame_writer import FrameWriter
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
)

log = logging.getLogger(__name__)

RECEIVE_SIZE = 1 << 16
# A reader running pipelined calls inline yields to other connections after this long.
FAIR_SLICE_S = 0.001
# Back pressure. A connection starts a call only while the answers waiting to be written
# (not yet taken by the socket) plus an estimate for each running call's answer stay
# within MAX_UNSENT_BYTES (one call may always run); otherwise it reads nothing more. The
# estimate starts at INITIAL_ANSWER_ESTIMATE (at most 4 calls before any answer is seen)
# and follows the sizes of the answers written since, decaying by 1/8 per answer.
MAX_UNSENT_BYTES = 256 * 1024
INITIAL_ANSWER_ESTIMATE = 64 * 1024
MIN_ANSWER_ESTIMATE = 1024
_CUT = ("shutting down: the daemon stopped before this call finished (graceful_timeout_s); "
        "it may have taken effect, in part")


class Connection:
    """One client connection: reader loop, concurrent calls, serialized writes, events."""

    def __init__(
        self,
        stream: trio.SocketStream,
        *,
        connection_id: int,
        peer_pid: int | None,
        config: DaemonConfig,
        dispatch: Callable[[Request, Connection], Awaitable[object]],
        answers_now: Callable[[Request], bool],
        counters: CallCounters,
    ) -> None:
        # Bytes move with plain non-blocking reads and writes on the stream's descriptor
        # (the stream only owns it): see ADR 0018 for why not through the stream.
        self._fd = stream.socket.fileno()
        self._id = connection_id
        self._peer_pid = peer_pid
        self._config = config
        self._dispatch = dispatch
        self._answers_now = answers_now
        self._counters = counters
        self._protocol = ServerProtocol(max_batch=config.max_batch)
        self._framer = LineFramer(config.max_request_bytes)
        self._writer = FrameWriter(self._fd, connection_id=connection_id,
                                   write_timeout_s=config.write_timeout_s, counters=counters)
        self._in_flight = 0  # lines running (inline or in a task)
        self._unsent = 0  # bytes of answers handed to send() and not yet written
        self._answer_estimate = INITIAL_ANSWER_ESTIMATE
        self._progress: trio.Event | None = None  # the reader waits for a slot or a write
        self._calls_done: trio.Event | None = None
        # Around the whole read loop, but cancelled only while the reader waits for bytes:
        # the idle watch and stop_reading interrupt that wait and nothing else, so a call
        # the reader runs inline still answers, and a line waiting for room is kept (to be
        # refused, not lost: stop_reading wakes that wait instead). One scope per connection
        # rather than one per wait, which would cost a ping as much as its parsing.
        self._read_scope = trio.CancelScope()
        self._waiting = False  # for bytes
        self._idle_expired = False
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        self._last_frame = 0.0
        self._idle_park: trio.Event | None = None  # the idle watch waits for a change
        self._idle_scope = trio.CancelScope()  # ...and ends with the reading
        self._unrun: list[bytes] = []  # lines read, not run when reading stopped
        self._linger: trio.Event | None = None  # a half-closed subscriber is served
        self.subscription: Subscription | None = None
        self._pumped: trio.Event | None = None  # set when the latest pump has ended

    @property
    def connection_id(self) -> int:
        return self._id

    @property
    def peer_pid(self) -> int | None:
        return self._peer_pid

    def stop_reading(self) -> None:
        """Stop taking requests; answers to calls already running are still sent."""
        self._stopping = True
        self._interrupt_reader()

    def _interrupt_reader(self) -> None:
        """Make the reader see that it must stop: end its wait for bytes, or wake its wait
        for room (which then keeps the line it holds for the refusals)."""
        if self._waiting:
            self._read_scope.cancel()
        self._wake_reader()
        if self._linger is not None:
            self._linger.set()

    def _stop_requested(self) -> bool:
        # A call, not the attribute: it changes while the reader awaits.
        return self._stopping or self._writer.gone

    def abort(self) -> None:
        """Close at once: stop reading, cancel running calls and the event pump."""
        self.stop_reading()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def serve(self) -> None:
        """Serve the client until EOF, a limit or :meth:`stop_reading` ends it."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._last_frame = trio.current_time()
            nursery.start_soon(self._watch_idle)
            graceful = False
            with self._read_scope:
                graceful = await self._read_loop(nursery)
            self._idle_scope.cancel()  # nothing more is read: no idleness to watch
            if self._read_scope.cancelled_caught:
                graceful = not self._idle_expired
            if graceful and self._stopping:  # the daemon stops: refuse what comes
                if self._in_flight:
                    nursery.start_soon(self._refuse_requests)
                else:
                    await self._refuse_requests()
            if graceful and self._in_flight:
                # EOF or server draining: let running calls answer, then close.
                self._calls_done = trio.Event()
                await self._calls_done.wait()
            if graceful and self.subscription is not None and not self._stop_requested():
                await self._serve_events_only(nursery)
            nursery.cancel_scope.cancel()

    async def _serve_events_only(self, nursery: trio.Nursery) -> None:
        """After the client's half-close (``shutdown(SHUT_WR)``, as ``nc -U`` does at the
        end of its input), keep sending its events until the subscription ends, the
        client is gone (a write fails, or it closes: POLLHUP) or stops reading (the
        write timeout aborts), or the server drains."""
        self._linger = linger = trio.Event()

        async def hangup() -> None:
            await wait_hangup(self._fd)
            linger.set()

        nursery.start_soon(hangup)
        await linger.wait()

    async def _read_loop(self, nursery: trio.Nursery) -> bool:
        """Read frames until EOF or stop_reading (True) or a reason to close at once (False)."""
        fd = self._fd
        framer = self._framer
        ready = False
        while not self._stop_requested():
            data = self._receive_ready() if ready else None
            if data is None:
                self._waiting = True
                try:
                    await trio.lowlevel.wait_readable(fd)
                except trio.ClosedResourceError:
                    return False
                finally:
                    self._waiting = False
                # Checked right after the wait, before touching any bytes: a stop or an
                # idle expiry that woke the reader ends it here.
                if self._idle_expired:
                    return False
                if self._stop_requested():
                    return True
                data = self._receive_ready()
                if data is None:
                    continue
            else:
                # Read without waiting: still let other tasks run (and see cancellation)
                # between chunks, as a stream's receive would.
                await trio.lowlevel.checkpoint()
            # Try to read before waiting next time only when this read filled the buffer:
            # after a short read the client most likely waits for our answer.
            ready = len(data) == RECEIVE_SIZE
            if not data:
                # The client ended its side: a last frame without its newline still counts
                # (a cut one does not parse, and gets its error).
                last = framer.finish()
                return not last or await self._take_line(last, nursery)
            try:
                lines = framer.feed(data)
            except FrameTooLarge:
                self._counters.errors_total += 1
                await self.send(encode(error_response(
                    None, errors.REQUEST_TOO_LARGE,
                    f"request larger than {self._config.max_request_bytes} bytes",
                )))
                return False
            if lines:
                self._last_frame = now = trio.current_time()
            if framer.pending_bytes:
                self._unpark_idle()  # a frame begun: idleness counts from here
            for index, line in enumerate(lines):
                if self._stop_requested():
                    self._unrun += lines[index:]
                    return True
                if not await self._take_line(line, nursery):
                    return False
                if trio.current_time() > now + FAIR_SLICE_S:  # other clients' turn
                    await trio.lowlevel.checkpoint()
                    now = trio.current_time()
        return True

    async def _take_line(self, line: bytes, nursery: trio.Nursery) -> bool:
        """Answer or start one line; False if the connection must close at once."""
        incoming = self._protocol.receive_line(line)
        if not incoming.calls:
            # Parse errors and invalid requests are answered in order; an oversize batch
            # is answered once and closes the connection.
            self._counters.errors_total += 1
            reply = self._protocol.reply(incoming, [])
            if reply is not None and not await self.send(reply):
                return self._writer.gone
            fatal = incoming.fatal
            return fatal is None or fatal["error"]["code"] != errors.REQUEST_TOO_LARGE
        inline = all(self._answers_now(call) for call in incoming.calls)
        if not await self._wait_room(need_slot=not inline):
            self._unrun.append(line)  # stopping: the read loop sees it
            return True
        self._in_flight += 1
        if inline:
            # Never waits (except to write the answer): no task, no slot.
            await self._run_line(incoming, inline=True)
        else:
            nursery.start_soon(self._run_line, incoming, False)
        return True

    async def _refuse_requests(self) -> None:
        """While the daemon stops, answer SHUTTING_DOWN to each request read but not run,
        and to each that comes while calls still run (up to :data:`MAX_UNSENT_BYTES`):
        the client knows it did not run, instead of seeing the connection close."""
        lines, self._unrun = self._unrun, []
        budget = MAX_UNSENT_BYTES
        while True:
            for line in lines:
                self._counters.errors_total += 1
                reply = self._protocol.refuse(line, errors.SHUTTING_DOWN, NOT_RUN)
                if reply is not None and not await self.send(reply):
                    return
            await trio.lowlevel.checkpoint()
            data = self._receive_ready()
            while data is None and self._in_flight:  # the lines above stay answered once
                await trio.lowlevel.wait_readable(self._fd)
                data = self._receive_ready()
            if not data or budget < len(data):
                return
            budget -= len(data)
            try:
                lines = self._framer.feed(data)
            except FrameTooLarge:
                return

    def _receive_ready(self) -> bytes | None:
        """The bytes the socket holds now (b"" at EOF or error), None if it holds none."""
        try:
            return os.read(self._fd, RECEIVE_SIZE)
        except BlockingIOError:
            return None
        except OSError:  # reset by the peer, or worse: nothing more to read
            return b""

    async def _watch_idle(self) -> None:
        """End the connection once its reader has waited ``idle_timeout_s`` for a frame.

        Waiting for a call or for events is not idleness, but a half sent frame is.
        Sleeps until the deadline (moved by every frame), so it wakes at most once per
        idle period instead of costing a timer per read; and while the client only waits
        for its calls or its events, it sleeps with no timer at all until that ends or
        half a frame comes (then a full period starts), so a subscriber that waits for
        hours costs no wake-up. Ends when the reading does.
        """
        idle_s = self._config.idle_timeout_s
        with self._idle_scope:
            while True:
                await trio.sleep_until(self._last_frame + idle_s)
                now = trio.current_time()
                if now < self._last_frame + idle_s:
                    continue  # frames came meanwhile
                if not self._waiting:  # the reader runs a call or waits for room
                    self._last_frame = now
                    continue
                if self._awaited():
                    while self._awaited():
                        self._idle_park = park = trio.Event()
                        await park.wait()
                    self._last_frame = trio.current_time()
                    continue
                self._counters.timeouts_total += 1
                log.info("connection %d: idle for %.1f s, closing", self._id, idle_s)
                self._idle_expired = True
                self._read_scope.cancel()
                return

    def _awaited(self) -> bool:
        """Whether the client waits for the daemon (a call running, or its events) with
        no half sent frame: not idle, whatever the time since its last frame."""
        return ((self._in_flight > 0 or self.subscription is not None)
                and self._framer.pending_bytes == 0)

    def _unpark_idle(self) -> None:
        """Wake the idle watch waiting for :meth:`_awaited` to change (it checks again)."""
        if self._idle_park is not None:
            self._idle_park.set()
            self._idle_park = None

    def _has_room(self, *, need_slot: bool) -> bool:
        """Whether a new call may start now (see :data:`MAX_UNSENT_BYTES`)."""
        if not need_slot or self._in_flight == 0:
            return self._unsent <= MAX_UNSENT_BYTES
        return self._in_flight < self._config.max_concurrent_calls_per_connection and (
            self._unsent + (self._in_flight + 1) * self._answer_estimate <= MAX_UNSENT_BYTES)

    async def _wait_room(self, *, need_slot: bool) -> bool:
        """Wait until a new call may start: a slot is free (if ``need_slot``) and the
        answers waiting to be written leave room for it. False if the connection stops
        reading; stop_reading wakes the wait."""
        while not self._has_room(need_slot=need_slot):
            if self._stop_requested():
                return False
            self._progress = progress = trio.Event()
            await progress.wait()
        return True

    def _wake_reader(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    async def _run_line(self, incoming: Incoming, inline: bool) -> None:
        try:
            # Members of a batch run one after another within one slot: bounded, and a
            # batch cannot starve the connection's other calls of slots.
            try:
                answers = await run_calls(self._dispatch, incoming, self, self._counters,
                                          lambda: self._stopping)
            except trio.Cancelled:
                if self._stopping:  # the server's grace ran out: say so if it can be said
                    self._writer.write_now(self._protocol.reply(incoming, [
                        None if c.is_notification else
                        error_response(c.id, errors.SHUTTING_DOWN, _CUT)
                        for c in incoming.calls]))
                raise
            try:
                reply = self._protocol.reply(incoming, answers)
            except orjson.JSONEncodeError:
                reply = self._protocol.reply(incoming, [encodable(a) for a in answers])
            del answers  # only the encoded reply is held while the client takes it
            if reply is not None:
                if not inline:  # the estimate is for the calls that take slots
                    self._answer_estimate = max(len(reply), self._answer_estimate * 7 // 8,
                                                MIN_ANSWER_ESTIMATE)
                await self.send(reply)
        finally:
            self._in_flight -= 1
            self._wake_reader()
            if self._in_flight == 0:
                self._unpark_idle()
            if self._in_flight == 0 and self._calls_done is not None:
                self._calls_done.set()

    async def send(self, data: bytes, *, abort: bool = True) -> bool:
        """Write one frame; False if the client is stuck (and, with ``abort``, the
        connection is aborted) or gone (then, as at EOF, nothing more is read and the
        calls running end before the connection closes).

        Frames are written whole and one at a time. A client that does not take a frame
        within ``write_timeout_s`` is cut off, so it cannot hold call slots, an event
        queue or the write lock for long (RELIABILITY 17). Cancelled while writing (the
        connection is ending), a half written frame marks the connection broken.
        """
        self._unsent += len(data)
        try:
            written = await self._writer.write(data)
            if written:
                return True
            if self._writer.gone:
                # As at EOF: read nothing more, let the running calls end (a client that
                # stopped waiting was told they do), then close.
                self._interrupt_reader()
            elif abort:
                self.abort()
            return False
        finally:
            self._unsent -= len(data)
            self._wake_reader()

    async def notify(self, topic: str, payload: Mapping[str, object]) -> bool:
        """One ``event`` notification to this connection only (see :class:`Peer`): the
        progress of one of its calls. A client gone or stuck meanwhile does not cut the
        call short: a restore or a backup it stopped waiting for finishes in the daemon,
        as the client says, and only its answer is lost."""
        return await self.send(event_notification(topic, dict(payload)), abort=False)

    def live_patterns(self) -> set[str]:
        sub = self.subscription
        return set(sub.patterns) if sub is not None and not sub.closed else set()

    def subscribe(self, bus: EventBus, patterns: Sequence[str], *, owner: str | None = None,
                  view: View | None = None) -> list[str]:
        """Add ``patterns`` to this connection's subscription, starting its pump if new.
        One connection subscribes for one agent (``owner``)."""
        sub = self.subscription if self.subscription and not self.subscription.closed else None
        check_subscription(sub, patterns, owner)
        if sub is not None:
            return sub.add(patterns)
        if self._nursery is None:
            raise errors.InternalError("connection is not serving")
        sub = bus.subscribe(patterns, max_queued=EVENT_QUEUE_SIZE, owner=owner, view=view)
        self.subscription = sub
        # A dropped subscription's pump may still be sending what it queued and then
        # events.dropped: the new one's events follow those, in order.
        after, self._pumped = self._pumped, trio.Event()
        self._nursery.start_soon(self._pump_events, sub, after, self._pumped)
        return sorted(sub.patterns)

    async def _pump_events(self, sub: Subscription, after: trio.Event | None,
                           pumped: trio.Event) -> None:
        try:
            if after is not None:
                await after.wait()
            await pump_events(sub, self.send)
        finally:
            sub.close()  # (cancelled while waiting: not closed by pump_events)
            pumped.set()
            if self.subscription is sub:
                self.subscription = None
                self._unpark_idle()
                if self._linger is not None:  # nothing more to send: close
                    self._linger.set()

