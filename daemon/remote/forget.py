"""Removing a shared workspace from its server for good (``remote.forget``): its row and
every row of its in the other tables, in one transaction, unless a daemon is connected
to it (one that still shares it would create it again at once).

:func:`forget` connects, deletes and disconnects; its database work runs in a worker
thread, with the server's ``statement_timeout`` lifted for that transaction (a large
workspace takes a while to delete) and :data:`FORGET_TIMEOUT_S` as the daemon's own
deadline. No state, no task.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from recalld.daemon.config import ConfigError, RemoteConfig
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.remote import db, locks
from recalld.daemon.remote.calls import in_thread, on_conn
from recalld.daemon.remote.searcher import one_line
from recalld.ipc.errors import AlreadyRunning, InvalidParams, NotFound, ProviderUnavailable

#: How long the deletion may take (no ``statement_timeout`` there: a large workspace has
#: many rows) before its connection is shut down under it, rolling it back.
FORGET_TIMEOUT_S = 600.0


class StillShared(Exception):
    """Daemons are connected to the workspace (their sessions hold a host's lock)."""


def _connected(conn: db.Conn, workspace_id: int) -> list[str]:
    """The sessions holding a host's lock in the workspace (see ``locks.claim_host``):
    ``from <address> since <time> UTC`` each."""
    if workspace_id > 0xFFFF_FFFF:
        return []  # no host can replicate it (locks.WorkspaceIdTooLarge)
    return [f"from {h.address or 'a local socket'} since {h.since} UTC"
            for h in locks.holders(conn, workspace_id, 1)]


def remove_workspace(conn: db.Conn, name: str) -> JsonObject | None:
    """Delete shared workspace ``name`` and its rows (None: the server has none of that
    name). Raises StillShared when a daemon is connected to it. Blocking."""
    with conn.transaction():
        if conn.execute("SELECT to_regclass('recalld_workspaces')").fetchone() in (
                None, (None,)):
            return None  # no recalld schema on that server at all
        conn.execute("SET LOCAL statement_timeout = 0")
        # The row lock every upload takes first: no upload goes on while the rows go.
        row = conn.execute("SELECT workspace_id FROM recalld_workspaces WHERE name = %s"
                           " FOR UPDATE", (name,)).fetchone()
        if row is None:
            return None
        workspace_id = int(str(row[0]))
        hosts = _connected(conn, workspace_id)
        if hosts:
            raise StillShared("; ".join(hosts))
        rows: dict[str, int] = {}
        for table in (*db.WORKSPACE_TABLES, "recalld_workspaces"):
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() in (
                    None, (None,)):
                continue  # recalld_embeddings without pgvector
            query = sql.SQL("DELETE FROM {} WHERE workspace_id = %s").format(
                sql.Identifier(table))
            rows[table] = conn.execute(query, (workspace_id,)).rowcount
    return {"workspace_id": workspace_id, "rows": dict(rows)}


async def forget(remote: RemoteConfig) -> JsonObject:
    """Remove the shared workspace ``remote.name`` from the server ``remote.dsn``; its
    id and the rows deleted per table. InvalidParams for settings that cannot be used,
    NotFound when the server has no workspace of that name, AlreadyRunning when daemons
    are connected to it, ProviderUnavailable when the server cannot be reached or fails.
    Cancelled (or past its deadline), the connection is shut down under the deletion,
    which the server rolls back."""
    try:
        remote.check("remote.forget")
    except ConfigError as exc:
        raise InvalidParams(str(exc)) from None
    secrets = (remote.dsn,)
    try:
        conn = await in_thread(db.connect, remote)
    except db.BadDsn as exc:
        raise InvalidParams(f"remote.forget: {exc}") from None
    except (psycopg.Error, OSError) as exc:
        raise ProviderUnavailable(f"the server cannot be reached: "
                                  f"{one_line(exc, secrets)}") from None
    try:
        done = await on_conn(conn, remove_workspace, remote.name, timeout_s=FORGET_TIMEOUT_S)
    except StillShared as exc:
        raise AlreadyRunning(
            f"daemons are connected to shared workspace {remote.name} ({exc}): remove "
            "`remote` from their settings (a host still sharing it would create it "
            "again), then forget it") from None
    except (psycopg.Error, db.NoAnswer) as exc:
        raise ProviderUnavailable(f"shared workspace {remote.name} was not removed: "
                                  f"{one_line(exc, secrets)}") from None
    finally:
        await in_thread(conn.close)
    if done is None:
        raise NotFound(f"the server has no shared workspace named {remote.name}")
    return {"name": remote.name, **done}
