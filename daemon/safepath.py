"""Confined resolution of paths named by clients (RELIABILITY 19).

A client names a file relative to a workspace root. The name is checked as text first
(no NUL, not absolute, no ``..`` component), then walked one component at a time with
``os.open(..., O_NOFOLLOW, dir_fd=parent)``: every step is relative to a descriptor we
already hold, and a symbolic link anywhere on the way is refused. A symlink swapped in
between a check and a use therefore cannot redirect the walk: there is no check-then-use.

Nothing here creates, truncates or modifies a file (:func:`open_confined` with
``writable`` hands its caller a descriptor to append to). All functions block on the file
system; call them through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from recalld.daemon.notetext import decode_as, decode_note, note_text
from recalld.ipc.errors import InvalidParams, NotFound, PathOutsideWorkspace
from recalld.ipc.regular_files import blocked_on_way, not_a_folder
from recalld.ipc.types import visible

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading must not hang; regular files ignore it.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
MAX_PATH_CHARS = 4096
#: The longest file name (one path component) in bytes: NAME_MAX of the Linux file
#: systems written to (ext4, xfs, btrfs, tmpfs).
MAX_NAME_BYTES = 255


def is_utf8(name: str) -> bool:
    """Whether the file name or path ``name`` (as ``os.fsdecode`` gives it) was valid
    UTF-8 on disk: other bytes come back as lone surrogates, which no index key, JSON
    answer, zip member name or database row can hold."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(name: str) -> str:
    """``name`` for a log line, with the bytes that are not UTF-8 as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def split_relative(path: object, *, root_ok: bool = False) -> list[str]:
    """The components of a client-named relative path, or PathOutsideWorkspace.

    ``.`` and empty components are dropped; a path naming the root itself is refused
    (InvalidParams), unless ``root_ok`` (then it has no components).
    """
    if not isinstance(path, str):
        raise InvalidParams("path must be a string")
    if "\x00" in path:
        raise PathOutsideWorkspace("path contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise InvalidParams("path is too long")
    if path.startswith("/"):
        raise PathOutsideWorkspace("path must be relative to the workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathOutsideWorkspace("path must not contain '..'")
    if not parts and not root_ok:
        raise InvalidParams("path names the workspace root, not a file")
    if any(len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for p in parts):
        # The file system would refuse it (ENAMETOOLONG) deep inside a read or a write.
        raise InvalidParams(f"a part of the path is longer than {MAX_NAME_BYTES} bytes")
    return parts


def split_file(path: object) -> list[str]:
    """:func:`split_relative` of a path that names a file: one ending in ``/`` (or
    ``/.``) names a folder, as the system reads it, and is refused (InvalidParams)."""
    parts = split_relative(path)
    if isinstance(path, str) and path.endswith(("/", "/.")):
        end = "/." if path.endswith("/.") else "/"
        raise InvalidParams(f"path ends in '{end}', so it names a folder, not a file: "
                            f"{quoted(path)}")
    return parts


def below(parts: Sequence[str], folders: Iterable[str]) -> bool:
    """Whether the path ``parts`` (from :func:`split_relative`) lies below one of
    ``folders`` (workspace-relative folder names)."""
    for folder in folders:
        prefix = split_relative(folder)
        if len(parts) > len(prefix) and list(parts[: len(prefix)]) == prefix:
            return True
    return False


def masked(path: str) -> str:
    """A client-named ``path`` as an error message names it: masked where a part of it
    looks like a credential, as search and status show such a note's path."""
    from recalld.daemon.memory.secret_names import mask_path

    return mask_path(path)


def quoted(path: str) -> str:
    """A client-named ``path`` as an error message quotes it: :func:`masked`, with control
    characters and bidi controls shown as escapes (as a search hit's header shows them),
    so a name cannot break the message into lines, drive a terminal or turn it around."""
    return visible(masked(path))


def shown_masked(path: str) -> str:
    """A path for a log line, a status or an answer: bytes that are not UTF-8 as ``\\xNN``
    (:func:`shown`), a name that holds what looks like a credential masked (:func:`masked`),
    as search shows such a note."""
    return masked(shown(path))


