"""Removing what writes a kill cut short left behind: temp files of the daemon's own
naming (:data:`~recalld.daemon.store.fsio.TEMP_RE`) anywhere below a folder, dated before
the moment this process became the folder's one writer. Owns nothing and starts
nothing; everything here blocks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

from recalld.daemon.store.fsio import TEMP_RE

#: Linux's CLOCK_REALTIME_COARSE, which file times are taken from (a tick behind the
#: precise clock: a reading of that one could date after a file made just after it).
FILE_TIMES_CLOCK: Final = 5


def file_times_now() -> int:
    """Now, in ns, on the clock file times are taken from: a file changed after this
    reading never has an earlier ``st_ctime_ns``."""
    return time.clock_gettime_ns(FILE_TIMES_CLOCK)


def remove_left_over(top: Path, before_ns: int, *, prefix: str | None = None) -> list[str]:
    """Remove the temp files of the daemon's own naming (``TEMP_RE``) anywhere under
    ``top`` whose inode last changed before ``before_ns`` (:func:`file_times_now`, read
    once the folder's one writer is this process): what writes a kill cut short left,
    never one a live writer still holds. Links are not followed; a folder that cannot be
    listed is passed by (best effort: a file left only takes room). With ``prefix``
    (:func:`~recalld.daemon.store.fsio.temp_prefix`), only those in ``top`` itself named
    so: a folder of the user's where the daemon publishes one file. Returns the removed
    paths, relative to ``top``."""
    removed: list[str] = []
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if prefix is None and entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif (TEMP_RE.match(entry.name) and entry.name.startswith(prefix or "")
                      and entry.is_file(follow_symlinks=False)
                      and entry.stat(follow_symlinks=False).st_ctime_ns < before_ns):
                    os.unlink(entry.path)
                    removed.append(os.path.relpath(entry.path, top))
            except OSError:
                continue
    return sorted(removed)
