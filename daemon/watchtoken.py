"""The background token a watcher's reconcile takes for its scan.

Owns :class:`ScanToken`: a reconcile nobody waits for (at startup, periodic, owed) takes
one of the background limiter's tokens before the watcher's apply lock, so that edits and
reconciles someone waits for never queue behind that wait. The reconcile itself is
``Watcher.reconcile``. Also :class:`RunSync`, how the watcher runs its disk work off the
event loop (:func:`in_thread`, a worker thread, unless a test runs it inline).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar, TypeVarTuple

import trio

__all__ = ["RunSync", "ScanToken", "in_thread"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class RunSync(Protocol):
    """Runs a blocking ``fn(*args)`` off the event loop (in a worker thread by default)."""

    async def __call__(self, fn: Callable[[*Ts], T], *args: *Ts,
                       limiter: trio.CapacityLimiter | None = None) -> T: ...


async def in_thread(fn: Callable[[*Ts], T], *args: *Ts,
                    limiter: trio.CapacityLimiter | None = None) -> T:
    """Run ``fn(*args)`` in a worker thread (the default :class:`RunSync`)."""
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter)


class ScanToken:
    """A background token for one reconcile's scan, in the calling task: taken before the
    apply lock (``then``), or under it only if one is free (``take_if_free``), and given
    back once the scan is done (the ``async with`` around it). No limiter: nothing to
    take."""

    def __init__(self, limiter: trio.CapacityLimiter | None) -> None:
        self._limiter = limiter
        self._held = False

    async def __aenter__(self) -> None:
        if self._limiter is not None and not self._held:
            await self._limiter.acquire()
            self._held = True

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def take_if_free(self) -> None:
        """Under the apply lock: the token if one is free, else none for this scan.
        Waiting for it there could wait for a task that holds one and waits for the lock
        (an unattended reconcile)."""
        if self._limiter is None or self._held:
            return
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            self._limiter = None  # scanned without: the lock is held, nothing may wait
        else:
            self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            assert self._limiter is not None
            self._limiter.release()

    @asynccontextmanager
    async def then(self, lock: trio.Lock, *, now: bool = True) -> AsyncIterator[None]:
        """The token (when ``now``), then ``lock``; the token is given back on the way out
        if the scan did not give it back already."""
        try:
            if now:
                await self.__aenter__()
            async with lock:
                yield
        finally:
            self.release()
