"""The state of the async client's connections (:mod:`recalld.ipc.aclient`): a connection
with the calls waiting on it, a waiting task, the markers of a connection that ended, and
what the client holds in each event loop run."""

from __future__ import annotations

import collections
import socket
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import sniffio

from recalld.ipc import _core, errors
from recalld.ipc._core import Lost, Missed
from recalld.ipc._place import Place
from recalld.ipc.protocol import LineFramer, Response
from recalld.ipc.types import Event

if TYPE_CHECKING:
    from anyio.abc import SocketStream


@dataclass(eq=False)
class Waiter:
    """A task waiting on a connection: for the answer to request ``answer_id``, or (None)
    for events. ``wake`` is set when something it may want arrived, or when the task that
    read stopped reading."""

    answer_id: int | None = None
    wake: anyio.Event = field(default_factory=anyio.Event)
    response: Response | None = None
    error: errors.RecalldError | None = None

    def answered(self) -> bool:
        return self.response is not None or self.error is not None


Events = collections.deque[Event | Lost | Missed]


@dataclass(eq=False)
class Connection:
    """One open connection of the async client."""

    stream: SocketStream
    #: The stream's non-blocking socket, for the send that needs no wait (see ``_send``).
    sock: socket.socket
    #: Where its events go: the event buffer of its run.
    events: Events
    #: Where they stand in the daemon's stream: its run's.
    place: Place = field(default_factory=Place)
    framer: LineFramer = field(
        default_factory=lambda: LineFramer(_core.CLIENT_MAX_FRAME_BYTES))
    pending: dict[int, Waiter] = field(default_factory=dict)
    #: Waiters asleep while another task reads, in arrival order.
    idle: dict[Waiter, None] = field(default_factory=dict)
    reading: bool = False
    #: Held while a request is sent in more than one piece; taken without a checkpoint.
    send_lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))
    closed: bool = False
    fatal: Response | None = None


@dataclass(eq=False)
class Run:
    """What the client holds in one event loop run: ``loop`` (an asyncio loop, or a trio
    run's token), its connection, and the lock and event its tasks wait on. None of it is
    awaited in another run."""

    loop: object
    conn: Connection | None = None
    connect_lock: anyio.Lock = field(default_factory=anyio.Lock)
    #: Set (and replaced) whenever a connection opens: event waiters wait for one.
    opened: anyio.Event = field(default_factory=anyio.Event)
    events: Events = field(default_factory=collections.deque)
    place: Place = field(default_factory=Place)

    def ended(self) -> bool:
        """Whether the loop has ended for good (an asyncio loop not running may run again)."""
        # (Each library is imported already: the loop is one of its own.)
        asyncio = sys.modules.get("asyncio")
        if asyncio is not None and isinstance(self.loop, asyncio.AbstractEventLoop):
            return bool(self.loop.is_closed())
        try:  # a trio token: a finished run takes no more callbacks
            self.loop.run_sync_soon(_nothing)  # type: ignore[attr-defined]
        except sys.modules["trio"].RunFinishedError:
            return True
        return False

    def drop(self) -> None:
        """Let go of the connection of a run that has ended or that a forked child
        inherited, without awaiting: close this process's descriptor of it (no
        shutdown, which would end a parent's connection too)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.closed = True
            conn.sock.close()


def current_loop() -> object:
    """The event loop run of the calling task: its trio token, or its asyncio loop (as
    anyio tells them apart; neither library is imported here for the other's programs)."""
    if not _on_asyncio():
        return sys.modules["trio"].lowlevel.current_trio_token()
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        raise RuntimeError("the async client is called from no trio or asyncio loop")
    return asyncio.get_running_loop()


async def to_the_end(work: Awaitable[None]) -> None:
    """Await ``work`` to its end even if the caller is cancelled meanwhile, then let the
    cancellation through (a request half sent would garble the next one on the shared
    connection). anyio's shield keeps anyio's and trio's cancellations out, but asyncio
    cancels a task through any shield (``asyncio.wait_for``, ``asyncio.timeout``,
    ``Task.cancel``): there ``work`` runs in a task of its own, which the caller waits for.
    ``work`` bounds its own time."""
    with anyio.CancelScope(shield=True):
        if not _on_asyncio():
            await work
            return
        asyncio = sys.modules["asyncio"]
        task = asyncio.ensure_future(work)
        cancelled: BaseException | None = None
        while True:
            try:
                await asyncio.shield(task)  # the work's own error, if it failed
                break
            except asyncio.CancelledError as exc:
                if task.done():  # the work itself was cancelled (its loop closing)
                    raise
                cancelled = exc
        if cancelled is not None:
            raise cancelled


def _on_asyncio() -> bool:
    """Whether the calling task runs on asyncio (as anyio tells; else on trio)."""
    return (sniffio.thread_local.name or sniffio.current_async_library_cvar.get()) != "trio"


def _nothing() -> None:
    pass


class NotSent(Exception):
    """The request never reached a live daemon; it is safe to send again. ``fatal``: the
    null-id error the daemon sent as it closed the connection (it refused it), if any."""

    def __init__(self, fatal: Response | None = None) -> None:
        super().__init__()
        self.fatal = fatal
