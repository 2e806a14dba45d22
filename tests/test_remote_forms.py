"""Shared workspaces: one note named in two Unicode forms on two hosts.

A macOS host, or a folder synced from one, often spells a name decomposed (NFD,
``nai\u0308ve.md``), a Linux host composed (NFC, ``naïve.md``). The server keeps one row per
note whatever the form, under the spelling it first reached the server in, and each host
applies it to the file its own disk spells (a host with none: the row's spelling).
Two daemons ("two hosts") share one workspace on the server of ``pg_server``, as in
tests/test_remote.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import threading
import unicodedata
from collections.abc import Iterator

import psycopg
from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, notes, pair, remote_status, root, search_paths, write
from waits import wait_for

from recalld.daemon.remote.db import channel

NFC = unicodedata.normalize("NFC", "memory/2026-07-26/naïve café.md")
NFD = unicodedata.normalize("NFD", NFC)


def rows(pg: PgServer, name: str) -> dict[str, bool]:
    """The shared workspace's rows on the server, path to deleted."""
    with psycopg.connect(pg.dsn) as conn:
        got = conn.execute(
            "SELECT f.path, f.deleted FROM recalld_files f JOIN recalld_workspaces w"
            " ON w.workspace_id = f.workspace_id WHERE w.name = %s", (name,)).fetchall()
    return {str(p): bool(d) for p, d in got}


def content(pg: PgServer, name: str, path: str) -> bytes | None:
    """The content of the shared workspace's row ``path`` on the server (None: none)."""
    with psycopg.connect(pg.dsn) as conn:
        got = conn.execute(
            "SELECT f.content FROM recalld_files f JOIN recalld_workspaces w"
            " ON w.workspace_id = f.workspace_id WHERE w.name = %s AND f.path = %s",
            (name, path)).fetchone()
    return None if got is None or got[0] is None else bytes(got[0])


@contextlib.contextmanager
def guard_kept_busy(d: DaemonHandle, rel: str) -> Iterator[None]:
    """Keep ``d``'s deletion guard from judging notes found gone (for up to its longest
    settle window): an empty note at ``rel`` is written again and again meanwhile."""
    done = threading.Event()

    def churn() -> None:
        p = root(d) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        while True:
            p.write_bytes(b"")
            if done.wait(0.2):
                return

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def settled(pg: PgServer, name: str, *hosts: DaemonHandle) -> bool:
    """Every host has uploaded its changes and applied the whole feed, and all hold the
    same notes (compared in NFC form: each names them as its disk spells them)."""
    with psycopg.connect(pg.dsn) as conn:
        last = conn.execute(
            "SELECT coalesce(max(f.version), 0) FROM recalld_files f JOIN recalld_workspaces"
            " w ON w.workspace_id = f.workspace_id WHERE w.name = %s", (name,)).fetchone()
    states = [remote_status(d) for d in hosts]
    held = [{unicodedata.normalize("NFC", p): h for p, h in notes(d).items()} for d in hosts]
    return (all(s["outbox"] == 0 and s["cursor"] == (last or [0])[0] for s in states)
            and all(h == held[0] for h in held))


#: A second note of the pair, to be deleted: a deletion judged with or after a rename.
OTHER = "memory/2026-07-26/other.md"


def pair_holding(daemon_factory: DaemonFactory,
                 pg_server: PgServer) -> tuple[DaemonHandle, DaemonHandle, str]:  # noqa: F811
    """Two hosts of one shared workspace, both holding NFC and OTHER."""
    a, b, name = pair(daemon_factory, pg_server)
    write(a, OTHER, "# Other\nto be deleted\n")
    write(a, NFC, "# Naive\nfirst text\n")
    wait_for(lambda: settled(pg_server, name, a, b) and NFC in notes(b), what="note on b")
    return a, b, name


