"""The circuit breaker's states under the fake clock."""

from __future__ import annotations

import pytest
import trio

from recalld.daemon.providers.breaker import BreakerConfig, CircuitBreaker
from recalld.daemon.providers.errors import CircuitOpen, ProviderConnectError


def fail(b: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        b.before_call()
        b.record_failure(ProviderConnectError("refused"))


async def test_opens_after_threshold(autojump_clock: object) -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=3, open_base_s=10.0))
    fail(b, 2)
    assert b.state == "closed"
    assert b.consecutive_failures == 2
    fail(b)
    assert b.state == "open"
    assert b.opened_at == trio.current_time()
    assert b.last_error == "refused"
    with pytest.raises(CircuitOpen) as info:
        b.before_call()
    assert info.value.retry_after_s == 10.0
    assert info.value.transient


async def test_success_resets_the_count(autojump_clock: object) -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=3))
    fail(b, 2)
    b.record_success()
    fail(b, 2)
    assert b.state == "closed"


async def test_half_open_admits_one_probe(autojump_clock: object) -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, open_base_s=10.0))
    fail(b)
    await trio.sleep(9.999)
    assert b.state == "open"
    await trio.sleep(0.001)
    assert b.state == "half_open"
    assert b.retry_in_s() == 0.0
    b.before_call()  # the probe
    with pytest.raises(CircuitOpen):
        b.before_call()  # a second caller while the probe runs
    b.record_success()
    assert b.state == "closed"
    b.before_call()
    b.before_call()


async def test_failed_probe_reopens_with_longer_wait(autojump_clock: object) -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, open_base_s=10.0, open_max_s=35.0))
    fail(b)
    waits = []
    for _ in range(4):
        opened = b.opened_at
        assert opened is not None
        waits.append(b.open_for_s)
        await trio.sleep(b.open_for_s)
        assert b.state == "half_open"
        fail(b)  # the probe fails
        assert b.state == "open"
        assert b.opened_at == trio.current_time()
    assert waits == [10.0, 20.0, 35.0, 35.0]
    await trio.sleep(35.0)
    b.before_call()
    b.record_success()
    assert b.open_for_s == 10.0
    assert b.consecutive_failures == 0


async def test_release_frees_the_probe(autojump_clock: object) -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, open_base_s=1.0))
    fail(b)
    await trio.sleep(1.0)
    b.before_call()
    b.release()
    assert b.state == "half_open"
    b.before_call()  # another probe may go now


async def test_snapshot_for_status(autojump_clock: object) -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=2, open_base_s=5.0))
    assert b.snapshot().as_dict() == {
        "state": "closed", "opened_at": None, "open_for_s": 5.0,
        "consecutive_failures": 0, "last_error": None,
    }
    fail(b, 2)
    snap = b.snapshot()
    assert snap.state == "open"
    assert snap.consecutive_failures == 2
    assert snap.opened_at == trio.current_time()
