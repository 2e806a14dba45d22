"""Removing what writes a kill cut short left behind: temp files of the daemon's own
naming (:data:`~recalld.daemon.store.fsio.TEMP_RE`) anywhere below a folder, dated before
the moment this process became the folder's one writer. Owns nothing and starts
nothing; everything here blocks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from recalld.daemon.store import confine
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
    never one a live writer still holds. ``top`` is opened as :mod:`confine` opens a
    folder (below an open workspace: through its folders' handles), each folder below it
    without following a link, and each file is removed relative to its folder's handle:
    a link in place of ``top`` or of a folder on the way (put there before or during the
    walk) leads no removal into another folder: one in place of ``top`` raises
    :class:`~recalld.daemon.store.confine.WritesElsewhere`. Another folder that cannot be
    opened or listed is passed by (best effort: a file left only takes room). With ``prefix``
    (:func:`~recalld.daemon.store.fsio.temp_prefix`), only those in ``top`` itself named
    so: a folder of the user's where the daemon publishes one file. Returns the removed
    paths, relative to ``top``."""
    removed: list[str] = []
    try:
        top_fd = confine.open_folder(top)
    except confine.WritesElsewhere:
        raise
    except OSError:
        return []
    # Depth first, one descriptor open per level: a wide folder costs no descriptors.
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []
    try:
        _enter(stack, top_fd, "")
        while stack:
            folder, rel, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                os.close(stack.pop()[0])
                continue
            try:
                if prefix is None and entry.is_dir(follow_symlinks=False):
                    child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                    | os.O_CLOEXEC, dir_fd=folder)
                    _enter(stack, child, os.path.join(rel, entry.name))
                elif (TEMP_RE.match(entry.name) and entry.name.startswith(prefix or "")
                      and entry.is_file(follow_symlinks=False)
                      and entry.stat(follow_symlinks=False).st_ctime_ns < before_ns):
                    os.unlink(entry.name, dir_fd=folder)
                    removed.append(os.path.join(rel, entry.name))
            except OSError:
                continue
    finally:
        for folder, _rel, _entries in stack:
            os.close(folder)
    return sorted(removed)


def _enter(stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]], folder: int,
           rel: str) -> None:
    """Push the opened ``folder`` (at ``rel``) with its entries; closed when it cannot
    be listed."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError:
        os.close(folder)
        return
    stack.append((folder, rel, iter(entries)))
