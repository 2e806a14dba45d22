"""The replica's file operations on the workspace directory, confined to it.

Reads go through :func:`recalld.daemon.safepath.open_confined`, writes through
:func:`recalld.daemon.memory.fileops.write_confined` (temp file, fsync, rename; symbolic
links refused on the way; a run of files fsyncs their folders once, after the last),
deletions walk the directories with ``O_NOFOLLOW`` the same way. Only Markdown files
under the watched folders (``daily_dir``, ``digest_dir``) are replicated: a path
arriving from the server that names anything else is refused, so a shared workspace
cannot write into another host's metadata or outside its root.

Everything here blocks on the file system; call it through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from recalld.daemon import safepath
from recalld.daemon.index.records import note_stamp
from recalld.daemon.memory.confined import NO_FILE, exchange_if, unlink_if
from recalld.daemon.memory.fileops import write_confined
from recalld.daemon.memory.notenames import is_day_index
from recalld.daemon.store import confine
from recalld.daemon.store.fsio import REAL, fit_name
from recalld.ipc.errors import RecalldError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

#: ``expect`` of a write that overwrites whatever the file holds.
ANY: object = object()


class LinkOnTheWay(OSError):
    """A folder on a note's path is a symbolic link (``memory/`` moved to another disk and
    linked back, a project folder linked in): the replica neither follows it nor takes
    the notes behind it for deleted, which would delete them on every other host."""

    def __init__(self, folder: str) -> None:
        super().__init__(errno.ELOOP, "a symbolic link the replica does not follow", folder)

    def __str__(self) -> str:
        return f"{self.filename} is a symbolic link, which the replica does not follow"


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class EditedMeanwhile(RecalldError):
    """A file changed on disk (an editor saved it) after the replica read it and before
    the replica's write replaced or removed it: the write is not made, the save is kept
    (``found``: the file as it is now), and goes up as a local change."""

    def __init__(self, found: LocalFile) -> None:
        super().__init__(f"{found.path} was changed on disk while the replica wrote it")
        self.found = found


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class LocalFile:
    """A file as it is on disk now: its bytes, hash and stat (None when absent): its
    :func:`note_stamp`, the last change and the size, as the index knows notes by."""

    path: str
    data: bytes | None
    hash: str | None
    stat: tuple[int, int] | None

    @property
    def exists(self) -> bool:
        return self.data is not None


class Confinement:
    """Which workspace-relative paths the replica reads and writes."""

    def __init__(self, root: Path, roots: tuple[str, ...], suffixes: tuple[str, ...] = (".md",),
                 *, daily_dir: str | None = None) -> None:
        self.root = root
        self.roots = tuple(tuple(r.strip("/").split("/")) for r in roots)
        self.suffixes = suffixes
        #: The daily folder, whose day indexes each host derives for itself (not shared).
        self.daily_dir = daily_dir

    def accepts(self, path: str) -> bool:
        """Whether ``path`` is a replicated note (under a watched folder, no hidden part,
        no day index)."""
        try:
            parts = safepath.split_relative(path)
        except RecalldError:
            return False
        if "/".join(parts) != path or len(parts) < 2:
            return False
        if any(p.startswith(".") for p in parts):
            return False
        if self.daily_dir is not None and is_day_index(path, self.daily_dir):
            return False  # derived from the day's notes on each host (``dayindex.py``)
        return (self._depth(parts) is not None) and parts[-1].endswith(self.suffixes)

    def _depth(self, parts: Sequence[str]) -> int | None:
        """How many parts of a path below a replicated folder name that folder (None:
        the path is not below one)."""
        for root in self.roots:
            if len(parts) > len(root) and tuple(parts[:len(root)]) == root:
                return len(root)
        return None

    def read_each(self, paths: list[str], failed: dict[str, Exception]
                  ) -> list[LocalFile | None]:
        """:meth:`read` of each path; one that cannot be read now (a folder in its place,
        unreadable) is ``None`` in the list, its error in ``failed``."""
        out: list[LocalFile | None] = []
        for path in paths:
            try:
                out.append(self.read(path))
            except (OSError, RecalldError) as exc:
                failed[path] = exc
                out.append(None)
        return out

    def read(self, path: str) -> LocalFile:
        """``path`` as it is now: absent unless a regular file (a folder, a link or a
        socket of that name is no note, as for the index, so its note counts as deleted).
        Raises OSError when the file may be there but cannot be read now (no descriptors
        left, an I/O error, no permission, :class:`LinkOnTheWay`): that is no deletion."""
        parts = safepath.split_relative(path)
        current = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for depth, name in enumerate(parts[:-1], 1):
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=current)
                except OSError as exc:
                    if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(name, current):
                        raise LinkOnTheWay("/".join(parts[:depth])) from None
                    raise
                os.close(current)
                current = child
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=current)
        except OSError as exc:
            if exc.errno in NO_FILE and not isinstance(exc, LinkOnTheWay):
                return LocalFile(path, None, None, None)
            raise
        finally:
            os.close(current)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return LocalFile(path, None, None, None)
            pieces: list[bytes] = []
            while chunk := os.read(fd, 1 << 20):
                pieces.append(chunk)
            data = b"".join(pieces)
        finally:
            os.close(fd)
        return LocalFile(path, data, content_hash(data), note_stamp(st))

    def write(self, path: str, data: bytes, expect: str | object | None = ANY
              ) -> tuple[int, int]:
        """Publish ``data`` at ``path`` atomically; returns its new stat (:func:`note_stamp`).
        ``expect``: the hash the file must still have just before the rename (None:
        absent), else :class:`EditedMeanwhile` is raised and the file left as it is."""
        stat = self.put([(path, data)], expect={path: expect})[0]
        assert stat is not None
        return stat

    def put(self, files: list[tuple[str, bytes | None]],
            failed: dict[str, Exception] | None = None, *,
            expect: Mapping[str, str | object | None] | None = None,
            edited: list[LocalFile] | None = None) -> list[tuple[int, int] | None]:
        """Make each ``path`` hold ``data`` (None: deleted), each file published
        atomically, the folders fsynced once at the end; the new stat of
        each (None: deleted). On an error, the files before it are published; with
        ``failed``, a file that cannot be written (a folder in its place) is recorded
        there instead (its stat None) and the others are written.

        ``expect`` maps a path to the hash it was read with (None: absent): a file found
        otherwise just before its rename or unlink (an editor saved it since) is left as
        it is, appended to ``edited`` as it is now (its stat None), or, without
        ``edited``, raised as :class:`EditedMeanwhile`."""
        for path, _ in files:
            if not self.accepts(path):
                raise RecalldError(f"refusing to write a path the replica does not own: {path}")
        stats: list[tuple[int, int] | None] = []
        folders: set[Path] = set()
        try:
            for path, data in files:
                want = ANY if expect is None else expect.get(path, ANY)
                try:
                    stats.append(self._put_one(path, data, folders, want))
                except EditedMeanwhile as exc:
                    if edited is None:
                        raise
                    edited.append(exc.found)
                    stats.append(None)
                except (OSError, RecalldError) as exc:
                    if failed is None:
                        raise
                    failed[path] = exc
                    stats.append(None)
        finally:
            for folder in folders:
                REAL.fsync_dir(folder)
        return stats

    def _put_one(self, path: str, data: bytes | None, folders: set[Path],
                 expect: str | object | None) -> tuple[int, int] | None:
        if data is None:
            self.remove(path, expect)
            return None
        publish = None if expect is ANY else partial(self._publish, path, expect)
        write_confined(self.root, path, data, sync_dir=False, publish=publish)
        target = self.root / path
        folders.add(target.parent)
        return note_stamp(os.stat(target, follow_symlinks=False))

    def _publish(self, path: str, expect: str | object | None, tmp: Path, target: Path
                 ) -> None:
        """Move ``tmp`` to ``target`` only if the target holds ``expect`` (None: absent),
        else raise :class:`EditedMeanwhile` and leave it as it is. No save can fall
        between the comparison and the rename: the rename exchanges the two files (or
        does not replace one), and what came out is compared; a save found so is put
        back with a second exchange. Where the file system cannot, compared, then
        renamed (a save in between is overwritten). Both are in one folder, reached
        through the folders the workspace opened without following a link."""
        with confine.at(target) as (folder, name):
            self._publish_in(path, expect, folder,
                             os.fspath(tmp) if folder is None else tmp.name, name)

    def _publish_in(self, path: str, expect: str | object | None, folder: int | None,
                    tmp: str, target: str) -> None:
        """:meth:`_publish` of ``tmp`` to ``target``, names in ``folder``."""
        if not exchange_if(tmp, target, folder, lambda data: (
                None if data is None else content_hash(data)) == expect):
            raise EditedMeanwhile(self.read(path))  # the temp file is removed by the writer

    def remove(self, path: str, expect: str | object | None = ANY) -> None:
        """Delete ``path`` if it exists (directories on the way must not be links), and
        the folders that leaves empty up to the replicated one, as on the host that
        deleted it (a folder renamed or replaced by a note of its name leaves none).
        ``expect``: the hash the file must still hold (else :class:`EditedMeanwhile`
        keeps it): it is moved aside first and compared there, so a save made meanwhile
        is never removed unseen."""
        if not self.accepts(path):
            raise RecalldError(f"refusing to delete a path the replica does not own: {path}")
        parts = safepath.split_relative(path)
        fds = [confine.open_folder(self.root)]  # checked where it lies, if guarded
        try:
            for name in parts[:-1]:
                try:
                    fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
                except (FileNotFoundError, NotADirectoryError):
                    return
            try:
                st = os.stat(parts[-1], dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                return
            if not stat.S_ISREG(st.st_mode):
                return
            if expect is ANY:
                os.unlink(parts[-1], dir_fd=fds[-1])
            elif not self._unlink_if(path, parts[-1], fds[-1], expect):
                return
            os.fsync(fds[-1])
            top = self._depth(parts)
            assert top is not None  # accepts() said so
            for depth in range(len(parts) - 2, top - 1, -1):  # parts[depth] is in fds[depth]
                try:
                    os.rmdir(parts[depth], dir_fd=fds[depth])
                except OSError:  # not empty (or gone): it stays
                    break
                os.fsync(fds[depth])
        finally:
            for fd in fds:
                os.close(fd)

    def _unlink_if(self, path: str, name: str, folder: int, expect: str | object | None
                   ) -> bool:
        """Unlink ``name`` in ``folder`` if it holds ``expect`` (False: it was gone).
        Moved aside under a temp name first and compared there; a save found so is moved
        back (unless a newer one took the name meanwhile)."""
        done = unlink_if(name, folder, lambda data: (
            None if data is None else content_hash(data)) == expect)
        if done is False:
            raise EditedMeanwhile(self.read(path))
        return bool(done)


def conflict_name(path: str, when: float, host: str, attempt: int = 0) -> str:
    """Syncthing's name for a conflict copy: ``note.sync-conflict-20261201-153216-host.md``.

    ``attempt`` > 0 adds a counter for the rare copy whose name is already taken. The
    stem is cut short where the name would pass ``safepath.MAX_NAME_BYTES``.
    """
    head, _, name = path.rpartition("/")
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    stamp = dt.datetime.fromtimestamp(when, dt.UTC).strftime("%Y%m%d-%H%M%S")
    extra = f"-{attempt}" if attempt else ""
    tail = f".sync-conflict-{stamp}-{host}{extra}" + (f".{ext}" if ext else "")
    # A stem as long as a file name may be leaves no room for the tail: it is cut short.
    new = fit_name(stem, safepath.MAX_NAME_BYTES - len(os.fsencode(tail))) + tail
    return f"{head}/{new}" if head else new
