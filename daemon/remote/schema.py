"""The PostgreSQL schema of shared workspaces, as numbered migrations run by recalld.

Every table except the workspace registry's own counter carries ``workspace_id`` first in
its primary key: it is the distribution column for Citus (``create_distributed_table(...,
'workspace_id')``) and keeps each workspace's rows together everywhere else. The
migrations are documented in docs/remote.md; a migration is never edited once released,
a change is a new one.

:func:`migrate` runs the missing migrations in one transaction, begun once it holds an
advisory lock, so several daemons starting at once against an empty database do not race.
A database whose schema is newer than this recalld knows is refused with a clear error.
Blocking (psycopg).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg

log = logging.getLogger(__name__)

# Advisory lock key of the migration step: a pair of keys ("reca", "rc" and 0), apart
# from the hosts' single bigint keys (workspace id, host), which a single key of the
# migration would share (it held the lock of a host of workspace 7,497,059), and from
# the job locks' pairs (workspace id, "rc" and the kind's number from 1).
MIGRATION_LOCK = (0x7265_6361, 0x7263_0000)


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered step of the shared database's schema."""

    version: int
    name: str
    sql: str
    #: Optional migrations (an extension the server may lack) are skipped when they fail
    #: and tried again at the next start.
    optional: bool = False


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "files and change feed", """
CREATE TABLE recalld_workspaces (
    workspace_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    last_version bigint NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE recalld_files (
    workspace_id bigint NOT NULL,
    path         text NOT NULL,
    content      bytea NOT NULL,
    content_hash text,
    version      bigint NOT NULL,
    author_host  text NOT NULL,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    deleted      boolean NOT NULL DEFAULT false,
    change_id    uuid NOT NULL,
    PRIMARY KEY (workspace_id, path)
);
CREATE INDEX recalld_files_feed ON recalld_files (workspace_id, version);
CREATE TABLE recalld_changes (
    workspace_id bigint NOT NULL,
    change_id    uuid NOT NULL,
    path         text NOT NULL,
    stored_path  text NOT NULL,
    outcome      text NOT NULL,
    version      bigint NOT NULL,
    author_host  text NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, change_id)
);
CREATE TABLE recalld_catalog (
    workspace_id bigint NOT NULL,
    job          text NOT NULL,
    key          text NOT NULL,
    value        jsonb NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, job, key)
);
"""),
    Migration(2, "embeddings per vector space and text (pgvector)", """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE recalld_embeddings (
    workspace_id bigint NOT NULL,
    space        text NOT NULL,
    text_hash    text NOT NULL,
    embedding    vector,
    claimed_by   text,
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, space, text_hash)
);
""", optional=True),
    Migration(3, "chunks for searching in the server", """
ALTER TABLE recalld_workspaces
    ADD COLUMN search_chunked boolean NOT NULL DEFAULT false,
    ADD COLUMN search_chunks bigint NOT NULL DEFAULT 0,
    ADD COLUMN search_length bigint NOT NULL DEFAULT 0;
ALTER TABLE recalld_files ADD COLUMN chunked_version bigint;
CREATE TABLE recalld_chunks (
    workspace_id bigint NOT NULL,
    path         text NOT NULL,
    seq          integer NOT NULL,
    start_line   integer NOT NULL,
    end_line     integer NOT NULL,
    heading      text NOT NULL,
    text         text NOT NULL,
    text_hash    text NOT NULL,
    author       text,
    doc_len      integer NOT NULL,
    PRIMARY KEY (workspace_id, path, seq)
);
CREATE INDEX recalld_chunks_text ON recalld_chunks (workspace_id, text_hash);
CREATE TABLE recalld_postings (
    workspace_id bigint NOT NULL,
    term         text NOT NULL,
    path         text NOT NULL,
    seq          integer NOT NULL,
    tf           integer NOT NULL,
    doc_len      integer NOT NULL,
    PRIMARY KEY (workspace_id, term, path, seq) INCLUDE (tf, doc_len)
);
CREATE INDEX recalld_postings_path ON recalld_postings (workspace_id, path);
"""),
    # The hosts listening on a workspace's channel learn of its removal at once, however
    # it is removed (``recalld remote forget``, an operator's SQL), rather than at their
    # next catch-up. Optional: where the trigger cannot be made (a user not the tables'
    # owner, Citus without its unsafe triggers) the hosts notice it at their periodic
    # catch-up instead (``filesync.py``).
    Migration(4, "removal of a workspace notified on its channel", """
CREATE FUNCTION recalld_workspace_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('recalld_ws_' || OLD.workspace_id, '0');
    RETURN NULL;
END $$;
CREATE TRIGGER recalld_workspace_removed AFTER DELETE ON recalld_workspaces
    FOR EACH ROW EXECUTE FUNCTION recalld_workspace_removed();
""", optional=True),
)

