"""Append-only logs of JSON records (pending work queues, job records, the inbox).

Each line is ``<crc32 as 8 hex digits> <json>\\n``, the CRC taken over the JSON bytes. An
append writes whole lines in one ``write`` and fsyncs (batch several records per call to
pay for one fsync). Recovery (``replay``) reads every line and checks its CRC and JSON:

- a torn or garbled tail (everything after the last good line: an unterminated line from a
  crash mid-append, or garbage such as the zero bytes some filesystems leave) is cut off by
  truncating the file to the end of the last good line;
- a bad line *followed by good ones* was committed and later damaged: it is reported with
  its byte offset and skipped, never fatal.

A log opened with a ``quarantine`` file sets damage aside instead of only skipping it:
the bad lines and the cut tail are appended there (raw bytes, offset, reason) before the
log is rewritten without them, so nothing is silently lost and the same damage is not
met again at the next open. A piece too big to copy (a log filled with garbage) is kept
by keeping the whole log under another name (``<name>.corrupt-<ns>``), which its
quarantine record names. A log that is no file at all (a directory, a device) is renamed
that way and starts empty.

``rewrite`` compacts the log into exactly the given records through an atomic publish;
``open`` removes what a rewrite killed before its rename left (the log's own temp files:
a compacted embedding cache is as large as the cache). A failed append is rolled back
(the file is truncated to its previous length), so a disk-full error never leaves half
a line behind. Blocking I/O: run it in a worker thread.
"""

from __future__ import annotations

import base64
import errno
import logging
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import NotRequired, TypedDict

import orjson

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store import confine
from recalld.daemon.store.errors import CorruptState, StorageError, translate_os_error
from recalld.daemon.store.fsio import (
    FS,
    NOT_A_FILE,
    REAL,
    TEMP_RE,
    atomic_write,
    ensure_dir,
    open_state,
    temp_prefix,
)
from recalld.daemon.store.records import BadLine

_CRC_LEN = 8
#: Damaged pieces up to this size are copied into the quarantine file (as base64 in
#: JSON); a bigger one (a log filled with garbage) is kept by keeping the whole log.
MAX_PIECE_BYTES = 16 << 20
log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReplayReport:
    """What recovery found: damaged committed lines, and the torn tail it cut off."""

    bad_lines: list[BadLine] = field(default_factory=list)
    #: Offset the file was (or, without repair, would be) truncated to; None if intact.
    truncated_at: int | None = None
    truncated_bytes: int = 0
    #: Pieces (bad lines, a cut tail) set aside in the quarantine file by this open.
    quarantined: int = 0
    #: Where a log that was no file (a directory, a device) was moved, and why.
    set_aside: str | None = None


def encode_line(record: Mapping[str, object]) -> bytes:
    body = orjson.dumps(record)
    return b"%08x %s\n" % (zlib.crc32(body), body)


def encode(records: Iterable[Mapping[str, object]]) -> bytes:
    return b"".join(encode_line(r) for r in records)


def _decode_line(line: bytes) -> JsonObject | str:
    """The record of one line (without its newline), or why it is bad."""
    if len(line) < _CRC_LEN + 2 or line[_CRC_LEN : _CRC_LEN + 1] != b" ":
        return "malformed line"
    try:
        crc = int(line[:_CRC_LEN], 16)
    except ValueError:
        return "malformed CRC"
    body = line[_CRC_LEN + 1 :]
    if zlib.crc32(body) != crc:
        return "CRC mismatch"
    try:
        record = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"bad JSON: {exc}"
    if not isinstance(record, dict):
        return "not a JSON object"
    return record


#: Why a record whose line is sound is not of the shape its log's writer gives it, or
#: None (a log's own check: a record written by hand or by another program).
ShapeCheck = Callable[[JsonObject], str | None]


