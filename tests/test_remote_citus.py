"""What can be checked of docs/scaling.md's Citus statements without a Citus server.

Citus distributes a table on one column only if every primary key and unique constraint
(and every unique index) of it includes that column, and co-located tables keep a
transaction on one worker only if each of its statements names one value of it. The
embedded PostgreSQL has no Citus extension, so ``create_distributed_table`` itself is not
run here; what is checked is the real schema, as recalld migrates it, against the rule
the statements depend on, table by table.
"""

from __future__ import annotations

import uuid

import psycopg
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)

from recalld.daemon.config import RemoteConfig
from recalld.daemon.remote import db
from recalld.daemon.remote.schema import LATEST

#: The tables docs/scaling.md distributes on ``workspace_id``, co-located.
DISTRIBUTED = ("recalld_files", "recalld_changes", "recalld_catalog", "recalld_embeddings",
               "recalld_chunks", "recalld_postings")


def _unique_indexes(conn: psycopg.Connection[tuple[object, ...]]
                    ) -> dict[str, list[tuple[str, list[str]]]]:
    """Per recalld table: (index name, its key columns) of every unique index (primary
    keys and unique constraints are unique indexes)."""
    rows = conn.execute("""
        SELECT t.relname, i.relname,
               array(SELECT a.attname FROM unnest(x.indkey) k
                     JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k)
        FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid
        JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indisunique AND t.relname LIKE 'recalld_%'""").fetchall()
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for table, index, cols in rows:
        assert isinstance(cols, list)
        out.setdefault(str(table), []).append((str(index), [str(c) for c in cols]))
    return out


def test_distributed_tables_carry_the_distribution_column_in_every_unique_key(
        pg_server: PgServer) -> None:  # noqa: F811
    conn = db.connect(RemoteConfig(dsn=pg_server.dsn, name="citus"))
    try:
        db.open_workspace(conn, "c" + uuid.uuid4().hex[:12])
        versions = {int(str(r[0])) for r in conn.execute(
            "SELECT version FROM recalld_schema_migrations").fetchall()}
        assert max(versions) == LATEST
        unique = _unique_indexes(conn)
        tables = {str(r[0]) for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE 'recalld_%'"
        ).fetchall()}
        # Every table recalld creates is either distributed or named below.
        assert tables == {*DISTRIBUTED, "recalld_workspaces", "recalld_schema_migrations"}
        for table in DISTRIBUTED:
            keys = unique[table]
            assert keys, f"{table} has no primary key"
            for index, cols in keys:
                assert cols[0] == "workspace_id", (table, index, cols)
        # No foreign keys: Citus would need them between co-located tables only.
        fks = conn.execute("SELECT conname FROM pg_constraint c JOIN pg_class t"
                           " ON t.oid = c.conrelid WHERE c.contype = 'f'"
                           " AND t.relname LIKE 'recalld_%'").fetchall()
        assert fks == []
        # The registry is not distributable on workspace_id: its unique name lacks it
        # (docs/scaling.md says so; it stays a reference table).
        ws_keys = dict(unique["recalld_workspaces"])
        assert any(cols == ["name"] for cols in ws_keys.values()), ws_keys
        # Nor is the migrations table, which has no workspace at all.
        assert all("workspace_id" not in cols
                   for _, cols in unique["recalld_schema_migrations"])
    finally:
        conn.close()
