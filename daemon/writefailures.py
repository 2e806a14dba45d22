"""A workspace's failing note writes, by cause, for its health.

A note that cannot be written (a full disk or quota, a read-only file system, no
permission) is refused to its caller, but the workspace must not look well meanwhile:
each cause is kept with when it first and last failed, until a later write of the
workspace succeeds. No polling: only the writes themselves tell.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import TypedDict

import trio

from recalld.daemon.store.errors import StorageIOError

#: The causes kept, by errno, and how the health reason of each begins.
CAUSES = {
    errno.ENOSPC: "writing notes fails: the disk is full",
    errno.EDQUOT: "writing notes fails: the disk quota is used up",
    errno.EROFS: "writing notes fails: the file system is read-only",
    errno.EACCES: "writing notes fails: permission denied",
    errno.EPERM: "writing notes fails: permission denied",
}


class WriteFailure(TypedDict):
    """One cause of failing writes: ``errno`` by name, the last ``error``, when the first
    and the last write failed for it (unix seconds) and how many did."""

    errno: str
    error: str
    since: float
    last: float
    count: int


class WriteFailures:
    """The failing causes of one workspace's note writes (:data:`CAUSES`)."""

    def __init__(self) -> None:
        self._failing: dict[int, WriteFailure] = {}

    def failed(self, exc: StorageIOError) -> None:
        """A write failed with ``exc``; kept if its errno is one of :data:`CAUSES`."""
        code = exc.errno
        if code not in CAUSES:
            return
        now = time.time()
        was = self._failing.get(code)
        self._failing[code] = {
            "errno": errno.errorcode[code], "error": exc.message,
            "since": now if was is None else was["since"], "last": now,
            "count": 1 if was is None else was["count"] + 1}

    async def run(self, write: Callable[[], object]) -> None:
        """``write()`` in a worker thread, kept as failed or succeeded by its outcome."""
        try:
            await trio.to_thread.run_sync(write)
        except StorageIOError as exc:
            self.failed(exc)
            raise
        self.succeeded()

    def succeeded(self) -> None:
        """A write succeeded: the file system takes writes again."""
        self._failing.clear()

    def status(self) -> list[WriteFailure]:
        """Each failing cause, the first to fail first."""
        return [f.copy() for f in sorted(self._failing.values(), key=lambda f: f["since"])]

    def reasons(self) -> list[str]:
        """A health reason per failing cause, with when it began."""
        out = []
        for code, f in sorted(self._failing.items(), key=lambda kv: kv[1]["since"]):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["since"]))
            out.append(f"{CAUSES[code]} ({f['errno']}, {f['count']} write(s) refused since "
                       f"{since}; last: {f['error']})")
        return out
