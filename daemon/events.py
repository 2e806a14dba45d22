"""The event bus: publishers hand events to every matching subscription, never waiting.

Topics are dotted names (``job.progress``, ``workspace.opened``). A subscription matches
exact topics and prefix patterns ending in ``*`` (``job.*``, or ``*`` for everything).

Slow subscribers never block publishers. Each subscription has a bounded queue
(``max_queued`` events). When a publish finds it full, the subscription is *dropped*:
its queue is closed after the events already queued, and the connection delivering it
sends one last event with topic ``events.dropped``, which says how many events the
subscription missed (``missed``: it counts them until then, so the count covers every
event from the first one lost to the notice); the client may subscribe again. Dropping
(rather than disconnecting) keeps the client's calls working, and it tells the client
exactly which guarantee it lost, and how much of it.

Every event has a place in the daemon run's *stream* (:attr:`EventBus.stream`, new each
run): its ``seq``, 1 for the run's first event. The bus keeps the last
:data:`RECENT_EVENTS` events, so that a subscriber that says where it left off
(:meth:`EventBus.count_since`) is told how many of the events since then it missed: after
a drop, a cut-off connection or a restart. Only counted, never sent again.

The bus owns no task: delivery happens in the connection's event pump (server.py).
"""

from __future__ import annotations

import collections
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import trio

DROPPED_TOPIC = "events.dropped"
DEFAULT_MAX_QUEUED = 256
#: How many of the last events the bus keeps to count what a subscriber missed.
RECENT_EVENTS = 1024
#: Payload keys an event notification uses for itself.
RESERVED_KEYS = frozenset({"topic", "stream", "seq"})
#: What a subscriber may see of an event, by its topic and payload: the payload, a part
#: of it, or None (nothing).
View = Callable[[str, Mapping[str, object]], Mapping[str, object] | None]
MAX_PATTERN_CHARS = 200
_TOPIC = re.compile(r"^(\*|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*|\*)?)\Z")
#: What a refused pattern is told: the rule :data:`_TOPIC` checks.
_TOPIC_RULE = ("a topic is words of A-Z a-z 0-9 _ - joined by single dots (job.state); a "
               "pattern is a topic, or the start of one ending in * (job.*, or * for all)")


def check_topic_pattern(pattern: object) -> str:
    """A valid topic or ``prefix*`` pattern, or ValueError (which names at most the
    pattern's first :data:`MAX_PATTERN_CHARS` characters, and says when it is too long)."""
    if isinstance(pattern, str) and len(pattern) <= MAX_PATTERN_CHARS \
            and _TOPIC.match(pattern):
        return pattern
    if not isinstance(pattern, str):
        raise ValueError(f"invalid topic pattern: {type(pattern).__name__}, not a string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"invalid topic pattern: {pattern[:40]!r}… is {len(pattern)} "
                         f"characters long; at most {MAX_PATTERN_CHARS}")
    raise ValueError(f"invalid topic pattern: {pattern!r}: {_TOPIC_RULE}")


def topic_matches(pattern: str, topic: str) -> bool:
    if pattern.endswith("*"):
        return topic.startswith(pattern[:-1])
    return pattern == topic


@dataclass(frozen=True, slots=True)
class Event:
    """One published event: its topic, payload and place in the stream (``seq``)."""

    topic: str
    payload: Mapping[str, object]
    seq: int = 0