def masked_about(text: str, path: str) -> str:
    """``text`` (an error's words, which may quote ``path`` or a folder of it, as an
    absolute path) with each name of ``path`` that :func:`masked` masks masked there."""
    from recalld.daemon.memory.secret_names import mask_name

    for part in sorted(set(path.split("/")), key=len, reverse=True):
        if part and (shown := mask_name(part)) != part:
            text = text.replace(part, shown)
    return text


def _refuse_or_missing(parent_fd: int, name: str, exc: OSError, path: str) -> Exception:
    """Translate a failed step: a symlink is outside, anything missing is NotFound."""
    shown = quoted(path)
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return NotFound(f"no such file in the workspace: {shown}")
    except OSError:
        return NotFound(f"cannot open {shown}: {os.strerror(exc.errno or 0)}")
    if stat.S_ISLNK(st.st_mode):
        return PathOutsideWorkspace(f"path goes through a symbolic link: {shown}")
    if exc.errno == errno.ENOTDIR:
        return NotFound(f"not a directory on the way to {shown}")
    return NotFound(f"cannot open {shown}: {os.strerror(exc.errno or 0)}")


def _check_opened_root(fd: int, root: Path) -> None:
    """PathOutsideWorkspace if the folder opened as ``root`` (``fd``) lies elsewhere: a
    link took the place of the workspace folder, or of a folder on its path."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: nothing to compare
        return
    if real != os.path.abspath(root):
        raise PathOutsideWorkspace(f"the workspace folder {root} now leads to {real}")


#: ``make(parent, name, walked)``: make the missing folder ``name`` in the folder
#: descriptor ``parent`` (``walked``: its workspace-relative path).
MakeFolder = Callable[[int, str, str], None]


def open_parent(root: Path, parts: Sequence[str], path: str,
                make: MakeFolder | None = None) -> int:
    """A descriptor of the folder ``parts[:-1]`` (:func:`split_relative` of ``path``)
    below ``root``, opened folder by folder without following a link; the caller closes
    it. With ``make``, a missing folder on the way is made by it and then opened as any
    other (a link put there meanwhile is refused). Raises PathOutsideWorkspace or
    NotFound."""
    try:
        current = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotFound(f"workspace root is not available: {exc.strerror}") from None
    try:
        _check_opened_root(current, root)
        for depth, name in enumerate(parts[:-1], start=1):
            child = _open_step(current, name, path,
                               None if make is None else "/".join(parts[:depth]), make)
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


def _open_step(parent: int, name: str, path: str, walked: str | None,
               make: MakeFolder | None) -> int:
    """The folder ``name`` in ``parent`` opened without following a link; made first by
    ``make`` if missing and ``make`` is given."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError as exc:
        if make is None or walked is None:
            raise _refuse_or_missing(parent, name, exc, path) from None
    except OSError as exc:
        raise _refuse_or_missing(parent, name, exc, path) from None
    make(parent, name, walked)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise _refuse_or_missing(parent, name, exc, path) from None


