"""A shared workspace's server that goes back in time: restored from a backup, or a
failover to a replica that lagged. Its versions go on from a point the hosts read past;
the hosts notice and start over, so nothing written since the backup is lost or left
behind on one host.

The restore is of the workspace's rows, on the server started by ``pg_server``
(tests/pgserver.py): its files and changes are put back as a copy taken earlier held
them, its ``last_version`` with them, and the hosts' connections are cut, as a server
restart would.
"""

from __future__ import annotations

import time

import psycopg
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import converged, notes, pair, remote_status, write
from waits import wait_for

from recalld.daemon.remote.filesync import CATCH_UP_EVERY_S

TABLES = ("recalld_files", "recalld_changes")


def backup(pg: PgServer, name: str) -> int:
    """Copy shared workspace ``name``'s rows aside; its last version."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT workspace_id, last_version FROM recalld_workspaces "
                           "WHERE name = %s", (name,)).fetchone()
        assert row is not None
        for table in TABLES:
            conn.execute(f"CREATE TABLE backup_{name}_{table} AS SELECT * FROM {table} "
                         "WHERE workspace_id = %s", (row[0],))
        return int(row[1])


def restore(pg: PgServer, name: str, last_version: int) -> None:
    """Put shared workspace ``name``'s rows back as :func:`backup` copied them, then cut
    every connection of the daemons."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        with conn.transaction():
            for table in TABLES:
                conn.execute(f"DELETE FROM {table} WHERE workspace_id = (SELECT workspace_id "
                             "FROM recalld_workspaces WHERE name = %s)", (name,))
                conn.execute(f"INSERT INTO {table} SELECT * FROM backup_{name}_{table}")
            conn.execute("UPDATE recalld_workspaces SET last_version = %s WHERE name = %s",
                         (last_version, name))
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name LIKE 'recalld%'")


def test_a_server_restored_from_a_backup_gets_back_what_it_lost(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    for i in range(3):
        write(a, f"memory/2026-12-05/before{i}.md", f"# Before {i}\nin the backup {i}\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 3, what="converged before")
    version = backup(pg_server, name)

    for i in range(3):
        write(a, f"memory/2026-12-06/after-backup{i}.md", f"# After {i}\nnot in it {i}\n")
    write(b, "memory/2026-12-05/before0.md", "# Before 0\nedited after the backup\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 6, what="converged after")
    assert min(remote_status(d)["cursor"] for d in (a, b)) > version

    restore(pg_server, name, version)
    for i in range(3):
        write(a, f"memory/2026-12-07/after-restore{i}.md", f"# Restored {i}\nlater {i}\n")
    # Notes written after the restore reach the other host, and what the server lost
    # comes back from the hosts that have it.
    wait_for(lambda: converged(a, b) and len(notes(b)) >= 9, what="converged after restore",
             deadline_s=60)
    with psycopg.connect(pg_server.dsn) as conn:
        on_server = {str(r[0]) for r in conn.execute(
            "SELECT path FROM recalld_files JOIN recalld_workspaces USING (workspace_id) "
            "WHERE name = %s AND NOT deleted", (name,))}
    assert set(notes(a)) <= on_server
    assert {f"memory/2026-12-0{day}/{kind}{i}.md" for day, kind in (
        (5, "before"), (6, "after-backup"), (7, "after-restore")) for i in range(3)} <= on_server
    # The edit the server lost is kept: at its path or as a conflict copy beside it.
    texts = [(a.data_dir / "workspaces/default" / p).read_text() for p in notes(a)]
    assert any("edited after the backup" in t for t in texts)
    assert any("the server is behind what this replica saw" in d.log() for d in (a, b))


def test_a_workspace_removed_on_the_server_is_noticed_and_every_host_starts_over(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # Its row deleted while both hosts are connected (an operator cleaning up): neither
    # host stays "online" with a workspace that is gone; both start over with a new one.
    a, b, name = pair(daemon_factory, pg_server)
    write(a, "memory/2026-07-20/one.md", "# One\nbefore the removal\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 1, what="one on b")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        row = conn.execute("DELETE FROM recalld_workspaces WHERE name = %s"
                           " RETURNING workspace_id", (name,)).fetchone()
        assert row is not None
        gone = row[0]
    # a finds out by uploading and wakes b (which writes nothing); the server's trigger on
    # the removal tells both at once too (else a host finds out at its next catch-up).
    write(a, "memory/2026-07-20/two.md", "# Two\nafter the removal\n")
    started = time.monotonic()
    wait_for(lambda: converged(a, b) and len(notes(b)) == 2, what="converged again",
             deadline_s=CATCH_UP_EVERY_S * 3)
    assert time.monotonic() - started < CATCH_UP_EVERY_S, "b waited for its catch-up"
    for d in (a, b):
        status = remote_status(d)
        # Online again, the removal is over for status; the log says what happened.
        assert status["state"] == "online" and status["last_error"] is None, status
        assert "no longer on the server" in d.log()
    assert "AssertionError" not in a.log() + b.log()
    # The removed workspace's rows went with it (no foreign key takes them along).
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        left = {t: conn.execute(f"SELECT count(*) FROM {t} WHERE workspace_id = %s".encode(),
                                (gone,)).fetchone()
                for t in ("recalld_files", "recalld_changes", "recalld_catalog")}
    assert all(n == (0,) for n in left.values()), left


def test_rows_of_a_removed_workspace_that_could_not_be_deleted_are_deleted_later(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    write(a, "memory/2026-07-21/kept.md", "# Kept\nrows the server may not delete yet\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 1, what="the note on b")
    fn = f"refuse_{name}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT workspace_id FROM recalld_workspaces WHERE name = %s",
                           (name,)).fetchone()
        assert row is not None
        gone = row[0]
        # The hosts' user may not delete the workspace's files (a grant missing), for now.
        conn.execute(f"""CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF EXISTS (SELECT 1 FROM old WHERE workspace_id = {gone}) THEN
                RAISE EXCEPTION 'permission denied' USING ERRCODE = 'insufficient_privilege';
              END IF;
              RETURN NULL;
            END $$""".encode())
        conn.execute(f"CREATE TRIGGER {fn} AFTER DELETE ON recalld_files REFERENCING OLD "
                     f"TABLE AS old FOR EACH STATEMENT EXECUTE FUNCTION {fn}()".encode())
        try:
            conn.execute("DELETE FROM recalld_workspaces WHERE workspace_id = %s", (gone,))
            write(a, "memory/2026-07-21/after.md", "# After\nthe removal\n")
            wait_for(lambda: converged(a, b) and len(notes(b)) == 2, what="converged again")
            wait_for(lambda: all("stay on the server for now" in d.log() for d in (a, b)),
                     what="the rows left said")
            conn.execute(f"DROP TRIGGER {fn} ON recalld_files".encode())
        finally:
            conn.execute(f"DROP FUNCTION {fn} CASCADE".encode())
        # The next session of each host tries again.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name LIKE 'recalld%'")
        wait_for(lambda: conn.execute("SELECT count(*) FROM recalld_files WHERE "
                                      "workspace_id = %s", (gone,)).fetchone() == (0,),
                 what="the removed workspace's files deleted", deadline_s=60)
    wait_for(lambda: converged(a, b), what="converged at the end")
