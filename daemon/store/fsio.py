"""The filesystem seam and atomic publish: the only way state bytes reach the disk.

Owns nothing long-lived and starts nothing. ``FS`` is the seam: the handful of mutating
primitives the store uses (open for write or append, write, fsync, truncate, close, replace,
link, fsync of a directory, unlink, listdir, mkdir). ``REAL`` is the process-wide real one;
``failingfs.FailingFS`` is the test double that raises ``OSError(ENOSPC)`` on the k-th
counted call, once or persistently. Reads do not go through the seam: they cannot corrupt
anything; below an open workspace they go through its folders' handles all the same
(:mod:`confine`), so that none reads another folder's state through a link.

``atomic_write`` / ``atomic_writer`` publish a file the way SQLite and Lucene do: a temp file
``.<name>.tmp-<random>`` in the same directory, write, fsync, ``os.replace``, fsync the
directory. On any failure the temp file is removed, the old file is untouched, and the error
is raised as a ``StorageError`` (``DiskFull`` for ENOSPC). Everything here blocks: callers in
the event loop run it in a worker thread.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from recalld.daemon.store import confine
from recalld.daemon.store.errors import CorruptState, translate_os_error
from recalld.daemon.store.tempnames import TEMP_RE as TEMP_RE
from recalld.daemon.store.tempnames import fit_name as fit_name
from recalld.daemon.store.tempnames import lock_temp
from recalld.daemon.store.tempnames import temp_name as temp_name
from recalld.daemon.store.tempnames import temp_prefix as temp_prefix
from recalld.ipc.folders import make_dirs_private

_CHECKSUM_BYTES = 32  # blake2b-256: ample against accidental corruption, fast in hashlib
_READ_CHUNK = 1 << 20
#: Every state file, log and record recalld writes: they may hold model keys given in a
#: workspace's config and the users' texts, and a workspace may lie in a folder others can
#: enter. The umask applies (it can only narrow it).
PRIVATE_MODE: Final = 0o600
#: A new note a client writes (umask applies), as an editor makes it; a rewritten note
#: keeps the mode it has (:func:`note_mode`).
NOTE_MODE: Final = 0o644
#: A folder recalld makes for its own state, logs and records (:func:`ensure_dir`), as
#: private as the files in it; the umask applies.
PRIVATE_DIR_MODE: Final = 0o700
#: A note folder a client's write makes (:meth:`FS.mkdir`), and a workspace folder a
#: restore makes, as an editor makes them (umask applies).
NOTE_DIR_MODE: Final = 0o755
#: Why :meth:`FS.open_append` refused what it found (a FIFO, a device, a socket).
NOT_A_FILE: Final = "not a regular file (a device, FIFO or socket)"
#: A file read whole with no expected size (a manifest, another tool's record file) is
#: refused past this: they are small, and nothing may read a device in its place forever.
MAX_UNVERIFIED_BYTES = 1 << 30


def new_hash() -> hashlib.blake2b:
    """The checksum used for every state file (blake2b, 256-bit digest)."""
    return hashlib.blake2b(digest_size=_CHECKSUM_BYTES)


def checksum(data: bytes | bytearray | memoryview) -> str:
    """Hex checksum of ``data``."""
    h = new_hash()
    h.update(data)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class FileEntry:
    """What the manifest records about one data file.

    ``name`` is the file name (relative to the state directory once committed), ``size``
    its byte length, ``checksum`` the hex blake2b-256 of all its bytes and ``records`` the
    record count for record files (None for other kinds).
    """

    name: str
    size: int
    checksum: str
    records: int | None = None


class FS:
    """The real filesystem. Subclass to inject faults; every method may raise OSError."""

    def open_write(self, path: Path, mode: int = PRIVATE_MODE) -> int:
        """Create ``path`` exclusively for writing (``mode``, umask applied) and return its
        descriptor."""
        with confine.at(path) as (folder, name):
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                           mode, dir_fd=folder)

    def open_write_at(self, folder: int, name: str, mode: int = PRIVATE_MODE) -> int:
        """:meth:`open_write` of ``name`` in the folder opened as ``folder``."""
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                       mode, dir_fd=folder)

    def open_append(self, path: Path) -> int:
        """Open (creating if needed) ``path`` to append (and read back); never via a link,
        and only a regular file: appends to a FIFO or a device (OSError EINVAL) would be
        lost, or wait for a reader for good. A log made by an older recalld that others
        may read is made private (PRIVATE_MODE) before anything more is appended."""
        with confine.at(path) as (folder, name):
            fd = os.open(name, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW | os.O_NONBLOCK, PRIVATE_MODE, dir_fd=folder)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, NOT_A_FILE, os.fspath(path))
            if stat.S_IMODE(st.st_mode) & ~PRIVATE_MODE:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & PRIVATE_MODE)
        except OSError:
            os.close(fd)
            raise
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> None:
        """Write all of ``data`` (looping over short writes)."""
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, src: Path, dst: Path) -> None:
        with confine.at(src) as (src_folder, src_name), \
                confine.at(dst) as (dst_folder, dst_name):
            os.replace(src_name, dst_name, src_dir_fd=src_folder, dst_dir_fd=dst_folder)

    def replace_at(self, folder: int, src: str, dst: str) -> None:
        """:meth:`replace` of ``src`` by ``dst``, both in the folder opened as ``folder``."""
        os.replace(src, dst, src_dir_fd=folder, dst_dir_fd=folder)

    def link(self, src: Path, dst: Path) -> None:
        with confine.at(src) as (src_folder, src_name), \
                confine.at(dst) as (dst_folder, dst_name):
            os.link(src_name, dst_name, src_dir_fd=src_folder, dst_dir_fd=dst_folder,
                    follow_symlinks=False)

    def fsync_dir(self, path: Path) -> None:
        """Make a directory's entries (creates, renames, unlinks) durable."""
        fd = confine.open_folder(path)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: Path) -> None:
        with confine.at(path) as (folder, name):
            os.unlink(name, dir_fd=folder)

    def listdir(self, path: Path) -> list[str]:
        return confine.listdir(path)

    def mkdir(self, path: Path, mode: int = NOTE_DIR_MODE) -> None:
        confine.mkdir(path, mode)


