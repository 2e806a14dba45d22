"""Shared workspaces: a server that answers but refuses this host's writes (read-only
after a failover, a role without rights). Status says so, not "offline"; reading goes on
where the server allows it; local changes wait in the outbox and go up once the server
takes writes again; connecting to a current schema runs no DDL.

Two or three daemons ("hosts") share one workspace on the server of ``pg_server``, as in
tests/test_remote.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, notes, pair, remote_status, write
from waits import wait_for


@contextmanager
def read_only(pg: PgServer) -> Iterator[None]:
    """The whole server read-only, its open sessions too (as after a failover to a
    standby), until the block ends."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("SET default_transaction_read_only = off")
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")


def test_a_host_connecting_to_a_read_only_server_reads_it_without_ddl(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    write(a, "memory/2026-09-03/known.md", "# Known\nwritten before the failover\n")
    wait_for(lambda: "memory/2026-09-03/known.md" in notes(b), what="known on b")
    with read_only(pg_server):
        # The schema and the workspace's row are there: connecting only reads them.
        c = daemon_factory(config(pg_server.dsn, name, "hostc"))
        wait_for(lambda: "memory/2026-09-03/known.md" in notes(c), what="c caught up")
        assert remote_status(c)["state"] == "online", remote_status(c)
        assert "read-only transaction" not in c.log(), c.log()
