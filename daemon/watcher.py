"""Live watching of one workspace's Markdown roots, with reconcile scans as the safety net.

Owns the change source (native inotify awaited by trio, watchfiles elsewhere, or a scripted
double in tests), the pending set of changed paths, and reconcile scans. ``Watcher.run``
starts the source (restarted with exponential backoff after errors), a flush task that
hands coalesced batches to the consumer, and a periodic reconcile task; it stops by
cancellation, within one watch step (the native watch thread has a stop event).

The consumer re-reads every path it is given (present: index it; absent: drop it), so event
types never matter: editors' temp-file-and-rename saves, swap files, renames and directory
moves all end correct as long as each affected path is reported. Directory events are
expanded (``watchpaths.py``'s scans) to the files below them, on disk and in the consumer's
snapshot (``known``). inotify loses events silently on queue overflow and during restarts,
so a reconcile scan (disk ``(mtime_ns, size)`` against ``known``) runs at start, every
``reconcile_interval_s``, after watcher errors and when the pending set overflows. A root a
scan cannot list (gone, unreadable) removes nothing and is scanned again with backoff until
it lists; one moved away is not recreated. Paths are workspace-relative with ``/``
(``memory/2026-07-23/commute.md``). Notes and disk scans: ``watchpaths.py``; settings and
status records: ``watchrecords.py``; syncs: ``watchsync.py``; a reconcile's background
token: ``watchtoken.py``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import trio

from recalld.daemon.store.errors import WorkspaceMissing
from recalld.daemon.watchpaths import Stamp, WatchedRoots, mtime_stamp
from recalld.daemon.watchrecords import (
    ReconcileResult,
    WatcherConfig,
    WatchErrors,
    WatcherStatus,
    describe_error,
)
from recalld.daemon.watchsource import (
    COOKIE_PREFIX,
    Change,
    ChangeSource,
    RawChange,
    WatchError,
    WatchOverflow,
    default_source,
)
from recalld.daemon.watchsync import CookieSync
from recalld.daemon.watchtoken import RunSync, ScanToken, in_thread

__all__ = ["Watcher"]

log = logging.getLogger(__name__)

Known = Callable[[], Mapping[str, tuple[int, int]]]
Apply = Callable[[set[str]], Awaitable[None]]


def _caused_by(exc: BaseException, kind: type[Exception]) -> bool:
    """Whether ``exc`` is a ``kind``, alone or in a group (a nursery wraps failures)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(kind) is not None
    return isinstance(exc, kind)


