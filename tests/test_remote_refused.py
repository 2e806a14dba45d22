"""Shared workspaces: a server that answers but refuses. A local change the server
refuses to store (a path longer than its index can hold, a character its encoding lacks)
waits by itself while the rest goes up; a schema newer than this recalld, or a
connection the server turns away, is told as such, not only as "unreachable".

Two daemons ("two hosts") share one workspace on the server of ``pg_server``, as in
tests/test_remote.py.
"""

from __future__ import annotations

import signal
import uuid

import psycopg
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import cli, config, converged, notes, pair, remote_status, root, write
from waits import wait_for

from recalld.daemon.memory.secret_names import mask_path

# A valid path on Linux (names under 255 bytes, the whole under 4,096) that PostgreSQL's
# B-tree index of the files cannot hold (about 2.7 kB a key): no two folders alike, so
# the key does not compress below that.
DEEP = "memory/" + "/".join(f"{i:02d}" + "".join(chr(0x4E00 + (i * 67 + j * 7) % 20000)
                                                 for j in range(62)) for i in range(16))
#: Named by a token too: the path is named masked in status and the log, as search shows it.
GITHUB = "ghp_Zr4Tq9Lm2Xw7Ks3Vn8Bp1Dh6Fy0Jc5Ga2Ue9"
LONG = DEEP + f"/deep-{GITHUB}.md"


def test_a_note_the_server_cannot_store_waits_alone_and_goes_once_renamed(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    assert len(LONG.encode()) < 4096
    a, b, _ = pair(daemon_factory, pg_server)
    # Queued in one run with notes to other files (a stopped while they are written).
    a.signal(signal.SIGSTOP)
    try:
        write(a, "memory/2026-08-01/before.md", "# Before\nwritten before\n")
        write(a, LONG, "# Deep\nfar down\n")
        write(a, "memory/2026-08-01/beside.md", "# Beside\nwritten beside\n")
    finally:
        a.signal(signal.SIGCONT)
    wait_for(lambda: {"memory/2026-08-01/before.md", "memory/2026-08-01/beside.md"}
             <= notes(b).keys(), what="the other notes on b")
    # b may read a note from the server before a has marked its upload done: the
    # outbox holds the refused change alone once a has.
    status = wait_for(lambda: (lambda s: s if s["refused"] and s["outbox"] == 1 else None)(
        remote_status(a)), what="the long path refused, alone in the outbox")
    assert list(status["refused"]) == [mask_path(LONG)], status
    assert GITHUB[4:20] not in str(status) and GITHUB[4:20] not in a.log(), status
    assert status["state"] == "failing", status
    assert "the server refuses to store" in str(status["last_error"]), status
    # Later notes go up too: the replica stays online.
    write(a, "memory/2026-08-01/after.md", "# After\nwritten after\n")
    wait_for(lambda: "memory/2026-08-01/after.md" in notes(b), what="after on b")
    shown = cli(a, "doctor")
    assert "reachable and accepts this host" not in shown and "rename the note" in shown, shown
    assert GITHUB[4:20] not in shown, shown
    # An edit takes the place of the refused change; the outbox holds one change.
    write(a, LONG, "# Deep\nfar down, edited\n")
    wait_for(lambda: (root(a) / LONG).read_text().endswith("edited\n")
             and remote_status(a)["outbox"] == 1, what="one change of the long path")

    # Renamed to a path the server can hold, it goes up, and nothing waits any more.
    (root(a) / LONG).rename(root(a) / "memory/2026-08-01/deep.md")
    wait_for(lambda: converged(a, b) and "memory/2026-08-01/deep.md" in notes(b),
             what="the renamed note on b")
    assert (root(b) / "memory/2026-08-01/deep.md").read_text() == "# Deep\nfar down, edited\n"
    status = remote_status(a)
    assert status["state"] == "online" and status["refused"] == {}, status
    assert LONG not in notes(b)


def test_a_schema_newer_than_this_recalld_is_failing_with_upgrade_advice(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # A database another host's newer recalld migrated answers: this host is too old,
    # the server is not offline.
    database = "n" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}".encode())
    dsn = pg_server.dsn.rsplit("/", 1)[0] + "/" + database
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE recalld_schema_migrations (version integer PRIMARY KEY,"
                     " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        conn.execute("INSERT INTO recalld_schema_migrations VALUES (99, 'from the future')")
    a = daemon_factory(config(dsn, "team", "hosta"))
    status = wait_for(lambda: (lambda s: s if s["last_error"] else None)(remote_status(a)),
                      what="the first attempt")
    assert status["state"] == "failing", status
    assert "upgrade recalld" in str(status["last_error"]), status
    write(a, "memory/2026-08-01/kept.md", "# Kept\nwaits for the upgrade\n")
    wait_for(lambda: remote_status(a)["outbox"] == 1, what="the change kept")
    shown = cli(a, "doctor")
    assert "remote failing" in shown and "upgrade recalld" in shown, shown
    assert "reachable and accepts this host" not in shown, shown
    assert a.log().count("this recalld knows up to") == 1  # said once, not at each retry


def test_a_server_that_refuses_the_connection_is_not_only_called_unreachable(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a = daemon_factory(config(pg_server.dsn.rsplit("/", 1)[0] + "/nosuchdatabase", "team",
                              "hosta"))
    wait_for(lambda: remote_status(a)["last_error"], what="the first attempt")
    assert remote_status(a)["state"] == "offline"
    shown = cli(a, "doctor")
    assert 'database "nosuchdatabase" does not exist' in shown, shown
    assert "accepts this host (the user, password, database and TLS settings" in shown, shown


def test_a_second_daemon_under_the_same_host_name_waits_and_says_why(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # Two machines cloned from one image, or one config copied: one host name twice.
    name = "t" + uuid.uuid4().hex[:12]
    a = daemon_factory(config(pg_server.dsn, name, "笔记本".encode().hex()))
    wait_for(lambda: remote_status(a)["state"] == "online", what="a online")
    b = daemon_factory(config(pg_server.dsn, name, "笔记本".encode().hex()))
    status = wait_for(lambda: (lambda s: s if s["last_error"] else None)(remote_status(b)),
                      what="b's first attempt")
    assert status["state"] == "failing", status
    assert "another daemon is connected to shared workspace" in str(status["last_error"])
    assert "from 127.0.0.1" in str(status["last_error"]), status
    write(a, "memory/2026-08-02/from-a.md", "# A\nwritten on a\n")
    write(b, "memory/2026-08-02/from-b.md", "# B\nwaits on b\n")
    wait_for(lambda: remote_status(b)["outbox"] == 1, what="b's change kept")
    shown = cli(b, "doctor")
    assert "remote failing" in shown and "needs its own `host`" in shown, shown
    assert remote_status(a)["state"] == "online" and remote_status(a)["outbox"] == 0
    # Once the first one is gone, the second takes over the name and catches up.
    a.stop()
    wait_for(lambda: remote_status(b)["state"] == "online"
             and remote_status(b)["outbox"] == 0
             and "memory/2026-08-02/from-a.md" in notes(b), what="b online, caught up")
    assert b.log().count("another daemon is connected") == 1  # said once, not at each retry
