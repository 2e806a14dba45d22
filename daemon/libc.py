"""The C library of this process, for the few calls the standard library lacks (inotify,
malloc tuning, renames that exchange or do not replace).

Found among the symbols already loaded into the process, once: no library search
(``ctypes.util.find_library`` runs ``ldconfig -p`` in a child process on every call, slow
at start-up, and every watcher of every workspace needs the library when it opens).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
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


#: ``renameat2`` flags: fail with EEXIST rather than replace the target; swap the two.
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
#: What ``renameat2`` fails with where the C library, the kernel or the file system (NFS,
#: some FUSE ones) lacks it or the flag: the caller does without.
RENAME_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})
_AT_FDCWD = -100


def renameat2(src: str | os.PathLike[str], dst: str | os.PathLike[str], flags: int, *,
              src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
    """``renameat2(2)``: rename ``src`` to ``dst`` (each relative to its folder's
    descriptor, if given) with ``flags``. Raises OSError, with ENOSYS where the C library
    has no such call (before glibc 2.28, musl before 1.2.5, off Linux)."""
    lib = libc()
    call = getattr(lib, "renameat2", None) if lib is not None else None
    if call is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", os.fspath(src))
    if call(_AT_FDCWD if src_dir_fd is None else src_dir_fd, os.fsencode(src),
            _AT_FDCWD if dst_dir_fd is None else dst_dir_fd, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))
