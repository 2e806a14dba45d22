"""What a shared workspace's replica shows in its workspace's status
(``Replica.status`` in ``remote/replica.py``; docs/protocol.md and docs/remote.md say
what each field means)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypedDict

from recalld.daemon.remote import db
from recalld.daemon.remote.calls import on_conn
from recalld.daemon.remote.guard import HeldStatus
from recalld.daemon.watchpaths import MisnamedStatus

log = logging.getLogger(__name__)


class OutsideStatus(TypedDict):
    notes: int  # notes of the workspace outside this host's folders
    example: str | None


async def count_outside(conn: db.Conn, workspace_id: int, folders: Sequence[str],
                        name: str, before: OutsideStatus) -> OutsideStatus:
    """The notes of shared workspace ``name`` outside this host's ``folders`` (logged
    when the first is found: ``before`` had none)."""
    count, example = await on_conn(conn, db.outside, workspace_id, folders)
    if count and not before["notes"]:
        log.warning("shared workspace %s: %d note(s) of it lie outside this host's "
                    "folders (%s), e.g. %r: another host's daily_dir or digest_dir "
                    "differs; they are not replicated here", name, count,
                    ", ".join(folders), example)
    return OutsideStatus(notes=count, example=example)


class VectorCounts(TypedDict):
    shared: int  # vectors another host had embedded
    embedded_here: int
    not_shared: str | None  # why vectors are not shared on this server (no pgvector)


class ServerSearchStatus(TypedDict):
    server_searches: int
    local_fallbacks: int
    chunks_ready: bool
    chunks_backfilled: int
    last_error: str | None


class ReplicaStatus(TypedDict):
    """A shared workspace's replica, as the workspace's status shows it."""

    # connecting, online, offline (the server), refusing (the server answers but refuses
    # this host's writes: ``refusing`` says why), failing (a fault of this host),
    # misconfigured (the settings: a DSN libpq cannot parse)
    state: str
    refusing: str | None  # read-only, disk full, permission denied (remote/writes.py)
    server: str  # the DSN, password masked
    name: str
    host: str
    outbox: int
    behind: int  # rows of the feed the catch-up under way has still to apply
    cursor: int
    uploaded: int
    pulled: int
    conflicts: int
    online_since: float | None
    last_upload: float | None
    last_pull: float | None
    last_error: str | None
    last_error_at: float | None
    blocked: dict[str, str]  # files of the feed this host cannot write, and why
    refused: dict[str, str]  # local changes the server refuses to store, and why
    held: HeldStatus  # local deletions held back (remote/guard.py)
    outside: OutsideStatus  # notes outside this host's folders (another host's differ)
    unshared: MisnamedStatus  # notes not shared: their name is not valid UTF-8
    watcher: str
    vectors: VectorCounts
    search_mode: str
    search: ServerSearchStatus
