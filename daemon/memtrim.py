"""Give freed heap memory back to the system after large transient allocations.

A first build or a commit of a large index allocates hundreds of MB of short-lived
objects (token lists, serialized records) in worker threads. glibc keeps freed memory in
per-thread arenas, so without a trim the daemon's resident size stays at its build-time
peak for good. ``malloc_trim(0)`` returns the free tops and pages of every arena.
Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim() -> bool:
    """Return free heap memory to the system; False where that is not possible."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


def trimmed(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, then :func:`trim` (for worker processes: this module is light)."""
    try:
        return fn(*args)
    finally:
        trim()
