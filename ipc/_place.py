"""Where a client's events stand in the daemon's event stream, so that when its
subscription ended (dropped for falling behind, or its connection lost) the client can
subscribe again from there and tell the subscriber how many events it missed.

Each event the daemon sends carries ``stream`` (the daemon run) and ``seq`` (its place);
``events.subscribe`` with ``after`` answers ``missed``. No I/O here: both client flavours
feed it what they read and put the gap it finds in their event buffer.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TypeVar

from recalld.ipc._core import Lost, Missed
from recalld.ipc.answers import JsonObject
from recalld.ipc.types import Event

T = TypeVar("T")

DROPPED_TOPIC = "events.dropped"
_DROPPED = ("published after the daemon dropped the subscription for falling behind, "
            "before it was subscribed again")
_LOST = "published while the subscription was gone"
_RESTARTED = ("at least: the daemon restarted, and published these before the subscription "
              "was made again (any its previous run did not send are not known)")


@dataclass(eq=False)
class Place:
    """The stream and ``seq`` of the last event read (or subscription made), and, once
    the subscription ended, what in the event buffer marks the end (``gap``: the drop
    notice, a Lost marker, or None: the buffer's front)."""

    stream: str | None = None
    seq: int = 0
    ended: bool = False
    gap: object | None = None

    def saw(self, event: Event) -> None:
        """Note ``event``, just read (kept or not)."""
        if event.stream is not None and event.seq is not None:
            self._move(event.stream, event.seq)

    def end(self, gap: object | None) -> None:
        """The subscription ended; ``gap`` marks where in the buffer (None: nothing kept)."""
        self.ended, self.gap = True, gap

    def after(self, topics: list[str], subscribed: list[str]) -> JsonObject | None:
        """The ``after`` param of an ``events.subscribe`` to ``topics`` that makes again
        the ended subscription to ``subscribed`` (none when it adds topics: events of
        those the subscriber never asked for are no gap)."""
        if not self.ended or self.stream is None or not set(topics) <= set(subscribed):
            return None
        return {"stream": self.stream, "seq": self.seq}

    def subscribed(self, answer: object,
                   events: collections.deque[T | Lost | Missed] | None) -> None:
        """Note an ``events.subscribe`` answer; with ``missed`` in it, put in ``events``
        (None: a client that keeps none) a marker of how many where the gap is."""
        if not isinstance(answer, dict):
            return
        stream, seq, missed = answer.get("stream"), answer.get("seq"), answer.get("missed")
        if isinstance(missed, int) and not isinstance(missed, bool) and missed > 0 \
                and events is not None:
            why = _LOST if isinstance(self.gap, Lost) else _DROPPED
            if stream != self.stream:
                why = _RESTARTED
            if isinstance(self.gap, Lost):
                why = f"{self.gap.why}; {why}"
            _mark_after(events, self.gap, Missed(missed, why))
        if isinstance(stream, str) and isinstance(seq, int):
            self._move(stream, seq)
        self.ended, self.gap = False, None

    def _move(self, stream: str, seq: int) -> None:
        if stream != self.stream:
            self.stream, self.seq = stream, seq
        else:  # (an ended subscription's last events may come after a new one's answer)
            self.seq = max(self.seq, seq)


def _mark_after(events: collections.deque[T | Lost | Missed], gap: object | None,
                marker: Missed) -> None:
    """``marker`` where ``gap`` is in ``events``: in the place of a Lost marker (one
    gap, told once, now with its count: an EventsMissed is a ConnectionLost), right
    after a drop notice, or first when ``gap`` was taken already: every event still
    there came after it."""
    for i, item in enumerate(events):
        if item is gap:
            if isinstance(gap, Lost):
                events[i] = marker
            else:
                events.insert(i + 1, marker)
            return
    events.appendleft(marker)