def parse(data: bytes, check: ShapeCheck | None = None,
          ) -> tuple[list[JsonObject], ReplayReport, int]:
    """Records, report and the length of the good prefix of a log's bytes; a record
    ``check`` refuses is a bad line (its line sound: the prefix goes on past it)."""
    records: list[JsonObject] = []
    bad: list[BadLine] = []
    good_end = 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # unterminated: torn, whatever it holds
        decoded = _decode_line(data[pos:nl])
        why = None if isinstance(decoded, str) or check is None else check(decoded)
        if isinstance(decoded, str):
            bad.append(BadLine(pos, decoded))
        elif why is not None:
            bad.append(BadLine(pos, f"not of this log's shape: {why}"))
            good_end = nl + 1
        else:
            records.append(decoded)
            good_end = nl + 1
        pos = nl + 1
    report = ReplayReport(bad_lines=[b for b in bad if b.offset < good_end])
    if len(data) > good_end:
        report.truncated_at = good_end
        report.truncated_bytes = len(data) - good_end
    return records, report, good_end


class SetAside(TypedDict):
    """A damaged piece of a log, as its quarantine file keeps it."""

    time: float
    offset: int
    reason: str
    raw_b64: str
    #: A piece over ``MAX_PIECE_BYTES`` is not copied (``raw_b64`` is empty): the whole
    #: damaged log is kept under this name, and ``length`` says how long the piece is.
    kept_in: NotRequired[str]
    length: NotRequired[int]


def _set_aside(data: bytes, report: ReplayReport, good_end: int,
               keep_whole: Callable[[], str]) -> list[SetAside]:
    """Quarantine records for the damaged pieces of a log's bytes. ``keep_whole`` keeps
    the whole log under another name (called once, for the first piece too big to copy)."""
    now = time.time()
    spans = [(bad.offset, data.find(b"\n", bad.offset), bad.reason) for bad in report.bad_lines]
    if len(data) > good_end:
        spans.append((good_end, len(data), "torn or garbled tail"))
    pieces: list[SetAside] = []
    kept: str | None = None
    for start, end, reason in spans:
        raw = memoryview(data)[start:end if end >= 0 else len(data)]
        if len(raw) <= MAX_PIECE_BYTES:
            pieces.append({"time": now, "offset": start, "reason": reason,
                           "raw_b64": base64.b64encode(raw).decode()})
            continue
        kept = kept or keep_whole()
        pieces.append({"time": now, "offset": start, "reason": reason, "raw_b64": "",
                       "kept_in": kept, "length": len(raw)})
    return pieces


def set_aside(fs: FS, path: Path, *, keep: bool = False) -> Path:
    """Put what is at ``path`` aside as ``<name>.corrupt-<ns>`` (a state file that is
    damaged or no file at all), durably; returns that path. ``keep`` leaves ``path`` as it
    is (a hard link), else it is renamed away and its place is free."""
    aside = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
    try:
        (fs.link if keep else fs.replace)(path, aside)
        fs.fsync_dir(path.parent)
    except OSError as exc:
        raise translate_os_error(exc, aside if keep else path) from exc
    return aside


def _keep_whole(fs: FS, path: Path) -> str:
    """Keep the log as it is under another name (a hard link); returns that name."""
    aside = set_aside(fs, path, keep=True)
    log.warning("%s: a damaged piece too big to quarantine; the whole log is kept as %s",
                path, aside.name)
    return aside.name


def _move_aside(fs: FS, path: Path, reason: str) -> ReplayReport:
    """Move a log that is no file out of the way (renamed, nothing removed): the log
    starts empty in its place."""
    aside = set_aside(fs, path)
    log.warning("%s is %s; set aside as %s, starting an empty log", path, reason, aside.name)
    return ReplayReport(set_aside=f"{aside.name}: {reason}")


def _open_quarantine(fs: FS, quarantine: Path) -> int:
    """The quarantine file opened to append; a FIFO or device in its place is set aside
    first (what is set aside must not be lost)."""
    try:
        return fs.open_append(quarantine)
    except OSError as exc:
        if exc.errno != errno.EINVAL or exc.strerror != NOT_A_FILE:
            raise
    aside = set_aside(fs, quarantine)
    log.warning("%s is %s; set aside as %s", quarantine, NOT_A_FILE, aside.name)
    return fs.open_append(quarantine)


