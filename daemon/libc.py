"""The C library of this process, for the few calls the standard library lacks (inotify,
malloc tuning).

Found among the symbols already loaded into the process, once: no library search
(``ctypes.util.find_library`` runs ``ldconfig -p`` in a child process on every call, slow
at start-up, and every watcher of every workspace needs the library when it opens).
"""

from __future__ import annotations

import ctypes
import functools
import sys


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The loaded C library with ``ctypes.get_errno`` kept per call; None off Linux or
    where it cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
