"""Remembered results of pure functions of a string (words, short queries).

A :class:`Memo` is a plain dict with a bound: a hit costs one dict lookup in C, less
than a call through ``functools.lru_cache``, which is what the tokenizer's per-word
lookups and the per-search query memos need. Keys longer than ``max_chars`` are
computed each time and never kept, so a memo of queries holds no long text.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Memo(dict[str, T]):
    """key -> ``fn(key)``, computed on first use (``memo[key]``); bounded: emptied once it
    holds ``limit`` keys. A key longer than ``max_chars`` is computed on every use and
    not kept. Misses of two threads at once compute a value twice, the same value."""

    __slots__ = ("fn", "limit", "max_chars")

    def __init__(self, fn: Callable[[str], T], limit: int, *,
                 max_chars: int = sys.maxsize) -> None:
        super().__init__()
        self.fn = fn
        self.limit = limit
        self.max_chars = max_chars

    def __missing__(self, key: str) -> T:
        value = self.fn(key)
        if len(key) <= self.max_chars:
            if len(self) >= self.limit:
                self.clear()
            self[key] = value
        return value