def open_confined(root: Path, path: str, *, writable: bool = False) -> int:
    """Open ``path`` (relative to ``root``, resolved: as the workspace was opened)
    read-only (``writable``: for reading and writing, never created or truncated)
    without leaving ``root``.

    Returns a file descriptor of a regular file that the caller must close.
    Raises PathOutsideWorkspace, NotFound or InvalidParams (not a regular file).
    """
    parts = split_file(path)
    current = open_parent(root, parts, path)
    try:
        try:
            # O_RDONLY is 0: or-ed with O_RDWR, it reads and writes.
            flags = _FILE_FLAGS | os.O_RDWR if writable else _FILE_FLAGS
            fd = os.open(parts[-1], flags, dir_fd=current)
        except OSError as exc:
            raise _refuse_or_missing(current, parts[-1], exc, path) from None
    finally:
        os.close(current)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidParams(f"not a regular file: {quoted(path)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True, slots=True)
class LineSlice:
    """Lines ``start_line..end_line`` (1-based, inclusive) of a file of ``total_lines``."""

    start_line: int
    end_line: int
    total_lines: int
    text: str
    truncated: bool


def read_lines(
    root: Path,
    path: str,
    *,
    start_line: int = 1,
    end_line: int | None = None,
    max_bytes: int = 512 * 1024,
) -> LineSlice:
    """Read a line range of a confined file, streaming so memory stays bounded.

    The whole file is scanned to count its lines, but at most ``max_bytes`` of it are
    kept; when the range does not fit, ``truncated`` is set and ``end_line`` says where
    the returned text stops. ``end_line`` past the end is clamped.
    """
    fd = open_confined(root, path)
    if os.pread(fd, 4, 0).startswith(_WIDE_BOMS):
        with os.fdopen(fd, "rb") as wide:
            return _wide_lines(wide.read(DETECT_BYTES), start_line, end_line, max_bytes)
    kept: list[bytes] = []
    kept_bytes = 0
    truncated = False
    last_kept = start_line - 1
    line_no = 0
    partial = b""
    with os.fdopen(fd, "rb", buffering=0) as f:

        def take(line: bytes, number: int) -> None:
            nonlocal kept_bytes, truncated, last_kept
            if truncated or number < start_line or (end_line is not None and number > end_line):
                return
            room = max_bytes - kept_bytes
            if len(line) <= room:
                kept.append(line)
                kept_bytes += len(line)
                last_kept = number
            else:
                if not kept:
                    # One line longer than the cap: hand back its head rather than nothing,
                    # cut where a character starts (not inside a Chinese one, say).
                    cut = room
                    while 0 < cut < len(line) and line[cut] & 0xC0 == 0x80:
                        cut -= 1
                    kept.append(line[:cut])
                    kept_bytes += cut
                    last_kept = number
                truncated = True

        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            pieces = (partial + chunk).split(b"\n")
            partial = pieces.pop()
            for piece in pieces:
                line_no += 1
                take(piece + b"\n", line_no)
            if len(partial) > max_bytes + 1:
                # Bound the memory held for a huge line: only its head can ever be returned.
                partial = partial[: max_bytes + 1]
        if partial:
            line_no += 1
            take(partial, line_no)
        data = b"".join(kept)
        if _utf8(data, prefix=truncated):
            text = note_text(data, prefix=truncated)
        else:
            # A few lines of a note in GBK, say, may look like Windows-1252 text: they
            # are read in the encoding of the whole note, as the index reads it.
            head = os.pread(f.fileno(), DETECT_BYTES, 0)
            encoding = decode_note(head, prefix=len(head) == DETECT_BYTES)[1]
            text = decode_as(data, encoding, prefix=truncated)
    end = last_kept if kept else min(start_line - 1, line_no)
    return LineSlice(
        start_line=start_line,
        end_line=max(end, start_line - 1),
        total_lines=line_no,
        text=text,
        truncated=truncated,
    )


#: How much of a note tells its encoding (as much as the index reads: ``MAX_NOTE_BYTES``).
DETECT_BYTES = 8 << 20


# UTF-16 and UTF-32 (their byte order marks: the only way a note is read so; UTF-32 LE's
# begins as UTF-16 LE's).
_WIDE_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_BE)


def _wide_lines(data: bytes, start_line: int, end_line: int | None,
                max_bytes: int) -> LineSlice:
    """:func:`read_lines` of a note in UTF-16 or UTF-32, whose line breaks are other bytes
    than ASCII's: the note (up to ``DETECT_BYTES``) is decoded whole, then cut into lines
    as the index cuts it; ``max_bytes`` counts the lines' bytes in UTF-8."""
    lines = note_text(data, prefix=len(data) == DETECT_BYTES).split("\n")
    last = lines.pop()  # "" when the note ends with a line break
    lines = [line + "\n" for line in lines] + ([last] if last else [])
    kept: list[str] = []
    used = 0
    truncated = False
    for line in lines[start_line - 1:end_line]:
        size = len(line.encode("utf-8"))
        if used + size > max_bytes:
            if not kept:  # one line longer than the cap: its head
                kept.append(line.encode("utf-8")[:max_bytes].decode("utf-8", "ignore"))
            truncated = True
            break
        kept.append(line)
        used += size
    end = start_line - 1 + len(kept) if kept else min(start_line - 1, len(lines))
    return LineSlice(start_line=start_line, end_line=max(end, start_line - 1),
                     total_lines=len(lines), text="".join(kept), truncated=truncated)


