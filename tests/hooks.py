"""A test's hook run at the start of a daemon function, in whatever thread calls it:
to hold a merge or a copy at a known point, or to make it fail there."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def run_first(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
              hook: Callable[[], None]) -> None:
    """Replace ``owner.name`` (for the test) by a function that calls ``hook()`` and then
    the real one with the same arguments."""
    real = getattr(owner, name)

    def first(*args: object, **kwargs: object) -> object:
        hook()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, first)
