"""The storage error family: every failure the storage layer reports is one of these.

OS and library exceptions (OSError, zstandard.ZstdError, orjson.JSONDecodeError) are
translated here, once, at the storage boundary; callers above only see ``StorageError``
subclasses. The family knows nothing of the wire: ``recalld.daemon.errors`` maps it to
JSON-RPC ``InternalError`` where it reaches a client (``DiskFull`` and
``FileSystemRefused`` to codes of their own), but callers normally handle it:
``CorruptState`` means "rebuild this file", ``DiskFull`` means "report it in status and
retry with backoff".

The message a client sees (``message``) names a file by its name only; the full path is
in ``path`` and in ``str(exc)``, for the daemon's log.
"""

from __future__ import annotations

import errno as errno_codes
import os

from recalld.daemon.store.confine import FolderMissing, WritesElsewhere
from recalld.ipc.errors import RecalldError

#: errno values that mean "no space left": a full disk or an exhausted quota.
_SPACE_ERRNOS = frozenset({errno_codes.ENOSPC, errno_codes.EDQUOT})
#: errno values that mean the file system refuses: read-only, or no permission.
_REFUSED_ERRNOS = frozenset({errno_codes.EROFS, errno_codes.EACCES, errno_codes.EPERM})


class StorageError(RecalldError):
    """Root of the storage family."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else str(path)
        self.detail = message
        public = message
        if self.path:
            public = public.replace(self.path, self.shown_path or "")
        super().__init__(public)

    @property
    def shown_path(self) -> str | None:
        """The file or folder as a client is shown it: by its name only."""
        return (os.path.basename(self.path.rstrip("/")) or "/") if self.path else None

    def __str__(self) -> str:
        return self.detail


class CorruptState(StorageError):
    """A state file failed verification (size, checksum, format, record count, ...).

    Never accompanied by partial data: the reader raises before returning anything. The
    caller rebuilds the file (from Markdown) while other files keep serving.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.reason = reason
        super().__init__(f"corrupt state file {path}: {reason}", path)


class UnsupportedVersion(CorruptState):
    """The file is well-formed but written in a format version this code cannot read.

    A subclass of CorruptState because the remedy is the same: rebuild it.
    """


class StorageIOError(StorageError):
    """An operating-system error while reading or writing state; ``errno`` says which."""

    def __init__(
        self, path: str | os.PathLike[str] | None, errno: int | None, message: str
    ) -> None:
        self.errno = errno
        super().__init__(message, path)


class DiskFull(StorageIOError):
    """No space left (ENOSPC or EDQUOT) while writing; nothing was published.

    Temp files are already removed and the previous generation is intact, so the caller
    reports "disk full" in its status and retries with backoff. On the wire it is
    ``DiskFull`` (-32011) with ``data.errno``, not an internal error.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, errno: int | None, message: str
    ) -> None:
        super().__init__(path, errno, message)
        self.data = {"errno": errno_codes.errorcode.get(errno or 0, "ENOSPC")}


class FileSystemRefused(StorageIOError):
    """The file system refused the read or write: it is read-only (EROFS) or the daemon
    has no permission (EACCES, EPERM). Not a fault of the daemon but a condition an
    operator fixes (remount read-write, fix permissions, serve from another folder): on
    the wire it is ``FileSystemRefused`` (-32013) with ``data.errno`` and ``data.path``
    (the file or folder refused, by its name only, as the message names it)."""

    def __init__(
        self, path: str | os.PathLike[str] | None, errno: int | None, message: str
    ) -> None:
        super().__init__(path, errno, message)
        self.data = {"errno": errno_codes.errorcode.get(errno or 0, "EACCES")}
        if self.shown_path is not None:
            self.data["path"] = self.shown_path


class LinkOnTheWay(StorageIOError):
    """A read or write below an open workspace's folder met a symbolic link in place of
    a folder on the way (:class:`~recalld.daemon.store.confine.WritesElsewhere`): it
    would have reached another folder's files, perhaps another agent's. Nothing was read
    or written; on the wire it is ``PathOutsideWorkspace``, not an internal error."""


class WorkspaceMissing(StorageIOError):
    """A read or write below an open workspace's folder found that folder gone (moved
    away, removed, on a disk not mounted: :class:`~recalld.daemon.store.confine.
    FolderMissing`). Nothing was written, nor the folder made again; on the wire it is
    ``NotFound``, not an internal error."""


def translate_os_error(exc: OSError, path: str | os.PathLike[str] | None = None) -> StorageIOError:
    """The storage error for an OSError (DiskFull for ENOSPC/EDQUOT, FileSystemRefused for EROFS,
    EACCES and EPERM)."""
    where = path if path is not None else exc.filename
    text = exc.strerror or str(exc)
    if exc.errno in _SPACE_ERRNOS:
        return DiskFull(where, exc.errno, f"disk full writing {where}: {text}")
    if isinstance(exc, WritesElsewhere):  # a link on the way, not at the file itself
        # Its text names the link, which may be a folder above ``where``: said once.
        return LinkOnTheWay(where, exc.errno, text)
    if isinstance(exc, FolderMissing):  # its text names the folder, not ``where``
        return WorkspaceMissing(where, exc.errno, text)
    if exc.errno in _REFUSED_ERRNOS:
        return FileSystemRefused(where, exc.errno, f"the file system refused {where}: {text}")
    if exc.errno == errno_codes.ELOOP:  # opened with O_NOFOLLOW: a link where a file should be
        return StorageIOError(where, exc.errno, f"{where} is a symbolic link, which recalld "
                              "does not write through: remove it")
    return StorageIOError(where, exc.errno, f"I/O error on {where}: {text}")

