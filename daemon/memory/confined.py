"""Blocking file primitives confined to a workspace root, for :mod:`fileops` and the
memory jobs (run them in a worker thread): publish a file atomically (also only if it
still holds what was read: :func:`publish_if_holds`), remove one, read one's text, tell
whether a file is UTF-8. Names are checked by :mod:`safepath`; symbolic links on the way
are refused. No state, no task (:func:`made_again_on_conflict` is the one coroutine: it
makes a change again from a file saved meanwhile).
"""

from __future__ import annotations

import codecs
import errno
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from recalld.daemon import safepath
from recalld.daemon.libc import RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_UNSUPPORTED, renameat2
from recalld.daemon.notetext import note_text
from recalld.daemon.store import confine
from recalld.daemon.store.errors import translate_os_error
from recalld.daemon.store.fsio import FS, NOTE_MODE, PRIVATE_MODE, REAL, atomic_writer, temp_name
from recalld.ipc.errors import InvalidParams, NotFound, Overloaded, PathOutsideWorkspace

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_EDIT_BYTES = 4 << 20
#: Exchanges made at most to put a save back where other saves keep landing meanwhile.
EXCHANGES = 8
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: What opening a path fails with when no regular file is there: nothing, a file or a
#: link on the way or at the end, a device or socket.
NO_FILE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENXIO, errno.EISDIR,
                     errno.ENAMETOOLONG, errno.ENODEV})


def _check_dir(path: Path, shown: str) -> bool:
    """True if ``path`` is a real directory, False if missing; refuse links and files."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    if stat.S_ISLNK(st.st_mode):
        raise PathOutsideWorkspace(f"path goes through a symbolic link: {shown}")
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidParams(f"not a directory on the way to {shown}")
    return True


class _PublishedBy(FS):
    """The daemon's file system (``REAL``, whatever it is), but for the rename that
    publishes a file: ``publish``'s."""

    def __init__(self, publish: Callable[[Path, Path], None]) -> None:
        self._publish = publish

    def open_write(self, path: Path, mode: int = PRIVATE_MODE) -> int:
        return REAL.open_write(path, mode)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        REAL.write(fd, data)

    def fsync(self, fd: int) -> None:
        REAL.fsync(fd)

    def close(self, fd: int) -> None:
        REAL.close(fd)

    def replace(self, src: Path, dst: Path) -> None:
        self._publish(src, dst)

    def fsync_dir(self, path: Path) -> None:
        REAL.fsync_dir(path)

    def unlink(self, path: Path) -> None:
        REAL.unlink(path)


def write_confined(root: Path, path: str, data: bytes, *, sync_dir: bool = True,
                   publish: Callable[[Path, Path], None] | None = None) -> None:
    """Publish ``data`` at ``root/path`` atomically, creating missing folders.

    Refuses symbolic links anywhere on the way and at the target (an existing target must
    be a regular file). Blocking. ``sync_dir=False``: the caller fsyncs the file's folder
    (see ``atomic_writer``). ``publish(temp, target)``, once the new content is on disk
    (fsynced) under its temp name, moves it to the target instead of ``os.replace``
    (only if the target still holds what the caller read, say): an exception it raises
    is raised, and the temp file, whatever it then holds, is removed.
    """
    parts = safepath.split_relative(path)
    if any(p.startswith(".") for p in parts):
        raise InvalidParams(f"hidden names are not writable: {path}")
    current = root
    for name in parts[:-1]:
        current = current / name
        if not _check_dir(current, path):
            try:
                REAL.mkdir(current)
                REAL.fsync_dir(current.parent)
            except FileExistsError:
                _check_dir(current, path)
            except OSError as exc:
                raise translate_os_error(exc, current) from exc
    target = current / parts[-1]
    mode = NOTE_MODE
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise translate_os_error(exc, target) from exc
    else:
        if stat.S_ISLNK(st.st_mode):
            raise PathOutsideWorkspace(f"path is a symbolic link: {path}")
        if not stat.S_ISREG(st.st_mode):
            raise InvalidParams(f"not a regular file: {path}")
        mode = stat.S_IMODE(st.st_mode)
    with atomic_writer(REAL if publish is None else _PublishedBy(publish), target,
                       sync_dir=sync_dir, mode=mode) as out:
        out.write(data)


