"""Blocking file primitives confined to a workspace root, for :mod:`fileops` and the
memory jobs (run them in a worker thread): publish a file atomically, remove one, read
one's text, tell whether a file is UTF-8. Names are checked by :mod:`safepath`; symbolic
links on the way are refused. No state, no task.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Callable
from pathlib import Path

from recalld.daemon import safepath
from recalld.daemon.notetext import note_text
from recalld.daemon.store.errors import translate_os_error
from recalld.daemon.store.fsio import FS, NOTE_MODE, REAL, atomic_writer
from recalld.ipc.errors import InvalidParams, NotFound, PathOutsideWorkspace

MAX_EDIT_BYTES = 4 << 20


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
    """The real file system, but for the rename that publishes a file: ``publish``'s."""

    def __init__(self, publish: Callable[[Path, Path], None]) -> None:
        self._publish = publish

    def replace(self, src: Path, dst: Path) -> None:
        self._publish(src, dst)


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


def unlink_confined(root: Path, path: str) -> None:
    """Remove the regular file ``path`` (relative to ``root``) without leaving ``root``;
    nothing there is no error. Raises PathOutsideWorkspace (a link on the way or at the
    end) or InvalidParams (not a regular file). Blocking."""
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
        os.unlink(parts[-1], dir_fd=folder)
        os.fsync(folder)
    finally:
        os.close(folder)


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
