"""A backup restored on a host of a shared workspace while the server cannot be reached,
over notes edited there meanwhile (two daemons, a real PostgreSQL).

A restore is a deliberate change: once the host reconnects, the restored text goes to
every host, as an edit made after the queued ones would, whether or not a sync tool
respelt the note's name (or its folder's) between Unicode forms in between, or after.
"""

from __future__ import annotations

import unicodedata

import pytest
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import changes_of, config, notes, pair, remote_status, root, write
from test_remote_forms import content, rows, settled
from test_remote_forms_shapes import FOLDER
from test_remote_writes import read_only
from waits import wait_for

BACKED = "# Backed up\nthe text the backup holds\n"
OTHER = "memory/2026-07-26/other.md"
EDITED = "# Edited offline\nqueued while the server was away\n"


@pytest.mark.parametrize("respell", ["none", "note", "folder", "note after"])
def test_a_restore_while_offline_reaches_every_host_over_a_queued_edit(
        daemon_factory: DaemonFactory, pg_server: PgServer, respell: str) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    named = f"{FOLDER}/naïve café.md"
    write(b, named, BACKED)
    write(b, OTHER, "# Other\n")
    wait_for(lambda: settled(pg_server, name, a, b) and len(notes(a)) == 2, what="on a")
    made = b.call("backup.create", {})

    pg_server.stop()
    try:
        wait_for(lambda: remote_status(b)["state"] == "offline", what="b offline")
        # A sync tool respells the name (or its folder's) decomposed, then b edits it.
        now = named
        if respell == "note":
            now = f"{FOLDER}/{unicodedata.normalize('NFD', 'naïve café.md')}"
            (root(b) / named).rename(root(b) / now)
        elif respell == "folder":
            now = f"{unicodedata.normalize('NFD', FOLDER)}/naïve café.md"
            (root(b) / FOLDER).rename(root(b) / unicodedata.normalize("NFD", FOLDER))
        write(b, now, EDITED)
        wait_for(lambda: remote_status(b)["outbox"] >= 1, what="the edit queued")
        b.call("backup.restore", {"file": made["file"], "overwrite_shared": True})
        wait_for(lambda: (root(b) / named).read_text() == BACKED, what="restored on b")
        if respell == "note after":
            # The sync tool respells the restored name, and a note is deleted with it:
            # once that deletion is queued, the old spelling was found gone too.
            wait_for(lambda: remote_status(b)["outbox"] >= 2, what="the restore queued")
            queued = remote_status(b)["outbox"]
            (root(b) / named).rename(
                root(b) / FOLDER / unicodedata.normalize("NFD", "naïve café.md"))
            (root(b) / OTHER).unlink()
            wait_for(lambda: remote_status(b)["outbox"] > queued, what="the deletion queued")
    finally:
        pg_server.start()

    wait_for(lambda: settled(pg_server, name, a, b) and content(pg_server, name, named)
             == BACKED.encode(), what="the restored text on the server", deadline_s=60)
    assert rows(pg_server, name)[named] is False
    held = {unicodedata.normalize("NFC", p) for p in notes(b)}
    assert set(notes(a)) == held and named in held
    assert (root(a) / named).read_text() == BACKED
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0
    if respell == "note after":
        # The old spelling is no note of b's any more: spelt back, the note is the same,
        # and nothing goes up for it (a note written after it goes up after it would).
        sent = changes_of(pg_server, name, named)
        (root(b) / FOLDER / unicodedata.normalize("NFD", "naïve café.md")).rename(
            root(b) / named)
        write(b, OTHER, "# Other\nagain\n")
        wait_for(lambda: settled(pg_server, name, a, b) and OTHER in notes(a),
                 what="the other note up")
        assert changes_of(pg_server, name, named) == sent


