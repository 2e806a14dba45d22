"""The durable outbox: local changes of a shared workspace waiting to be uploaded.

One append log (``<metadata_dir>/remote/outbox.log``, CRC-checked JSON lines, see
:mod:`recalld.daemon.store.applog`) with two kinds of records: ``add`` (a change: its
unique ``id``, the path, the file's bytes base64-encoded or a deletion, the hash, the local
time) and ``done`` (the id of a change the server has answered). The pending changes are
the adds without a done, in order. A change is appended (and fsynced) before anything
else knows of it, and marked done only after the server's answer has been recorded in the
replica state, so a crash at any point loses no change; the server remembers every
change id, so one uploaded twice is answered from that record instead of applied again.

Only the oldest pending change of a path is ever sent (:meth:`Outbox.head_run`; the next
one's base is the version it makes), so a path's later changes have never left the host:
a new change of a path that has two or more pending takes the place of the last one (its
id, at the end of the order), written as an ``add`` of that id again. A note saved a
thousand times while the server cannot be reached so keeps two versions in the outbox,
not a thousand, and the log is compacted once the versions replaced outweigh the rest.

Blocking file I/O: every method that touches the log runs in a worker thread.
"""

from __future__ import annotations

import base64
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypedDict

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.applog import AppendLog

COMPACT_AFTER_LINES = 2_000
#: File content of replaced changes the log may hold (and at most as much as the pending
#: changes hold) before it is compacted.
COMPACT_AFTER_STALE_BYTES = 16 << 20


class OutboxRecord(TypedDict):
    """A :class:`Change` in the outbox log."""

    op: Literal["add"]
    id: str
    path: str
    hash: str | None
    time: float
    data: str | None  # base64; None: a deletion


@dataclass(frozen=True, slots=True)
class Change:
    """One local change: ``data`` None means the file was deleted."""

    id: str
    path: str
    data: bytes | None
    hash: str | None
    time: float

    @property
    def deleted(self) -> bool:
        return self.data is None

    def to_record(self) -> OutboxRecord:
        return {
            "op": "add", "id": self.id, "path": self.path, "hash": self.hash, "time": self.time,
            "data": None if self.data is None else base64.b64encode(self.data).decode("ascii"),
        }

    @classmethod
    def from_record(cls, rec: JsonObject) -> Change:
        data = rec.get("data")
        return cls(id=str(rec["id"]), path=str(rec["path"]),
                   data=None if data is None else base64.b64decode(data),
                   hash=rec.get("hash"), time=float(rec["time"]))


class Outbox:
    """The pending changes, oldest first, backed by the log at ``path``."""

    def __init__(self, path: Path) -> None:
        self._log = AppendLog(path)
        self._pending: OrderedDict[str, Change] = OrderedDict()
        self._paths: Counter[str] = Counter()
        #: The id of each path's last pending change.
        self._last: dict[str, str] = {}
        self._lines = 0
        #: Bytes of file content in the log's ``add`` records of replaced changes.
        self._stale_bytes = 0

    def open(self) -> None:
        records, _report = self._log.open()
        for rec in records:
            if rec.get("op") == "add":
                change = Change.from_record(rec)
                self._place(change)
            elif rec.get("op") == "done":
                self._pending.pop(str(rec.get("id")), None)
        self._paths = Counter(c.path for c in self._pending.values())
        self._last = {c.path: c.id for c in self._pending.values()}
        self._lines = len(records)

    def _place(self, change: Change) -> bool:
        """Put ``change`` last in the order, in place of the pending change of its id if
        there is one (True then)."""
        old = self._pending.pop(change.id, None)
        self._pending[change.id] = change
        if old is not None:
            self._stale_bytes += len(old.data or b"")
        return old is not None

    def close(self) -> None:
        self._log.close()

    def add(self, changes: Iterable[Change]) -> None:
        """Append changes durably (one write, one fsync). A change of a path that had two
        or more changes pending before the call takes the place of the last of them (see
        the module docstring)."""
        batch = [self._slot(c) for c in changes]
        if not batch:
            return
        self._log.append([c.to_record() for c in batch])
        for change in batch:
            if not self._place(change):
                self._paths[change.path] += 1
            self._last[change.path] = change.id
        self._lines += len(batch)
        if self._stale_bytes > COMPACT_AFTER_STALE_BYTES and self._stale_bytes > sum(
                len(c.data or b"") for c in self._pending.values()):
            self._compact()

    def _slot(self, change: Change) -> Change:
        """``change`` with the id it takes in the outbox."""
        last = self._last.get(change.path)
        if last is None or self._paths[change.path] < 2:
            return change
        return replace(change, id=last)

    def _compact(self) -> None:
        self._log.rewrite([c.to_record() for c in self._pending.values()])
        self._lines = len(self._pending)
        self._stale_bytes = 0

    def done(self, change_ids: Iterable[str]) -> None:
        """Mark changes answered (one write, one fsync); compacts the log when it has
        grown long."""
        ids = list(change_ids)
        if not ids:
            return
        self._log.append([{"op": "done", "id": i} for i in ids])
        for change_id in ids:
            change = self._pending.pop(change_id, None)
            if change is not None:
                self._paths[change.path] -= 1
                if self._paths[change.path] <= 0:
                    del self._paths[change.path]
                if self._last.get(change.path) == change_id:
                    del self._last[change.path]
        self._lines += len(ids)
        if self._lines > COMPACT_AFTER_LINES and self._lines > 4 * len(self._pending):
            self._compact()

    def head_run(self, count: int, data_bytes: int,
                 passed: Collection[str] = frozenset()) -> list[Change]:
        """The oldest pending changes up to the first that repeats a path of the run, at
        most ``count`` of them and, past the first, ``data_bytes`` of file content; the
        changes of the paths in ``passed`` are passed by (they wait, in their order)."""
        run: list[Change] = []
        paths: set[str] = set()
        size = 0
        for change in self._pending.values():
            if change.path in passed:
                continue
            size += len(change.data or b"")
            if len(run) == count or change.path in paths or (run and size > data_bytes):
                break
            run.append(change)
            paths.add(change.path)
        return run

    def pending(self) -> list[Change]:
        return list(self._pending.values())

    def pending_for(self, path: str) -> bool:
        return path in self._paths

    def count_for(self, path: str) -> int:
        """How many pending changes name ``path``."""
        return self._paths.get(path, 0)

    def __len__(self) -> int:
        return len(self._pending)