def replay(
    path: Path, fs: FS = REAL, *, repair: bool = True, quarantine: Path | None = None,
    check: ShapeCheck | None = None,
) -> tuple[list[JsonObject], ReplayReport]:
    """The good records of the log at ``path`` (none if it does not exist).

    With ``repair`` a torn tail is truncated away (and the truncation fsynced). With a
    ``quarantine`` file (implies repair), damaged lines and the tail are appended there
    first and the log is rewritten with only its good records.
    """
    try:
        with open_state(path) as f:
            data = f.read()
    except FileNotFoundError:
        return [], ReplayReport()
    except CorruptState as exc:
        return [], _move_aside(fs, path, exc.reason) if repair else ReplayReport()
    except OSError as exc:
        raise translate_os_error(exc, path) from exc
    records, report, good_end = parse(data, check)
    if quarantine is not None and (report.bad_lines or report.truncated_at is not None):
        pieces = _set_aside(data, report, good_end, lambda: _keep_whole(fs, path))
        ensure_dir(fs, quarantine.parent)
        try:
            fd = _open_quarantine(fs, quarantine)
            try:
                fs.write(fd, encode(pieces))
                fs.fsync(fd)
            finally:
                fs.close(fd)
        except OSError as exc:
            raise translate_os_error(exc, quarantine) from exc
        atomic_write(fs, path, data[:good_end] if not report.bad_lines else encode(records))
        report.quarantined = len(pieces)
        return records, report
    if repair and report.truncated_at is not None:
        try:
            fd = fs.open_append(path)
            try:
                fs.truncate(fd, good_end)
                fs.fsync(fd)
            finally:
                fs.close(fd)
        except OSError as exc:
            raise translate_os_error(exc, path) from exc
    return records, report


