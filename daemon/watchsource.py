"""Change sources for the watcher: the native notifier and a scripted double, and
:func:`default_source`, the one a watcher uses unless given another.

A source delivers batches of raw ``(Change, absolute path)`` pairs to a callback that
never blocks, and says when its watch is active through ``task_status``. The native
source stops by cancellation within one watch step; the scripted one at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Protocol

import trio


class Change(IntEnum):
    """What happened to a path: watchfiles' ``Change`` values, so its batches pass as
    they are, and ``folder``: a source that knows the path is a directory says so
    (created, moved in or out, deleted: the notes below it may have changed, whatever
    its name), and ``moved_away``: a source that can tell says a root itself was moved
    (``deleted``: removed, or gone in a way it cannot tell). Defined here because the
    native source needs no watchfiles at all (which loads its Rust extension and anyio);
    :class:`WatchfilesSource` imports it when run."""

    added = 1
    modified = 2
    deleted = 3
    folder = 4
    moved_away = 5


RawChange = tuple[Change, str]
#: Receives one batch of raw changes (absolute paths); must not block.
Emit = Callable[[set[RawChange]], None]

#: Sync cookies are hidden files with this prefix, written into the first root.
COOKIE_PREFIX = ".recalld-cookie-"


class WatchError(Exception):
    """The change source stopped or failed; the watcher restarts it with backoff."""


class WatchOverflow(WatchError):
    """The kernel's event queue overflowed: events were lost (the watcher counts it among
    its ``overflows`` and rescans)."""


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
    """The portable source: ``watchfiles.watch`` (inotify, FSEvents, kqueue or polling,
    through the notify crate), recursive, iterated in one worker thread.

    ``watchfiles.awatch`` runs under trio through anyio, but it cannot say when the watch
    is active and its thread holds a token of the default thread limiter. Here the
    generator runs in a thread under its own one-token limiter and yields on every
    ``timeout_ms`` without changes: its first yield means the notifier exists, so the watch
    is active (which bounds the start by ``timeout_ms``). Batches reach ``emit`` on the
    event loop; on cancellation a sibling task sets the stop event, which the notifier
    checks every ``step_ms``.
    """

    debounce_ms: int = 50
    step_ms: int = 20
    timeout_ms: int = 100
    force_polling: bool = False
    poll_delay_ms: int = 300

    async def run(
        self,
        roots: Sequence[Path],
        emit: Emit,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        import watchfiles

        stop = threading.Event()

        def iterate() -> None:
            started = False
            for changes in watchfiles.watch(
                *roots, watch_filter=None, debounce=self.debounce_ms, step=self.step_ms,
                stop_event=stop, rust_timeout=self.timeout_ms, yield_on_timeout=True,
                debug=False, raise_interrupt=False, force_polling=self.force_polling,
                poll_delay_ms=self.poll_delay_ms, recursive=True,
                ignore_permission_denied=True,
            ):
                if not started:
                    started = True
                    trio.from_thread.run_sync(task_status.started)
                if changes:
                    trio.from_thread.run_sync(emit, {(Change(c), p) for c, p in changes})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_set_on_cancel, stop)
            await trio.to_thread.run_sync(iterate, limiter=trio.CapacityLimiter(1))
            # Only our cancel sets the event: let the pending Cancelled land.
            await trio.lowlevel.checkpoint()
            raise WatchError("the native watch stopped")


def default_source() -> ChangeSource:
    """inotify awaited by trio where the platform has it (no thread, no polling),
    else watchfiles' notifier."""
    from recalld.daemon import inotify

    return inotify.InotifySource() if inotify.available() else WatchfilesSource()


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
