"""A workspace's failing note writes, by cause, for its health.

A note that cannot be written (a full disk or quota, a read-only file system, no
permission) is refused to its caller, but the workspace must not look well meanwhile:
each cause is kept, per file system (``st_dev``: a notes folder may be a mount of its
own), with when it first and last failed, until a later write of the workspace on that
file system succeeds. No polling: only the writes themselves tell.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypedDict

import trio

from recalld.daemon.store.errors import StorageIOError

P = ParamSpec("P")

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


def device_of(path: Path) -> int | None:
    """``st_dev`` of ``path``, or of its nearest folder there (a file not written, a
    folder not made); None when none is. Blocking."""
    for place in (path, *path.parents):
        try:
            return os.stat(place).st_dev
        except OSError:
            continue
    return None


#: A failing cause: the file system's ``st_dev`` (None: not known) and the errno.
_Key = tuple[int | None, int]


class WriteFailures:
    """The failing causes of one workspace's note writes (:data:`CAUSES`), per file
    system."""

    def __init__(self) -> None:
        self._failing: dict[_Key, WriteFailure] = {}
        self._places: dict[_Key, Path] = {}  # what each cause last failed to write

    def failed(self, exc: StorageIOError, device: int | None = None,
               place: Path | None = None) -> None:
        """A write of ``place`` on the file system ``device`` failed with ``exc``; kept
        if its errno is one of :data:`CAUSES`."""
        code = exc.errno
        if code not in CAUSES:
            return
        now = time.time()
        was = self._failing.get((device, code))
        self._failing[device, code] = {
            "errno": errno.errorcode[code], "error": exc.message,
            "since": now if was is None else was["since"], "last": now,
            "count": 1 if was is None else was["count"] + 1}
        if place is not None:
            self._places[device, code] = place

    async def run(self, path: Path, write: Callable[P, object], *args: P.args,
                  **kwargs: P.kwargs) -> None:
        """``write(*args, **kwargs)`` of ``path`` in a worker thread, kept as failed or
        succeeded on ``path``'s file system by its outcome."""
        keys, places = list(self._failing), dict(self._places)  # not read in the thread

        def attempt() -> tuple[int | None, StorageIOError | None, list[_Key]]:
            try:
                write(*args, **kwargs)
            except StorageIOError as exc:
                return device_of(path), exc, []
            if not keys:  # nothing failing: no file system to look up
                return None, None, []
            device = device_of(path)
            # Also a cause whose place now lies on this file system (it was unmounted).
            return device, None, [key for key in keys if key[0] in (device, None)
                                  or (key in places and device_of(places[key]) == device)]

        device, exc, taken = await trio.to_thread.run_sync(attempt)
        if exc is not None:
            self.failed(exc, device, path)
            raise exc
        self.succeeded(taken)

    def succeeded(self, causes: list[_Key] | None = None) -> None:
        """Writes succeeded again on the file systems of ``causes`` (None: of all)."""
        for key in list(self._failing) if causes is None else causes:
            self._failing.pop(key, None)
            self._places.pop(key, None)

    def status(self) -> list[WriteFailure]:
        """Each failing cause, the first to fail first."""
        return [f.copy() for f in sorted(self._failing.values(), key=lambda f: f["since"])]

    def reasons(self) -> list[str]:
        """A health reason per failing cause, with when it began."""
        out = []
        for (_, code), f in sorted(self._failing.items(), key=lambda kv: kv[1]["since"]):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["since"]))
            out.append(f"{CAUSES[code]} ({f['errno']}, {f['count']} write(s) refused since "
                       f"{since}; last: {f['error']})")
        return out
