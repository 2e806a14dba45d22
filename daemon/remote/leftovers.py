"""The rows a shared workspace removed on the server leaves in the other tables: no
foreign key takes them along, and no host reads them again, so the first replica that
connects to the workspace made anew under its name deletes them (``ReplicaState.forget``
names them until then). Blocking psycopg calls, as in ``db.py``.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from recalld.daemon.remote import db

log = logging.getLogger(__name__)

#: The primary keys of the workspace's tables after ``workspace_id``.
KEYS: dict[str, tuple[str, ...]] = {
    "recalld_postings": ("term", "path", "seq"), "recalld_chunks": ("path", "seq"),
    "recalld_embeddings": ("space", "text_hash"), "recalld_catalog": ("job", "key"),
    "recalld_changes": ("change_id",), "recalld_files": ("path",)}
#: Rows of a removed workspace deleted a statement where all of a table's at once took
#: longer than statement_timeout.
FORGET_BATCH = 5_000


def forget_removed(conn: db.Conn, old_ident: str, workspace_id: int,
                   batch: int = FORGET_BATCH) -> int | None:
    """Delete the rows of the shared workspace ``old_ident`` (what this replica synced
    with) if its ``recalld_workspaces`` row was removed and a new one (``workspace_id``)
    took its name: no foreign key takes them along, and no host reads them again. Each
    table's rows go in one statement, or, where that took longer than statement_timeout,
    ``batch`` rows a statement (each committed: what is deleted stays deleted). Returns
    the rows deleted (0: none are this replica's to delete), or None where some stay (the
    server may not delete them, or could not even in batches), logged: they cost room
    only, and the caller tries again at its next session."""
    old_id = old_ident.split("/")[-2] if old_ident.count("/") >= 2 else ""
    if not old_id.isdigit() or int(old_id) == workspace_id:
        return 0
    old = int(old_id)
    deleted = 0
    try:
        if conn.execute("SELECT 1 FROM recalld_workspaces WHERE workspace_id = %s",
                        (old,)).fetchone() is not None:
            return 0  # still there (another server's id, say): not ours to remove
        for table in db.WORKSPACE_TABLES:
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() in (None, (None,)):
                continue  # recalld_embeddings without pgvector
            query = sql.SQL("DELETE FROM {} WHERE workspace_id = %s").format(
                sql.Identifier(table))
            try:
                deleted += conn.execute(query, (old,)).rowcount
            except psycopg.errors.QueryCanceled:  # too many at once for statement_timeout
                deleted += _delete_in_batches(conn, table, KEYS[table], old, batch)
    except (psycopg.errors.QueryCanceled, psycopg.errors.InsufficientPrivilege) as exc:
        log.warning("the rows of removed shared workspace %s stay on the server for now "
                    "(%d deleted; tried again at the next connection): %s",
                    old_ident, deleted, exc)
        return None
    return deleted


def _delete_in_batches(conn: db.Conn, table: str, keys: tuple[str, ...], workspace_id: int,
                       batch: int) -> int:
    """Delete ``table``'s rows of ``workspace_id``, ``batch`` rows a statement (by its
    primary key ``keys`` after ``workspace_id``); how many."""
    cols = sql.SQL(", ").join(map(sql.Identifier, keys))
    query = sql.SQL("DELETE FROM {t} WHERE workspace_id = %s AND ({c}) IN "
                    "(SELECT {c} FROM {t} WHERE workspace_id = %s LIMIT %s)").format(
                        t=sql.Identifier(table), c=cols)
    deleted = 0
    while n := conn.execute(query, (workspace_id, workspace_id, batch)).rowcount:
        deleted += n
    return deleted