def file_bytes(name: str | Path, folder: int | None = None) -> bytes | None:
    """The bytes of the regular file ``name`` (in ``folder``); None: none there, or
    anything else than a regular file. Blocking."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno in NO_FILE:
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        pieces: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            pieces.append(chunk)
        return b"".join(pieces)
    finally:
        os.close(fd)


def _inode(name: str, folder: int | None) -> tuple[int, int]:
    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    return st.st_dev, st.st_ino


def exchange_if(tmp: str, target: str, folder: int | None,
                holds: Callable[[bytes | None], bool]) -> bool:
    """Move ``tmp`` to ``target`` (names in ``folder``) only if the target holds what
    ``holds`` accepts (its bytes; None: no file there): True. Else the target is left as
    it is and False returned (``tmp`` is then the caller's to remove, whatever it holds).

    No save can fall between the comparison and the rename: the rename exchanges the two
    files (or, where no file is expected, does not replace one), and what came out is
    compared; a save found so is put back with a second exchange (a save made at the
    target meanwhile, over ours, is newer still: exchanged back there, and so on). Where
    the file system cannot exchange, compared, then renamed (a save in between is
    overwritten). A save written into the old file in place after it came out and was
    compared is not seen: that file is removed. Blocking."""
    at = {"src_dir_fd": folder, "dst_dir_fd": folder}
    try:
        if holds(None):
            renameat2(tmp, target, RENAME_NOREPLACE, **at)
            return True
        ours = _inode(tmp, folder)
        renameat2(tmp, target, RENAME_EXCHANGE, **at)
    except OSError as exc:
        if exc.errno not in RENAME_UNSUPPORTED | {errno.EEXIST, errno.ENOENT}:
            raise
        if not holds(file_bytes(target, folder)):  # EEXIST, ENOENT: not as read
            return False
        os.replace(tmp, target, **at)
        return True
    if holds(file_bytes(tmp, folder)):  # what the target held until the exchange
        os.unlink(tmp, dir_fd=folder)
        return True
    for _ in range(EXCHANGES):
        going = _inode(tmp, folder)
        renameat2(tmp, target, RENAME_EXCHANGE, **at)
        if _inode(tmp, folder) == ours:
            break
        ours = going
    return False


def unlink_if(name: str, folder: int | None, holds: Callable[[bytes | None], bool]
              ) -> bool | None:
    """Unlink ``name`` (in ``folder``) if it holds what ``holds`` accepts: True; None: it
    was gone; False: it held something else (a save made since it was read) and stays.
    Moved aside under a temp name first and compared there, so a save made meanwhile is
    never removed unseen; one found so is moved back (unless a newer one took the name
    meanwhile). Where the file system cannot, compared, then unlinked. Blocking."""
    at = {"src_dir_fd": folder, "dst_dir_fd": folder}
    aside = temp_name(name)
    try:
        renameat2(name, aside, RENAME_NOREPLACE, **at)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in RENAME_UNSUPPORTED:
            raise
        if not holds(file_bytes(name, folder)):
            return False
        os.unlink(name, dir_fd=folder)
        return True
    if holds(file_bytes(aside, folder)):
        os.unlink(aside, dir_fd=folder)
        return True
    try:
        renameat2(aside, name, RENAME_NOREPLACE, **at)
    except FileExistsError:  # saved again since: that newer save stays
        os.unlink(aside, dir_fd=folder)
    return False


def unlink_confined(root: Path, path: str, before: str | None = None) -> None:
    """Remove the regular file ``path`` (relative to ``root``) without leaving ``root``;
    nothing there is no error. Raises PathOutsideWorkspace (a link on the way or at the
    end) or InvalidParams (not a regular file). ``before``: only if it holds that text
    as :func:`read_confined` reads it, else :class:`WriteConflict` and the file stays
    (:func:`unlink_if`). Blocking."""
    parts = safepath.split_relative(path)
    try:
        folder = safepath.open_parent(root, parts, path)
    except NotFound:
        return
    try:
        try:
            st = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise PathOutsideWorkspace(f"path is a symbolic link: {path}")
        if not stat.S_ISREG(st.st_mode):
            raise InvalidParams(f"not a regular file: {path}")
        if before is None:
            os.unlink(parts[-1], dir_fd=folder)
        elif unlink_if(parts[-1], folder, lambda data: data is not None and (
                note_text(data) == before)) is False:
            raise WriteConflict(f"{path} changed since it was read")
        os.fsync(folder)
    finally:
        os.close(folder)


def rmdir_confined(root: Path, path: str) -> bool:
    """Remove the folder ``path`` (relative to ``root``) if it is empty, without leaving
    ``root``; True if it was removed (not empty, gone or no folder: False). Blocking."""
    parts = safepath.split_relative(path)
    try:
        folder = safepath.open_parent(root, parts, path)
    except NotFound:
        return False
    try:
        try:
            os.rmdir(parts[-1], dir_fd=folder)
        except OSError:  # not empty (a note came meanwhile), gone, or a link
            return False
        os.fsync(folder)
        return True
    finally:
        os.close(folder)


class WriteConflict(Exception):
    """A file changed between a read and the write made from it (:meth:`FileOps.replace`)."""


def publish_if_holds(rel: str, before: str | None, tmp: Path, target: Path) -> None:
    """Move ``tmp`` to ``target`` if the target holds ``before`` as :func:`read_confined`
    reads it (None: there is no file), else :class:`WriteConflict` (the file saved
    meanwhile stays as it is). Blocking."""

    def holds(data: bytes | None) -> bool:
        return (None if data is None else note_text(data)) == before

    with confine.at(target) as (folder, name):
        if not exchange_if(os.fspath(tmp) if folder is None else tmp.name, name, folder,
                           holds):
            raise WriteConflict(f"{rel} changed since it was read")


async def made_again_on_conflict(attempt: Callable[[], Awaitable[T]], tries: int) -> T:
    """``attempt()`` (a change made from a file's text, written if the file still holds
    it: else :class:`WriteConflict`) made again while the file is saved in between, up to
    ``tries`` times; then :func:`saved_meanwhile`."""
    for _ in range(tries - 1):
        try:
            return await attempt()
        except WriteConflict as exc:
            log.info("%s: made again from the file as saved meanwhile", exc)
    try:
        return await attempt()
    except WriteConflict as exc:
        raise saved_meanwhile(exc, tries) from None


def saved_meanwhile(exc: WriteConflict, tries: int) -> Overloaded:
    """What a caller is told when a file kept being saved while a change was written."""
    return Overloaded(f"{exc}: saved again each of {tries} times the change was made; "
                      "nothing was changed, try again")


class NotUtf8(InvalidParams):
    """A file saved in another encoding than UTF-8: read, it would hold U+FFFD where its
    text is; written from that, what a person wrote would be lost."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is not UTF-8 text (saved in another encoding): it is "
                         "left as it is, and cannot be read or changed here")


