"""The wall clock the cron scheduler reads: the system's, or a fake one for tests that
advances with trio's clock and can be stepped like a real clock (NTP, a hand change, a
suspend)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

import trio


class WallClock(Protocol):
    def now(self) -> datetime:
        """The current wall time, timezone-aware."""
        ...


class SystemWallClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeWallClock:
    """Wall time that advances with trio's clock (a MockClock in tests) and can jump.

    Create it inside ``trio.run``.
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self._start = start
        self._t0 = trio.current_time()
        self._offset = timedelta(0)

    def now(self) -> datetime:
        return self._start + self._offset + timedelta(seconds=trio.current_time() - self._t0)

    def jump(self, delta: timedelta) -> None:
        """Step the wall clock (NTP step, manual change, or a suspend's lost time)."""
        self._offset += delta
