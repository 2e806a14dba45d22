"""A note a host edited while the server could not be reached, and another host edited
meanwhile, after a sync tool respelt its name between Unicode forms and the host was
stopped (two daemons, a real PostgreSQL).

Respelt or not, the host's edits are one conflict copy, and the note itself takes the
other host's text, in the spelling this host's disk has.
"""

from __future__ import annotations

import json
import unicodedata

import pytest
from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, notes, pair, remote_status, root, write
from test_remote_forms import content, settled
from test_remote_forms_shapes import FOLDER
from waits import wait_for

OTHER = "memory/2026-07-26/other.md"


def took_over(d: DaemonHandle, path: str) -> bool:
    """Whether ``d``'s replica state records that ``path`` took a note over (respelt)."""
    log = root(d) / "mem_metadata/remote/state.log"
    return f'"t":{json.dumps(path, ensure_ascii=False)}' in log.read_text(errors="replace")


@pytest.mark.parametrize("respell", ["plain", "respelt", "edited after"])
def test_an_offline_edit_that_loses_is_one_conflict_copy_in_either_spelling(
        daemon_factory: DaemonFactory, pg_server: PgServer, respell: str) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    named = f"{FOLDER}/naïve café.md"
    now = named if respell == "plain" else (
        f"{FOLDER}/{unicodedata.normalize('NFD', 'naïve café.md')}")
    write(b, named, "# Naive\nfirst text\n")
    write(b, OTHER, "# Other\n")
    wait_for(lambda: settled(pg_server, name, a, b) and len(notes(a)) == 2, what="on a")

    # Offline, b edits the note, a sync tool respells its name and b finds it respelt;
    # another note is deleted, and b may edit the note again under its new name. Then
    # b is stopped.
    pg_server.stop()
    try:
        wait_for(lambda: remote_status(b)["state"] == "offline", what="b offline")
        write(b, named, "# Naive\nb's edit, made offline\n")
        wait_for(lambda: remote_status(b)["outbox"] == 1, what="b's edit queued")
        if now != named:
            (root(b) / named).rename(root(b) / now)
            wait_for(lambda: took_over(b, now), what="b found the note respelt")
        (root(b) / OTHER).unlink()
        wait_for(lambda: remote_status(b)["outbox"] == 2, what="the deletion queued")
        if respell == "edited after":
            write(b, now, "# Naive\nb's edit, made offline\nand more\n")
            wait_for(lambda: remote_status(b)["outbox"] == 3, what="the second edit queued")
        b.stop()
    finally:
        pg_server.start()

    # a edits the note meanwhile; then b starts again.
    write(a, named, "# Naive\na's edit\n")
    wait_for(lambda: remote_status(a)["outbox"] == 0
             and content(pg_server, name, named) == b"# Naive\na's edit\n", what="a's edit up")
    b = daemon_factory(config(pg_server.dsn, name, "hostb"), RECALLD_DATA_DIR=str(b.data_dir))

    wait_for(lambda: settled(pg_server, name, a, b) and len(notes(a)) == 2,
             what="b's changes up and settled", deadline_s=60)
    assert remote_status(b)["conflicts"] == 1
    [copy] = [p for p in notes(b) if ".sync-conflict-" in p]
    assert set(notes(b)) == {now, copy}
    assert (root(b) / now).read_text() == (root(a) / named).read_text() == "# Naive\na's edit\n"
    # b's edits go to the copy, as under one name: the copy holds the last of them.
    assert (root(b) / copy).read_text() == "# Naive\nb's edit, made offline\n" + (
        "and more\n" if respell == "edited after" else "")
    assert [i["kind"] for i in b.call("inbox.list", {"agent_id": "default"})["items"]] == [
        "sync_conflict"]