#: The process-wide real filesystem.
REAL = FS()


def mkdir_private(path: Path) -> bool:
    """Create ``path`` (and missing parents, all 0700) with mode 0700 and return True, or
    return False when it exists already: an existing directory is never chmod-ed (it may
    be any folder the user named), so the caller checks what it found."""
    make_dirs_private(path.parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    os.chmod(path, 0o700)  # ours, just made: only the umask could have narrowed it
    return True


def ensure_dir(fs: FS, path: Path) -> None:
    """Create the folder ``path`` of recalld's own files (and missing parents) durably,
    private (PRIVATE_DIR_MODE): each new entry's parent is fsynced."""
    _make_durably(fs, path, lambda folder: fs.mkdir(folder, PRIVATE_DIR_MODE),
                  PRIVATE_DIR_MODE)


def ensure_root(fs: FS, path: Path) -> None:
    """Create the workspace folder ``path`` itself (and missing parents) durably: what
    the writes below a guarded folder never make again (:func:`confine.mkdir`), a
    restore makes where it puts a workspace that had no folder."""
    _make_durably(fs, path, lambda folder: os.mkdir(folder, NOTE_DIR_MODE), NOTE_DIR_MODE)


def _make_durably(fs: FS, path: Path, make: Callable[[Path], None], mode: int) -> None:
    """``make(path)`` and fsync its parent; missing parents are made first, of ``mode``."""
    if path.is_dir():
        return
    _make_durably(fs, path.parent, lambda folder: fs.mkdir(folder, mode), mode)
    try:
        make(path)
    except FileExistsError:
        return
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    try:
        fs.fsync_dir(path.parent)
    except OSError as exc:
        raise translate_os_error(exc, path.parent) from exc


class AtomicFile:
    """A temp file being written; becomes ``path`` only when ``atomic_writer`` exits cleanly.

    ``write`` streams bytes through the seam and keeps the running size and checksum, so
    the published file's ``FileEntry`` costs no second read.
    """

    def __init__(self, fs: FS, fd: int, path: Path, tmp: Path) -> None:
        self._fs = fs
        self._fd = fd
        self.path = path
        self.tmp = tmp
        self.size = 0
        self._hash = new_hash()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data)
        self._fs.write(self._fd, view)
        self._hash.update(view)
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        """No buffering here (stream wrappers call it)."""

    def entry(self, records: int | None = None) -> FileEntry:
        return FileEntry(self.path.name, self.size, self._hash.hexdigest(), records)


