"""The events of one connection: the limits on what it subscribes to, and the pump that
writes its subscription's events to it.

:class:`recalld.daemon.rpc.connection.Connection` owns the subscription and runs
:func:`pump_events` in its nursery. The pump ends when the subscription ends (the bus
closed it, or dropped it for a full queue: the client is told so) or the client stops
taking events; either way it closes the subscription. Cancelling it closes it too.
:func:`wait_hangup` tells when a subscriber that ended its side of the connection (a
half-close: it still reads) is gone altogether.
"""

from __future__ import annotations

import select
from collections.abc import Awaitable, Callable, Sequence

import trio

from recalld.daemon.events import DROPPED_TOPIC, RESERVED_KEYS, Subscription
from recalld.ipc import errors
from recalld.ipc.protocol import event_notification

EVENT_QUEUE_SIZE = 256
# Topic patterns one connection may subscribe to: every event is matched against each,
# on the publisher's side, and each events.subscribe answer lists them all.
MAX_TOPIC_PATTERNS = 256


def check_subscription(sub: Subscription | None, patterns: Sequence[str],
                       owner: str | None) -> None:
    """InvalidParams unless ``patterns`` for ``owner`` may join ``sub`` (None: a first
    subscription): one connection subscribes for one agent, and within the pattern cap."""
    if sub is not None and sub.owner != owner:
        raise errors.InvalidParams(
            f"this connection receives the events of agent {sub.owner!r}; "
            f"subscribe for {owner!r} on another connection")
    if len((sub.patterns if sub else set()) | set(patterns)) > MAX_TOPIC_PATTERNS:
        raise errors.InvalidParams(f"at most {MAX_TOPIC_PATTERNS} topic patterns per "
                                   "connection")


async def pump_events(sub: Subscription, send: Callable[[bytes], Awaitable[bool]]) -> None:
    """Send ``sub``'s events with ``send`` until it ends or ``send`` fails, then close it."""
    stream = sub.stream
    try:
        async for event in sub.receive:
            payload = {k: v for k, v in event.payload.items() if k not in RESERVED_KEYS}
            payload.update(stream=stream, seq=event.seq)
            if not await send(event_notification(event.topic, payload)):
                return
        if sub.dropped:
            sub.close()  # counted up to here: the notice's count is the whole gap
            # Its seq is where the gap ends: a subscription again after it is told of the
            # events published in between.
            await send(event_notification(DROPPED_TOPIC, {
                "reason": "subscriber too slow: event queue overflowed",
                "topics": sorted(sub.patterns),
                "missed": sub.missed,
                "stream": stream,
                "seq": sub.bus_seq,
            }))
    finally:
        sub.close()


async def wait_hangup(fd: int) -> None:
    """Return once the peer of the connected socket ``fd`` has closed it (POLLHUP) or it
    failed (POLLERR); cancellable.

    After the peer's half-close the socket reads as EOF for good, so waiting to read says
    nothing more: an epoll instance of its own, watching ``fd`` for no event at all, still
    reports those two (as every epoll does), and is itself readable only then. No timer.
    """
    with select.epoll(1) as hangup:
        hangup.register(fd, 0)
        while not hangup.poll(0):
            await trio.lowlevel.wait_readable(hangup.fileno())
