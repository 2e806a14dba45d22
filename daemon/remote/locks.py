"""Session-level advisory locks of a shared workspace, held by a connection until it
closes: one per job kind (``auto_dream``, ``auto_resource``: the job runs on one host at
a time) and one per host name (a second daemon under a name in use waits).

Blocking psycopg calls: run them in worker threads.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from recalld.daemon.remote.db import Conn

# Second key of the session-level advisory lock that runs a job kind on one host at a
# time ("rc" in the high bytes; the first key is the workspace's, :func:`workspace_key`).
JOB_LOCKS = {"auto_dream": 0x7263_0001, "auto_resource": 0x7263_0002}


class WorkspaceIdTooLarge(Exception):
    """The shared workspace's id does not fit the 32 bits its advisory lock keys give it
    (the server's id sequence set past 4,294,967,295): its hosts and jobs could not be
    told from another workspace's, so this host does not replicate it."""


def workspace_key(workspace_id: int) -> int:
    """The workspace's half of its lock keys: the id's 32 bits as the signed int4 the
    server's pairs of keys take (an id up to 2^31 - 1 is itself), the same in
    ``pg_locks.classid`` as the id. WorkspaceIdTooLarge when it has more bits."""
    if not 0 <= workspace_id <= 0xFFFF_FFFF:
        raise WorkspaceIdTooLarge(
            f"shared workspace id {workspace_id} does not fit the 32 bits of its advisory "
            "lock keys (the server's id sequence of recalld_workspaces was set past "
            "4294967295): remove the workspace on the server (`recalld remote forget`) "
            "and restart the sequence lower (ALTER TABLE recalld_workspaces ALTER COLUMN "
            "workspace_id RESTART), then it is created anew")
    return workspace_id - (1 << 32) if workspace_id >> 31 else workspace_id


def job_lock_key(workspace_id: int, kind: str) -> tuple[int, int]:
    return workspace_key(workspace_id), JOB_LOCKS[kind]


def host_lock_key(workspace_id: int, host: str) -> int:
    """The single bigint key of ``host``'s lock in the workspace: the workspace's key in
    the high half, the name's CRC-32 in the low one."""
    return (workspace_key(workspace_id) << 32) | zlib.crc32(host.encode())


@dataclass(frozen=True, slots=True)
class Holder:
    """A session holding an advisory lock."""

    address: str | None  # None: a local socket
    since: str  # the session's start, "YYYY-MM-DD HH:MM:SS" UTC
    application: str


def holders(conn: Conn, workspace_id: int, objsubid: int, objid: int | None = None
            ) -> list[Holder]:
    """The sessions holding an advisory lock of this database whose first key half is
    the workspace's (:func:`workspace_key`; and second ``objid``, if given); ``objsubid``
    1 for a single bigint key, 2 for a pair of keys. pg_locks lists the advisory locks of
    the whole server, but they are taken per database, and another database's workspaces
    have the same ids."""
    classid = workspace_key(workspace_id) & 0xFFFF_FFFF  # an oid: unsigned
    rows = conn.execute(
        "SELECT host(a.client_addr), to_char(a.backend_start AT TIME ZONE 'UTC',"
        " 'YYYY-MM-DD HH24:MI:SS'), a.application_name FROM pg_locks l"
        " JOIN pg_stat_activity a ON a.pid = l.pid"
        " JOIN pg_database d ON d.oid = l.database AND d.datname = current_database()"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::bigint::oid"
        " AND l.objsubid = %s AND (%s::bigint IS NULL OR l.objid = %s::bigint::oid)"
        " ORDER BY a.backend_start", (classid, objsubid, objid, objid)).fetchall()
    return [Holder(None if addr is None else str(addr), str(since), str(app or ""))
            for addr, since, app in rows]


class HostTaken(Exception):
    """Another daemon's session holds this host name in the shared workspace: two
    replicas under one name would take each other's embedding claims and write conflict
    copies under one name, so the second one waits (status: failing)."""


def claim_host(conn: Conn, workspace_id: int, name: str, host: str) -> None:
    """Take the session-level advisory lock of ``host`` in the workspace on ``conn``
    (held until it closes: a single bigint key, apart from the job locks' pairs of
    keys); HostTaken naming the session that holds it."""
    key = host_lock_key(workspace_id, host)
    row = conn.execute("SELECT pg_try_advisory_lock(%s::bigint)", (key,)).fetchone()
    if row is not None and row[0]:
        return
    found = holders(conn, workspace_id, 1, key & 0xFFFF_FFFF)
    addr, since = (found[0].address, found[0].since) if found else (None, None)
    where = " ".join(filter(None, [f"from {addr}" if addr else "",
                                   f"since {since} UTC" if since else ""]))
    raise HostTaken(
        f"another daemon is connected to shared workspace {name} as host {host!r}"
        f"{f' ({where})' if where else ''}: each daemon sharing a workspace needs its own "
        "`host` in its remote setting; this one waits and tries again (a session of this "
        "host that ended uncleanly is dropped by the server within about half a minute)")


def try_job_lock(conn: Conn, workspace_id: int, kind: str) -> str | None:
    """Take the job's advisory lock on ``conn`` (held until it closes): None if taken,
    else the ``application_name`` of the session holding it ("" if unknown)."""
    key = job_lock_key(workspace_id, kind)
    row = conn.execute("SELECT pg_try_advisory_lock(%s::int4, %s::int4)", key).fetchone()
    if row is not None and row[0]:
        return None
    found = holders(conn, workspace_id, 2, key[1])
    return found[0].application if found else ""