@contextmanager
def atomic_writer(fs: FS, path: Path, *, sync_dir: bool = True,
                  mode: int = PRIVATE_MODE, temp_of: Callable[[str], str] = temp_name,
                  locked: bool = False) -> Iterator[AtomicFile]:
    """Write ``path`` atomically: ``with atomic_writer(fs, p) as f: f.write(...)``.

    The file appears (fully written and fsynced) only if the block exits normally. On any
    exception, including cancellation-driven ones, the temp file is removed and the old
    ``path`` (if any) is untouched; OSErrors are raised as StorageIOError / DiskFull.
    ``sync_dir=False`` leaves the fsync of the folder (which makes the rename durable) to
    the caller, who publishes several files in it. ``mode``: the new file's (umask
    applied), from its creation on; PRIVATE_MODE but for notes (:func:`note_mode`).
    ``temp_of`` names the temp file; ``locked``: the writer holds an exclusive ``flock``
    on it till the end, so that :func:`tempnames.remove_dead_temps` tells it from one a
    killed writer left.
    """
    while True:
        tmp = path.with_name(temp_of(path.name))
        try:
            fd = fs.open_write(tmp, mode)
        except OSError as exc:
            raise translate_os_error(exc, path) from exc
        if not locked or lock_temp(fd):
            break
        _quietly(os.close, fd)  # taken for a dead writer's and removed: another name
    published = False
    closed = False
    try:
        out = AtomicFile(fs, fd, path, tmp)
        yield out
        fs.fsync(fd)
        closed = True
        fs.close(fd)
        fs.replace(tmp, path)
        published = True
        if sync_dir:
            fs.fsync_dir(path.parent)
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    finally:
        if not closed:
            _quietly(os.close, fd)
        if not published:
            _quietly(fs.unlink, tmp)


def atomic_write(fs: FS, path: Path, data: bytes | bytearray | memoryview, *,
                 sync_dir: bool = True) -> FileEntry:
    """Publish ``data`` as ``path`` atomically (see ``atomic_writer``); return its entry."""
    with atomic_writer(fs, path, sync_dir=sync_dir) as out:
        out.write(data)
    return out.entry()


def note_mode(path: Path) -> int:
    """The mode to write the note ``path`` with: the one it has (a note its user made
    private stays private), NOTE_MODE for a new one."""
    try:
        st = os.lstat(path)
    except OSError:
        return NOTE_MODE
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else NOTE_MODE


def publish_copy(fs: FS, src: Path, dst: Path) -> None:
    """Make ``dst`` an atomic replica of ``src`` (a hard link; a copy where links fail).

    ``src`` must not change afterwards (generation files never do). The link is made under a
    temp name and renamed over ``dst``, so a reader of ``dst`` sees the old or the new file.
    """
    tmp = dst.with_name(temp_name(dst.name))
    try:
        try:
            fs.link(src, tmp)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP):
                raise
            _copy(fs, src, dst)
            return
        try:
            fs.replace(tmp, dst)
        except OSError:
            _quietly(fs.unlink, tmp)
            raise
        fs.fsync_dir(dst.parent)
    except OSError as exc:
        raise translate_os_error(exc, dst) from exc


def _copy(fs: FS, src: Path, dst: Path) -> None:
    with open_state(src) as f, atomic_writer(fs, dst) as out:
        while block := f.read(_READ_CHUNK):
            out.write(block)