@pytest.mark.parametrize("edited_after", [False, True])
def test_a_conflict_after_the_folder_was_respelt_offline_keeps_one_folder(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        edited_after: bool) -> None:
    a, b, name = pair(daemon_factory, pg_server)
    folder_nfd = unicodedata.normalize("NFD", FOLDER)
    named = f"{FOLDER}/Übersicht.md"
    now = f"{folder_nfd}/Übersicht.md"  # a sync tool respells the folder, not the file
    write(b, named, "# Räume\nfirst text\n")
    wait_for(lambda: settled(pg_server, name, a, b) and named in notes(a), what="on a")

    # Offline, b edits the note, then its folder is respelt decomposed and b finds the
    # note under the new spelling (and may edit it there); b is stopped, a edits the
    # note meanwhile.
    pg_server.stop()
    try:
        wait_for(lambda: remote_status(b)["state"] == "offline", what="b offline")
        write(b, named, "# Räume\nb's edit, made offline\n")
        wait_for(lambda: remote_status(b)["outbox"] == 1, what="b's edit queued")
        (root(b) / FOLDER).rename(root(b) / folder_nfd)
        wait_for(lambda: took_over(b, now), what="b found the folder respelt")
        if edited_after:
            write(b, now, "# Räume\nb's edit, made offline\nand more\n")
            wait_for(lambda: remote_status(b)["outbox"] == 2, what="the second edit queued")
        b.stop()
    finally:
        pg_server.start()
    write(a, named, "# Räume\na's edit\n")
    wait_for(lambda: remote_status(a)["outbox"] == 0
             and content(pg_server, name, named) == "# Räume\na's edit\n".encode(),
             what="a's edit up")
    b = daemon_factory(config(pg_server.dsn, name, "hostb"), RECALLD_DATA_DIR=str(b.data_dir))

    wait_for(lambda: remote_status(b)["conflicts"] == 1 and settled(pg_server, name, a, b)
             and len(notes(a)) == 2, what="the conflict settled", deadline_s=60)
    # One folder on b, spelt as its disk spells it: the note (a's text) and b's copy.
    day = root(b) / "memory/2026-07-26"
    assert sorted(p.name for p in day.iterdir()) == [folder_nfd.rsplit("/", 1)[1]]
    [copy] = [p for p in notes(b) if ".sync-conflict-" in p]
    assert set(notes(b)) == {now, copy} and copy.startswith(folder_nfd + "/")
    assert (root(b) / now).read_text() == "# Räume\na's edit\n"
    # b's edits went to the copy, in b's folder: the copy holds the last of them.
    assert (root(b) / copy).read_text() == "# Räume\nb's edit, made offline\n" + (
        "and more\n" if edited_after else "")
    assert remote_status(b)["conflicts"] == 1


@pytest.mark.parametrize("respelt", ["file", "folder"])
def test_an_offline_edit_of_a_note_respelt_while_stopped_is_one_conflict_copy(
        daemon_factory: DaemonFactory, pg_server: PgServer, respelt: str) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    named = f"{FOLDER}/naïve café.md"
    folder_now = unicodedata.normalize("NFD", FOLDER) if respelt == "folder" else FOLDER
    now = f"{folder_now}/" + (
        "naïve café.md" if respelt == "folder" else unicodedata.normalize("NFD", "naïve café.md"))
    write(b, named, "# Naive\nfirst text\n")
    wait_for(lambda: settled(pg_server, name, a, b) and named in notes(a), what="on a")

    # Offline, b edits the note and is stopped; then a sync tool respells the name and a
    # edits the note meanwhile. b starts with its edit queued under the old spelling.
    pg_server.stop()
    try:
        wait_for(lambda: remote_status(b)["state"] == "offline", what="b offline")
        write(b, named, "# Naive\nb's edit, made offline\n")
        wait_for(lambda: remote_status(b)["outbox"] == 1, what="b's edit queued")
        b.stop()
    finally:
        pg_server.start()
    if respelt == "folder":
        (root(b) / FOLDER).rename(root(b) / folder_now)
    else:
        (root(b) / named).rename(root(b) / now)
    write(a, named, "# Naive\na's edit\n")
    wait_for(lambda: remote_status(a)["outbox"] == 0
             and content(pg_server, name, named) == b"# Naive\na's edit\n", what="a's edit up")
    b = daemon_factory(config(pg_server.dsn, name, "hostb"), RECALLD_DATA_DIR=str(b.data_dir))

    wait_for(lambda: remote_status(b)["conflicts"] >= 1 and settled(pg_server, name, a, b)
             and len(notes(a)) >= 2, what="the conflict settled", deadline_s=60)
    assert remote_status(b)["conflicts"] == 1
    [copy] = [p for p in notes(b) if ".sync-conflict-" in p]
    assert set(notes(b)) == {now, copy}
    assert (root(b) / now).read_text() == "# Naive\na's edit\n"
    assert (root(b) / copy).read_text() == "# Naive\nb's edit, made offline\n"
