"""Remembered results of pure functions of a string.

:class:`Memo` is a plain dict with a bound: a hit costs one dict lookup in C, which is
what the tokenizer's per-word lookups need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Memo(dict[str, T]):
    """key -> ``fn(key)``, computed on first use (``memo[key]``); bounded: emptied once it
    holds ``limit`` keys. Misses of two threads at once compute a value twice, the same
    value."""

    __slots__ = ("fn", "limit")

    def __init__(self, fn: Callable[[str], T], limit: int) -> None:
        super().__init__()
        self.fn = fn
        self.limit = limit

    def __missing__(self, key: str) -> T:
        if len(self) >= self.limit:
            self.clear()
        value = self[key] = self.fn(key)
        return value

