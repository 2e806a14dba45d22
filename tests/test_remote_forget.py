"""``remote.forget`` (``recalld remote forget NAME --dsn DSN``): a shared workspace removed
from its server for good, its rows in every table, refused while a daemon shares it."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import cli, converged, notes, pair, root, write
from waits import wait_for

from recalld.daemon.config import RemoteConfig
from recalld.daemon.remote import db, forget, locks, schema
from recalld.ipc.errors import AlreadyRunning, InvalidParams, NotFound

TABLES = ("recalld_files", "recalld_changes", "recalld_catalog", "recalld_embeddings")


def rows(pg: PgServer, name: str) -> dict[str, int]:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        out = {}
        for table in TABLES:
            row = conn.execute(f"SELECT count(*) FROM {table} t JOIN recalld_workspaces w"
                               " USING (workspace_id) WHERE w.name = %s", (name,)).fetchone()
            out[table] = int(row[0]) if row else 0
        return out


def test_a_shared_workspace_is_forgotten_once_no_daemon_shares_it(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    write(a, "memory/2026-10-01/Ölwechsel.md", "# Ölwechsel\nbeim Kilometerstand 90 000\n")
    write(b, "digest/wiki/车.md", "# 车\n换油\n")
    wait_for(lambda: converged(a, b) and len(notes(a)) == 2, what="both notes on both hosts")
    assert rows(pg_server, name)["recalld_files"] == 2
    # Removed while hosts share it, it would be made again at once by them.
    with pytest.raises(AlreadyRunning, match="daemons are connected"):
        a.call("remote.forget", {"name": name, "dsn": pg_server.dsn})
    assert rows(pg_server, name)["recalld_files"] == 2

    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        found = conn.execute("SELECT workspace_id FROM recalld_workspaces WHERE name = %s",
                             (name,)).fetchone()
    assert found is not None
    for d in (a, b):
        d.stop()
    plain = daemon_factory("[workspaces.default]\n")
    refused = cli(plain, "remote", "forget", name, "--dsn", pg_server.dsn)
    assert "Pass --yes to confirm" in refused and rows(pg_server, name)["recalld_files"] == 2
    assert f"{name}: removed from the server" in cli(
        plain, "remote", "forget", name, "--dsn", pg_server.dsn, "--yes")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM recalld_workspaces WHERE name = %s",
                            (name,)).fetchone() is None
        for table in TABLES:  # none of its rows is left behind
            assert conn.execute(f"SELECT count(*) FROM {table} WHERE workspace_id = %s",
                                found).fetchone() == (0,), table
    with pytest.raises(NotFound, match=f"no shared workspace named {name}"):
        plain.call("remote.forget", {"name": name, "dsn": pg_server.dsn})
    with pytest.raises(InvalidParams, match="name must be"):
        plain.call("remote.forget", {"name": "team memory", "dsn": pg_server.dsn})
    # The hosts keep their files (now a local workspace's).
    assert (root(a) / "memory/2026-10-01/Ölwechsel.md").exists()


def test_sessions_of_another_database_do_not_hold_a_workspace_of_this_one(
        pg_server: PgServer) -> None:  # noqa: F811
    # One server, a database per team: workspace ids start at 1 in each, so the hosts
    # connected to another database's workspace of the same id are not this one's.
    name = "f" + uuid.uuid4().hex[:12]
    other = "o" + uuid.uuid4().hex[:12]
    cfg = RemoteConfig(dsn=pg_server.dsn, name=name)
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {other}".encode())
    here, there = db.connect(cfg), db.connect(
        RemoteConfig(dsn=pg_server.dsn.rsplit("/", 1)[0] + "/" + other, name=name))
    try:
        workspace_id, _ = db.open_workspace(here, name)
        there.execute("SET application_name = 'recalld hostz auto_dream'")
        locks.claim_host(there, workspace_id, name, "laptop")
        assert locks.try_job_lock(there, workspace_id, "auto_dream") is None
        # This database's own holders are still seen.
        with db.connect(cfg) as rival:
            locks.claim_host(rival, workspace_id, name, "desk")
            with pytest.raises(locks.HostTaken, match=re.escape("'desk' (from 127.0.0.1 since")):
                locks.claim_host(here, workspace_id, name, "desk")
            (rival_pid,) = rival.execute("SELECT pg_backend_pid()").fetchone() or (None,)
        # A closed connection's server process ends (and lets its locks go) after the
        # close returns: wait for it, or its host lock may still be seen below.
        wait_for(lambda: here.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                      (rival_pid,)).fetchone() is None, "the rival's session")
        assert locks.try_job_lock(here, workspace_id, "auto_dream") is None
        assert forget.remove_workspace(here, name) == {
            "workspace_id": workspace_id, "rows": {**dict.fromkeys(
                (*db.WORKSPACE_TABLES, "recalld_workspaces"), 0), "recalld_workspaces": 1}}
    finally:
        here.close()
        there.close()
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {other} WITH (FORCE)".encode())


def test_a_migrating_session_is_no_host_of_any_workspace(pg_server: PgServer) -> None:  # noqa: F811
    # The migration lock's key lies apart from the hosts' (workspace id, host) keys: a
    # daemon migrating the schema was counted as a host of workspace 7,497,059 (the
    # migration key's first half), whose forgetting it refused.
    name = "f" + uuid.uuid4().hex[:12]
    cfg = RemoteConfig(dsn=pg_server.dsn, name=name)
    key = schema.MIGRATION_LOCK
    args = key if isinstance(key, tuple) else (key,)
    with db.connect(cfg) as here, db.connect(cfg) as migrating:
        schema.migrate(here)
        here.execute("INSERT INTO recalld_workspaces (workspace_id, name) OVERRIDING SYSTEM"
                     " VALUE VALUES (7497059, %s)", (name,))
        migrating.execute(f"SELECT pg_advisory_lock({', '.join(['%s'] * len(args))})", args)
        assert forget.remove_workspace(here, name) == {
            "workspace_id": 7497059, "rows": {**dict.fromkeys(
                (*db.WORKSPACE_TABLES, "recalld_workspaces"), 0), "recalld_workspaces": 1}}


def test_workspaces_past_31_bits_of_id_have_lock_keys_of_their_own(
        pg_server: PgServer) -> None:  # noqa: F811
    # An id sequence set high (or 2^31 workspaces made): the hosts' keys kept 31 bits of
    # the id, so a host of workspace k held the name in workspace 2^31 + k, whose forget
    # took it for a daemon connected; a job's key did not fit the server's int4.
    name = "f" + uuid.uuid4().hex[:12]
    cfg = RemoteConfig(dsn=pg_server.dsn, name=name)
    low = 1_000_000_000 + uuid.uuid4().int % 100_000_000
    with db.connect(cfg) as here, db.connect(cfg) as other, db.connect(cfg) as high:
        schema.migrate(here)
        for workspace_id in (low + (1 << 31), (1 << 32) - 1):
            here.execute("INSERT INTO recalld_workspaces (workspace_id, name) OVERRIDING"
                         " SYSTEM VALUE VALUES (%s, %s)", (workspace_id, name))
            other.execute("SELECT pg_advisory_unlock_all()")
            locks.claim_host(other, workspace_id - (1 << 31), "x", "laptop")
            assert locks.try_job_lock(other, workspace_id - (1 << 31), "auto_dream") is None
            locks.claim_host(here, workspace_id, name, "laptop")
            assert locks.try_job_lock(here, workspace_id, "auto_dream") is None
            here.execute("SET application_name = 'recalld laptop auto_dream'")
            assert locks.try_job_lock(high, workspace_id, "auto_dream") == (
                "recalld laptop auto_dream")
            with pytest.raises(locks.HostTaken, match=r"'laptop'.* within about half a minute"):
                locks.claim_host(high, workspace_id, name, "laptop")
            with pytest.raises(forget.StillShared, match=re.escape("from 127.0.0.1")):
                forget.remove_workspace(high, name)
            here.execute("SELECT pg_advisory_unlock_all()")
            assert forget.remove_workspace(high, name) == {
                "workspace_id": workspace_id, "rows": {**dict.fromkeys(
                    (*db.WORKSPACE_TABLES, "recalld_workspaces"), 0), "recalld_workspaces": 1}}
        # Past 32 bits no key could tell it apart: refused, saying what to do.
        with pytest.raises(locks.WorkspaceIdTooLarge,
                           match=re.escape("restart the sequence lower (ALTER TABLE")):
            locks.claim_host(here, 1 << 32, name, "laptop")
