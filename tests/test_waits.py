"""The test waiters' failure messages: they say what was awaited and what was seen last."""

from __future__ import annotations

import pytest
from waits import wait_for, wait_value


def test_wait_value_returns_the_first_value_accepted() -> None:
    values = iter([1, 2, 3, 4])
    assert wait_value(lambda: next(values), lambda v: v >= 3, "three") == 3


def test_wait_for_returns_the_first_true_value() -> None:
    values = iter([None, "", "found"])
    assert wait_for(lambda: next(values)) == "found"


def test_a_timeout_names_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the answer; last: 41"):
        wait_value(lambda: 41, lambda v: v == 42, "the answer", deadline_s=0.0)


def test_without_what_a_timeout_names_the_condition_source() -> None:
    with pytest.raises(AssertionError, match=r"waiting for .*never_true.*; last: False"):
        wait_for(lambda: never_true(), deadline_s=0.0)
    with pytest.raises(AssertionError, match=r"waiting for .*never_true.*; last: False"):
        wait_value(lambda: never_true(), lambda v: v, deadline_s=0.0)


def never_true() -> bool:
    return False