def test_a_note_spelt_decomposed_on_one_host_stays_one_note(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    assert NFC != NFD
    a, b, name = pair(daemon_factory, pg_server)
    # b, stopped, already holds the note as its disk spells it (NFD) when a shares it
    # spelt composed (NFC).
    b.signal(signal.SIGSTOP)
    try:
        write(b, NFD, "# Naive\nsame text everywhere\n")
        write(a, NFC, "# Naive\nsame text everywhere\n")
        wait_for(lambda: rows(pg_server, name), what="the note on the server")
    finally:
        b.signal(signal.SIGCONT)
    # b applies the row to its own file (or uploads the file first: the same content).
    wait_for(lambda: remote_status(b)["pulled"] + remote_status(b)["uploaded"] >= 1
             and settled(pg_server, name, a, b), what="settled")
    assert list(notes(a)) == [NFC]
    assert list(notes(b)) == [NFD]

    # An edit on either host reaches the other's file, as its disk spells it.
    write(b, NFD, "# Naive\nedited on b quokkaferry\n")
    wait_for(lambda: (root(a) / NFC).read_text() == "# Naive\nedited on b quokkaferry\n",
             what="b's edit on a")
    write(a, NFC, "# Naive\nedited on a zebracrossing\n")
    wait_for(lambda: (root(b) / NFD).read_text() == "# Naive\nedited on a zebracrossing\n",
             what="a's edit on b")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert list(notes(a)) == [NFC] and list(notes(b)) == [NFD]
    assert rows(pg_server, name) == {NFC: False}
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0


def test_a_note_keeps_the_spelling_it_first_reached_the_server_in(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    # Written decomposed, folder and name, by a (a macOS host): b, holding none of it,
    # writes it as a spelt it, and the server names it so.
    nfd = unicodedata.normalize("NFD", "memory/2026-07-26/Öffentliche Räume/Übersicht.md")
    write(a, nfd, "# Räume\nhallways wombatlantern\n")
    wait_for(lambda: settled(pg_server, name, a, b) and nfd in notes(b), what="note on b")
    assert list(notes(a)) == list(notes(b)) == [nfd]
    assert rows(pg_server, name) == {nfd: False}
    assert search_paths(b, "wombatlantern") == [nfd]
    # An edit on b goes to that row, as b spells it.
    write(b, nfd, "# Räume\nedited on b\n")
    wait_for(lambda: (root(a) / nfd).read_text() == "# Räume\nedited on b\n"
             and settled(pg_server, name, a, b), what="b's edit on a")
    assert rows(pg_server, name) == {nfd: False}


def test_a_rename_between_forms_is_no_change_for_the_other_hosts(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair_holding(daemon_factory, pg_server)
    other = OTHER

    # A sync tool on b spells the note decomposed: a rename that keeps the note. A
    # deletion after it is judged with it or later: once it is on a, so is the rename.
    (root(b) / NFC).rename(root(b) / NFD)
    (root(b) / other).unlink()
    wait_for(lambda: other not in notes(a), what="the later deletion on a")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert NFC in notes(a)
    assert NFD in notes(b) and NFC not in notes(b)
    # Edits go on reaching the other host's file as its disk spells it.
    write(b, NFD, "# Naive\nedited on b after the rename\n")
    wait_for(lambda: (root(a) / NFC).read_text() == "# Naive\nedited on b after the rename\n",
             what="b's edit on a")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert rows(pg_server, name) == {NFC: False, other: True}

    # Renamed between forms and edited at once: the edit is based on the note's version
    # (no conflict copy), and the other host's file takes it.
    # (a stopped meanwhile: it finds both changes done when it looks.)
    a.signal(signal.SIGSTOP)
    try:
        write(a, NFD, "# Naive\nrenamed and edited on a\n")
        (root(a) / NFC).unlink()
    finally:
        a.signal(signal.SIGCONT)
    wait_for(lambda: (root(b) / NFD).read_text() == "# Naive\nrenamed and edited on a\n",
             what="a's edit on b")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert list(notes(a)) == list(notes(b)) == [NFD]
    assert rows(pg_server, name) == {NFC: False, other: True}
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0

    # b spells it composed again, edited, while running: the edit may go up before the
    # old spelling is found gone; either way the same note, no deletion, no conflict.
    (root(b) / NFD).rename(root(b) / NFC)
    write(b, NFC, "# Naive\nback to composed on b\n")
    wait_for(lambda: (root(a) / NFD).read_text() == "# Naive\nback to composed on b\n",
             what="b's edit on a")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert list(notes(a)) == [NFD] and list(notes(b)) == [NFC]
    assert rows(pg_server, name) == {NFC: False, other: True}
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0


def test_a_name_the_server_holds_in_two_forms_stays_two_notes(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # Shared before one row per name: a host on macOS and one on Linux each uploaded
    # the name in its own form, and every host holds both files.
    a, b, name = pair(daemon_factory, pg_server)
    texts = {NFC: b"# Naive\ncomposed note\n", NFD: b"# Naive\ndecomposed note\n"}
    held = {}
    for path, data in texts.items():  # one after the other: each host holds the first
        with psycopg.connect(pg_server.dsn) as conn:
            ws, version = conn.execute(
                "UPDATE recalld_workspaces SET last_version = last_version + 1 WHERE name"
                " = %s RETURNING workspace_id, last_version", (name,)).fetchone() or (0, 0)
            conn.execute(
                "INSERT INTO recalld_files (workspace_id, path, content, content_hash,"
                " version, author_host, change_id) VALUES (%s, %s, %s, %s, %s, 'old',"
                " gen_random_uuid())",
                (ws, path, data, hashlib.sha256(data).hexdigest(), version))
            conn.execute("SELECT pg_notify(%s, %s)", (channel(ws), str(version)))
        held[path] = hashlib.sha256(data).hexdigest()
        wait_for(lambda: notes(a) == notes(b) == held, what="the notes on both hosts")

    write(b, NFD, "# Naive\ndecomposed note, edited on b\n")
    wait_for(lambda: (root(a) / NFD).read_text() == "# Naive\ndecomposed note, edited on b\n",
             what="b's edit on a")
    write(a, NFC, "# Naive\ncomposed note, edited on a\n")
    wait_for(lambda: (root(b) / NFC).read_text() == "# Naive\ncomposed note, edited on a\n",
             what="a's edit on b")
    wait_for(lambda: settled(pg_server, name, a, b) and notes(a) == notes(b),
             what="settled")
    assert sorted(notes(a)) == sorted(texts)
    assert rows(pg_server, name) == {NFC: False, NFD: False}
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0

    # Deleting one of the two is a deletion, not a rename into the other's spelling.
    (root(b) / NFD).unlink()
    wait_for(lambda: rows(pg_server, name) == {NFC: False, NFD: True}, what="the deletion")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert sorted(notes(a)) == sorted(notes(b)) == [NFC]


def test_a_rename_between_forms_survives_a_kill_before_the_old_name_is_found_gone(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair_holding(daemon_factory, pg_server)
    other = OTHER

    # a renames the note between forms and edits it; the edit goes up, and a is killed
    # before it has found the old spelling gone (its deletion guard kept waiting).
    edited = "# Naive\nrenamed, edited, then killed\n"
    with guard_kept_busy(a, "memory/2026-07-26/scratch.md"):
        a.signal(signal.SIGSTOP)
        try:
            write(a, NFD, edited)
            (root(a) / NFC).unlink()
        finally:
            a.signal(signal.SIGCONT)
        wait_for(lambda: content(pg_server, name, NFC) == edited.encode()
                 and remote_status(a)["outbox"] == 0, what="the edit up", poll_s=0.01)
        a.kill()
    # Started again, a finds the old spelling gone: the same note, no deletion. A
    # deletion after the restart is judged with it or later: once it is on the server,
    # so is whatever the old spelling's absence became.
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    (root(a) / other).unlink()
    wait_for(lambda: rows(pg_server, name).get(other), what="the later deletion")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled after the restart")
    assert rows(pg_server, name)[NFC] is False
    assert (root(b) / NFC).read_text() == edited
    assert NFD in notes(a) and NFC not in notes(a)
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0
