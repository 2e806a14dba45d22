"""The state of the async client's connections (:mod:`recalld.ipc.aclient`): a connection
with the calls waiting on it, a waiting task, and the markers of a connection that ended."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from recalld.ipc import _core, errors
from recalld.ipc.protocol import LineFramer, Response

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


@dataclass(eq=False)
class Connection:
    stream: SocketStream
    #: The stream's non-blocking socket, for the send that needs no wait (see ``_send``).
    sock: socket.socket
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


class Lost:
    """Marker put in the event buffer when a subscribed connection dies."""


class NotSent(Exception):
    """The request never reached a live daemon; it is safe to send again. ``fatal``: the
    null-id error the daemon sent as it closed the connection (it refused it), if any."""

    def __init__(self, fatal: Response | None = None) -> None:
        super().__init__()
        self.fatal = fatal
