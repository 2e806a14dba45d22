"""The records an index state keeps and reports: plain data, no I/O.

Owns :class:`FileInfo` (what the index knows of one file) with its catalog form
:class:`FileRecord` and :func:`compact_keys`, :class:`ApplyStats` (what one
``IndexState.apply`` did) and :class:`StateStats` (``IndexState.stats``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from recalld.daemon.jsontypes import JsonObject

__all__ = ["ApplyStats", "FileInfo", "FileRecord", "StateStats", "compact_keys", "note_stamp"]


def note_stamp(st: os.stat_result) -> tuple[int, int]:
    """The ``(mtime_ns, size)`` the index knows a note's file by, and that scans compare
    with it: ``mtime_ns`` is the file's last change, the later of its modification and
    status-change times. A copy that keeps the old modification time (``cp -p``,
    ``rsync -a``, ``tar x``, a checkout tool that restores times) still sets the
    status-change time, which nothing outside the kernel can set back: a note rewritten
    at the same size with its old time is still seen changed, also by the scan at start
    after it happened while the daemon was down."""
    return max(st.st_mtime_ns, st.st_ctime_ns), st.st_size


class FileRecord(TypedDict):
    """A :class:`FileInfo` as the catalog stores it."""

    path: str
    mtime_ns: int
    size: int
    digest: str
    keys: list[int]
    secret_name: NotRequired[bool]
    encoding: NotRequired[str]


class StateStats(TypedDict):
    files: int
    chunks: int
    links: int
    keyword: dict[str, int]


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What the index knows of one file: the stat it was read at (:func:`note_stamp`)
    and its chunks."""

    path: str
    mtime_ns: int
    size: int
    digest: str
    #: The file's chunk keys, in order; a ``range`` when consecutive (as the index hands
    #: them out), which costs the same for one chunk or a thousand.
    keys: Sequence[int]
    #: A component of the path holds what redaction masks: it is shown masked.
    secret_name: bool = False
    #: The encoding the file was read in when it is not UTF-8 (``notetext.decode_note``).
    encoding: str = ""

    @property
    def read_again(self) -> bool:
        """Loaded from a generation saved under older rules (``persist``): the stat and
        digest are cleared, so the next reconcile reads the note under these rules."""
        return self.mtime_ns == 0 and self.size == 0 and not self.digest

    def to_record(self) -> FileRecord:
        rec: FileRecord = {"path": self.path, "mtime_ns": self.mtime_ns, "size": self.size,
                           "digest": self.digest, "keys": list(self.keys)}
        if self.secret_name:  # rare: written only when set
            rec["secret_name"] = True
        if self.encoding:  # rare too
            rec["encoding"] = self.encoding
        return rec

    @classmethod
    def from_record(cls, rec: JsonObject) -> FileInfo:
        return cls(str(rec["path"]), int(rec["mtime_ns"]), int(rec["size"]),
                   str(rec["digest"]), _record_keys(rec["keys"]),
                   rec.get("secret_name") is True, str(rec.get("encoding") or ""))


def _record_keys(keys: list[int]) -> Sequence[int]:
    """A catalog record's ``keys`` as :func:`compact_keys` makes them of their ints.

    Nearly every file's keys are consecutive ints, as the index hands them out: those
    are compared with their range in C, not converted one at a time (a warm start reads
    every file's record)."""
    if type(keys) is list and keys and type(keys[0]) is int:
        run = range(keys[0], keys[0] + len(keys))
        if keys == list(run):
            return run
    return compact_keys([int(k) for k in keys])


def compact_keys(keys: list[int]) -> Sequence[int]:
    """``keys`` as a ``range`` when they are consecutive, else as a tuple."""
    if keys and keys == list(range(keys[0], keys[0] + len(keys))):
        return range(keys[0], keys[0] + len(keys))
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class ApplyStats:
    """How many records one applied batch added, updated and deleted."""

    added: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    #: Files that could not be read (path, why): left as the index had them.
    unreadable: tuple[tuple[str, str], ...] = ()
    #: Unchanged files whose stat (mtime, size) the index took over: worth a save, or
    #: every start reads them again.
    restat: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.deleted)
