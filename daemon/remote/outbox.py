"""The durable outbox: local changes of a shared workspace waiting to be uploaded.

One append log (``<metadata_dir>/remote/outbox.log``, CRC-checked JSON lines, see
:mod:`recalld.daemon.store.applog`) with two kinds of records: ``add`` (a change: its
unique ``id``, the path, the file's bytes base64-encoded or a deletion, the hash, the local
time) and ``done`` (the id of a change the server has answered). The pending changes are
the adds without a done, in order. A change is appended (and fsynced) before anything
else knows of it, and marked done only after the server's answer has been recorded in the
replica state, so a crash at any point loses no change; the server remembers every
change id, so one uploaded twice is answered from that record instead of applied again.

Blocking file I/O: every method that touches the log runs in a worker thread.
"""

from __future__ import annotations

import base64
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.applog import AppendLog

COMPACT_AFTER_LINES = 2_000


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
        self._lines = 0

    def open(self) -> None:
        records, _report = self._log.open()
        for rec in records:
            if rec.get("op") == "add":
                change = Change.from_record(rec)
                self._pending[change.id] = change
            elif rec.get("op") == "done":
                self._pending.pop(str(rec.get("id")), None)
        self._paths = Counter(c.path for c in self._pending.values())
        self._lines = len(records)

    def close(self) -> None:
        self._log.close()

    def add(self, changes: Iterable[Change]) -> None:
        """Append changes durably (one write, one fsync)."""
        batch = list(changes)
        if not batch:
            return
        self._log.append([c.to_record() for c in batch])
        for change in batch:
            self._pending[change.id] = change
            self._paths[change.path] += 1
        self._lines += len(batch)

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
        self._lines += len(ids)
        if self._lines > COMPACT_AFTER_LINES and self._lines > 4 * len(self._pending):
            self._log.rewrite([c.to_record() for c in self._pending.values()])
            self._lines = len(self._pending)

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
