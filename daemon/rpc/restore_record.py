"""The rollback point of the last restore: ``backups/rollback.json`` names the
pre-restore snapshot and the agents it covers (see :mod:`ops_methods`).

A restore that fails before it changed anything leaves the rollback point as it found
it (:func:`put_back`): a rollback still undoes the restore before it.

Everything here blocks on the file system; the RPC layer runs it in worker threads.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from recalld.daemon.rpc.dispatch import DaemonState, JsonObject
from recalld.daemon.rpc.echo import echoed_path
from recalld.daemon.store.errors import DiskFull as StoreDiskFull
from recalld.daemon.store.errors import StorageError, StorageIOError
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir, read_verified
from recalld.ipc.errors import DiskFull, RecalldError

ROLLBACK_RECORD = "rollback.json"
KEEP_SNAPSHOTS = 10  # automatic pre-restore snapshots kept; manual backups are never pruned


def backups_dir(state: DaemonState) -> Path:
    return state.config.data_dir / "backups"


def read_record(state: DaemonState) -> JsonObject | None:
    path = backups_dir(state) / ROLLBACK_RECORD
    try:  # a FIFO or device in its place must not stall the event loop
        record = orjson.loads(read_verified(path, None))
    except (StorageError, orjson.JSONDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("snapshot"), str) or (
            not isinstance(record.get("agents"), list)):
        return None
    if isinstance(record.get("restored_from"), str):  # as written before it was masked
        record["restored_from"] = echoed_path(record["restored_from"])
    return record


def write_record(state: DaemonState, record: JsonObject) -> None:
    folder = backups_dir(state)
    ensure_dir(REAL, folder)
    atomic_write(REAL, folder / ROLLBACK_RECORD, orjson.dumps(record, option=orjson.OPT_INDENT_2))


def drop_record(state: DaemonState) -> None:
    path = backups_dir(state) / ROLLBACK_RECORD
    if read_record(state) is not None:  # a FIFO or folder in its place is left alone
        path.unlink(missing_ok=True)


def put_back(state: DaemonState, previous: JsonObject | None, snapshot: str | None) -> None:
    """Undo what a restore that changed nothing did to the rollback point: the record it
    replaced (``previous``) is written again, or none left if there was none, and its
    own ``snapshot`` is removed."""
    if previous is not None:
        write_record(state, previous)
    else:
        drop_record(state)
    if snapshot is not None:
        Path(snapshot).unlink(missing_ok=True)


def prune_snapshots(folder: Path, keep: Path) -> None:
    snapshots = sorted(folder.glob("pre-restore-*.zip"), key=lambda p: p.stat().st_mtime)
    for old in snapshots[:-KEEP_SNAPSHOTS]:
        if old != keep:
            old.unlink(missing_ok=True)


def snapshot_failed(exc: StorageIOError, folder: Path) -> RecalldError:
    """The error of a restore whose pre-restore snapshot (in ``folder``) could not be
    written (``exc``): it says that nothing was restored and how to go on, and keeps the
    failure's kind (a full disk, a file system refusing, a file larger than the file
    system or the daemon's file size limit takes)."""
    without = "restore without one (--no-snapshot: no rollback then)"
    if isinstance(exc, StoreDiskFull):
        return DiskFull(f"no pre-restore snapshot can be taken: {exc.message}; nothing was "
                        f"restored: free space in {folder}, or {without}", exc.data)
    return type(exc)(exc.path, exc.errno, f"no pre-restore snapshot can be taken: "
                     f"{exc.detail}; nothing was restored: it is written in {folder}, or "
                     f"{without}")