def open_state(path: Path) -> BinaryIO:
    """Open a state file for reading; CorruptState unless it is a regular file.

    A directory, device, FIFO or socket in its place is damage with the remedy of a
    garbled file, not an I/O error; the open does not wait for a FIFO's writer.
    FileNotFoundError is left to the caller (a missing file means different things).
    Below an open workspace it is opened through its folders' handles (:mod:`confine`):
    a link in place of a folder on the way raises WritesElsewhere, one in place of the
    file itself OSError(ELOOP), as the writers refuse it.
    """
    try:
        fd = confine.open_file(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket
            raise CorruptState(path, "not a regular file (a socket)") from exc
        if exc.errno == errno.ELOOP and not isinstance(exc, confine.WritesElsewhere):
            # A link in the file's own place (below a workspace, never followed): damage
            # to set aside as a directory there is, not a folder leading elsewhere.
            raise CorruptState(path, "not a regular file (a symbolic link)") from exc
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
            raise CorruptState(path, f"not a regular file ({kind})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_verified(path: Path, expected: FileEntry | None, *, trusted: bool = False) -> bytes:
    """All bytes of ``path``; with ``expected``, only if size and checksum match
    (``trusted``: the checksum was verified moments ago, check the size only).

    Raises CorruptState (missing, not a regular file, wrong size, wrong checksum, over
    ``MAX_UNVERIFIED_BYTES`` without ``expected``) or StorageIOError.
    """
    limit = MAX_UNVERIFIED_BYTES if expected is None else expected.size
    try:
        with open_state(path) as f:
            size = os.fstat(f.fileno()).st_size
            if expected is not None and size != expected.size:
                raise CorruptState(path, f"size {size} != expected {expected.size}")
            if size > limit:
                raise CorruptState(path, f"{size} bytes, more than a state file holds")
            # What fstat saw and a byte more, not ``limit`` bytes: a read reserves its
            # whole size at once (a gigabyte for every small file read unverified, which
            # an address-space limit refuses). One that grew meanwhile is read on.
            data = f.read(size + 1)
            while size < len(data) <= limit and (
                    more := f.read(min(_READ_CHUNK, limit + 1 - len(data)))):
                data += more
            if len(data) > limit:
                raise CorruptState(path, "grew while read")
    except FileNotFoundError as exc:
        raise CorruptState(path, "missing") from exc
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    if expected is not None:
        if len(data) != expected.size:  # changed under us since fstat
            raise CorruptState(path, f"size {len(data)} != expected {expected.size}")
        if not trusted and checksum(data) != expected.checksum:
            raise CorruptState(path, "checksum mismatch")
    return data


def verify_file(path: Path, expected: FileEntry) -> None:
    """Check size and checksum of ``path`` by streaming it; raise CorruptState if wrong.

    For native loaders that take a path (hnswlib): verify, then load the same path.
    """
    try:
        with open_state(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size != expected.size:
                raise CorruptState(path, f"size {size} != expected {expected.size}")
            h = new_hash()
            total = 0
            while block := f.read(_READ_CHUNK):
                h.update(block)
                total += len(block)
    except FileNotFoundError as exc:
        raise CorruptState(path, "missing") from exc
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    if total != expected.size:
        raise CorruptState(path, f"size {total} != expected {expected.size}")
    if h.hexdigest() != expected.checksum:
        raise CorruptState(path, "checksum mismatch")


def adopt_file(fs: FS, tmp: Path, path: Path) -> FileEntry:
    """Publish a file a native writer produced at ``tmp`` (e.g. hnswlib ``save_index``).

    Hashes it, fsyncs it, renames it to ``path`` and fsyncs the directory. ``tmp`` should be
    named with ``temp_name`` in the same directory so that an interrupted adopt is cleaned
    up like any other temp file. On failure ``tmp`` is removed.
    """
    published = False
    try:
        h = new_hash()
        size = 0
        with open_state(tmp) as f:  # below a workspace: through its folders' handles
            while block := f.read(_READ_CHUNK):
                h.update(block)
                size += len(block)
            fs.fsync(f.fileno())
        fs.replace(tmp, path)
        published = True
        fs.fsync_dir(path.parent)
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    finally:
        if not published:
            _quietly(fs.unlink, tmp)
    return FileEntry(path.name, size, h.hexdigest())


def remove_temp_files(fs: FS, directory: Path) -> list[str]:
    """Remove interrupted-publish temp files in ``directory``; return their names."""
    try:
        names = fs.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise translate_os_error(exc, directory) from exc
    removed = [name for name in names if TEMP_RE.match(name)]
    for name in removed:
        _quietly(fs.unlink, directory / name)
    return removed


def remove_if_there(fs: FS, path: Path) -> None:
    """Remove the file ``path`` through ``fs`` (through handles below a workspace's
    folder); nothing there is no error."""
    try:
        fs.unlink(path)
    except FileNotFoundError:
        pass


def _quietly(func: Callable[..., object], *args: object) -> None:
    """Best-effort cleanup: the original error matters more than a failed unlink."""
    try:
        func(*args)
    except OSError:
        pass
