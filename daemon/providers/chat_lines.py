"""What the chat clients of one provider endpoint and credential share, daemon-wide.

Every workspace makes its own :class:`~recalld.daemon.providers.chat.ChatClient`; those
sending to the same endpoint with the same key and wire format, for the same model, share
one :class:`ChatLine`: its circuit breaker (the failures of every workspace count, and once it
opens no workspace sends more than its probes), the provider's last Retry-After (told to
one, kept by all), and the watchers woken when the provider answers again after it was
unavailable (capture retries of every workspace using it go out at once, not after their
doubled delay), and which one capture retry goes out as the breaker's half-open probe
(:meth:`ChatLine.retry_wait_s`). Clients with different keys never share one, even on
one URL: one key's quota or revocation is not another's; nor do clients of different
models, whose rate limits are their own (OpenAI's are per model) and which a gateway may
route to servers of their own (one model's backend down is not another's). A line is
keyed by a digest of the key, never the key itself, and is dropped once no client uses
it. No task, no I/O.
"""

from __future__ import annotations

import hashlib
import logging
import math
import weakref
from typing import Protocol

import trio

from recalld.daemon.providers.breaker import BreakerConfig, CircuitBreaker

log = logging.getLogger(__name__)


class Watcher(Protocol):
    def provider_back(self) -> None:
        """The provider answers again after it was unavailable."""


class ChatLine:
    """The breaker, Retry-After wait and watchers of one chat provider endpoint and key."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker
        self._quiet_until = -math.inf
        #: The error (its key masked) that came with the Retry-After being kept.
        self.quiet_error: str | None = None
        #: Whether a call met the provider unavailable since it last answered.
        self._down = False
        self._watchers: weakref.WeakSet[Watcher] = weakref.WeakSet()
        #: The opening of the breaker whose half-open probe a retry was let through for,
        #: and until when no other retry is (:meth:`retry_wait_s`).
        self._probe_for: float | None = None
        self._probe_until = -math.inf

    def watch(self, watcher: Watcher) -> None:
        self._watchers.add(watcher)

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def hold(self, wait_s: float, error: str) -> None:
        """The provider asked (Retry-After) to be left alone ``wait_s`` seconds."""
        self._down = True
        until = trio.current_time() + wait_s
        if until > self._quiet_until:
            self._quiet_until = until
            self.quiet_error = error

    def quiet_s(self) -> float:
        """Seconds the provider's last Retry-After still asks to be left alone."""
        return max(self._quiet_until - trio.current_time(), 0.0)

    def retry_wait_s(self) -> float:
        """Seconds before a retry that can wait (capture's) should be queued: 0 to queue
        it now. While the breaker is open or a Retry-After runs, until then; once it is
        half-open, 0 for the first asking (its run is the single probe) and the breaker's
        open time for the others until that probe is answered or that time has passed
        (else each would queue a run the breaker refuses unsent)."""
        breaker = self.breaker
        if (hold := max(breaker.retry_in_s(), self.quiet_s())) > 0:
            return hold
        if breaker.state != "half_open":
            return 0.0
        now = trio.current_time()
        if self._probe_for == breaker.opened_at and now < self._probe_until:
            return self._probe_until - now
        self._probe_for = breaker.opened_at
        self._probe_until = now + breaker.open_for_s
        return 0.0

    def unavailable(self) -> None:
        """A call met the provider unavailable (no answer, 408, 429, a 5xx)."""
        self._down = True

    def answered(self, *, ok: bool) -> None:
        """The provider answered a call (``ok``: with a completion; else it refused that
        request, which ends no Retry-After): wake the watchers if it was unavailable."""
        if ok:
            self._quiet_until = -math.inf
            self.quiet_error = None
        if not self._down:
            return
        self._down = False
        watchers = list(self._watchers)
        log.info("%s answers again; %d workspace(s) woken", self.breaker.name, len(watchers))
        for watcher in watchers:
            watcher.provider_back()


class ChatLines:
    """Every :class:`ChatLine` in use, by backend, endpoint, a digest of the key and
    model."""

    def __init__(self) -> None:
        self._lines: weakref.WeakValueDictionary[
            tuple[str, str, str, str, BreakerConfig], ChatLine] = weakref.WeakValueDictionary()

    def line(self, backend: str, endpoint: str, api_key: str, model: str,
             breaker: BreakerConfig) -> ChatLine:
        """The line of clients sending to ``endpoint`` as ``backend`` with ``api_key``
        for ``model``, their breaker set as ``breaker``."""
        digest = hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()
        key = (backend, endpoint, digest, model, breaker)
        found = self._lines.get(key)
        if found is None:
            found = ChatLine(CircuitBreaker(breaker, name=f"chat provider {backend}"))
            self._lines[key] = found
        return found


__all__ = ["ChatLine", "ChatLines", "Watcher"]
