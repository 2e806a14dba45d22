"""Retries on the trio side: an immutable policy and the loop that applies it.

The bridge performs single attempts; :func:`call_with_retry` decides whether and when to try
again. Retried: connect errors, timeouts of one attempt, HTTP 408/429 and the 5xx of a
server or gateway that is down or busy (the policy's ``retry_statuses``). Everything
else fails at once. Waits use full jitter,
``uniform(0, min(backoff_max_s, backoff_base_s * 2**attempt))``, unless the provider sent
Retry-After, which is honoured exactly but capped at ``retry_after_cap_s``. The whole call,
sleeps included, stays inside ``deadline_s``: a wait that would end past the deadline is not
started and the last error is raised instead. All sleeping is ``trio.sleep``, so the fake
clock governs it in tests.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from recalld.daemon.providers.breaker import CircuitBreaker
from recalld.daemon.providers.bridge import HttpResult
from recalld.daemon.providers.errors import (
    CircuitOpen,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderTransient,
    redact,
    status_error,
    unexpected,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What a server, or the gateway in front of it, answers while it is down, busy or out of
#: time: 408, 429, 500, 502-504; the gateways' own (Cloudflare's 520-524: the server
#: behind it failed, refused, timed out or is out of reach), 529 (overloaded: Anthropic's
#: API and others), 598/599 (a proxy's read or connect timeout). Not 501 or 505 (what
#: the server cannot do at all: llama.cpp's 501 for embeddings it was not started for),
#: nor 525/526/530 (TLS or DNS set up wrongly): no retry changes those. Taken for
#: permanent, an overloaded server failed each call at once, and a run of them counted
#: as the provider up, so the breaker never held the calls that followed.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529,
                            598, 599})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry one provider call. Immutable."""

    max_attempts: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_cap_s: float = 60.0
    retry_statuses: frozenset[int] = RETRY_STATUSES
    #: The whole call, all attempts and waits included.
    deadline_s: float = 120.0
    #: One HTTP attempt (also bounded by what is left of ``deadline_s``).
    attempt_timeout_s: float = 60.0

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """Full-jitter wait after failed attempt number ``attempt`` (0-based)."""
        ceiling = min(self.backoff_max_s, self.backoff_base_s * (2 ** attempt))
        return rng.uniform(0.0, ceiling)

    def delay_s(self, attempt: int, error: ProviderError, rng: random.Random) -> float:
        """The wait before the next attempt: capped Retry-After if given, else backoff."""
        if error.retry_after_s is not None:
            return min(max(0.0, error.retry_after_s), self.retry_after_cap_s)
        return self.backoff_s(attempt, rng)

    def is_retryable(self, error: ProviderError) -> bool:
        if error.status is not None:
            return error.status in self.retry_statuses
        return isinstance(error, ProviderTransient)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None.

    ``now`` is the wall-clock time an HTTP-date is measured from (default: time.time()).
    Dates in the past give 0 (a date naming no zone is UTC, as HTTP dates are);
    unparseable values give None, whatever the header holds
    (a provider's header is input: a date whose year or offset no datetime holds is
    no wait, not an error of the caller's).
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # NaN -> None
    import datetime
    import email.utils  # an HTTP date is rare: the email package waits for one

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):  # a field past a C long: Overflow
        return None
    if when.tzinfo is None:
        # An HTTP date is UTC in each of its three forms; the asctime form ("Sun Nov  6
        # 08:49:37 1994") names no zone and "-0000" parses without one: both are UTC.
        when = when.replace(tzinfo=datetime.UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def check_response(result: HttpResult, policy: RetryPolicy, *, what: str,
                   secret: str = "") -> HttpResult:
    """Return ``result`` if 2xx, else raise the typed error (with Retry-After parsed);
    ``secret`` (the key sent) is masked where the error quotes the answer."""
    if 200 <= result.status < 300:
        return result
    location = result.headers.get("location")
    if 300 <= result.status < 400 and location:
        # Not followed (bridge.followed): say where it leads, not what the page says.
        where = redact(location.split("?", 1)[0], secret)
        raise ProviderRejected(
            f"{what}: HTTP {result.status}: the provider redirects to {where}; set "
            "base_url to where it leads (only 307/308 within one server are followed)",
            status=result.status)
    raise status_error(
        result.status,
        result.body,
        retryable=policy.retry_statuses,
        retry_after_s=parse_retry_after(result.headers.get("retry-after")),
        what=what,
        secrets=(secret,) if secret else (),
    )


async def call_with_retry(
    policy: RetryPolicy,
    attempt_fn: Callable[[float], Awaitable[T]],
    *,
    rng: random.Random,
    breaker: CircuitBreaker | None = None,
    what: str = "provider call",
    on_wait: Callable[[float, ProviderError], None] | None = None,
    secret: str = "",
) -> T:
    """Run ``attempt_fn(timeout_s)`` until it succeeds, fails permanently or time runs out.

    ``attempt_fn`` gets the timeout for that one attempt and raises ProviderError subclasses;
    any other Exception it raises is that attempt's ProviderFault (logged with its
    traceback, ``secret``, the key sent, masked), never its caller's crash.
    The breaker (if any) is consulted before every attempt (CircuitOpen is raised at once
    when it refuses the first; a retry it refuses raises the failed attempt's own error:
    the call was sent, and the caller may count that against what it sent) and told
    every outcome: transient failures count; any answer, even a permanent error,
    means the provider is up. Raises the last error, or ProviderTimeout when ``deadline_s``
    passes during an attempt. ``on_wait(delay_s, error)`` is told of each wait before a
    retry, as it starts. On cancellation nothing is recorded against the provider.
    """
    deadline = trio.current_time() + policy.deadline_s
    attempt = 0
    last: ProviderError | None = None

    def timeout() -> ProviderTimeout:
        # What the attempts before met tells a slow provider from one that is down.
        before = f" after {attempt} attempt(s), the last: {last}" if last is not None else ""
        return ProviderTimeout(f"{what}: deadline of {policy.deadline_s:g}s passed{before}")

    while True:
        if breaker is not None:
            try:
                breaker.before_call()
            except CircuitOpen:
                if last is None:
                    raise
                # A retry the breaker no longer admits: the provider's own error says
                # what happened to this call (it was sent), not the breaker's.
                raise last from None
        remaining = deadline - trio.current_time()
        error: ProviderError
        try:
            if remaining <= 0:
                raise timeout()
            with trio.move_on_after(remaining) as scope:
                result = await attempt_fn(min(policy.attempt_timeout_s, remaining))
            if scope.cancelled_caught:
                raise timeout()
        except ProviderError as exc:
            error = exc
        except Exception as exc:  # reading the answer met what nobody foresaw
            error = unexpected(exc, what, secret)
        except BaseException:
            if breaker is not None:
                breaker.release()
            raise
        else:
            if breaker is not None:
                breaker.record_success()
            return result

        retryable = policy.is_retryable(error)
        if breaker is not None:
            if error.transient:
                breaker.record_failure(error)
            else:
                breaker.record_success()
        attempt += 1
        last = error
        if not retryable or attempt >= policy.max_attempts:
            raise error
        delay = policy.delay_s(attempt - 1, error, rng)
        if trio.current_time() + delay >= deadline:
            raise error
        log.info("%s failed (%s); attempt %d in %.2fs", what, error, attempt + 1, delay)
        if on_wait is not None:
            on_wait(delay, error)
        await trio.sleep(delay)
