"""The blocking client: one Unix socket, one call at a time, typed methods.

``Client`` connects lazily on the first call. A connection found dead before a request is
sent (the daemon restarted since the last call) is replaced once, transparently; a
connection that dies while a call waits for its answer raises :class:`ConnectionLost` for
that call (it may or may not have run) and is replaced on the next call. ``event``
notifications that arrive while a call waits are queued and handed out by
:meth:`Client.events`. Topics subscribed with :meth:`Client.subscribe` are subscribed again
after a reconnect.

Calls from several threads are serialized by a lock, and the wait for it counts against
the call's ``timeout_s`` (a thread iterating :meth:`Client.events` without a timeout holds
it until an event comes); use one client per thread for parallel calls. An answer line
over 64 MiB ends the connection (:class:`ConnectionLost`). Nothing here starts a thread.

A client copied into a child by ``os.fork`` lets go of its parent's connection (both
would read the answers meant for either) and of its lock (a thread of the parent may
have held it), leaving the parent's untouched; its next call connects anew.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from recalld.ipc import _call, _core, _flavours, _methods, errors, paths
from recalld.ipc._call import Call
from recalld.ipc._core import Lost, Missed
from recalld.ipc._place import DROPPED_TOPIC, Place
from recalld.ipc.answers import JobInfo, JsonObject, Subscribed
from recalld.ipc.protocol import (
    ClientProtocol,
    FrameTooLarge,
    LineFramer,
    Notification,
    Response,
)
from recalld.ipc.types import Event

T = TypeVar("T")
MAX_QUEUED_EVENTS = 10_000
PROGRESS_TOPIC = "call.progress"


class Client(_flavours.SyncMethods):
    """Blocking JSON-RPC client of the recalld daemon.

    ``timeout_s`` bounds each call (raising :class:`TimeoutError`), ``connect_timeout_s``
    each connect. With ``autostart=True`` a missing daemon is started with
    ``recalld serve`` in the background and waited for. At most ``max_events`` events
    wait to be read (those that came first); more are dropped and counted in
    ``events_dropped``, and :meth:`events` raises :class:`EventsMissed` (how many) where
    they would have come.
    """

    #: Every client of this process, for a child forked from it (:meth:`_forget_inherited`).
    _living: ClassVar[weakref.WeakSet[Client]] = weakref.WeakSet()

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        autostart: bool = False,
        max_events: int = MAX_QUEUED_EVENTS,
    ) -> None:
        self.socket_path = paths.socket_path(socket_path, lenient=True, named=paths.ARG_SOCKET)
        self._request_limit = _core.request_limit()
        # Socket and lock waits end at threading.TIMEOUT_MAX (~292 years); a longer
        # timeout (1e300, "forever") is that one rather than an OverflowError.
        self.timeout_s = min(_core.checked_timeout(timeout_s, "timeout_s"),
                             threading.TIMEOUT_MAX)
        self.connect_timeout_s = min(
            _core.checked_timeout(connect_timeout_s, "connect_timeout_s"), threading.TIMEOUT_MAX)
        self.autostart = autostart
        self._sock: socket.socket | None = None
        self._poller: select.poll | None = None  # POLLIN of _sock
        self._framer = LineFramer(_core.CLIENT_MAX_FRAME_BYTES)
        self._protocol = ClientProtocol()
        self._max_events = _core.checked_max_events(max_events)
        #: Events dropped because nobody read them fast enough.
        self.events_dropped = 0
        self._events: collections.deque[Event | Lost | Missed] = collections.deque()
        self._topics: list[str] = []
        #: Where its events stand in the daemon's stream (see recalld.ipc._place).
        self._place = Place()
        #: token -> handler of the ``call.progress`` events of a call being waited for.
        self._progress: dict[str, Callable[[JsonObject], None]] = {}
        self._topics_agent: str | None = None
        self._lock = threading.RLock()
        #: The null-id error a connection of this call ended with (a refusal), if any.
        self._fatal: Response | None = None
        Client._living.add(self)

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent). The client can still be used: it reconnects."""
        with self._lock:
            self._drop(lost=False)

    @property
    def request_limit(self) -> int:
        """The largest request the daemon takes, in bytes of JSON (``max_request_bytes``)."""
        return self._request_limit

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def held_elsewhere(self) -> bool:
        """Whether another thread holds this client now (a call or ``events()`` under way
        there): a call from this thread waits for it, up to ``timeout_s``."""
        if self._lock.acquire(blocking=False):
            self._lock.release()
            return False
        return True

    @classmethod
    def _forget_inherited(cls) -> None:
        """In a child just forked: every client's connection and lock are the parent's.
        Closing this process's descriptor leaves the parent's connection open (no
        shutdown)."""
        for client in list(cls._living):
            client._lock = threading.RLock()
            client._drop(lost=False)

    def _drop(self, *, lost: bool = True) -> None:
        """Close the connection. Unless the caller closes it (``lost=False``), or it says
        so itself, a subscriber's next :meth:`events` raises ConnectionLost once, after
        the events read before: those sent meanwhile are gone, even though the next call
        subscribes again."""
        if self._sock is not None and lost and self._topics:
            self._place.end(_core.mark_lost(self._events, Lost())
                            if self._max_events else None)
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._poller = None
                self._framer = LineFramer(_core.CLIENT_MAX_FRAME_BYTES)

    def _open_socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.connect_timeout_s)
        try:
            sock.connect(str(self.socket_path))
        except TimeoutError:
            sock.close()
            raise TimeoutError(f"connecting to {self.socket_path} timed out") from None
        except OSError as exc:
            sock.close()
            raise _core.connect_error(self.socket_path, exc) from None
        return sock

    def _connect(self) -> None:
        for attempt in range(2):
            try:
                sock = self._open_socket()
            except errors.DaemonNotRunning:
                if not self.autostart:
                    raise
                sock = self._start_daemon()
            self._sock = sock
            self._poller = select.poll()
            self._poller.register(sock, select.POLLIN)
            if not self._topics:
                return
            try:
                self._resubscribed(self._call_on_connection(
                    _methods.subscribe(self._topics, self._topics_agent,
                                       self._place.after(self._topics, self._topics)),
                    time.monotonic() + self.timeout_s))
                return
            except errors.ConnectionLost:
                # Closed before it answered the subscription (a daemon that was dying
                # took the connection): the caller's call was not sent on it, so one
                # more connection is safe; where the daemon has gone, it says so.
                if attempt:
                    raise

    def _start_daemon(self) -> socket.socket:
        spawned = _core.spawn_daemon(self.socket_path)
        deadline = time.monotonic() + _core.AUTOSTART_WAIT_S
        try:
            while True:
                # Read before the connect: a daemon that exits because another one won the
                # socket does so once that one listens, so this connect reaches it.
                exited = spawned.exited()
                try:
                    return self._open_socket()
                except errors.DaemonNotRunning:
                    failed = _core.autostart_gave_up(
                        self.socket_path, time.monotonic() >= deadline, exited)
                    if failed is not None:
                        raise failed from None
                    time.sleep(_core.AUTOSTART_POLL_S)
        finally:
            spawned.close()

    def _read_leftover(self) -> None:
        """Read what the daemon sent before closing the connection (events, a refusal)."""
        assert self._sock is not None
        self._sock.settimeout(0)
        with contextlib.suppress(OSError, errors.ConnectionLost):
            while data := self._sock.recv(_core.READ_CHUNK_BYTES):
                self._fatal = self._dispatch(data, want=None) or self._fatal

    def _alive(self) -> bool:
        """Whether the open connection still works; reads pending notifications."""
        sock, poller = self._sock, self._poller
        if sock is None or poller is None:
            return False
        # Usually nothing arrived since the last call, and one poll() says so (select()
        # would fail on descriptors above FD_SETSIZE in processes with many files open).
        # Else a non-blocking read of what did: events, or the end of the connection.
        # Every other operation sets its own timeout again.
        if not poller.poll(0):
            return True
        sock.settimeout(0)
        while True:
            try:
                data = sock.recv(_core.READ_CHUNK_BYTES)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            try:  # a null-id error: what the daemon said as it closed (a refusal)
                self._fatal = self._dispatch(data, want=None) or self._fatal
            except errors.ConnectionLost:
                return False  # dropped: the call goes on a new connection

    # -------------------------------------------------------------------- calls

    def call(self, method: str, params: _call.Params | None = None) -> Any:
        """Call ``method`` with ``params`` (named: a mapping; positional, for the methods
        that take them: a list or a tuple); return the raw result or raise its typed
        error. TypeError for other params."""
        return self._run(_call.raw_call(method, params))

    def _run(self, call: Call[T]) -> T:
        deadline = time.monotonic() + self.timeout_s
        # Another thread may hold the connection for long (a call, or events() waiting
        # without a timeout): waiting for it counts against this call's timeout too.
        if not self._lock.acquire(timeout=max(self.timeout_s, 0.0)):
            raise TimeoutError(f"{call.method}: no answer within {self.timeout_s} s "
                               "(another thread held the client all that time)")
        try:
            self._fatal = None
            if self._sock is not None and not self._alive():
                self._drop()
            if self._sock is None:
                self._connect()
            return self._call_on_connection(call, deadline)
        finally:
            self._lock.release()

    def _call_on_connection(self, call: Call[T], deadline: float) -> T:
        id_, frame = self._protocol.request(call.method, call.params)
        _core.check_request_size(frame, self._request_limit)
        for attempt in range(2):
            assert self._sock is not None
            try:
                self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
                self._sock.sendall(frame)
                break
            except (BrokenPipeError, ConnectionResetError):
                # Nothing reached a live daemon: safe to send once more on a new connection.
                # What it said as it closed (a refusal: overloaded) is the error if the
                # second connection is closed too.
                self._read_leftover()
                self._drop()
                if attempt:
                    raise _core.lost(self._fatal, "the daemon closed the connection") from None
                self._connect()
            except TimeoutError:
                self._drop()  # a half-written frame would corrupt the stream
                raise TimeoutError(f"{call.method}: sending timed out") from None
            except BaseException:
                self._drop()  # interrupted mid-frame (KeyboardInterrupt): same reason
                raise
        return _core.finish(call, self._wait_response(call.method, id_, deadline))

    def _wait_response(self, method: str, id_: int, deadline: float) -> Response:
        while True:
            assert self._sock is not None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{method}: no answer within {self.timeout_s} s")
            self._sock.settimeout(None if remaining is None
                                  else min(remaining, threading.TIMEOUT_MAX))
            try:
                data = self._sock.recv(_core.READ_CHUNK_BYTES)
            except TimeoutError:
                # The connection stays: a late answer carries an id nobody waits for and
                # is dropped when it arrives.
                raise TimeoutError(f"{method}: no answer within {self.timeout_s} s") from None
            except OSError:
                data = b""
            if not data:
                self._drop()
                raise errors.ConnectionLost(
                    f"{method}: the daemon closed the connection before answering"
                )
            response = self._dispatch(data, want=id_)
            if response is not None:
                return response

    def _dispatch(self, data: bytes, want: int | None) -> Response | None:
        """Feed received bytes; queue events; return the response with id ``want``."""
        found: Response | None = None
        try:
            lines = self._framer.feed(data)
        except FrameTooLarge:
            # Nothing after the oversize line can be read in step: the connection is done.
            self._drop()
            raise errors.ConnectionLost(
                f"the daemon sent a line over {_core.CLIENT_MAX_FRAME_BYTES} bytes; "
                "the connection was closed") from None
        for line in lines:
            for message in self._protocol.receive_line(line):
                if isinstance(message, Notification):
                    if message.method == "event":
                        self._take_event(Event.from_params(message.params))
                elif message.id == want or (message.id is None and message.error is not None
                                            and want is not None):
                    # A null id with an error answers a request the daemon could not read
                    # (too large, unparsable): with one call in flight, it is ours.
                    found = message
        return found

    def _take_event(self, event: Event) -> None:
        """Queue ``event`` (or count it, with the buffer full), or hand it to the handler
        of the call whose progress it tells."""
        handler = (self._progress.get(str(event.data.get("token")))
                   if event.topic == PROGRESS_TOPIC else None)
        if handler is not None:
            handler(event.data)
            return
        self._place.saw(event)
        if len(self._events) >= self._max_events:
            self.events_dropped += 1
            if self._max_events:
                _core.mark_missed(self._events)
        else:
            self._events.append(event)
        if event.topic == DROPPED_TOPIC and event.seq is not None:
            self._place.end(self._events[-1] if self._events else None)

    def _resubscribed(self, answer: Subscribed) -> Subscribed:
        """``answer`` to an ``events.subscribe``, noted: where events stand now, and the
        count of those missed in the gap before it, if any."""
        self._place.subscribed(answer, self._events if self._max_events else None)
        return answer

    def jobs_of_every_workspace(self) -> list[JobInfo]:
        """The jobs of every workspace listed, open or not (each listed as its own agent;
        a failed one's jobs wait for it), oldest first: what ``recalld status``,
        ``doctor`` and ``jobs list`` show the user who runs the daemon."""
        seen: dict[str, JobInfo] = {}
        for ws in self.workspace_list():
            agent = str(ws["agent_id"])
            with contextlib.suppress(errors.UnknownWorkspace):  # closed meanwhile
                for job in self.jobs_list(agent):
                    # Whole as its owner lists it; as a reader sees it only until then.
                    if job["agent_id"] == agent:
                        seen[str(job["job_id"])] = job
                    else:
                        seen.setdefault(str(job["job_id"]), job)
        return sorted(seen.values(), key=lambda j: j.get("submitted_at", 0.0))

    # ------------------------------------------------------------------- events

    @contextlib.contextmanager
    def progress_of(self, token: str,
                    handler: Callable[[JsonObject], None]) -> Iterator[None]:
        """While in the block, the ``call.progress`` events of a call made with
        ``progress_token=token`` go to ``handler`` (called in the thread that waits for
        the call, as they arrive) instead of :meth:`events`."""
        self._progress[token] = handler
        try:
            yield
        finally:
            self._progress.pop(token, None)

    def subscribe(self, topics: Sequence[str],
                  agent_id: str | None = None) -> Subscribed:
        """Add ``topics`` to the ``event`` notifications subscribed (every topic is kept
        across reconnects), of the workspaces ``agent_id`` may read (the default agent's
        without one)."""
        # After a drop notice: made again from where it ended (a reconnect does that
        # itself, and then this adds nothing).
        after = (self._place.after(list(topics), self._topics)
                 if self._sock is not None and agent_id == self._topics_agent else None)
        result = self._resubscribed(self._run(_methods.subscribe(topics, agent_id, after)))
        # Every pattern of the connection, not only these: a subscription adds to it.
        self._topics = list(result["subscribed"])
        self._topics_agent = agent_id
        return result

    def events(self, timeout_s: float | None = None) -> Iterator[Event]:
        """Yield events as they arrive; stop after ``timeout_s`` without one (None: never).

        Raises :class:`ConnectionLost` if the daemon goes away while waiting, or once
        after the events read before, when the subscribed connection was lost meanwhile
        (found dead by a call, which reconnected): events sent in between are missed. The
        next call (or ``events()``) reconnects and subscribes again. Raises
        :class:`EventsMissed` (a ConnectionLost) once where events were left out of a
        full buffer (``max_events``), saying how many; the connection goes on.
        ValueError at once unless ``timeout_s`` is None or seconds, 0 or more.
        """
        return self._yield_events(_core.checked_wait(timeout_s, "timeout_s"))

    def _yield_events(self, timeout_s: float | None) -> Iterator[Event]:
        while True:
            with self._lock:
                if not self._events:
                    self._wait_event(timeout_s)
                if not self._events:
                    return
                event = self._events.popleft()
            yield _core.unmarked(event)

    def _wait_event(self, timeout_s: float | None) -> None:
        if self._sock is None:
            self._connect()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._events:
            assert self._sock is not None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            self._sock.settimeout(None if remaining is None
                                  else min(remaining, threading.TIMEOUT_MAX))
            try:
                data = self._sock.recv(_core.READ_CHUNK_BYTES)
            except TimeoutError:
                return
            except OSError:
                data = b""
            if not data:
                self._drop(lost=False)  # told here
                if self._topics:  # a count of what was missed then comes first
                    self._place.end(None)
                raise errors.ConnectionLost("the daemon closed the connection")
            self._dispatch(data, want=None)




os.register_at_fork(after_in_child=Client._forget_inherited)
