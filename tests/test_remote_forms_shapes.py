"""Shared workspaces: one note per name across Unicode forms, in other shapes than
tests/test_remote_forms.py: a folder spelt in another form on each host, a conflict on
such a name. Two daemons ("two hosts") share one workspace on the server of
``pg_server``, as in tests/test_remote.py.
"""

from __future__ import annotations

import os
import unicodedata
import uuid
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from hooks import start_hook
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, notes, pair, remote_status, root, write
from test_remote_forms import content, rows, settled
from waits import wait_for

FOLDER = unicodedata.normalize("NFC", "memory/2026-07-26/Öffentliche Räume")
NOTE = FOLDER + "/Übersicht.md"


def nfd(path: str) -> str:
    return unicodedata.normalize("NFD", path)


def pair_holding(daemon_factory: DaemonFactory,
                 pg_server: PgServer) -> tuple[DaemonHandle, DaemonHandle, str]:  # noqa: F811
    """Two hosts of one shared workspace, both holding NOTE (composed)."""
    a, b, name = pair(daemon_factory, pg_server)
    write(a, NOTE, "# Räume\nfirst text\n")
    wait_for(lambda: settled(pg_server, name, a, b) and NOTE in notes(b), what="note on b")
    return a, b, name


def respell_stopped(b: DaemonHandle) -> None:
    """Stop ``b`` and respell its folder and NOTE decomposed, as a sync tool would."""
    b.stop()
    (root(b) / FOLDER).rename(root(b) / nfd(FOLDER))
    (root(b) / nfd(FOLDER) / "Übersicht.md").rename(root(b) / nfd(NOTE))


