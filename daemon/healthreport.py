"""The shape of a workspace's ``health`` (``maintenance.Health.status``): plain data."""

from __future__ import annotations

from typing import TypedDict

from recalld.daemon.index.encodings import NotUtf8Notes
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.writefailures import WriteFailure


class HealthError(TypedDict):
    """A failure the health service met itself (a scan)."""

    what: str
    error: str
    time: float


class HealthReport(TypedDict):
    """A workspace's health: clean, pending (work under way) or degraded, and why."""

    state: str
    reasons: list[str]
    files_indexed: int | None
    files_on_disk: int | None
    chunks: int | None
    pending_changes: int | None
    unindexed: int
    unindexed_paths: list[str]
    # Notes loaded from an index saved under older rules, not read again yet under these.
    read_again: int
    partly_indexed: int
    partly_indexed_paths: list[str]
    unreadable: int
    unreadable_paths: list[str]
    not_utf8: NotUtf8Notes  # notes not read as UTF-8
    secret_named: int  # notes named by a secret (their paths shown masked)
    secret_named_folders: list[str]
    write_errors: list[WriteFailure]  # note writes failing now, by cause
    watcher: str | None
    scanned_at: float | None
    derived_bytes: int | None
    vectors: JsonObject | None
    last_errors: list[JsonObject]
