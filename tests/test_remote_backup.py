"""A backup restored on one host of a shared workspace (two daemons, a real PostgreSQL).

A restore is sent to every host like any other change: notes written anywhere since the
backup would be deleted everywhere, edits made since replaced. So a restore of a shared
workspace is refused unless asked for by name (``overwrite_shared``), and its dry run and
answer say what it does.
"""

from __future__ import annotations

import signal
import unicodedata
import uuid
from pathlib import Path

import pytest
from clirun import run_recalld
from conftest import DaemonFactory
from hooks import held_after_install, start_hook
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, converged, notes, pair, remote_status, root, write
from test_remote_forms import content, guard_kept_busy, rows, settled
from test_remote_forms_shapes import FOLDER
from waits import wait_for

from recalld.ipc.errors import NotAllowed

KEPT = "memory/2026-12-05/Αθήνα.md"
EDITED = "memory/2026-12-05/東京.md"
NEW = "memory/2026-12-06/written-on-b.md"


def test_a_restore_on_one_host_does_not_silently_undo_the_others(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    write(a, KEPT, "# Αθήνα\nπριν από το αντίγραφο\n")
    write(a, EDITED, "# 東京\nバックアップの前\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 2, what="converged before")
    made = a.call("backup.create", {"agents": ["default"]})

    write(b, NEW, "# Written on b\nafter the backup\n")
    write(b, EDITED, "# 東京\nバックアップの後に b で編集\n")
    wait_for(lambda: converged(a, b) and NEW in notes(a)
             and notes(a)[EDITED] == notes(b)[EDITED], what="b's work on a")
    after = notes(b)

    plan = a.call("backup.restore", {"file": made["file"], "dry_run": True})
    assert plan["shared"] == [{"agent_id": "default", "shared_workspace": name}]
    assert "deleted everywhere" in plan["shared_warning"]
    with pytest.raises(NotAllowed, match="shared with other hosts") as refused:
        a.call("backup.restore", {"file": made["file"]})
    assert refused.value.data == {"shared": plan["shared"]}
    for yes in (["--yes"], []):  # refused before it asks, not after
        proc = run_recalld(["--socket", str(a.socket_path), "backup", "restore",
                            made["file"], *yes], env=a.env)
        assert proc.returncode != 0
        assert "warning: default (shared workspace" in proc.stdout
        assert "--overwrite-shared" in proc.stderr, proc.stderr
    # Nothing was written: B's note and edit are on both hosts, as they were.
    assert notes(a) == after == notes(b)
    assert a.call("backup.list")["rollback"] is None

    # Asked for by name, it restores, and says what it did.
    done = a.call("backup.restore", {"file": made["file"], "overwrite_shared": True})
    assert done["shared_warning"] == plan["shared_warning"]
    wait_for(lambda: converged(a, b) and NEW not in notes(b), what="the restore on b")

    # Its rollback reaches every host too: refused alike, then B's work comes back.
    with pytest.raises(NotAllowed, match="shared with other hosts"):
        a.call("backup.rollback")
    back = a.call("backup.rollback", {"overwrite_shared": True})
    assert back["shared"] == plan["shared"]
    wait_for(lambda: converged(a, b) and notes(b) == after, what="the rollback on b")


@pytest.mark.parametrize("form", ["NFC", "NFD"])
def test_a_restore_over_names_a_sync_tool_respelt_puts_the_backup_on_every_host(
        daemon_factory: DaemonFactory, pg_server: PgServer, form: str) -> None:  # noqa: F811
    # b backs up notes spelt in ``form``; a sync tool on b then spells a note's name,
    # and a folder's, in the other form, and a edits them; b restores its backup. The
    # restore puts the old spellings back and removes the new ones before b has found
    # the old ones gone: the backup's text goes to every host, nothing is deleted.
    a, b, name = pair(daemon_factory, pg_server)
    other_form = "NFD" if form == "NFC" else "NFC"
    folder, folder_now = (unicodedata.normalize(f, FOLDER) for f in (form, other_form))
    named = unicodedata.normalize(form, "memory/2026-07-26/naïve café.md")
    spelt = {named: unicodedata.normalize(other_form, named),
             f"{folder}/Übersicht.md": f"{folder_now}/Übersicht.md"}
    kept = "memory/2026-07-26/kept.md"
    for p in (*spelt, kept):
        write(b, p, f"# {p[-12:]}\nbacked up\n")
    wait_for(lambda: settled(pg_server, name, a, b) and len(notes(a)) == 3, what="on a")
    made = b.call("backup.create", {})

    with guard_kept_busy(b, "memory/2026-07-26/scratch.md"):
        (root(b) / named).rename(root(b) / spelt[named])
        (root(b) / folder).rename(root(b) / folder_now)
        for p in spelt:
            write(a, p, "# edited on a\nafter the backup\n")
        wait_for(lambda: all((root(b) / now).read_text() == "# edited on a\nafter the backup\n"
                             for now in spelt.values()), what="a's edits on b")
        b.call("backup.restore", {"file": made["file"], "overwrite_shared": True})
    # A deletion made after the restore is judged with the new spellings' absence or
    # later: once it is on the server, so is whatever that absence became.
    (root(b) / kept).unlink()
    wait_for(lambda: rows(pg_server, name).get(kept), what="the later deletion")
    wait_for(lambda: settled(pg_server, name, a, b), what="settled", deadline_s=40)
    for p in spelt:
        backed = f"# {p[-12:]}\nbacked up\n"
        assert content(pg_server, name, p) == backed.encode()
        assert rows(pg_server, name)[p] is False
        assert (root(a) / p).read_text() == (root(b) / p).read_text() == backed
    assert not any((root(b) / now).exists() for now in spelt.values())
    assert remote_status(a)["conflicts"] == remote_status(b)["conflicts"] == 0


#: Start hook lines: once the replica has written the server's version of $HOLD_PATH to
#: take after a conflict, it goes on only when its workspace closes (a restore closes it
#: there, as one does whose close comes while the file is written).
SETTLED_AS_IT_CLOSES = held_after_install([
    "with trio.CancelScope(shield=True), trio.move_on_after(60):",
    "    while self._ws.state != 'closing':",
    "        await trio.sleep(0.05)"])


def test_a_restore_that_closes_the_workspace_as_a_conflict_settles_puts_the_backup_on_every_host(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    # b's edit of a note loses to a's; b writes a's version into the note, and its
    # workspace closes right then for a restore of a backup made before both edits: the
    # backup's text is the note's on every host, not a conflict copy's.
    path = "memory/2026-12-07/Ελσίνκι.md"
    name = "t" + uuid.uuid4().hex[:12]
    a = daemon_factory(config(pg_server.dsn, name, "hosta"))
    b = daemon_factory(config(pg_server.dsn, name, "hostb"),
                       **start_hook(tmp_path, SETTLED_AS_IT_CLOSES), HOLD_PATH=path)
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    backed = "# Ελσίνκι\nστο αντίγραφο ασφαλείας\n"
    write(a, path, backed)
    wait_for(lambda: settled(pg_server, name, a, b) and path in notes(b), what="on b")
    made = b.call("backup.create", {})

    uploaded = remote_status(a)["uploaded"]
    b.signal(signal.SIGSTOP)
    try:
        write(b, path, "# Ελσίνκι\nb, after the backup\n")
        write(a, path, "# Ελσίνκι\na, after the backup\n")
        wait_for(lambda: remote_status(a)["uploaded"] > uploaded
                 and remote_status(a)["outbox"] == 0, what="a uploaded")
    finally:
        b.signal(signal.SIGCONT)
    wait_for(lambda: (root(b) / path).read_text() == "# Ελσίνκι\na, after the backup\n",
             what="a's version on b")
    b.call("backup.restore", {"file": made["file"], "overwrite_shared": True})
    # Until the restored text has gone up and come down, the hosts' notes differ.
    wait_for(lambda: settled(pg_server, name, a, b), what="settled")
    assert content(pg_server, name, path) == backed.encode()
    assert (root(a) / path).read_text() == (root(b) / path).read_text() == backed
    assert list(notes(a)) == list(notes(b)) == [path]  # no copy: the backup had none
