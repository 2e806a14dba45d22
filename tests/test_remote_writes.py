"""Shared workspaces: a server that answers but refuses this host's writes (read-only
after a failover, a role without rights). Status says so, not "offline"; reading goes on
where the server allows it; local changes wait in the outbox and go up once the server
takes writes again; connecting to a current schema runs no DDL.

Two or three daemons ("hosts") share one workspace on the server of ``pg_server``, as in
tests/test_remote.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import (
    cli,
    config,
    converged,
    finished_job,
    notes,
    pair,
    remote_status,
    root,
    write,
)
from waits import wait_for


@contextmanager
def read_only(pg: PgServer) -> Iterator[None]:
    """The whole server read-only, its open sessions too (as after a failover to a
    standby), until the block ends."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        conn.execute("SELECT pg_reload_conf()")
    # The reload is the server's to do after pg_reload_conf() returns: once a new session
    # starts read-only, the server has read it and told every open session, which each
    # takes before its next statement.
    wait_for(lambda: _setting(pg, "default_transaction_read_only") == "on",
             what="the server read-only")
    try:
        yield
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("SET default_transaction_read_only = off")
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")


def _setting(pg: PgServer, name: str) -> str:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


def test_a_host_connecting_to_a_hot_standby_reads_it_without_ddl_or_listen(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    server = ', search_mode = "server"'
    a, b, name = pair(daemon_factory, pg_server, server)
    write(a, "memory/2026-09-03/known.md", "# Known\nwritten before the failover\n")
    wait_for(lambda: "memory/2026-09-03/known.md" in notes(b), what="known on b")
    standby = pg_server.standby()
    try:
        # The schema, the workspace's row and its chunks are there: connecting only
        # reads them, so the server still answers searches. A standby refuses LISTEN:
        # the feed is read all the same.
        c = daemon_factory(config(standby.dsn, name, "hostc", server))
        status = wait_for(lambda: (lambda s: s if ("memory/2026-09-03/known.md" in notes(c)
                                    and s["search"]["chunks_ready"])
                                   or (s["refusing"] and s["online_since"] is None)
                                   else None)(remote_status(c)), what="c caught up")
        assert status["online_since"] is not None, status  # the session goes on
        assert status["state"] == "refusing" and status["refusing"] == "read-only", status
        # Said when met (the idle host's later tries of a write may say the server
        # refuses them since, in last_error).
        assert "LISTEN during recovery" in c.log(), c.log()
        assert status["search"]["last_error"] is None, status
        found = c.call("memory.search", {"agent_id": "default", "query": "failover"})
        assert found["search_mode"] == "server", found
        assert [r["path"] for r in found["results"]] == ["memory/2026-09-03/known.md"]
        since = status["online_since"]
        assert "CREATE" not in c.log(), c.log()
        # A job finds the refusal out (instead of running with a catalog the other
        # hosts would never see), and the next one is told at once.
        for _ in range(2):
            job = finished_job(c, "auto_resource")
            assert job["state"] == "failed" and job["error_code"] == -32003, job
            assert "is refusing (read-only: " in str(job["error"]), job
            assert "waits until the server takes this host's writes" in str(job["error"])
        status = remote_status(c)
        assert status["outbox"] == 0 and status["online_since"] == since, status
        # Promoted (the failover), with nothing to upload: status says so without a
        # local change, and the job runs.
        standby.promote()
        wait_for(lambda: remote_status(c)["state"] == "online", what="c takes writes")
        assert finished_job(c, "auto_resource")["state"] == "succeeded"
    finally:
        standby.discard()


def test_a_read_only_server_is_refusing_reads_go_on_and_the_outbox_waits(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, _ = pair(daemon_factory, pg_server)
    write(b, "memory/2026-09-01/before.md", "# Before\nwritten before the failover\n")
    wait_for(lambda: converged(a, b), what="converged")
    began = time.time()
    with read_only(pg_server):
        write(a, "memory/2026-09-01/during.md", "# During\nwritten while read-only\n")
        status = wait_for(lambda: (lambda s: s if s["state"] == "refusing" else None)(
            remote_status(a)), what="a refusing")
        assert status["refusing"] == "read-only" and status["outbox"] == 1, status
        assert "read-only transaction" in str(status["last_error"]), status
        # What is wrong comes with when it began.
        assert began <= (status["last_error_at"] or 0) <= time.time(), status
        shown = cli(a, "doctor")
        assert "remote refusing writes" in shown and "point the dsn at the primary" in shown
        assert "reachable and accepts this host" not in shown, shown
        assert "memory/2026-09-01/during.md" not in notes(b)
        assert remote_status(a)["outbox"] == 1
    # Writable again: what waited goes up, and status says online.
    write(a, "memory/2026-09-01/after.md", "# After\nwritten after\n")
    wait_for(lambda: converged(a, b) and "memory/2026-09-01/during.md" in notes(b),
             what="a's notes on b")
    assert (root(b) / "memory/2026-09-01/during.md").read_text().endswith("read-only\n")
    status = remote_status(a)
    assert status["state"] == "online" and status["refusing"] is None, status
    assert status["last_error"] is None, status
    assert a.log().count("refuses this host's writes") == 1, a.log()


def test_a_role_that_may_only_read_catches_up_and_says_permission_denied(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    write(a, "memory/2026-09-02/shared.md", "# Shared\nfrom the writer\n")
    wait_for(lambda: "memory/2026-09-02/shared.md" in notes(b), what="shared on b")
    role = "r" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN".encode())
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}".encode())
    dsn = pg_server.dsn.replace("postgres@", f"{role}@", 1)
    # It searches in the server, whose chunks nobody made yet: making them is a write.
    r = daemon_factory(config(dsn, name, "reader", ', search_mode = "server"'))
    wait_for(lambda: "memory/2026-09-02/shared.md" in notes(r), what="the reader caught up")
    write(r, "memory/2026-09-02/mine.md", "# Mine\nfrom the reader\n")
    status = wait_for(lambda: (lambda s: s if s["state"] == "refusing" and s["outbox"]
                               else None)(remote_status(r)), what="the reader refusing")
    assert status["refusing"] == "permission denied" and status["outbox"] == 1, status
    # The chunks wait too, and say why; the session goes on (reading) without them.
    assert not status["search"]["chunks_ready"], status
    assert "chunks of the files written before wait" in str(status["search"]["last_error"])
    since = status["online_since"]
    found = r.call("memory.search", {"agent_id": "default", "query": "writer"})
    assert found["search_mode"] == "local", found
    shown = cli(r, "doctor")
    assert "remote refusing writes" in shown and "grant it SELECT, INSERT" in shown, shown
    # Reading goes on meanwhile: a note of the writer comes down.
    write(a, "memory/2026-09-02/later.md", "# Later\nwhile the reader waits\n")
    wait_for(lambda: "memory/2026-09-02/later.md" in notes(r), what="later on the reader")
    status = remote_status(r)
    assert status["state"] == "refusing" and status["outbox"] == 1, status
    assert status["online_since"] == since, status  # one session all along
    # Granted the rights, the change goes up (a new local change tries at once).
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public "
                     f"TO {role}".encode())
    write(r, "memory/2026-09-02/more.md", "# More\nonce granted\n")
    wait_for(lambda: {"memory/2026-09-02/mine.md", "memory/2026-09-02/more.md"}
             <= notes(a).keys(), what="the reader's notes on a")
    wait_for(lambda: remote_status(r)["state"] == "online", what="the reader online")
    # Writes taken, the chunks are made and the server answers.
    wait_for(lambda: remote_status(r)["search"]["chunks_ready"], what="the chunks made")
    found = r.call("memory.search", {"agent_id": "default", "query": "writer"})
    assert found["search_mode"] == "server", found
    assert [x["path"] for x in found["results"]] == ["memory/2026-09-02/shared.md"], found
    assert remote_status(r)["search"]["last_error"] is None


def test_a_new_database_the_role_may_not_create_tables_in_is_refusing(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    database = "n" + uuid.uuid4().hex[:12]
    role = "r" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}".encode())
        conn.execute(f"CREATE ROLE {role} LOGIN".encode())
    base = pg_server.dsn.rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/{database}", autocommit=True) as conn:
        conn.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}".encode())
    a = daemon_factory(config(f"{base}/{database}".replace("postgres@", f"{role}@", 1),
                              "team", "hosta"))
    status = wait_for(lambda: (lambda s: s if s["last_error"] else None)(remote_status(a)),
                      what="the first attempt")
    assert status["state"] == "refusing", status
    assert status["refusing"] == "permission denied", status
    assert "permission denied for schema public" in str(status["last_error"]), status
    shown = cli(a, "doctor")
    assert "CREATE on the schema" in shown, shown
    assert "reachable and accepts this host" not in shown, shown

