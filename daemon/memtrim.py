"""Give freed heap memory back to the system after large transient allocations.

A first build or a commit of a large index allocates hundreds of MB of short-lived
objects (token lists, serialized records) in worker threads. glibc keeps freed memory in
per-thread arenas, so without a trim the daemon's resident size stays at its build-time
peak for good. ``malloc_trim(0)`` returns the free tops and pages of every arena.

glibc also gives each thread that allocates its own arena (up to 8 per core), and a
long-lived object left in one pins that arena's pages: after a build, memory freed in
the worker threads' arenas stays resident around a few survivors. :func:`limit_arenas`
caps them (``mallopt(M_ARENA_MAX)``, what ``MALLOC_ARENA_MAX`` does) before the first
thread starts; the daemon's threads take the GIL for almost every allocation anyway,
so they hardly ever contend for an arena.

Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

from recalld.daemon.libc import libc as _libc

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: ``M_MMAP_THRESHOLD`` and ``M_ARENA_MAX`` of glibc's ``<malloc.h>``.
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    libc = _libc()
    try:
        fn = libc.malloc_trim if libc is not None else None
    except AttributeError:
        return None
    if fn is None:
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


def collect() -> bool:
    """Collect garbage of every generation (cycles included), then :func:`trim`."""
    gc.collect()
    return trim()


def limit_arenas(count: int) -> bool:
    """Let malloc use at most ``count`` arenas from now on (call before threads start);
    False where that is not possible. ``MALLOC_ARENA_MAX`` in the environment wins."""
    if count < 1 or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return _mallopt(_M_ARENA_MAX, count)


def map_large(min_bytes: int) -> bool:
    """Give every block of ``min_bytes`` or more a mapping of its own, returned to the
    system when freed; False where that is not possible. ``MALLOC_MMAP_THRESHOLD_`` in
    the environment wins.

    glibc raises this threshold by itself (up to 32 MB) each time a mapped block is
    freed, so after a build's merges its large arrays come from the heap, and numpy
    marks the ranges of arrays of 4 MB or more for transparent huge pages: freed, such
    a range can stay resident as a whole 2 MB page that a trim does not split.
    """
    if min_bytes < 1 or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    return _mallopt(_M_MMAP_THRESHOLD, min_bytes)


def _mallopt(param: int, value: int) -> bool:
    libc = _libc()
    if libc is None:
        return False
    try:
        mallopt = libc.mallopt
    except AttributeError:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(param, value))


def trimmed(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``fn(*args)``, then :func:`trim` (for worker processes: this module is light)."""
    try:
        return fn(*args)
    finally:
        trim()
