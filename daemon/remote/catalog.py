"""A job's catalog shared by the hosts of a shared workspace (what the dream has
consolidated), read and written on the job lock's connection (``Replica.job_lock``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import psycopg
from psycopg.types.json import Jsonb

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.catalog import put_back_plan
from recalld.daemon.remote import db
from recalld.daemon.remote.calls import on_conn
from recalld.daemon.remote.searcher import one_line
from recalld.daemon.remote.writes import WriteRefusal
from recalld.ipc.errors import ProviderUnavailable

log = logging.getLogger(__name__)


class JobCatalog:
    """A job's catalog kept on the server for every host of the shared workspace (what the
    dream has consolidated, so another host does not do it again). Best effort: a server
    that fails here costs repeated work, never the job."""

    def __init__(self, conn: db.Conn, workspace_id: int, name: str,
                 writes: WriteRefusal) -> None:
        self._conn = conn
        self._workspace_id = workspace_id
        self._name = name
        # A write refused here (read-only, ...) is the replica's: status says it, and
        # the next job waits until the server takes writes again.
        self._writes = writes

    async def load(self, job: str) -> dict[str, JsonObject]:
        try:
            return await on_conn(self._conn, catalog, self._workspace_id, job)
        except (psycopg.Error, db.NoAnswer) as exc:
            log.warning("shared workspace %s: %s catalog not read: %s", self._name, job,
                        one_line(exc, ()))
            return {}

    async def store(self, job: str, catalog: Mapping[str, JsonObject],
                    known: dict[str, JsonObject]) -> None:
        """Send what ``job``'s ``catalog`` changed since ``known`` (the records the hosts
        were last told of): the records changed and the keys removed (a renamed note's
        old name, which a host reading it back would take for a note deleted since).
        ``known`` then holds ``catalog``, sent or not (the server's failure is logged)."""
        changed = {k: v for k, v in catalog.items() if known.get(k) != v}
        dropped = [k for k in known if k not in catalog]
        known.clear()
        known.update(catalog)
        try:
            await on_conn(self._conn, put_catalog, self._workspace_id, job, changed,
                          dropped)
        except (psycopg.Error, db.NoAnswer) as exc:
            log.warning("shared workspace %s: %s catalog not stored: %s", self._name, job,
                        one_line(exc, ()))
            self._writes.refused(exc, self._name)

    async def put_back(self, job: str, changes: Mapping[str, Mapping[str, object]]) -> None:
        """Put back the records of ``job``'s catalog an undone run changed (``changes``:
        each key's record ``before`` and ``after`` the run) as they were before it, but
        those changed since (what a later run did stands). Unlike :meth:`store`, raises
        ProviderUnavailable when the server fails: the undo tells it later."""
        try:
            current = await on_conn(self._conn, catalog, self._workspace_id, job)
            put, dropped = put_back_plan(current, changes)
            await on_conn(self._conn, put_catalog, self._workspace_id, job, put,
                          [key for key in dropped if key in current])
        except (psycopg.Error, db.NoAnswer) as exc:
            self._writes.refused(exc, self._name)
            raise ProviderUnavailable(f"shared workspace {self._name}: {job} catalog not "
                                      f"put back: {one_line(exc, ())}") from None


def catalog(conn: db.Conn, workspace_id: int, job: str) -> dict[str, JsonObject]:
    """The records of ``job``'s catalog kept for the whole shared workspace, by key."""
    rows = conn.execute("SELECT key, value FROM recalld_catalog WHERE workspace_id = %s"
                        " AND job = %s", (workspace_id, job)).fetchall()
    return {str(key): value for key, value in rows if isinstance(value, dict)}


def put_catalog(conn: db.Conn, workspace_id: int, job: str,
                records: Mapping[str, Mapping[str, object]],
                dropped: Sequence[str] = ()) -> None:
    """Store ``records`` in ``job``'s shared catalog (each replaces its key's) and remove
    the keys ``dropped``, in one transaction."""
    if not records and not dropped:
        return
    with conn.transaction(), conn.cursor() as cur:
        if records:
            cur.executemany(
                "INSERT INTO recalld_catalog (workspace_id, job, key, value)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (workspace_id, job, key)"
                " DO UPDATE SET value = EXCLUDED.value, updated_at = now()",
                [(workspace_id, job, key, Jsonb(dict(value)))
                 for key, value in records.items()])
        if dropped:
            cur.execute("DELETE FROM recalld_catalog WHERE workspace_id = %s AND job = %s"
                        " AND key = ANY(%s)", (workspace_id, job, list(dropped)))