class Watcher(CookieSync):
    """Keeps one workspace's consumer in step with the Markdown files under ``roots``
    (workspace-relative folders: ``daily_dir``, ``digest_dir``; created when missing).

    ``known()`` returns the consumer's snapshot, workspace-relative path to the stamp of
    each file as it last read it, ``stamp`` of its stat (``(mtime_ns, size)`` by
    default); ``apply(paths)`` makes the consumer re-read each path (present: index it,
    absent: drop it); ``apply`` calls never overlap. ``hold``, if given, is awaited before
    the watch is set up: the watcher reports started at once with the startup reconcile
    owed, and watches, reconciles and applies once it returns (the daemon's start has
    ended); the reconcile's scan comes after the watch, so it finds every change made
    before."""

    def __init__(
        self,
        workspace: Path,
        roots: Sequence[str],
        *,
        apply: Apply,
        known: Known,
        source: ChangeSource | None = None,
        config: WatcherConfig | None = None,
        limiter: trio.CapacityLimiter | None = None,
        background: trio.CapacityLimiter | None = None,
        wall: Callable[[], float] = time.time,
        run_sync: RunSync | None = None,
        hold: Callable[[], Awaitable[None]] | None = None,
        stamp: Stamp = mtime_stamp,
    ) -> None:
        if not roots:
            raise ValueError("at least one root to watch")
        self._config = config or WatcherConfig()
        self._paths = WatchedRoots(workspace, roots, suffixes=self._config.suffixes,
                                   ignore_dirs=self._config.ignore_dirs,
                                   misnamed_hint=self._config.misnamed_hint,
                                   unread_listed=self._config.unread_listed, stamp=stamp)
        # Read-only copies of what the paths hold (nothing changes them).
        self._workspace = self._paths.workspace
        self._root_rels = self._paths.root_rels
        self._roots = self._paths.roots
        self._apply = apply
        self._known = known
        self._source: ChangeSource = source if source is not None else default_source()
        self._limiter = limiter
        # Taken before ``limiter`` by the scans nobody waits for (startup, periodic and owed
        # reconciles); a reconcile a caller waits for (a sync, a restore) takes only ``limiter``.
        self._background = background
        self._wall = wall
        # Disk work runs in worker threads; tests under a fake clock run it inline.
        self._run_sync: RunSync = run_sync or in_thread
        self._hold = hold
        self._set_up = trio.Event()  # the watch is set up (or failed, retried in the back)
        self._never_watched = False  # stopped before its watch was set up
        self._ended = False  # run() returned: no batch is applied any more
        self._pending: set[str] = set()
        self._pending_dirs: set[str] = set()
        self._rescan: str | None = None  # a reconcile the flush task owes, and why
        self._wake = trio.Event()
        self._apply_lock = trio.Lock()
        self._received_seq = 0
        self._applied_seq = 0
        self._cookies: dict[str, trio.Event] = {}
        self._cookie_seen: dict[str, int] = {}
        self._cookie_n = 0
        self._source_scope: trio.CancelScope | None = None
        self._watch_state = "starting"
        self._why: str | None = None
        self._rescanning = False
        #: The notes a reconcile's scan under way has listed so far (None: none scans).
        self._listing: dict[str, tuple[int, int]] | None = None
        self._unlisted: dict[str, str] = {}  # roots the last scan could not list, and why
        self._unlisted_found = trio.Event()
        self._moved_away: set[str] = set()  # lost roots not to recreate
        self._errors = WatchErrors(str(self._workspace))
        self._restarts = 0
        self._sync_fallbacks = 0
        self._overflows = 0
        self._max_pending_seen = 0
        self._last_change_applied: float | None = None
        self._last_reconcile: ReconcileResult | None = None
        self._reconciled = trio.Event()  # a reconcile applied every difference it found
        #: Called with ``(disk, known)`` after every reconcile's scan, before it applies
        #: the differences: others that need the disk's state (health) need not scan again.
        self.scan_listeners: list[Callable[[Mapping[str, tuple[int, int]],
                                            Mapping[str, tuple[int, int]]], None]] = []
        #: ``(n, fn)``: ``fn()`` is called from a reconcile scan's worker thread once the
        #: scan has found ``n`` notes, so a consumer can get ready for a large apply while
        #: the listing goes on (other scans, health's or a rebuild's, apply nothing).
        self.scan_reached: tuple[int, Callable[[], None]] | None = None
        #: Called with a root's relative path when it is removed or moved away.
        self.root_lost: list[Callable[[str], None]] = []

    def is_note(self, rel: str) -> bool:
        """Whether a workspace-relative path names a file the consumer indexes."""
        return self._paths.is_note(rel)

    # -- ingest (called by the source; never blocks) ----------------------------------------

    def _ingest(self, batch: set[RawChange]) -> None:
        self._received_seq += 1
        seq = self._received_seq
        for change, path in batch:
            rel = self._paths.relative(path)
            if rel is None:
                continue
            name = rel.rsplit("/", 1)[-1]
            if name.startswith(COOKIE_PREFIX):
                if name in self._cookies:
                    self._cookie_seen.setdefault(name, seq)
                continue
            if rel in self._root_rels:
                if change == Change.moved_away:
                    # Not recreated: `mv memory x; mv x memory` must not end as memory/x.
                    self._moved_away.add(rel)
                if change in (Change.deleted, Change.moved_away):
                    for lost in self.root_lost:  # told at once: an inode may be reused
                        lost(rel)
                    self._lose_root()
                else:  # its mode changed (chmod): whether it can be listed may have too
                    self._request_rescan(f"{rel} changed")
                continue
            if self._rescan is not None:
                continue  # a full reconcile is owed anyway
            if self._paths.misnamed_change(rel, change):
                # Notes never indexed, but counted where status and verify name them:
                # only a scan recounts them (such names are rare).
                self._request_rescan("a note whose name is not valid UTF-8 changed")
            elif change == Change.folder:
                if not self._paths.passed_by(rel):
                    self._pending_dirs.add(rel)
            elif self.is_note(rel):
                self._pending.add(rel)
            elif self._paths.maybe_dir(rel):
                self._pending_dirs.add(rel)
            if len(self._pending) + len(self._pending_dirs) > self._config.max_pending:
                self._overflows += 1
                self._request_rescan("pending set overflow")
        self._max_pending_seen = max(self._max_pending_seen, self.pending_count())
        self._wake.set()

    def _lose_root(self) -> None:
        # inotify drops the watch with the directory: restart the source on a new one.
        if self._source_scope is not None:
            self._source_scope.cancel()

    def _request_rescan(self, reason: str) -> None:
        self._pending.clear()
        self._pending_dirs.clear()
        if self._rescan is None:
            self._rescan = reason
        self._wake.set()

    async def wait_reconciled(self) -> None:
        """Return once a reconcile (the startup one, first) has compared the disk with
        what the consumer knows and applied every difference: what the consumer loaded
        from before the start is then what the notes hold. Cancellation changes nothing."""
        await self._reconciled.wait()

    def pending_count(self) -> int:
        return len(self._pending) + len(self._pending_dirs)

    # -- what is on disk and what the consumer knows ---------------------------------------

    def scan(self, reached: tuple[int, Callable[[], None]] | None = None,
             ) -> dict[str, tuple[int, int]]:
        """Every note under the roots with its ``(mtime_ns, size)`` (blocking);
        ``reached``: as :attr:`scan_reached`, for this scan."""
        return self._paths.scan(reached)

    def misnamed(self) -> list[str]:
        """The notes the last scan passed by because their name is not valid UTF-8, as
        shown (see :meth:`WatchedRoots.misnamed_shown`)."""
        return self._paths.misnamed_shown()

    def _known_here(self) -> dict[str, tuple[int, int]]:
        # Only what lies under the watched roots takes part in the comparison.
        prefixes = tuple(r + "/" for r in self._root_rels)
        return {p: (int(v[0]), int(v[1])) for p, v in self._known().items()
                if p.startswith(prefixes)}

    # -- applying ----------------------------------------------------------------------------

    async def _apply_all(self, paths: set[str]) -> None:
        ordered = sorted(paths)
        step = self._config.apply_batch_max
        for i in range(0, len(ordered), step):
            await self._apply(set(ordered[i:i + step]))
        if ordered:
            self._last_change_applied = self._wall()

    async def reconcile(self, reason: str = "requested", *,
                        unattended: bool = False) -> ReconcileResult:
        """Compare the disk with ``known()`` and apply every difference.

        ``unattended``: nobody waits for it, so its scan waits for a background token too,
        taken before the apply lock: edits and reconciles someone waits for never queue
        behind that wait.
        Raises what the consumer's ``apply`` raises. On cancellation some batches may be
        applied and others not; the next reconcile finds the rest.
        """
        token = ScanToken(self._background if unattended else None)
        async with token.then(self._apply_lock):
            return await self._reconcile_locked(reason, token)

    async def _reconcile_locked(self, reason: str, token: ScanToken) -> ReconcileResult:
        self._rescanning = True
        start = trio.current_time()
        try:
            # Listing from now (while waiting for a token too): what the disk holds is
            # unknown until the scan ends.
            self._listing = {}
            try:
                async with token:
                    disk, unlisted = await self._run_sync(
                        partial(self._paths.scan_roots, self.scan_reached, self._listing),
                        limiter=self._limiter)
            finally:
                self._listing = None
            known = self._known_here()
            for listener in self.scan_listeners:
                listener(disk, known)
            self._unlisted = unlisted
            if unlisted:
                self._unlisted_found.set()
            # What a root that could not be listed holds is unknown: nothing of it is gone.
            unknown = tuple(r + "/" for r in unlisted)
            added = disk.keys() - known.keys()
            deleted = {p for p in known.keys() - disk.keys() if not p.startswith(unknown)}
            if self._config.outside_roots_gone:
                deleted |= self._known().keys() - known.keys()
            changed = {p for p in disk.keys() & known.keys() if disk[p] != known[p]}
            await self._apply_all(added | deleted | changed)
        finally:
            self._rescanning = False
        result = ReconcileResult(reason, self._wall(), len(added), len(changed), len(deleted),
                                 trio.current_time() - start)
        self._last_reconcile = result
        self._reconciled.set()
        if added or changed or deleted:
            log.info("reconcile (%s) of %s: %d added, %d changed, %d deleted", reason,
                     self._workspace, len(added), len(changed), len(deleted))
        return result

    async def _relist_loop(self) -> None:
        # A root a reconcile could not list is scanned again with backoff until it lists
        # (moved back, readable again: not every way back makes an event).
        while True:
            await self._unlisted_found.wait()
            backoff = self._config.restart_backoff_initial_s
            while self._unlisted:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self._config.restart_backoff_max_s)
                try:
                    await self.reconcile("a root could not be listed", unattended=True)
                except Exception as exc:
                    self._record_error("reconcile failed", exc)
            self._unlisted_found = trio.Event()

    async def _flush(self) -> None:
        # An owed rescan is unattended: its token first, as in ``reconcile`` (one owed
        # after this look takes a token under the lock only if one is free).
        token = ScanToken(self._background)
        async with token.then(self._apply_lock, now=self._rescan is not None):
            upto = self._received_seq
            if self._rescan is not None:
                reason, self._rescan = self._rescan, None
                token.take_if_free()
                await self._reconcile_locked(reason, token)
            else:
                files, dirs = self._pending, self._pending_dirs
                self._pending, self._pending_dirs = set(), set()
                if dirs:
                    files |= await self._run_sync(
                        self._paths.expand_dirs, dirs, self._known_here(), limiter=self._limiter)
                    if self._paths.unlisted_seen:  # kept, and a scan says why
                        self._request_rescan("a folder could not be listed")
                if files:
                    files = await self._run_sync(self._paths.with_other_names, files,
                                                 limiter=self._limiter)
                await self._apply_all(files)
            self._applied_seq = max(self._applied_seq, upto)
            for name, seq in self._cookie_seen.items():
                if seq <= self._applied_seq and name in self._cookies:
                    self._cookies[name].set()

    async def _flush_loop(self) -> None:
        backoff = self._config.restart_backoff_initial_s
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self._flush()
                backoff = self._config.restart_backoff_initial_s
                self._errors.recovered("apply failed")
            except Exception as exc:
                # The paths left pending are unknown now: a reconcile finds them again.
                self._record_error("apply failed", exc)
                self._request_rescan(f"retry after apply error: {exc}")
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self._config.restart_backoff_max_s)

    async def _periodic_loop(self) -> None:
        while True:
            await trio.sleep(self._config.reconcile_interval_s)
            try:
                await self.reconcile("periodic", unattended=True)
                self._errors.recovered("periodic reconcile failed")
            except Exception as exc:
                self._record_error("periodic reconcile failed", exc)

    def _record_error(self, what: str, exc: BaseException) -> None:
        # The workspace folder gone (moved away, removed) is said in words, as a use says it.
        self._errors.record(what, exc, explained=(WatchError, WorkspaceMissing))

    # -- the native watch, restarted with backoff -----------------------------------------------

    async def _watch_loop(self, *, task_status: trio.TaskStatus[None]) -> None:
        backoff = self._config.restart_backoff_initial_s
        started = False
        while True:
            began = trio.current_time()
            try:
                await self._run_sync(self._paths.make_roots, frozenset(self._moved_away))
                with trio.CancelScope() as scope:
                    self._source_scope = scope
                    async with trio.open_nursery() as nursery:
                        await nursery.start(partial(self._source.run, self._roots, self._ingest))
                        self._watch_state, self._why = "watching", None
                        self._errors.recovered("watch failed")
                        self._moved_away.clear()
                        if started:
                            self._request_rescan("watch restarted")
                            await self._rewrite_cookies()
                        else:
                            started = True
                            task_status.started()
                self._source_scope = None
                if not scope.cancelled_caught:
                    raise WatchError("the change source stopped")
                self._restarts += 1
                self._why = "a watched root was removed; watching again"
                continue  # at once (a removed root is recreated, a moved one is not)
            except Exception as exc:
                self._source_scope = None
                if _caused_by(exc, WatchOverflow):  # events lost, as a pending set's overflow
                    self._overflows += 1
                self._record_error("watch failed", exc)
                self._watch_state, self._why = "failed", describe_error(exc)
                if not started:
                    # Serve degraded (reconcile only) rather than not at all.
                    started = True
                    task_status.started()
                self._request_rescan("after watch error")
            if trio.current_time() - began >= self._config.healthy_after_s:
                backoff = self._config.restart_backoff_initial_s
            await trio.sleep(backoff)
            backoff = min(backoff * 2, self._config.restart_backoff_max_s)
            self._restarts += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled. Started once the native watch is active (or failed: it
        serves by reconcile alone and keeps retrying) and, unless ``reconcile_before_ready``
        is off, the startup reconcile has applied every change made while the daemon was
        down. With a ``hold``: started at once, the rest after it."""
        try:
            await self._run(task_status)
        finally:
            # Stopped (the workspace closed or failed): a sync waiting for its cookie's
            # batch, which nobody applies now, ends at once instead of waiting on.
            self._ended = True
            for done in self._cookies.values():
                done.set()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        hold = None if self._config.reconcile_before_ready else self._hold
        async with trio.open_nursery() as nursery:
            if not self._config.reconcile_before_ready:
                self._request_rescan("startup")  # the flush task runs it first
            try:
                if hold is not None:
                    task_status.started()
                    await hold()
                await nursery.start(self._watch_loop)
            except BaseException:
                # Stopped (the workspace closed or failed) before its watch was set up: a
                # sync waiting for the watch must not wait for ever.
                self._never_watched = True
                self._set_up.set()
                raise
            self._set_up.set()
            if self._config.reconcile_before_ready:
                await self.reconcile("startup", unattended=True)
            nursery.start_soon(self._flush_loop)
            nursery.start_soon(self._periodic_loop)
            nursery.start_soon(self._relist_loop)
            if hold is None:
                task_status.started()

    # -- status ------------------------------------------------------------------------------

    @property
    def reconcile_interval_s(self) -> float:
        """How long the periodic reconcile waits after one ends before it scans again."""
        return self._config.reconcile_interval_s

    @property
    def state(self) -> str:
        if self._watch_state == "failed" or self._unlisted:
            return "failed"
        return "rescanning" if self._rescanning else self._watch_state

    def status(self) -> WatcherStatus:
        last = self._last_reconcile
        return {
            "state": self.state,
            "why": self._why or "; ".join(f"cannot list {rel}: {why}"
                                          for rel, why in self._unlisted.items()) or None,
            "roots": list(self._root_rels),
            "last_change_applied": self._last_change_applied,
            "pending": self.pending_count(),
            "listed": None if self._listing is None else len(self._listing),
            "rescan_owed": self._rescan,
            "last_reconcile": None if last is None else last.as_dict(),
            "errors": self._errors.count,
            "last_error": self._errors.last,
            "last_error_at": self._errors.last_at,
            "restarts": self._restarts,
            "overflows": self._overflows,
            "sync_fallbacks": self._sync_fallbacks,
            "max_pending_seen": self._max_pending_seen,
            "misnamed": self._paths.misnamed_status(),
        }
