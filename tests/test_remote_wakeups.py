"""What an idle shared workspace asks of its server: a host notified of the workspace's
changes (LISTEN) does not read the change feed on a timer, and still learns at once when
the workspace is removed on the server; a host whose server refuses LISTEN (a hot
standby) reads the feed every ``CATCH_UP_EVERY_S``.

The daemons run with a hook that sets ``CATCH_UP_EVERY_S`` to ``CATCH_UP_S``, records each
read of the feed in ``FEEDS``, and, with ``DEAF`` set, has the listener's LISTEN refused as
a hot standby refuses it (a read-only session), all read at each use (a test daemon may be
forked from a server started with another's environment).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, notes, remote_status, write
from waits import wait_for

SITECUSTOMIZE = """\
import os
if os.environ.get("FEEDS"):
    from recalld.daemon.remote import db, filesync

    filesync.CATCH_UP_EVERY_S = float(os.environ["CATCH_UP_S"])
    feed, listen = db.feed, db.listen

    def counted(*args, **kwargs):
        with open(os.environ["FEEDS"], "a") as f:
            f.write("feed\\n")
        return feed(*args, **kwargs)

    def deaf(conn, workspace_id):
        if os.environ.get("DEAF"):  # refused, as a hot standby refuses LISTEN
            conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            conn.execute("CREATE TABLE recalld_deaf ()")
        listen(conn, workspace_id)

    db.feed = counted
    db.listen = deaf
"""


def reads(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def hosts(daemon_factory: DaemonFactory, pg: PgServer, tmp_path: Path, catch_up_s: float,
          ) -> tuple[DaemonHandle, DaemonHandle, str, Path, Path]:
    """A host notified of changes and one whose LISTEN is refused, both online, of one new
    shared workspace: they, its name and their feed logs."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    name = "w" + uuid.uuid4().hex[:12]
    heard_log, deaf_log = tmp_path / "heard.log", tmp_path / "deaf.log"
    heard = daemon_factory(config(pg.dsn, name, "heard"), PYTHONPATH=str(hooks),
                           FEEDS=str(heard_log), CATCH_UP_S=str(catch_up_s))
    deaf = daemon_factory(config(pg.dsn, name, "deaf"), PYTHONPATH=str(hooks),
                          FEEDS=str(deaf_log), CATCH_UP_S=str(catch_up_s), DEAF="1")
    wait_for(lambda: remote_status(heard)["state"] == "online", what="heard online")
    # The deaf host's writes are refused at first too, then tried and taken again.
    wait_for(lambda: remote_status(deaf)["state"] == "online" and reads(deaf_log) >= 1,
             what="deaf online, having read the feed")
    return heard, deaf, name, heard_log, deaf_log


def test_a_notified_host_reads_the_feed_only_when_told(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    heard, deaf, _, heard_log, deaf_log = hosts(daemon_factory, pg_server, tmp_path, 0.05)
    # The deaf host reads the feed every CATCH_UP_EVERY_S: the test's clock.
    before = reads(heard_log)
    ticks = reads(deaf_log)
    wait_for(lambda: reads(deaf_log) >= ticks + 20, what="the deaf host's catch-ups")
    assert reads(heard_log) == before
    # Told of a change (its own, notified on the channel), it reads the feed.
    write(heard, "memory/2026-12-11/heron.md", "# Heron\nstands in the reeds\n")
    wait_for(lambda: reads(heard_log) > before, what="the feed read when told")
    wait_for(lambda: notes(deaf) == notes(heard) and len(notes(deaf)) == 1,
             what="the note on the deaf host")

def test_a_workspace_removed_on_the_server_is_noticed_at_once_while_notified(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    # No catch-up on a timer would find it (an hour apart), nor an upload: the removal
    # itself notifies the hosts listening on the workspace's channel.
    heard, deaf, name, _, _ = hosts(daemon_factory, pg_server, tmp_path, 3600.0)
    del deaf
    write(heard, "memory/2026-12-12/wren.md", "# Wren\nsings before dawn\n")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        wait_for(lambda: conn.execute(
            "SELECT count(*) FROM recalld_files f JOIN recalld_workspaces w USING "
            "(workspace_id) WHERE w.name = %s", (name,)).fetchone() == (1,),
            what="the note on the server")
        row = conn.execute("DELETE FROM recalld_workspaces WHERE name = %s"
                           " RETURNING workspace_id", (name,)).fetchone()
        assert row is not None
    wait_for(lambda: "no longer on the server" in heard.log(), what="the removal noticed")
    wait_for(lambda: remote_status(heard)["state"] == "online", what="online again")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        again = conn.execute("SELECT workspace_id FROM recalld_workspaces WHERE name = %s",
                             (name,)).fetchone()
    assert again is not None and again[0] != row[0]
