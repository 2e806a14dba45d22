"""Writes and state reads below an open workspace's folder, made through folder handles.

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
The storage layer's reads of state files (a manifest, an index file, a log's replay, a
folder's listing, a file's stat) go the same way (:func:`open_file`, :func:`stat_file`,
:func:`listdir`), so nothing of another folder is read into this workspace's memory.

The owner of a guarded folder may be told (:func:`told`) whenever a call below it meets
a link, in whatever thread made the call: an open workspace then stops at once rather
than retry, in the background, what cannot succeed.

Paths below no guarded folder (the daemon's own state folders) are used as given. Owns
the set of guarded folders only; no task. Everything here blocks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_lock = threading.Lock()
#: Guarded folders (absolute, resolved), counted: two workspaces may hold one folder.
_guarded: Counter[str] = Counter()
#: The same, longest first (the nearest guarded folder of a path), read without the lock.
_roots: tuple[str, ...] = ()
#: Told when a call below a guarded folder meets a link (:func:`told`).
_on_link: dict[str, list[Callable[[WritesElsewhere], object]]] = {}


class WritesElsewhere(OSError):
    """A write (or a state read) below a guarded folder that would have gone through a
    symbolic link."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(errno.ELOOP, message, path)


class FolderMissing(FileNotFoundError):
    """A write (or a state read) below a guarded folder that is gone itself: moved away,
    removed, or on a disk not mounted. It is not made again: empty, it would take the
    place the folder is put back in (or hide the disk's notes once it is mounted)."""

    def __init__(self, root: str) -> None:
        super().__init__(
            errno.ENOENT, f"the workspace folder {root} is missing (moved away, removed, "
            "or on a disk not mounted), and recalld does not make it again, empty: put "
            "it back", root)


def guard(root: Path) -> None:
    """From now on, writes and state reads below ``root`` (absolute, resolved) go
    through handles."""
    global _roots
    key = os.path.abspath(root)
    with _lock:
        _guarded[key] += 1
        if _guarded[key] == 1:  # a new one (each call guards the folders it uses again)
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


@contextmanager
def guarded(root: Path | None) -> Iterator[None]:
    """Within the block, ``root`` (if any) is guarded (:func:`guard`), whoever else
    releases it meanwhile."""
    if root is None:
        yield
        return
    guard(root)
    try:
        yield
    finally:
        release(root)


@contextmanager
def told(root: Path, on_link: Callable[[WritesElsewhere], object]) -> Iterator[None]:
    """Within the block, ``on_link`` is called with each WritesElsewhere raised below
    ``root`` (guarded), in the thread that met the link: it must not block."""
    key = os.path.abspath(root)
    with _lock:
        _on_link.setdefault(key, []).append(on_link)
    try:
        yield
    finally:
        with _lock:
            _on_link[key].remove(on_link)
            if not _on_link[key]:
                del _on_link[key]


def _tell(root: str, exc: WritesElsewhere) -> WritesElsewhere:
    """Call the ``on_link`` callbacks of ``root`` with ``exc``; returns ``exc``."""
    with _lock:
        told = list(_on_link.get(root, ()))
    for callback in told:
        # One that cannot be told now (its event loop ended): the error raised says it.
        with contextlib.suppress(Exception):
            callback(exc)
    return exc


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
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FolderMissing(root) from None
    try:
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc: nothing to compare
            real = root
        if real != root:
            raise _tell(root, WritesElsewhere(
                f"the workspace folder {root} now leads to {real} (a symbolic link took "
                "its place or that of a folder on its path), which recalld does not "
                "read or write through", root))
        for i, name in enumerate(names):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, name):
                    place = os.path.join(root, *names[: i + 1])
                    raise _tell(root, WritesElsewhere(
                        f"{place} is a symbolic link, which recalld does not read or "
                        "write through: put the folder back", place)) from None
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


def mkdir(path: str | os.PathLike[str], mode: int) -> None:
    """``os.mkdir(path, mode)``; below a guarded folder through its folders' handles. A
    guarded folder itself is never made: FileExistsError while it is there, else
    FolderMissing. Raises WritesElsewhere."""
    below = _below(path)
    if below is not None and not below[1]:
        if os.path.isdir(below[0]):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), below[0])
        raise FolderMissing(below[0])
    with at(path) as (folder, name):
        os.mkdir(name, mode, dir_fd=folder)


def open_folder(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the folder ``path`` (to fsync it), opened as :func:`at`
    opens folders. The caller closes it. Raises WritesElsewhere."""
    below = _below(path)
    if below is None:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return _open_below(*below)


def open_file(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open(path, flags)``; below a guarded folder through its folders' handles, and
    not through a link at ``path`` itself either (ELOOP). Raises WritesElsewhere."""
    with at(path) as (folder, name):
        if folder is not None:
            flags |= os.O_NOFOLLOW
        return os.open(name, flags, dir_fd=folder)


def stat_file(path: str | os.PathLike[str]) -> os.stat_result:
    """``os.stat(path)``; below a guarded folder through its folders' handles, of a link
    at ``path`` itself rather than of its target. Raises WritesElsewhere."""
    with at(path) as (folder, name):
        return os.stat(name, dir_fd=folder, follow_symlinks=folder is None)


def listdir(path: str | os.PathLike[str]) -> list[str]:
    """``os.listdir(path)``; below a guarded folder, of the folder opened through
    handles. Raises WritesElsewhere."""
    if _below(path) is None:
        return os.listdir(path)
    fd = open_folder(path)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)
