"""The watcher's settings and the records it reports.

Owns :class:`WatcherConfig` (frozen), :class:`WatcherStatus` (what ``Watcher.status``
returns), :class:`ReconcileResult` with its status record (one reconcile: why, when,
how long, what it found), :func:`describe_error`, an error as status shows it, and
:class:`WatchErrors`, the count and the last of the watcher's errors, which logs them. No
trio, no other I/O.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TypedDict

from recalld.daemon.watchpaths import IGNORE_DIRS, MisnamedStatus

__all__ = [
    "ReconcileFound", "ReconcileRecord", "ReconcileResult", "WatchErrors", "WatcherConfig",
    "WatcherStatus", "describe_error",
]

log = logging.getLogger("recalld.daemon.watcher")


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """The watcher's intervals and limits."""

    reconcile_interval_s: float = 300.0
    max_pending: int = 10_000
    sync_timeout_s: float = 2.0
    restart_backoff_initial_s: float = 1.0
    restart_backoff_max_s: float = 60.0
    # A source that ran this long before failing counts as healthy: backoff restarts.
    healthy_after_s: float = 60.0
    apply_batch_max: int = 2_000
    suffixes: tuple[str, ...] = (".md",)
    # False: report started as soon as the watch is active and run the startup reconcile
    # in the background (a first build of a large workspace takes minutes; the daemon
    # serves meanwhile and ``sync`` waits for it).
    reconcile_before_ready: bool = True
    ignore_dirs: tuple[str, ...] = IGNORE_DIRS
    # What the warning about a note whose name is not valid UTF-8 says to do.
    misnamed_hint: str = "rename it to have it indexed"
    # True: what the consumer knows outside the roots (a folder named otherwise in the
    # settings since) is applied as gone by each reconcile; its apply must take it so.
    outside_roots_gone: bool = False
    # True: the scans list the files below the roots that are there but are not read (a
    # link, a FIFO, a socket, one the system refuses to read) too, stamped
    # :data:`~recalld.daemon.watchpaths.UNREAD_STAMP`, so the consumer records them (and
    # gives them that stamp in ``known()``) whether they were made while it watched or
    # not. A link to a folder is not listed: it is not descended either.
    unread_listed: bool = False


class ReconcileFound(TypedDict):
    added: int
    changed: int
    deleted: int


class ReconcileRecord(TypedDict):
    """A reconcile as status shows it."""

    reason: str
    time: float
    duration_s: float
    found: ReconcileFound


class WatcherStatus(TypedDict):
    state: str
    why: str | None
    roots: list[str]
    last_change_applied: float | None
    pending: int
    #: While a reconcile lists the notes on disk: how many it has found so far.
    listed: int | None
    rescan_owed: str | None
    last_reconcile: ReconcileRecord | None
    errors: int
    last_error: str | None
    last_error_at: float | None
    restarts: int
    overflows: int
    sync_fallbacks: int
    max_pending_seen: int
    misnamed: MisnamedStatus  # notes passed by: their name is not valid UTF-8


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What one reconcile of the folder with the index found."""

    reason: str
    time: float
    added: int
    changed: int
    deleted: int
    duration_s: float

    def as_dict(self) -> ReconcileRecord:
        return {
            "reason": self.reason, "time": self.time, "duration_s": self.duration_s,
            "found": {"added": self.added, "changed": self.changed, "deleted": self.deleted},
        }


def describe_error(exc: BaseException) -> str:
    """An error as status shows it: its type and message, the first real cause of a group
    (nurseries wrap failures in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


#: How many causes of one work :class:`WatchErrors` remembers as said.
LASTING_CAUSES = 8


@dataclass(slots=True)
class WatchErrors:
    """The watcher's errors: how many, the last and when (wall clock, for status).

    Each is logged as a warning, but an error of a work said before (a retry of a
    lasting cause: a link in place of a root, even after another cause came between)
    only at debug level, until that work is :meth:`recovered`; at most
    ``LASTING_CAUSES`` causes of a work are kept. An error said in words (of the
    ``explained`` type, alone or as every error of a group) has no traceback.
    """

    workspace: str
    count: int = 0
    last: str | None = None
    last_at: float | None = None
    #: work -> the errors said of it since it last worked, oldest first
    lasting: dict[str, dict[str, None]] = field(default_factory=dict)

    def record(self, what: str, exc: BaseException, *,
               explained: type[Exception] | tuple[type[Exception], ...]) -> None:
        error = f"{what}: {describe_error(exc)}"
        said = isinstance(exc, explained) or (
            isinstance(exc, BaseExceptionGroup) and exc.split(explained)[1] is None)
        causes = self.lasting.setdefault(what, {})
        again = error in causes
        self.count, self.last, self.last_at = self.count + 1, error, time.time()
        causes.pop(error, None)
        causes[error] = None
        while len(causes) > LASTING_CAUSES:
            del causes[next(iter(causes))]
        log.log(logging.DEBUG if again else logging.WARNING, "watcher of %s: %s",
                self.workspace, error, exc_info=None if said else exc)

    def recovered(self, what: str) -> None:
        self.lasting.pop(what, None)