def read_confined(root: Path, path: str, max_bytes: int = MAX_EDIT_BYTES, *,
                  strict: bool = False) -> str | None:
    """The text of ``root/path`` (None if it does not exist), read as
    :func:`~recalld.daemon.notetext.note_text` reads notes. Blocking. With ``strict``
    (the text is to be changed and written back), a file that is not UTF-8 raises
    :class:`NotUtf8`."""
    text, utf8 = read_checked(root, path, max_bytes)
    if strict and not utf8:
        # Read with a guess, or with U+FFFD: written back, it would not be what its
        # person's editor reads (or would have lost what they wrote).
        raise NotUtf8(path)
    return text


def read_checked(root: Path, path: str,
                 max_bytes: int = MAX_EDIT_BYTES) -> tuple[str | None, bool]:
    """:func:`read_confined`'s text, and whether the file is UTF-8 (True when there is
    none): one read in Windows-1252 or GBK holds no U+FFFD, and is not UTF-8 all the
    same. Blocking."""
    try:
        fd = safepath.open_confined(root, path)
    except NotFound:
        return None, True
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InvalidParams(f"file is too large to edit ({max_bytes} bytes max): {path}")
    return note_text(data), _utf8(data)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def utf8_file(root: Path, path: str) -> bool:
    """Whether the whole of ``root/path`` is UTF-8 (read in pieces; any size). Blocking."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with os.fdopen(safepath.open_confined(root, path), "rb") as f:
        try:
            while chunk := f.read(1 << 16):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return False
    return True
