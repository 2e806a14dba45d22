"""A watcher's freshness: :meth:`~recalld.daemon.watcher.Watcher.sync` returns once every
change made before the call has been applied, by a sync cookie written into the first root
and seen coming back through the watch, or by a reconcile when the watch cannot tell.

Owns the cookies of the syncs under way (written again after a watch restart), nothing
else: the watch, its batches and reconciles are the watcher's (``watcher.py``), whose
state this mixin reads. It starts no task; a cancelled sync removes its cookie.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

from recalld.daemon.watchpaths import WatchedRoots
from recalld.daemon.watchrecords import ReconcileResult, WatcherConfig, WatchErrors
from recalld.daemon.watchsource import COOKIE_PREFIX
from recalld.daemon.watchtoken import RunSync
from recalld.ipc.errors import UnknownWorkspace

__all__ = ["CookieSync"]

# The syncs are the watcher's: they log under its name.
log = logging.getLogger("recalld.daemon.watcher")


class CookieSync:
    """The sync half of :class:`~recalld.daemon.watcher.Watcher` (a mixin: the watcher
    sets every attribute below)."""

    _config: WatcherConfig
    _paths: WatchedRoots
    _run_sync: RunSync
    _hold: Callable[[], Awaitable[None]] | None
    _set_up: trio.Event
    _never_watched: bool
    _ended: bool
    _workspace: Path
    _watch_state: str
    _unlisted: dict[str, str]
    _cookies: dict[str, trio.Event]
    _cookie_seen: dict[str, int]
    _cookie_n: int
    _errors: WatchErrors
    _apply_lock: trio.Lock
    _wake: trio.Event
    _sync_fallbacks: int
    _moved_away: set[str]
    _pending: set[str]
    _rescan: str | None

    def _known_here(self) -> dict[str, tuple[int, int]]:
        raise NotImplementedError

    async def reconcile(self, reason: str = "requested", *,
                        unattended: bool = False) -> ReconcileResult:
        raise NotImplementedError

    async def sync(self) -> None:
        """Return once every change made before the call has been applied: a cookie file
        written into the first root, its event arrived and the batch holding everything
        before it applied. A cookie not seen within ``sync_timeout_s`` (events lost, watch
        down) is a reconcile instead; one seen while an apply still runs is waited for. On
        cancellation the cookie is removed and nothing else changes. A held watcher's
        sync waits for its watch, after the hold. One under way when the watcher stops (the
        workspace failed or closed), or made after, raises UnknownWorkspace."""
        if self._hold is not None:
            await self._set_up.wait()
            if self._never_watched:
                raise UnknownWorkspace("the workspace stopped before it was watched")
        self._check_running()
        if self._watch_state != "watching" or self._unlisted:
            await self._sync_by_reconcile("sync without a watch")
            return
        if self._paths.has_other_names():
            await self._queue_changed_links()
        self._cookie_n += 1
        name = f"{COOKIE_PREFIX}{os.getpid()}-{self._cookie_n}"
        done = trio.Event()
        errors = self._errors.count
        self._cookies[name] = done
        try:
            try:
                await self._run_sync(self._paths.mark, name)
            except OSError as exc:  # no root, or a link in its place: never written there
                log.debug("sync cookie %s not written: %s", name, exc)
            else:
                while True:
                    with trio.move_on_after(self._config.sync_timeout_s):
                        await done.wait()
                        self._check_running()
                        return
                    # The cookie came, and the batch holding it waits behind an apply
                    # still running or owed (a first build's reconcile takes seconds):
                    # the events flow, so wait for it rather than scan the disk after
                    # it. An apply that failed meanwhile ends the wait: the reconcile
                    # below raises its error to the caller.
                    owed = self._apply_lock.locked() or self._wake.is_set()
                    if name not in self._cookie_seen or errors != self._errors.count or not owed:
                        break
            self._sync_fallbacks += 1
            await self._sync_by_reconcile("sync cookie not seen")
        finally:
            self._cookies.pop(name, None)
            self._cookie_seen.pop(name, None)
            with trio.CancelScope(shield=True):
                try:
                    await self._run_sync(partial(self._paths.mark, name, remove=True))
                except OSError as exc:  # the root is a file now, or unreadable
                    log.debug("sync cookie %s not removed: %s", name, exc)

    async def _queue_changed_links(self) -> None:
        # A note with more than one name may have changed through a name outside the
        # roots, which no event says: what differs is applied with the cookie's batch.
        changed = await self._run_sync(self._paths.changed_links, self._known_here())
        if changed and self._rescan is None:  # an owed reconcile finds them anyway
            self._pending |= changed
            self._wake.set()

    def _check_running(self) -> None:
        if self._ended:
            raise UnknownWorkspace(f"the workspace at {self._workspace} stopped before the "
                                   "change was indexed (it failed or was closed; what was "
                                   "written stays on disk and is indexed once it opens "
                                   "again)")

    async def _sync_by_reconcile(self, reason: str) -> None:
        # A root removed (rm -r memory) is made again first, as the watch's restart does,
        # so the scan finds it empty instead of keeping its notes as unknown.
        await self._run_sync(self._paths.make_removed_roots, frozenset(self._moved_away))
        await self.reconcile(reason)

    async def _rewrite_cookies(self) -> None:  # those written while no watch saw them
        for name in list(self._cookies):
            try:
                await self._run_sync(self._paths.mark, name)
                if name not in self._cookies:  # its sync ended meanwhile: leave no trace
                    await self._run_sync(partial(self._paths.mark, name, remove=True))
            except OSError as exc:
                log.debug("sync cookie %s not written again: %s", name, exc)