LATEST = MIGRATIONS[-1].version


class SchemaTooNew(Exception):
    """The database was migrated by a newer recalld."""


def applied_versions(conn: psycopg.Connection[tuple[object, ...]]) -> set[int] | None:
    """The migrations the database has (None: no schema yet); SchemaTooNew when a newer
    recalld migrated it. Reads only."""
    row = conn.execute("SELECT to_regclass('recalld_schema_migrations')").fetchone()
    if row is None or row[0] is None:
        return None
    done = {int(str(r[0])) for r in conn.execute(
        "SELECT version FROM recalld_schema_migrations").fetchall()}
    if done and max(done) > LATEST:
        raise SchemaTooNew(
            f"the shared database's schema is at version {max(done)}, this recalld knows "
            f"up to {LATEST}: upgrade recalld")
    return done


def _wanted(conn: psycopg.Connection[tuple[object, ...]], done: set[int] | None) -> bool:
    """Whether a migration is to be tried: a required one is missing, or an optional one
    on a server that takes writes (a read-only one leaves it to a later start)."""
    missing = [m for m in MIGRATIONS if done is None or m.version not in done]
    if not all(m.optional for m in missing):
        return True
    if not missing:
        return False
    row = conn.execute("SELECT current_setting('transaction_read_only')").fetchone()
    return row is None or row[0] != "on"


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> list[int]:
    """Apply the missing migrations; returns the versions applied now. A schema already
    current is only read (no DDL, no lock): a server that refuses writes (a standby, a
    role without CREATE) still serves the rest."""
    if not _wanted(conn, applied_versions(conn)):
        return []
    # The lock is taken before the transaction begins, not inside it: a session that
    # waited for it inside its transaction still has the catalog as the transaction
    # found it (PostgreSQL reads other sessions' catalog changes at a transaction's
    # start), so the tables another daemon made meanwhile were missing to it, and its
    # CREATE TABLE failed with "already exists".
    conn.execute("SELECT pg_advisory_lock(%s, %s)", MIGRATION_LOCK)
    try:
        return _migrate_locked(conn)
    finally:
        if not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", MIGRATION_LOCK)


def _migrate_locked(conn: psycopg.Connection[tuple[object, ...]]) -> list[int]:
    """:func:`migrate`'s work, holding the migration lock."""
    applied: list[int] = []
    with conn.transaction():
        done = applied_versions(conn)
        if done is None:
            conn.execute("""
CREATE TABLE IF NOT EXISTS recalld_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)""")
            done = set()
        for m in MIGRATIONS:
            if m.version in done:
                continue
            try:
                with conn.transaction():
                    conn.execute(m.sql.encode())
                    conn.execute("INSERT INTO recalld_schema_migrations (version, name) "
                                 "VALUES (%s, %s)", (m.version, m.name))
            except psycopg.Error as exc:
                if not m.optional and done and isinstance(
                        exc, psycopg.errors.InsufficientPrivilege):
                    raise _owner_needed(conn, m, max(done), exc) from exc
                if not m.optional:
                    raise
                log.warning("schema migration %d (%s) skipped: %s", m.version, m.name,
                            str(exc).strip().splitlines()[0] if str(exc) else type(exc))
                continue
            applied.append(m.version)
    return applied


def _owner_needed(conn: psycopg.Connection[tuple[object, ...]], m: Migration, at: int,
                  exc: psycopg.Error) -> psycopg.errors.InsufficientPrivilege:
    """The refusal of a migration of an existing schema by a role that may use its
    tables but not alter them (PostgreSQL lets only a table's owner): which migration,
    and whose it is to run, rather than the server's bare "must be owner of table"."""
    row = conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = "
                       "'recalld_workspaces' AND schemaname = ANY (current_schemas(false))"
                       ).fetchone()
    owner = f" ({row[0]})" if row is not None else ""
    said = " ".join((exc.diag.message_primary or str(exc)).split())
    return psycopg.errors.InsufficientPrivilege(
        f"the shared database's schema is at version {at} and needs migration "
        f"{m.version} ({m.name}), which only the owner of its tables{owner} may run: "
        f"{said}; connect once as that role, or make this one their owner")