def _utf8(data: bytes, *, prefix: bool) -> bool:
    """Whether ``data`` is UTF-8 (``prefix``: it may end inside a character)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return prefix and exc.reason == "unexpected end of data" and exc.end == len(data)
    return True


def is_inside(path: Path | str, root: Path | str, real_root: str | None = None) -> bool:
    """Whether ``path``, with every symbolic link resolved, lies in ``root`` (resolved).

    A directory link that stays in the workspace passes; one that leads out of it (to
    another agent's memory, to a system folder) does not, nor does a link loop.
    ``real_root``: where ``root`` really lay when it was opened, so that a link put in the
    place of the workspace folder since does not carry its notes' place along.
    """
    try:
        real = os.path.realpath(path, strict=True)
    except (OSError, RuntimeError):
        return False
    return _within(real, os.path.realpath(root) if real_root is None else real_root)


def leads_elsewhere(root: Path | str) -> str | None:
    """Where the workspace folder ``root`` (absolute, resolved when it was opened) now
    really lies, when a link took its place or that of a folder on its path; None while
    it resolves to itself, or while it is gone (a folder moved away or on a disk not
    mounted is missing, not elsewhere)."""
    try:
        real = os.path.realpath(root, strict=True)
    except (OSError, RuntimeError):
        return None
    return None if real == os.path.abspath(root) else real


def check_in_place(root: Path) -> None:
    """PathOutsideWorkspace if the workspace folder ``root`` now leads elsewhere
    (:func:`leads_elsewhere`): what a job would save by path under it (its catalog, its
    run's record) would land in that other folder, perhaps another agent's (blocking)."""
    elsewhere = leads_elsewhere(root)
    if elsewhere is not None:
        raise PathOutsideWorkspace(f"the workspace folder {root} now leads to {elsewhere}")


def _within(real: str, base: str) -> bool:
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def open_inside(root: Path, rel: str, real_root: str | None = None) -> int:
    """Open ``root/rel`` read-only for the daemon's own scans (indexer, cataloguer).

    Unlike :func:`open_confined`, directory links on the way are followed, but only as far
    as they stay in ``root``: the file opened is checked where it really lies (through its
    descriptor, so a link swapped in meanwhile cannot redirect the check). The last
    component is never followed. Returns a descriptor the caller closes; raises
    PathOutsideWorkspace for a file outside ``root`` and OSError as ``os.open`` does.
    ``real_root``: ``os.path.realpath(root)``, when the caller opens many files of it.
    """
    fd = os.open(os.path.join(root, rel), _FILE_FLAGS)
    try:
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")  # already free of links
        except OSError:  # no /proc: resolve the name instead
            real = os.path.realpath(os.path.join(root, rel))
        if not _within(real, os.path.realpath(root) if real_root is None else real_root):
            raise PathOutsideWorkspace(f"{quoted(rel)} lies outside the workspace")
    except BaseException:
        os.close(fd)
        raise
    return fd


def why_not_made(path: Path, exc: OSError) -> str:
    """Why the folder ``path`` (or one to make a file in) could not be made: the file on
    its way if one is (mkdir says only "File exists" or "Not a directory"), else the
    system's words (blocking)."""
    place = blocked_on_way(path)
    return not_a_folder(place) if place is not None else exc.strerror or str(exc)


def why_failed(exc: OSError) -> str:
    """One line for ``exc``, met making a file and the folders on its way: for mkdir's
    "File exists" or "Not a directory", the file in the way of a folder
    (:func:`why_not_made`); else the system's words and the path (blocking)."""
    words = exc.strerror or str(exc)
    if exc.filename is None:
        return words
    place = Path(os.fsdecode(exc.filename))
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        why = why_not_made(place, exc)
        if why != words:
            return why
    return f"{words}: {place}"


def why_not_writable(target: Path) -> str | None:
    """Why the file ``target`` could not be opened for appending, the folders on its way
    made as needed (a file in the way of one, a folder in its place, a place we may not
    write in), found without making anything; None: nothing in the way (blocking)."""
    place = next((p for p in (target, *target.parents) if os.path.lexists(p)), target)
    if place == target:
        if os.path.isdir(target):
            return f"{os.strerror(errno.EISDIR)}: {target}"
    elif not os.path.isdir(place):
        return f"{place} is not a directory"
    if not os.access(place, os.W_OK | (os.X_OK if place != target else 0)):
        return f"{os.strerror(errno.EACCES)}: {place}"
    return None
