"""RetryPolicy and call_with_retry under the fake clock (no I/O: scripted attempt functions)."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable

import pytest
import trio

from recalld.daemon.providers.breaker import BreakerConfig, CircuitBreaker
from recalld.daemon.providers.bridge import HttpResult
from recalld.daemon.providers.errors import (
    CircuitOpen,
    ProviderBadResponse,
    ProviderConnectError,
    ProviderError,
    ProviderRejected,
    ProviderRetryableStatus,
    ProviderTimeout,
)
from recalld.daemon.providers.retry import (
    RetryPolicy,
    call_with_retry,
    check_response,
    parse_retry_after,
)


class Script:
    """An attempt function that raises the scripted errors, then returns "ok"."""

    def __init__(self, *outcomes: ProviderError | Callable[[], None]) -> None:
        self.outcomes = list(outcomes)
        self.times: list[float] = []
        self.timeouts: list[float] = []

    async def __call__(self, timeout_s: float) -> str:
        self.times.append(trio.current_time())
        self.timeouts.append(timeout_s)
        if self.outcomes:
            item = self.outcomes.pop(0)
            if isinstance(item, ProviderError):
                raise item
            await trio.sleep_forever()
        return "ok"


def status(code: int, retry_after: float | None = None) -> ProviderError:
    cls = ProviderRetryableStatus if code in {408, 429, 500, 502, 503, 504} else ProviderRejected
    return cls(f"HTTP {code}", status=code, retry_after_s=retry_after)


def hang() -> None:
    """Marker: the attempt never answers."""


def test_backoff_full_jitter_ranges() -> None:
    policy = RetryPolicy(backoff_base_s=0.5, backoff_max_s=30.0)
    rng = random.Random(1)
    for attempt in range(10):
        ceiling = min(30.0, 0.5 * 2 ** attempt)
        samples = [policy.backoff_s(attempt, rng) for _ in range(200)]
        assert all(0.0 <= s <= ceiling for s in samples)
        # Full jitter spreads over the whole range, not just near the ceiling.
        assert min(samples) < ceiling * 0.2
        assert max(samples) > ceiling * 0.8


def test_policy_is_immutable() -> None:
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.max_attempts = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("5", 5.0), (" 2.5 ", 2.5), ("0", 0.0), ("-3", 0.0), ("", None), (None, None),
     ("soon", None), ("nan", None)],
)
def test_parse_retry_after_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value) == expected


def test_parse_retry_after_http_date() -> None:
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 42, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(42.0)
    past = email.utils.formatdate(now - 100, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0


@pytest.mark.parametrize("form", [
    "%a %b %d %H:%M:%S %Y",         # asctime, the third HTTP-date form: no zone, UTC
    "%A, %d-%b-%y %H:%M:%S GMT",    # RFC 850
    "%a, %d %b %Y %H:%M:%S -0000",  # a zone of -0000 (UTC, parsed as none)
])
def test_parse_retry_after_http_date_of_every_form(form: str) -> None:
    # A provider asking to wait with a date naming no zone was not waited for at all.
    now = 1_800_000_000.0
    date = time.strftime(form, time.gmtime(now + 42))
    assert parse_retry_after(date, now=now) == pytest.approx(42.0)


@pytest.mark.parametrize("value", [
    "Wed, 21 Oct 99999999999999999999 07:28:00 GMT",
    "Wed, 21 Oct 2015 99999999999999999999:28:00 GMT",
    "Wed, 21 Oct 2015 07:28:00 +9999999999999999999",
    "Wed, 21 Oct 2015 07:28:00 -9999",
])
def test_a_retry_after_date_no_datetime_holds_is_no_wait(value: str) -> None:
    # A year, hour or offset past a C long raised OverflowError out of the parse: the
    # 503 it came with was no provider error but a crash (an embedding workspace's
    # health check took the whole workspace down with it).
    assert parse_retry_after(value) is None
    with pytest.raises(ProviderRetryableStatus) as info:
        check_response(HttpResult(503, {"retry-after": value}, b"busy"), RetryPolicy(),
                       what="t")
    assert info.value.retry_after_s is None and info.value.transient


def test_check_response_types() -> None:
    policy = RetryPolicy()
    ok = HttpResult(200, {}, b"{}")
    assert check_response(ok, policy, what="t") is ok
    with pytest.raises(ProviderRetryableStatus) as info:
        check_response(HttpResult(429, {"retry-after": "7"}, b"slow down"), policy, what="t")
    assert info.value.status == 429
    assert info.value.retry_after_s == 7.0
    assert info.value.transient
    with pytest.raises(ProviderRejected) as rej:
        check_response(HttpResult(401, {}, b"bad key sk-abcdefghijklmnop"), policy, what="t")
    assert not rej.value.transient
    assert "sk-abcdefghijklmnop" not in str(rej.value)


@pytest.mark.parametrize("code", [408, 429, 500, 502, 503, 504])
async def test_retryable_statuses_are_retried(code: int, autojump_clock: object) -> None:
    script = Script(status(code), status(code))
    result = await call_with_retry(RetryPolicy(), script, rng=random.Random(0))
    assert result == "ok"
    assert len(script.times) == 3


@pytest.mark.parametrize("code", [520, 521, 522, 523, 524, 529, 598, 599])
async def test_a_gateway_s_or_an_overloaded_server_s_status_is_retried(
        code: int, autojump_clock: object) -> None:
    # Cloudflare's 52x, an overloaded API's 529, a proxy's 598/599: the server is down,
    # busy or slow, as with a 503. Taken for a refusal, the call failed at once and its
    # breaker counted the provider up.
    policy = RetryPolicy()
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=2), name="t")
    answers = [HttpResult(code, {}, b"<html>busy</html>"), HttpResult(200, {}, b"{}")]

    async def attempt(timeout_s: float) -> HttpResult:
        return check_response(answers.pop(0), policy, what="t")

    result = await call_with_retry(policy, attempt, rng=random.Random(0), breaker=breaker)
    assert result.status == 200 and answers == []
    with pytest.raises(ProviderRetryableStatus):
        check_response(HttpResult(code, {}, b""), policy, what="t")
    for _ in range(2):
        answers.append(HttpResult(code, {}, b""))
        with pytest.raises(ProviderRetryableStatus):
            await call_with_retry(RetryPolicy(max_attempts=1), attempt,
                                  rng=random.Random(0), breaker=breaker)
    assert breaker.snapshot().state == "open"


@pytest.mark.parametrize("code", [501, 505, 525, 526, 530])
def test_a_status_no_retry_changes_is_a_refusal(code: int) -> None:
    with pytest.raises(ProviderRejected) as info:
        check_response(HttpResult(code, {}, b"not supported"), RetryPolicy(), what="t")
    assert not info.value.transient


@pytest.mark.parametrize("code", [400, 401, 403, 404, 413, 422, 501])
async def test_other_statuses_fail_at_once(code: int, autojump_clock: object) -> None:
    script = Script(status(code))
    with pytest.raises(ProviderRejected):
        await call_with_retry(RetryPolicy(), script, rng=random.Random(0))
    assert len(script.times) == 1


async def test_bad_response_is_not_retried(autojump_clock: object) -> None:
    script = Script(ProviderBadResponse("garbage"))
    with pytest.raises(ProviderBadResponse):
        await call_with_retry(RetryPolicy(), script, rng=random.Random(0))
    assert len(script.times) == 1


async def test_connect_errors_retry_with_jittered_backoff(autojump_clock: object) -> None:
    policy = RetryPolicy(max_attempts=5, backoff_base_s=0.5, backoff_max_s=30.0)
    script = Script(*[ProviderConnectError("refused") for _ in range(4)])
    start = trio.current_time()
    assert await call_with_retry(policy, script, rng=random.Random(3)) == "ok"
    assert script.times[0] == start
    gaps = [b - a for a, b in zip(script.times, script.times[1:], strict=False)]
    assert len(gaps) == 4
    for k, gap in enumerate(gaps):
        assert 0.0 <= gap <= min(30.0, 0.5 * 2 ** k)


async def test_retry_after_is_honoured_exactly(autojump_clock: object) -> None:
    script = Script(status(429, retry_after=7.0), status(503, retry_after=2.5))
    start = trio.current_time()
    assert await call_with_retry(RetryPolicy(), script, rng=random.Random(0)) == "ok"
    assert script.times == [start, start + 7.0, start + 9.5]


async def test_retry_after_is_capped(autojump_clock: object) -> None:
    policy = RetryPolicy(retry_after_cap_s=60.0, deadline_s=1000.0)
    script = Script(status(503, retry_after=3600.0))
    start = trio.current_time()
    assert await call_with_retry(policy, script, rng=random.Random(0)) == "ok"
    assert script.times == [start, start + 60.0]


async def test_attempts_are_bounded(autojump_clock: object) -> None:
    policy = RetryPolicy(max_attempts=3, deadline_s=1000.0)
    script = Script(*[status(500) for _ in range(10)])
    with pytest.raises(ProviderRetryableStatus):
        await call_with_retry(policy, script, rng=random.Random(0))
    assert len(script.times) == 3


async def test_overall_deadline_cuts_a_hanging_attempt(autojump_clock: object) -> None:
    policy = RetryPolicy(deadline_s=20.0, attempt_timeout_s=60.0)
    script = Script(hang)
    start = trio.current_time()
    with pytest.raises(ProviderTimeout):
        await call_with_retry(policy, script, rng=random.Random(0))
    assert trio.current_time() == start + 20.0
    # The attempt was told the smaller of its own timeout and what was left.
    assert script.timeouts == [20.0]


async def test_attempt_timeout_shrinks_with_remaining_time(autojump_clock: object) -> None:
    policy = RetryPolicy(deadline_s=100.0, attempt_timeout_s=30.0, retry_after_cap_s=100.0)
    script = Script(status(503, retry_after=80.0))
    assert await call_with_retry(policy, script, rng=random.Random(0)) == "ok"
    assert script.timeouts == [30.0, 20.0]


async def test_no_sleep_past_the_deadline(autojump_clock: object) -> None:
    policy = RetryPolicy(deadline_s=10.0, retry_after_cap_s=60.0)
    script = Script(status(429, retry_after=30.0))
    start = trio.current_time()
    with pytest.raises(ProviderRetryableStatus):
        await call_with_retry(policy, script, rng=random.Random(0))
    # It gave up at once instead of sleeping 30 s into a 10 s deadline.
    assert trio.current_time() == start
    assert len(script.times) == 1


async def test_breaker_opens_and_fails_fast(autojump_clock: object) -> None:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=3, open_base_s=30.0))
    policy = RetryPolicy(max_attempts=10, deadline_s=1000.0)
    script = Script(*[status(503, retry_after=1.0) for _ in range(10)])
    # The call that opened the circuit raises the provider's own error: it was sent.
    with pytest.raises(ProviderRetryableStatus) as sent:
        await call_with_retry(policy, script, rng=random.Random(0), breaker=breaker)
    assert sent.value.status == 503
    assert len(script.times) == 3
    assert breaker.state == "open"
    # The next call is refused without an attempt.
    with pytest.raises(CircuitOpen) as info:
        await call_with_retry(policy, script, rng=random.Random(0), breaker=breaker)
    assert info.value.retry_after_s == pytest.approx(30.0 - 2.0, abs=2.0)
    assert len(script.times) == 3
    # After the open period one probe goes through; success closes the circuit.
    await trio.sleep(30.0)
    script.outcomes.clear()
    assert await call_with_retry(policy, script, rng=random.Random(0), breaker=breaker) == "ok"
    assert breaker.state == "closed"


async def test_permanent_error_counts_as_provider_up(autojump_clock: object) -> None:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=2))
    policy = RetryPolicy(max_attempts=1)
    with pytest.raises(ProviderConnectError):
        await call_with_retry(policy, Script(ProviderConnectError("x")),
                              rng=random.Random(0), breaker=breaker)
    assert breaker.consecutive_failures == 1
    with pytest.raises(ProviderRejected):
        await call_with_retry(policy, Script(status(400)), rng=random.Random(0),
                              breaker=breaker)
    assert breaker.consecutive_failures == 0
    assert breaker.state == "closed"


async def test_cancellation_releases_the_probe(autojump_clock: object) -> None:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=1, open_base_s=5.0))
    policy = RetryPolicy(max_attempts=1)
    with pytest.raises(ProviderConnectError):
        await call_with_retry(policy, Script(ProviderConnectError("x")),
                              rng=random.Random(0), breaker=breaker)
    await trio.sleep(5.0)
    assert breaker.state == "half_open"
    with trio.move_on_after(1.0):
        await call_with_retry(policy, Script(hang), rng=random.Random(0), breaker=breaker)
    # The cancelled probe did not count and did not keep the probe slot.
    assert breaker.state == "half_open"
    assert await call_with_retry(policy, Script(), rng=random.Random(0), breaker=breaker) == "ok"
    assert breaker.state == "closed"


def test_error_family_maps_to_the_wire() -> None:
    from recalld.daemon.errors import wire_error
    from recalld.daemon.providers.errors import (
        DimensionMismatch,
        ProviderPermanent,
        ProviderTransient,
        redact,
    )
    from recalld.ipc.errors import PROVIDER_UNAVAILABLE, ProviderUnavailable

    for exc in (ProviderConnectError("a"), ProviderTimeout("b"), CircuitOpen("c"),
                status(503)):
        assert isinstance(exc, ProviderTransient)
        assert exc.transient
    for exc in (ProviderBadResponse("d"), DimensionMismatch("e"), status(404)):
        assert isinstance(exc, ProviderPermanent)
        assert not exc.transient
    err = status(429, retry_after=3.0)
    assert not isinstance(err, ProviderUnavailable)  # a domain error; mapped at the boundary
    wire = wire_error(err)
    assert type(wire) is ProviderUnavailable
    assert wire.code == PROVIDER_UNAVAILABLE
    assert wire.to_error() == {"code": PROVIDER_UNAVAILABLE, "message": "HTTP 429",
                               "data": {"transient": True, "status": 429}}
    assert redact("key sk-abcdefghijkl and AIzaSyA1234567890123456789012 x", "x") == (
        "key *** and *** ***")


async def test_a_passed_deadline_names_what_the_attempts_met(autojump_clock: object) -> None:
    policy = RetryPolicy(deadline_s=10.0, attempt_timeout_s=4.0, backoff_base_s=0.01,
                         backoff_max_s=0.02, max_attempts=10)
    timed_out = ProviderTimeout("request to http://127.0.0.1:9/v1 timed out after 4s")
    script = Script(timed_out, timed_out, hang)
    with pytest.raises(ProviderTimeout) as info:
        await call_with_retry(policy, script, rng=random.Random(0), what="chat qwen3")
    assert str(info.value).startswith("chat qwen3: deadline of 10s passed after 2 "
                                      "attempt(s), the last: request to http://127.0.0.1:9")
    with pytest.raises(ProviderTimeout, match=r"^chat qwen3: deadline of 10s passed$"):
        await call_with_retry(policy, Script(hang), rng=random.Random(0), what="chat qwen3")