class AppendLog:
    """An open append log. ``open()`` recovers it; then ``append`` / ``rewrite``; ``close``.

    Usable as a context manager (``with AppendLog(p) as log: records, report = log.opened``).
    """

    def __init__(self, path: Path, fs: FS = REAL, *, quarantine: Path | None = None,
                 check: ShapeCheck | None = None) -> None:
        self.path = Path(path)
        self.fs = fs
        self.quarantine = quarantine
        self.check = check
        self._fd: int | None = None
        self._size = 0
        self._rollback_pending = False
        self.opened: tuple[list[JsonObject], ReplayReport] = ([], ReplayReport())

    def open(self) -> tuple[list[JsonObject], ReplayReport]:
        """Recover the log (see ``replay``) and open it for appending."""
        ensure_dir(self.fs, self.path.parent)
        self._remove_unfinished()
        existed = self._is_file()
        records, report = replay(self.path, self.fs, repair=True, quarantine=self.quarantine,
                                 check=self.check)
        self._reopen()
        if not existed:
            try:
                self.fs.fsync_dir(self.path.parent)
            except OSError as exc:
                raise translate_os_error(exc, self.path.parent) from exc
        self.opened = (records, report)
        return records, report

    def _is_file(self) -> bool:
        """Whether a regular file is at the log's path (a link there is not followed:
        replay sets it aside, and the log made in its place is new)."""
        try:
            return stat.S_ISREG(confine.stat_file(self.path).st_mode)
        except OSError:
            return False

    def _remove_unfinished(self) -> None:
        """Remove the temp files of a rewrite of this log that a crash cut short (nobody
        else names a file so: the log has one writer). Best effort: a file that cannot
        be removed only takes room."""
        own = temp_prefix(self.path.name)
        try:
            names = self.fs.listdir(self.path.parent)
        except OSError:
            return
        for name in names:
            if name.startswith(own) and TEMP_RE.match(name):
                try:
                    self.fs.unlink(self.path.parent / name)
                except OSError as exc:
                    log.warning("could not remove %s: %s", self.path.parent / name, exc)

    def _reopen(self) -> None:
        self.close()
        try:
            self._fd = self.fs.open_append(self.path)
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise translate_os_error(exc, self.path) from exc

    def append(self, records: Iterable[Mapping[str, object]], *, sync: bool = True) -> None:
        """Append ``records`` (one write, then one fsync unless ``sync=False``).

        On failure (DiskFull, ...) the file is cut back to its previous length, so either
        all of them are in the log or none.
        """
        fd = self._require_open()
        payload = encode(records)
        if not payload:
            return
        fd = self._follow(fd)
        try:
            if self._rollback_pending:
                self.fs.truncate(fd, self._size)
                self._rollback_pending = False
            self.fs.write(fd, payload)
            if sync:
                self.fs.fsync(fd)
        except OSError as exc:
            self._rollback(fd)
            raise translate_os_error(exc, self.path) from exc
        self._size += len(payload)

    def _follow(self, fd: int) -> int:
        """The descriptor to append to. When the log's path names no file any more (its
        folder was removed, or moved and made again), or the open file was unlinked as
        another took its place (an editor's save, ``rsync``, ``sed -i``: a copy renamed
        over it), what the open file holds is first published at the path again: appends
        to a file nobody can find would be lost at the next start. The file that took its
        place is kept beside it (``<name>.corrupt-<ns>``); one put there while the open
        file is still linked elsewhere (its folder moved away) is left alone."""
        try:
            confine.stat_file(self.path)
            if os.fstat(fd).st_nlink > 0:
                return fd
            replaced: Path | None = set_aside(self.fs, self.path)
        except FileNotFoundError:
            replaced = None
        except OSError as exc:
            raise translate_os_error(exc, self.path) from exc
        try:
            held = os.pread(fd, self._size, 0)
        except OSError as exc:
            raise translate_os_error(exc, self.path) from exc
        ensure_dir(self.fs, self.path.parent)
        atomic_write(self.fs, self.path, held)
        if replaced is None:
            log.warning("%s was gone; written again from the open log (%d bytes)",
                        self.path, len(held))
        else:
            log.warning("%s was replaced by another file, kept as %s; written again from "
                        "the open log (%d bytes)", self.path, replaced.name, len(held))
        self._rollback_pending = False
        self._reopen()
        return self._require_open()

    def _rollback(self, fd: int) -> None:
        try:
            self.fs.truncate(fd, self._size)
        except OSError:
            self._rollback_pending = True  # retried before the next append

    def sync(self) -> None:
        """Make appends made with ``sync=False`` durable."""
        fd = self._require_open()
        try:
            self.fs.fsync(fd)
        except OSError as exc:
            raise translate_os_error(exc, self.path) from exc

    def rewrite(self, records: Iterable[Mapping[str, object]]) -> None:
        """Replace the whole log with ``records`` atomically (compaction). A log that
        holds exactly those bytes already (the rewrite after recovery at a start, of a log
        nothing was added to) is only synced: no new file, no renaming, no folder sync."""
        fd = self._require_open()
        data = encode(records)
        if self._holds(fd, data):
            try:
                self.fs.fsync(fd)
            except OSError as exc:
                raise translate_os_error(exc, self.path) from exc
            return
        atomic_write(self.fs, self.path, data)
        self._rollback_pending = False
        self._reopen()  # the old descriptor points at the replaced file

    def _holds(self, fd: int, data: bytes) -> bool:
        """Whether the file at the log's path is the open one and holds ``data`` exactly."""
        if self._rollback_pending or self._size != len(data):
            return False
        try:
            here, opened = confine.stat_file(self.path), os.fstat(fd)
            if (here.st_dev, here.st_ino) != (opened.st_dev, opened.st_ino):
                return False
            return os.pread(fd, len(data) + 1, 0) == data
        except OSError:  # gone, or unreadable: the rewrite publishes it anew
            return False

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _require_open(self) -> int:
        if self._fd is None:
            raise StorageError(f"append log {self.path} is not open", self.path)
        return self._fd

    def __enter__(self) -> AppendLog:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
