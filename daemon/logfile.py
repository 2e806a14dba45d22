"""The daemon's log file (``recalld serve --log-file``): where it is, and a rotated
handler that keeps it and its rotations private (the log names workspaces, notes and
queries).

Owns nothing long-lived and starts nothing: the handler is the logging module's once
installed.
"""

from __future__ import annotations

import io
import logging
import os
import stat
from logging.handlers import RotatingFileHandler
from pathlib import Path

from recalld.ipc.folders import make_dirs_private
from recalld.ipc.paths import expand_home, from_here

LOG_FILE_BYTES = 10 << 20
LOG_FILE_BACKUPS = 3
LOG_FILE_MODE = 0o600


class PrivateRotatingFileHandler(RotatingFileHandler):
    """A rotated log only its owner may read: the log names workspaces, notes and
    queries. The file and every one that replaces it at a rollover are created 0600
    whatever the umask; one left by an earlier start (and its rotations) is tightened."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                     LOG_FILE_MODE)
        try:
            _make_private(fd)
            return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)
        except BaseException:
            os.close(fd)
            raise


def _make_private(fd: int) -> None:
    """Tighten the regular file ``fd`` of ours to LOG_FILE_MODE (``--log-file /dev/stderr``
    and the like keep their modes)."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and (
            stat.S_IMODE(st.st_mode) & ~LOG_FILE_MODE):
        os.fchmod(fd, LOG_FILE_MODE)


def log_path(value: str) -> Path:
    """``--log-file``'s file: ``~`` expanded, a relative one taken from the current
    directory; PathError for a ``~name`` of no user, or when that directory no longer
    exists (a relative name would then name no file)."""
    return from_here(expand_home(value, "--log-file"), "--log-file", value)


def rotating_log(path: str) -> logging.Handler:
    target = expand_home(path, "--log-file")
    make_dirs_private(target.parent)
    handler = PrivateRotatingFileHandler(target, maxBytes=LOG_FILE_BYTES,
                                         backupCount=LOG_FILE_BACKUPS, encoding="utf-8")
    for n in range(1, LOG_FILE_BACKUPS + 1):  # what older starts rotated away
        try:
            fd = os.open(f"{target}.{n}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            _make_private(fd)
        finally:
            os.close(fd)
    return handler


def check_log_file(log_file: str | None) -> str | None:
    """``--check-config``'s check of ``--log-file`` (absolute, as :func:`log_path` made
    it): what opening it would meet (a file in the way of its folder, a folder in its
    place), told as serving would tell it; None when nothing is in the way."""
    from recalld.daemon.safepath import why_not_writable

    why = why_not_writable(Path(log_file)) if log_file else None
    return None if why is None else f"cannot open the log file {log_file}: {why}"
