"""A file system that fails on purpose: the fault seam of :mod:`fsio` (RELIABILITY 7), for
tests and for crash and disk-full harnesses that stand it in for the real one."""

from __future__ import annotations

import errno
import os
from collections.abc import Collection
from pathlib import Path

from recalld.daemon.store.fsio import FS, NOTE_DIR_MODE, PRIVATE_MODE


class FailingFS(FS):
    """A filesystem that fails the ``fail_at``-th counted call with ``OSError(err)``.

    ``ops`` names the counted methods (default: only ``write``). With ``persistent`` every
    counted call from the ``fail_at``-th on fails (a disk that stays full); otherwise only
    that one does (space freed right after). With ``partial_write`` a failing write first
    writes half its bytes, as a real ENOSPC does. ``calls`` counts counted calls so far;
    ``failures`` counts the raised errors.
    """

    def __init__(
        self,
        fail_at: int,
        *,
        persistent: bool = False,
        ops: Collection[str] = ("write",),
        err: int = errno.ENOSPC,
        partial_write: bool = True,
    ) -> None:
        self.fail_at = fail_at
        self.persistent = persistent
        self.ops = frozenset(ops)
        self.err = err
        self.partial_write = partial_write
        self.calls = 0
        self.failures = 0

    def _check(self, op: str) -> bool:
        if op not in self.ops:
            return False
        self.calls += 1
        return self.calls == self.fail_at or (self.persistent and self.calls > self.fail_at)

    def _fail(self, op: str) -> OSError:
        self.failures += 1
        return OSError(self.err, f"{os.strerror(self.err)} (injected at {op} #{self.calls})")

    def open_write(self, path: Path, mode: int = PRIVATE_MODE) -> int:
        if self._check("open_write"):
            raise self._fail("open_write")
        return super().open_write(path, mode)

    def open_write_at(self, folder: int, name: str, mode: int = PRIVATE_MODE) -> int:
        if self._check("open_write"):
            raise self._fail("open_write")
        return super().open_write_at(folder, name, mode)

    def open_append(self, path: Path) -> int:
        if self._check("open_append"):
            raise self._fail("open_append")
        return super().open_append(path)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        if self._check("write"):
            if self.partial_write and len(data) > 1:
                super().write(fd, memoryview(data)[: len(data) // 2])
            raise self._fail("write")
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        if self._check("fsync"):
            raise self._fail("fsync")
        super().fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        if self._check("truncate"):
            raise self._fail("truncate")
        super().truncate(fd, size)

    def replace(self, src: Path, dst: Path) -> None:
        if self._check("replace"):
            raise self._fail("replace")
        super().replace(src, dst)

    def replace_at(self, folder: int, src: str, dst: str) -> None:
        if self._check("replace"):
            raise self._fail("replace")
        super().replace_at(folder, src, dst)

    def link(self, src: Path, dst: Path) -> None:
        if self._check("link"):
            raise self._fail("link")
        super().link(src, dst)

    def fsync_dir(self, path: Path) -> None:
        if self._check("fsync_dir"):
            raise self._fail("fsync_dir")
        super().fsync_dir(path)

    def mkdir(self, path: Path, mode: int = NOTE_DIR_MODE) -> None:
        if self._check("mkdir"):
            raise self._fail("mkdir")
        super().mkdir(path, mode)
