"""A circuit breaker for one provider endpoint (closed -> open -> half-open -> closed).

Closed: calls pass; ``failure_threshold`` consecutive transient failures open it. Open: calls
fail fast with :class:`CircuitOpen` until ``open_for_s`` has passed; then half-open lets
exactly ONE probe through. A successful probe closes it; a failed probe reopens it with the
open time doubled (up to ``open_max_s``). Time comes from ``trio.current_time()``, so the fake
clock drives it in tests. No task, no I/O: callers report outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

import trio

from recalld.daemon.providers.errors import CircuitOpen

State = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """When a circuit breaker opens, and for how long."""

    failure_threshold: int = 5
    open_base_s: float = 5.0
    open_max_s: float = 300.0


class BreakerState(TypedDict):
    """:class:`BreakerSnapshot` as JSON."""

    state: State
    opened_at: float | None
    open_for_s: float
    consecutive_failures: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """The breaker's state for ``daemon.status`` (times are trio clock seconds)."""

    state: State
    opened_at: float | None
    open_for_s: float
    consecutive_failures: int
    last_error: str | None

    def as_dict(self) -> BreakerState:
        return {
            "state": self.state,
            "opened_at": self.opened_at,
            "open_for_s": self.open_for_s,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
        }


class CircuitBreaker:
    """Counts consecutive transient failures; see the module docstring for the states."""

    def __init__(self, config: BreakerConfig | None = None, *, name: str = "provider") -> None:
        self.config = config or BreakerConfig()
        self.name = name
        self._open = False
        self._opened_at: float | None = None
        self._reopens = 0
        self._probe_in_flight = False
        self.consecutive_failures = 0
        self.last_error: str | None = None

    @property
    def open_for_s(self) -> float:
        cfg = self.config
        return float(min(cfg.open_max_s, cfg.open_base_s * (2 ** self._reopens)))

    @property
    def opened_at(self) -> float | None:
        return self._opened_at

    @property
    def state(self) -> State:
        if not self._open:
            return "closed"
        assert self._opened_at is not None
        if trio.current_time() >= self._opened_at + self.open_for_s:
            return "half_open"
        return "open"

    def retry_in_s(self) -> float:
        """Seconds until a call may pass again (0 when closed or half-open)."""
        if self.state != "open":
            return 0.0
        assert self._opened_at is not None
        return max(0.0, self._opened_at + self.open_for_s - trio.current_time())

    def before_call(self) -> None:
        """Admit a call or raise CircuitOpen. In half-open, only one probe is admitted."""
        state = self.state
        if state == "closed":
            return
        if state == "half_open" and not self._probe_in_flight:
            self._probe_in_flight = True
            return
        wait = self.retry_in_s() if state == "open" else self.open_for_s
        raise CircuitOpen(
            f"{self.name} is unavailable (circuit open after {self.consecutive_failures} "
            f"failures; last error: {self.last_error})",
            retry_after_s=wait,
        )

    def record_success(self) -> None:
        """The provider answered (even with a permanent error): close the circuit. The
        failures counted before are past, and so is the last one's error."""
        self._open = False
        self._opened_at = None
        self._reopens = 0
        self._probe_in_flight = False
        self.consecutive_failures = 0
        self.last_error = None

    def record_failure(self, error: BaseException) -> None:
        """A transient failure: count it; open (or reopen) when due."""
        self.consecutive_failures += 1
        self.last_error = str(error)
        if self._probe_in_flight:
            # The single half-open probe failed: back off longer before the next one.
            self._probe_in_flight = False
            self._reopens += 1
            self._opened_at = trio.current_time()
        elif not self._open and self.consecutive_failures >= self.config.failure_threshold:
            self._open = True
            self._opened_at = trio.current_time()

    def release(self) -> None:
        """A call ended without an outcome (cancelled): free the probe slot, change nothing."""
        self._probe_in_flight = False

    def snapshot(self) -> BreakerSnapshot:
        return BreakerSnapshot(
            state=self.state,
            opened_at=self._opened_at,
            open_for_s=self.open_for_s,
            consecutive_failures=self.consecutive_failures,
            last_error=self.last_error,
        )
