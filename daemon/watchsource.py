"""Change sources for the watcher: the native notifier and a scripted double.

A source delivers batches of raw ``(Change, absolute path)`` pairs to a callback that
never blocks, and says when its watch is active through ``task_status``. The native
source stops by cancellation within one watch step; the scripted one at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import trio
from watchfiles import Change
from watchfiles._rust_notify import RustNotify

RawChange = tuple[Change, str]
#: Receives one batch of raw changes (absolute paths); must not block.
Emit = Callable[[set[RawChange]], None]

#: Sync cookies are hidden files with this prefix, written into the first root.
COOKIE_PREFIX = ".recalld-cookie-"


class WatchError(Exception):
    """The change source stopped or failed; the watcher restarts it with backoff."""


class ChangeSource(Protocol):
    """Delivers batches of raw changes below ``roots`` to ``emit`` until cancelled.

    ``task_status.started()`` means the watch is active: every change made after it will
    be delivered (unless the kernel drops it, which reconcile covers). Returning or
    raising means the watch is over; the watcher restarts it.
    """

    async def run(
        self,
        roots: Sequence[Path],
        emit: Emit,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None: ...


async def _set_on_cancel(stop: threading.Event) -> None:
    try:
        await trio.sleep_forever()
    finally:
        stop.set()


@dataclass(frozen=True, slots=True)
class WatchfilesSource:
    """The native source: watchfiles' Rust notifier (inotify on Linux), recursive.

    ``watchfiles.awatch`` runs under trio through anyio, but it cannot say when the watch
    is active, its constructor blocks the event loop, its thread holds a token of the
    default thread limiter, and a cancel waits up to its rust timeout (5 s). Driving the
    notifier directly fixes all four: it is built in a worker thread, waits in a thread
    under its own one-token limiter, and a sibling task sets its stop event on cancel.
    """

    debounce_ms: int = 50
    step_ms: int = 20
    idle_timeout_ms: int = 30_000
    force_polling: bool = False
    poll_delay_ms: int = 300

    async def run(
        self,
        roots: Sequence[Path],
        emit: Emit,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        limiter = trio.CapacityLimiter(1)
        notify = await trio.to_thread.run_sync(
            partial(RustNotify, [str(r) for r in roots], False, self.force_polling,
                    self.poll_delay_ms, True, True),
            limiter=limiter,
        )
        stop = threading.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_set_on_cancel, stop)
                task_status.started()
                while True:
                    raw = await trio.to_thread.run_sync(
                        notify.watch, self.debounce_ms, self.step_ms, self.idle_timeout_ms,
                        stop, limiter=limiter,
                    )
                    if raw == "stop":
                        # Only our cancel sets the event: let the pending Cancelled land.
                        await trio.lowlevel.checkpoint()
                        raise WatchError("the native watch stopped")
                    if isinstance(raw, set):
                        emit({(Change(kind), path) for kind, path in raw})
        finally:
            notify.close()


class ScriptedChangeSource:
    """A change source driven by the test: ``emit`` delivers, ``silent`` drops, ``fail``
    breaks the running watch (as an inotify error would)."""

    def __init__(self) -> None:
        self.silent = False
        self.starts = 0
        self.roots: list[Path] = []
        self._emit: Emit | None = None
        self._failure: BaseException | None = None
        self._wake = trio.Event()
        self.running = trio.Event()

    async def run(
        self,
        roots: Sequence[Path],
        emit: Emit,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.starts += 1
        self.roots = list(roots)
        self._emit = emit
        self.running.set()
        task_status.started()
        try:
            while self._failure is None:
                await self._wake.wait()
                self._wake = trio.Event()
            failure, self._failure = self._failure, None
            raise failure
        finally:
            self._emit = None
            self.running = trio.Event()

    def emit(self, changes: Iterable[tuple[Change, str | os.PathLike[str]]]) -> bool:
        """Deliver one batch now; False when dropped (silent or not running)."""
        if self.silent or self._emit is None:
            return False
        self._emit({(change, os.fspath(path)) for change, path in changes})
        return True

    def emit_cookies(self) -> bool:
        """Deliver the sync cookies present in the roots (what inotify would report)."""
        found = [
            (Change.added, entry.path)
            for root in self.roots if root.is_dir()
            for entry in os.scandir(root) if entry.name.startswith(COOKIE_PREFIX)
        ]
        return bool(found) and self.emit(found)

    def fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._wake.set()