def test_the_feed_keeps_off_a_respelt_note_whose_restore_waits_under_the_old_name(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    named = f"{FOLDER}/naïve café.md"
    respelt = f"{FOLDER}/{unicodedata.normalize('NFD', 'naïve café.md')}"
    write(b, named, BACKED)
    write(b, OTHER, "# Other\n")
    wait_for(lambda: settled(pg_server, name, a, b) and len(notes(a)) == 2, what="on a")
    made = b.call("backup.create", {})

    # Offline, b edits the note, restores the backup over it, and a sync tool respells
    # the restored name; the deletion of another note queued says b found it respelt.
    pg_server.stop()
    try:
        wait_for(lambda: remote_status(b)["state"] == "offline", what="b offline")
        write(b, named, EDITED)
        wait_for(lambda: remote_status(b)["outbox"] == 1, what="the edit queued")
        b.call("backup.restore", {"file": made["file"], "overwrite_shared": True})
        wait_for(lambda: remote_status(b)["outbox"] == 2, what="the restore queued")
        (root(b) / named).rename(root(b) / respelt)
        (root(b) / OTHER).unlink()
        wait_for(lambda: remote_status(b)["outbox"] == 3, what="the deletion queued")
        b.stop()
    finally:
        pg_server.start()

    # a saves the text of b's queued edit (no conflict), and the server takes no writes
    # when b starts again: b reads the feed, its queued changes wait.
    write(a, named, EDITED)
    wait_for(lambda: remote_status(a)["outbox"] == 0
             and content(pg_server, name, named) == EDITED.encode(), what="a's edit up")
    last = remote_status(a)["cursor"]
    with read_only(pg_server):
        b = daemon_factory(config(pg_server.dsn, name, "hostb"),
                           RECALLD_DATA_DIR=str(b.data_dir))
        wait_for(lambda: remote_status(b)["cursor"] >= last, what="b read the feed")
        # The restored text waits to go up after the edit: the feed leaves it on disk.
        assert (root(b) / respelt).read_text() == BACKED
        assert remote_status(b)["outbox"] == 3

    wait_for(lambda: settled(pg_server, name, a, b) and content(pg_server, name, named)
             == BACKED.encode(), what="the restored text on the server", deadline_s=60)
    assert set(notes(b)) == {respelt} and set(notes(a)) == {named}
    assert (root(a) / named).read_text() == (root(b) / respelt).read_text() == BACKED
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0


@pytest.mark.parametrize("how", ["restored away", "deleted while stopped"])
def test_a_note_with_a_queued_change_gone_before_a_start_is_deleted_everywhere(
        daemon_factory: DaemonFactory, pg_server: PgServer, how: str) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    named = f"{FOLDER}/naïve café.md"
    write(b, named, BACKED)
    write(b, OTHER, "# Other\n")
    wait_for(lambda: settled(pg_server, name, a, b) and len(notes(a)) == 2, what="on a")
    made = b.call("backup.create", {})
    later = "memory/2026-07-27/later.md"

    # Offline, b queues a change of a note, which is gone before b starts again: a
    # note written since the backup that a restore removes, or one removed while b was
    # stopped.
    pg_server.stop()
    try:
        wait_for(lambda: remote_status(b)["state"] == "offline", what="b offline")
        gone = later if how == "restored away" else named
        write(b, gone, EDITED)
        wait_for(lambda: remote_status(b)["outbox"] == 1, what="the change queued")
        if how == "restored away":
            b.call("backup.restore", {"file": made["file"], "overwrite_shared": True})
        else:
            b.stop()
            (root(b) / named).unlink()
            b = daemon_factory(config(pg_server.dsn, name, "hostb"),
                               RECALLD_DATA_DIR=str(b.data_dir))
        assert not (root(b) / gone).exists()
    finally:
        pg_server.start()

    wait_for(lambda: settled(pg_server, name, a, b) and rows(pg_server, name).get(gone)
             is not False, what="b's changes up", deadline_s=60)
    assert gone not in notes(a) and gone not in notes(b)
    assert rows(pg_server, name).get(gone, True) is True
