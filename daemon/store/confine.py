"""Writes below an open workspace's folder, made through folder handles.

While a workspace is open its folder (absolute, resolved when it opened) is *guarded*
(:func:`guard`, :func:`release`). A mutating call of the filesystem seam
(:class:`~recalld.daemon.store.fsio.FS`) on a path below a guarded folder does not hand the
path to the kernel: the guarded folder is opened and checked where it really lies (a link
may have taken its place, or that of a folder on its path), each folder below it is opened
without following a link, and the call acts relative to the last one. So a link put in the
place of the workspace folder, of ``mem_metadata/`` or of any folder below, between two uses
of the workspace, cannot lead a write (an index generation, a log's append, a catalog's or
a run record's save, a removal) into another folder, another agent's among them: the call
raises :class:`WritesElsewhere`, which the storage layer reports as the write refused.

Paths below no guarded folder (the daemon's own state folders) are used as given. Owns
the set of guarded folders only; no task. Everything here blocks.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_lock = threading.Lock()
#: Guarded folders (absolute, resolved), counted: two workspaces may hold one folder.
_guarded: Counter[str] = Counter()
#: The same, longest first (the nearest guarded folder of a path), read without the lock.
_roots: tuple[str, ...] = ()


class WritesElsewhere(OSError):
    """A write below a guarded folder that would have gone through a symbolic link."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(errno.ELOOP, message, path)


def guard(root: Path) -> None:
    """From now on, writes below ``root`` (absolute, resolved) go through handles."""
    global _roots
    with _lock:
        _guarded[os.path.abspath(root)] += 1
        _roots = tuple(sorted(_guarded, key=len, reverse=True))


def release(root: Path) -> None:
    """Undo one :func:`guard` of ``root``."""
    global _roots
    key = os.path.abspath(root)
    with _lock:
        _guarded[key] -= 1
        if _guarded[key] <= 0:
            del _guarded[key]
        _roots = tuple(sorted(_guarded, key=len, reverse=True))


def _below(path: str | os.PathLike[str]) -> tuple[str, list[str]] | None:
    """The nearest guarded folder holding ``path`` and the names from it to ``path``."""
    full = os.path.abspath(path)  # lexical: with no link on the way, what it names
    for root in _roots:
        if full == root:
            return root, []
        if full.startswith(root.rstrip(os.sep) + os.sep):
            return root, full[len(root.rstrip(os.sep)) + 1:].split(os.sep)
    return None


def _open_below(root: str, names: list[str]) -> int:
    """A descriptor of ``root/names...``: ``root`` checked where it really lies, each
    folder below it opened without following a link. The caller closes it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc: nothing to compare
            real = root
        if real != root:
            raise WritesElsewhere(f"the workspace folder {root} now leads to {real} (a "
                                  "symbolic link took its place or that of a folder on "
                                  "its path), which recalld does not write through", root)
        for i, name in enumerate(names):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, name):
                    place = os.path.join(root, *names[: i + 1])
                    raise WritesElsewhere(f"{place} is a symbolic link, which recalld "
                                          "does not write through: put the folder back",
                                          place) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextmanager
def at(path: str | os.PathLike[str]) -> Iterator[tuple[int | None, str]]:
    """``(folder, name)`` to act on ``path`` with (``os.open(name, ..., dir_fd=folder)``):
    below a guarded folder, a descriptor of its folder opened through handles (closed on
    exit) and its last name; elsewhere ``(None, path)``. Raises WritesElsewhere."""
    below = _below(path)
    if below is None or not below[1]:
        yield None, os.fspath(path)
        return
    root, names = below
    folder = _open_below(root, names[:-1])
    try:
        yield folder, names[-1]
    finally:
        os.close(folder)


def open_folder(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the folder ``path`` (to fsync it), opened as :func:`at`
    opens folders. The caller closes it. Raises WritesElsewhere."""
    below = _below(path)
    if below is None:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return _open_below(*below)
