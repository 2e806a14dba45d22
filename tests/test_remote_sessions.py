"""Settings of the server's role or database that would end the sessions a replica holds
open (its host's name, its LISTEN): the replica's own settings for its sessions win."""

from __future__ import annotations

import uuid

import psycopg
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, converged, notes, remote_status, search_paths, write
from waits import wait_for


def test_timeouts_of_the_role_do_not_end_the_replica_sessions_nor_its_uploads(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    role = "i" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN".encode())
        conn.execute(f"CREATE DATABASE {role} OWNER {role}".encode())
        for setting, value in (("idle_session_timeout", "1s"), ("transaction_timeout", "1ms"),
                               ("lock_timeout", "1ms"),
                               ("idle_in_transaction_session_timeout", "1ms")):
            conn.execute(f"ALTER ROLE {role} SET {setting} = '{value}'".encode())
    try:
        dsn = f"postgresql://{role}@127.0.0.1:{pg_server.port}/{role}"
        name = "i" + uuid.uuid4().hex[:12]
        a = daemon_factory(config(dsn, name, "hosta"))
        b = daemon_factory(config(dsn, name, "hostb"))
        for d in (a, b):
            wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
        since = remote_status(a)["online_since"]

        def sessions_outlive_the_timeout() -> bool:
            with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
                ages = conn.execute(
                    "SELECT extract(epoch FROM now() - backend_start) FROM pg_stat_activity"
                    " WHERE usename = %s AND application_name = 'recalld'",
                    (role,)).fetchall()
            # Each host's writer and listener, idle past three timeouts.
            return len(ages) == 4 and all(float(str(age)) > 3.0 for (age,) in ages)
        wait_for(sessions_outlive_the_timeout, what="the sessions kept", deadline_s=30)
        assert remote_status(a)["online_since"] == since, remote_status(a)
        # Uploads of both hosts at once: transactions, and waits for the workspace's lock.
        for i in range(20):
            write(a if i % 2 else b, f"memory/2026-12-15/idle{i}.md", f"# Idle\nkeeper {i}\n")
        write(a, "memory/2026-12-15/idle.md", "# Idle\nthe lighthouse keeper\n")
        wait_for(lambda: converged(a, b) and len(notes(b)) == 21, what="the notes on both")
        assert search_paths(b, "lighthouse") == ["memory/2026-12-15/idle.md"]
        assert remote_status(a)["online_since"] == since, remote_status(a)
        assert "timeout" not in a.log() + b.log()
        a.stop()
        b.stop()
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)".encode())
            conn.execute(f"DROP ROLE IF EXISTS {role}".encode())