class Subscription:
    """One subscriber's patterns and its bounded queue.

    The consumer reads :attr:`receive`; it ends (EndOfChannel) after :meth:`close`, or
    after the bus dropped the subscription, in which case :attr:`dropped` is True.
    """

    def __init__(self, bus: EventBus, patterns: Iterable[str], max_queued: int, *,
                 owner: str | None = None, view: View | None = None) -> None:
        self._bus = bus
        self.patterns: set[str] = set(patterns)
        #: Who subscribed (an agent id), and what of each event that subscriber may see.
        self.owner = owner
        self._view = view
        self._send, self.receive = trio.open_memory_channel[Event](max_queued)
        self.dropped = False
        self.closed = False
        self.delivered = 0
        #: Events lost since the queue overflowed (counted until :meth:`close`).
        self.missed = 0

    @property
    def stream(self) -> str:
        """The stream of the bus this subscription is on."""
        return self._bus.stream

    @property
    def bus_seq(self) -> int:
        """The ``seq`` of the bus's last event."""
        return self._bus.seq

    def matches(self, topic: str) -> bool:
        return any(topic_matches(p, topic) for p in self.patterns)

    def shown(self, event: Event) -> Event | None:
        """``event`` as this subscriber may see it, or None when it may not."""
        if self._view is None:
            return event
        payload = self._view(event.topic, event.payload)
        if payload is None:
            return None
        return event if payload is event.payload else Event(event.topic, payload, event.seq)

    def add(self, patterns: Iterable[str]) -> list[str]:
        self.patterns.update(patterns)
        return sorted(self.patterns)

    def _offer(self, event: Event) -> bool:
        if self.dropped:
            self.missed += 1
            return False
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            # Dropped: nothing more is queued, but it stays on the bus to count what it
            # misses until its consumer has read the queue and closes it.
            self.dropped = self.closed = True
            self.missed = 1
            self._send.close()
            return False
        except trio.ClosedResourceError:
            self.close()
            return False
        self.delivered += 1
        return True

    def close(self) -> None:
        """Stop receiving; events already queued can still be read. Idempotent."""
        self.closed = True
        self._bus._discard(self)  # the bus and its subscriptions are one unit
        self._send.close()


@dataclass(frozen=True, slots=True)
class EventBusStatistics:
    """The event bus's counters, for ``daemon.status``: ``subscriptions`` are those
    still receiving (not one dropped whose queue is still being sent)."""

    subscriptions: int
    published_total: int
    delivered_total: int
    dropped_subscriptions_total: int


class EventBus:
    """Fan-out of events to subscriptions; :meth:`publish` is synchronous and never blocks."""

    def __init__(self, max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        self.max_queued = max_queued
        #: This run's stream: a subscriber that left off in another one missed what the
        #: daemon did since it started.
        self.stream = secrets.token_hex(8)
        self._recent: collections.deque[Event] = collections.deque(maxlen=RECENT_EVENTS)
        self._subscriptions: set[Subscription] = set()
        self._published = 0
        self._delivered = 0
        self._dropped = 0

    def subscribe(self, patterns: Iterable[str], *, max_queued: int | None = None,
                  owner: str | None = None, view: View | None = None) -> Subscription:
        """A subscription to ``patterns``; with ``view``, each event is queued as ``view``
        shows it to ``owner`` (a part of its payload, or not at all)."""
        checked = [check_topic_pattern(p) for p in patterns]
        sub = Subscription(self, checked, max_queued or self.max_queued, owner=owner,
                           view=view)
        self._subscriptions.add(sub)
        return sub

    def publish(self, topic: str, payload: Mapping[str, object] | None = None) -> int:
        """Queue ``topic`` with ``payload`` for every matching subscription.

        ``payload`` must be JSON-serializable and must not contain the keys
        :data:`RESERVED_KEYS`.
        Returns how many subscriptions received it. Never blocks, never raises for a
        slow subscriber (it is dropped instead, see the module docstring).
        """
        self._published += 1
        event = Event(topic, dict(payload or {}), self._published)
        self._recent.append(event)
        sent = 0
        for sub in list(self._subscriptions):
            shown = sub.shown(event) if sub.matches(topic) else None
            if shown is not None:
                was_dropped = sub.dropped
                if sub._offer(shown):
                    sent += 1
                elif sub.dropped and not was_dropped:
                    self._dropped += 1
        self._delivered += sent
        return sent

    @property
    def seq(self) -> int:
        """The ``seq`` of the last event published in this stream (0: none yet)."""
        return self._published

    def count_since(self, stream: str, seq: int,
                    counted: Callable[[Event], bool]) -> int | None:
        """How many events published after ``seq`` of ``stream`` are ``counted``: of a
        stream of another run, those of this run so far. None when the bus no longer
        keeps them all (over :data:`RECENT_EVENTS` ago); ValueError for a ``seq`` this
        stream has not reached."""
        if stream != self.stream:
            seq = 0
        elif seq > self._published:
            raise ValueError(f"seq {seq} is after the stream's last event ({self._published})")
        if self._published - seq > len(self._recent):
            return None
        return sum(1 for event in self._recent if event.seq > seq and counted(event))

    def _discard(self, sub: Subscription) -> None:
        self._subscriptions.discard(sub)

    def statistics(self) -> EventBusStatistics:
        return EventBusStatistics(
            subscriptions=sum(not sub.dropped for sub in self._subscriptions),
            published_total=self._published,
            delivered_total=self._delivered,
            dropped_subscriptions_total=self._dropped,
        )