def test_a_conflict_copy_lands_in_the_folder_as_each_host_spells_it(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair_holding(daemon_factory, pg_server)

    # b, stopped, has its folder respelt decomposed (a sync tool) and the note edited in
    # it; a edits the note meanwhile: b's edit conflicts when b starts again.
    respell_stopped(b)
    write(b, nfd(NOTE), "# Räume\nedited on b\n")
    write(a, NOTE, "# Räume\nedited on a\n")
    wait_for(lambda: remote_status(a)["outbox"] == 0, what="a's edit up")
    b = daemon_factory(config(pg_server.dsn, name, "hostb"), RECALLD_DATA_DIR=str(b.data_dir))
    wait_for(lambda: remote_status(b)["conflicts"] == 1
             and settled(pg_server, name, a, b), what="the conflict settled")

    # b's copy sits beside its note, in the folder as b's disk spells it: no second
    # folder alike but for the form; a's copy is in a's folder.
    day_b = sorted(os.listdir(root(b) / "memory/2026-07-26"))
    assert day_b == [nfd("Öffentliche Räume")]
    assert (root(b) / nfd(NOTE)).read_text() == "# Räume\nedited on a\n"
    copies_b = [p for p in notes(b) if ".sync-conflict-" in p]
    assert len(copies_b) == 1 and copies_b[0].startswith(nfd(FOLDER) + "/")
    assert sorted(os.listdir(root(a) / "memory/2026-07-26")) == ["Öffentliche Räume"]
    copies_a = [p for p in notes(a) if ".sync-conflict-" in p]
    assert len(copies_a) == 1 and copies_a[0].startswith(FOLDER + "/")
    assert (root(a) / copies_a[0]).read_text() == "# Räume\nedited on b\n"
    assert sorted(rows(pg_server, name).values()) == [False, False]


def test_a_rename_between_forms_alone_is_no_edit_against_another_hosts(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair_holding(daemon_factory, pg_server)

    # b, stopped, has the note respelt decomposed, unchanged; a edits it meanwhile. The
    # rename sends nothing: a's edit reaches b's file, no conflict copy.
    respell_stopped(b)
    write(a, NOTE, "# Räume\nedited on a\n")
    wait_for(lambda: remote_status(a)["outbox"] == 0, what="a's edit up")
    b = daemon_factory(config(pg_server.dsn, name, "hostb"), RECALLD_DATA_DIR=str(b.data_dir))
    wait_for(lambda: (root(b) / nfd(NOTE)).read_text() == "# Räume\nedited on a\n"
             and settled(pg_server, name, a, b), what="a's edit on b")
    assert list(notes(b)) == [nfd(NOTE)] and list(notes(a)) == [NOTE]
    assert rows(pg_server, name) == {NOTE: False}
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0


def test_a_folder_of_many_notes_respelt_between_forms_deletes_nothing(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    other = "memory/2026-07-26/other.md"
    write(a, other, "# Other\nto be deleted\n")
    inside = [f"{FOLDER}/n{i}.md" for i in range(14)]  # more than a mass deletion's least
    for i, path in enumerate(inside):
        write(a, path, f"# N{i}\nnote {i} of the folder\n")
    wait_for(lambda: settled(pg_server, name, a, b) and len(notes(b)) == 15, what="on b")

    # A sync tool on b respells the folder decomposed, with every note in it.
    (root(b) / FOLDER).rename(root(b) / nfd(FOLDER))
    (root(b) / other).unlink()  # judged with the rename or later
    wait_for(lambda: rows(pg_server, name).get(other), what="the later deletion")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert remote_status(b)["held"]["deletions"] == 0
    assert [p for p, gone in rows(pg_server, name).items() if gone] == [other]
    assert sorted(notes(b)) == sorted(nfd(p) for p in inside)
    write(b, nfd(inside[3]), "# N3\nedited on b in the respelt folder\n")
    wait_for(lambda: (root(a) / inside[3]).read_text()
             == "# N3\nedited on b in the respelt folder\n", what="b's edit on a")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert sorted(os.listdir(root(a) / "memory/2026-07-26")) == ["Öffentliche Räume"]
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0


#: Start hook lines: the replica reads no change that names $RESPELT before its feed has
#: been applied past where it stood then (a watcher behind, on a loaded machine, while
#: another host's edit comes down).
RESPELLING_READ_LATE = "\n".join([
    "import os, trio",
    "from recalld.daemon.remote import replicafiles",
    "real_apply = replicafiles.ReplicaFiles._apply_local",
    "async def late(self, paths):",
    "    if os.environ['RESPELT'] in paths:",
    "        stood = self.state.cursor",
    "        with trio.move_on_after(60):",
    "            while self.state.cursor == stood:",
    "                await trio.sleep(0.05)",
    "    await real_apply(self, paths)",
    "replicafiles.ReplicaFiles._apply_local = late"])


def test_an_edit_that_comes_down_before_the_respelling_is_read_reaches_the_file(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    # A sync tool respells a note's name on b; a's edit of the note comes down before
    # b's watcher has reported the rename: the file in its new spelling is the note as
    # b knew it, so it takes a's edit, and nothing goes up.
    name = "t" + uuid.uuid4().hex[:12]
    named = unicodedata.normalize("NFD", "memory/2026-07-28/naïve café.md")
    now = unicodedata.normalize("NFC", named)
    a = daemon_factory(config(pg_server.dsn, name, "hosta"))
    b = daemon_factory(config(pg_server.dsn, name, "hostb"),
                       **start_hook(tmp_path, RESPELLING_READ_LATE), RESPELT=now)
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    write(b, named, "# café\nfirst text\n")
    wait_for(lambda: settled(pg_server, name, a, b) and named in notes(a), what="on a")

    (root(b) / named).rename(root(b) / now)
    edited = "# café\nedited on a\n"
    write(a, named, edited)
    wait_for(lambda: (root(b) / now).read_text() == edited, what="a's edit on b",
             deadline_s=30)
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert content(pg_server, name, named) == edited.encode()
    assert not (root(b) / named).exists()
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0


#: Start hook lines: the replica reads a change that names $RESPELT after the others
#: reported with it, once the deletion guard has judged $OLD (its old spelling) gone and
#: then its feed has been applied past where it stood then (a watcher behind by more than
#: the guard's longest wait, on a loaded machine); it makes $JUDGED once the guard judged.
RESPELLING_READ_AFTER_THE_GUARD = "\n".join([
    "import os, trio",
    "from recalld.daemon.remote import replicafiles",
    "real_apply = replicafiles.ReplicaFiles._apply_local",
    "async def late(self, paths):",
    "    respelt = os.environ['RESPELT']",
    "    if respelt in paths:",
    "        await real_apply(self, paths - {respelt})",
    "        paths = {respelt}",
    "        with trio.move_on_after(60):",
    "            while (self.state.bases.get(os.environ['OLD']) or",
    "                   replicafiles.Base(0, None)).hash is not None:",
    "                await trio.sleep(0.05)",
    "            stood = self.state.cursor",
    "            open(os.environ['JUDGED'], 'w').close()",
    "            while self.state.cursor == stood:",
    "                await trio.sleep(0.05)",
    "    await real_apply(self, paths)",
    "replicafiles.ReplicaFiles._apply_local = late"])


def test_a_respelling_the_watcher_reports_after_the_guard_judged_takes_the_note_over(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    # A sync tool respells a note's name on b; b's deletion guard finds the old spelling
    # gone, renamed, before b's watcher has reported the new one, and a's edit comes down
    # after that: the new spelling is the note b knew, so it takes a's edit, and the
    # rename sends nothing (no conflict copy of the old text).
    name = "t" + uuid.uuid4().hex[:12]
    named = "memory/2026-07-29/Ωραία θέα, façade.md"
    now = nfd(named)
    judged = tmp_path / "judged"
    a = daemon_factory(config(pg_server.dsn, name, "hosta"))
    b = daemon_factory(config(pg_server.dsn, name, "hostb"),
                       **start_hook(tmp_path, RESPELLING_READ_AFTER_THE_GUARD), RESPELT=now,
                       OLD=named, JUDGED=str(judged))
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    write(b, named, "# θέα\nfirst text\n")
    wait_for(lambda: settled(pg_server, name, a, b) and named in notes(a), what="on a")

    (root(b) / named).rename(root(b) / now)
    wait_for(judged.exists, what="the guard's judgement on b", deadline_s=60)
    edited = "# θέα\nedited on a\n"
    write(a, named, edited)
    wait_for(lambda: (root(b) / now).read_text() == edited
             and settled(pg_server, name, a, b), what="a's edit on b", deadline_s=60)
    assert content(pg_server, name, named) == edited.encode()
    assert list(notes(b)) == [now] and list(notes(a)) == [named]
    assert rows(pg_server, name) == {named: False}
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0
