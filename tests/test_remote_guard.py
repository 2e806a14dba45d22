"""Shared workspaces: notes gone in bulk (a folder removed whole, the workspace folder
removed) are held back by the deletion guard, not deleted on every host; a deliberate
deletion of one note still goes up; the hold survives a restart and ends by a restore
or a release.

Two daemons ("two hosts") share one workspace on the server of ``pg_server``, as in
tests/test_remote.py.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from hooks import held_after_install, start_hook
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import cli, config, converged, notes, pair, remote_status, root, write
from test_remote_forms import content, settled
from waits import wait_for

NOTES = {f"memory/2026-03-0{i}/walk{i}.md": f"# Walk {i}\nheron and kestrel {i}\n"
         for i in range(1, 4)}


def held(d: object) -> int:
    return int(remote_status(d)["held"]["deletions"])  # type: ignore[arg-type]


def test_a_removed_folder_is_held_kept_over_a_restart_and_released(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    for rel, text in NOTES.items():
        write(a, rel, text)
    write(a, "digest/drop.md", "# Drop\none note to delete\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 4, what="notes on b")

    # One note deleted on purpose goes to every host.
    (root(a) / "digest/drop.md").unlink()
    wait_for(lambda: "digest/drop.md" not in notes(b) and converged(a, b),
             what="the deletion on b")
    assert held(a) == 0

    # memory/ removed whole: nothing of it is deleted on b, status and doctor say why.
    uploaded = remote_status(a)["uploaded"]
    shutil.rmtree(root(a) / "memory")
    wait_for(lambda: held(a) == 3, what="the deletions held on a")
    status = remote_status(a)
    assert status["outbox"] == 0 and status["uploaded"] == uploaded, status
    assert "memory was removed" in status["held"]["why"], status
    assert status["held"]["paths"] == sorted(NOTES)
    assert sorted(notes(b)) == sorted(NOTES)
    assert "3 deletion(s) held" in cli(a, "status")
    assert "recalld remote release default --restore" in a.log()

    # Held over a restart: not sent, not forgotten.
    a.stop()
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    wait_for(lambda: remote_status(a)["state"] == "online", what="a online again")
    assert held(a) == 3 and sorted(notes(b)) == sorted(NOTES)

    # Written back from the server.
    assert "3 held note(s) written back" in cli(a, "remote", "release", "default",
                                                 "--restore")
    assert held(a) == 0
    for rel, text in NOTES.items():
        assert (root(a) / rel).read_text() == text
    wait_for(lambda: converged(a, b), what="converged after the restore")

    # Removed again and released: now they go.
    shutil.rmtree(root(a) / "memory")
    wait_for(lambda: held(a) == 3, what="held again")
    assert a.call("remote.release", {"agent_id": "default", "action": "upload"}) == {
        "agent_id": "default", "action": "upload", "released": 3}
    wait_for(lambda: notes(b) == {} and converged(a, b), what="the deletions on b")
    assert held(a) == 0


def test_the_workspace_folder_removed_whole_deletes_nothing_elsewhere(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, _ = pair(daemon_factory, pg_server)
    for rel, text in NOTES.items():
        write(a, rel, text)
    write(a, "digest/topics.md", "# Topics\nbirds\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 4, what="notes on b")
    shutil.rmtree(root(a), ignore_errors=True)  # the daemon may make folders again meanwhile
    # Either the folder stays (its roots made again while rm ran: the notes are seen gone
    # and their deletions held) or it is gone whole (the workspace folder itself is never
    # made again: nothing is seen deleted, its notes stay indexed). Nothing goes to b.
    wait_for(lambda: held(a) == 4 or (not root(a).exists() and "is missing" in a.log()),
             what="the deletions held on a, or the folder seen missing")
    assert len(notes(b)) == 4 and remote_status(a)["outbox"] == 0
    # The files put back by hand: nothing is held, nothing was ever sent.
    for rel, text in {**NOTES, "digest/topics.md": "# Topics\nbirds\n"}.items():
        write(a, rel, text)
    wait_for(lambda: held(a) == 0, what="the hold ended by the files")
    assert converged(a, b) and len(notes(b)) == 4


def test_deletions_are_held_from_ten_notes_and_more_than_half_at_once(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # Whole day folders emptied (`rm memory/<day>/*`), not the replicated folder: the
    # count decides. Below ten notes, or half of them exactly, they go to every host.
    a, b, _ = pair(daemon_factory, pg_server)
    day = {f"memory/2026-04-0{i % 3 + 1}/n{i:02}.md": f"# N{i}\nplover {i}\n"
           for i in range(9)}
    for rel, text in day.items():
        write(a, rel, text)
    wait_for(lambda: converged(a, b) and len(notes(b)) == 9, what="nine notes on b")
    for rel in day:
        (root(a) / rel).unlink()  # nine of nine: fewer than ten
    wait_for(lambda: notes(b) == {} and converged(a, b), what="nine deletions on b")

    first = {f"digest/keep/k{i:02}.md": f"# K{i}\ngrebe {i}\n" for i in range(10)}
    second = {f"memory/2026-04-09/d{i:02}.md": f"# D{i}\navocet {i}\n" for i in range(10)}
    for rel, text in {**first, **second}.items():
        write(a, rel, text)
    wait_for(lambda: converged(a, b) and len(notes(b)) == 20, what="twenty notes on b")
    for rel in second:
        (root(a) / rel).unlink()  # ten of twenty: half, not more
    wait_for(lambda: sorted(notes(b)) == sorted(first) and converged(a, b),
             what="ten deletions on b")
    assert held(a) == 0

    more = {f"memory/2026-04-10/e{i}.md": f"# E{i}\nstint {i}\n" for i in range(9)}
    for rel, text in more.items():
        write(a, rel, text)
    wait_for(lambda: converged(a, b) and len(notes(b)) == 19, what="nineteen notes on b")
    for rel in first:
        (root(a) / rel).unlink()  # ten of nineteen: more than half
    wait_for(lambda: held(a) == 10, what="ten deletions held")
    why = remote_status(a)["held"]["why"]
    assert why.startswith("10 of 19 notes were deleted at once"), why
    assert sorted(notes(b)) == sorted({**first, **more})


def test_notes_made_empty_then_written_go_up_once_with_their_text(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    """A writer that creates a note, then writes it (``open(..., "w")``, ``touch`` then an
    append) sends the note once, with its text: its empty state is not another host's
    note in between, nor a version that a host writing the same note crosses. A note
    left empty still goes up, after the settle window."""
    import psycopg

    a, b, name = pair(daemon_factory, pg_server)
    made = [root(a) / f"memory/2026-05-{d:02d}/chat{i:03d}.md" for d in (11, 12)
            for i in range(150)] + [root(a) / "digest/people/otter.md"]
    for p in made:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()
    for i, p in enumerate(made[:-1]):
        with p.open("a", encoding="utf-8") as f:
            f.write(f"# Chat {i}\nsandpiper log {i}\n")
    wait_for(lambda: len(notes(b)) == len(made) and converged(a, b), what="converged")
    assert (root(b) / "digest/people/otter.md").read_bytes() == b""
    with psycopg.connect(pg_server.dsn) as conn:
        counts = conn.execute(
            "SELECT c.path, count(*) FROM recalld_changes c JOIN recalld_workspaces w "
            "USING (workspace_id) WHERE w.name = %s GROUP BY c.path", (name,)).fetchall()
    assert len(counts) == len(made)
    assert [path for path, n in counts if n != 1] == []


#: Start hook lines: once a restore of held notes has written $HOLD_PATH back, it goes on
#: only when it is cancelled (the daemon stopping cuts it short there).
RESTORED_AS_IT_STOPS = held_after_install([
    "end = trio.current_time() + 60",
    "while trio.current_effective_deadline() != -math.inf and trio.current_time() < end:",
    "    with trio.CancelScope(shield=True):",
    "        await trio.sleep(0.05)"], "import math")


def test_a_held_note_written_back_as_the_daemon_stops_keeps_the_version_it_got(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    # Another host edits a held note; a restore writes that version back here and the
    # daemon stops right then, cutting the restore short: the note is recorded at that
    # version, so an edit made here afterwards follows it instead of conflicting with it.
    a = _restore_cut_short(daemon_factory, pg_server, tmp_path, RESTORED_AS_IT_STOPS,
                           lambda a: None)
    assert held(a) == 2  # the two not written yet stay held


#: Start hook lines: once a restore of held notes has written $HOLD_PATH back, it goes on
#: only once its workspace closes and the replica's state is closed, or about to be.
RESTORED_AS_IT_CLOSES = held_after_install([
    "with trio.CancelScope(shield=True), trio.move_on_after(60):",
    "    while 'shut' not in done and self.state._log._fd is not None:",
    "        await trio.sleep(0.05)"],
    "from recalld.daemon.remote import filesync",
    "real_shut = getattr(filesync.FileSync, 'shut', None)",
    "async def shut(self):",
    "    done.append('shut')",
    "    await real_shut(self)",
    "if real_shut is not None:",
    "    filesync.FileSync.shut = shut")


def test_a_restore_of_held_notes_as_the_workspace_closes_writes_and_records_them_all(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    # The workspace closed (`recalld workspace close`) while a restore writes held notes
    # back: the replica's state is closed once the restore is done, not under it.
    a = _restore_cut_short(daemon_factory, pg_server, tmp_path, RESTORED_AS_IT_CLOSES,
                           lambda a: a.call("workspace.close", {"agent_id": "default"}))
    assert held(a) == 0


def _restore_cut_short(daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
                       tmp_path: Path, lines: str, cut: Callable[[DaemonHandle], object]
                       ) -> DaemonHandle:
    """Three notes held on a, the first edited on b; a restore on a (held by ``lines``
    once the first is written back) is cut short by ``cut(a)`` and a's stop; a started
    again edits the first note, which goes up with no conflict. Returns a."""
    notes_ = {f"memory/2026-08-1{i}/ястреб{i}.md": f"# Ястреб {i}\nнад полем {i}\n"
              for i in range(1, 4)}
    first = sorted(notes_)[0]
    name = "t" + uuid.uuid4().hex[:12]
    hook = {**start_hook(tmp_path, lines), "HOLD_PATH": first}
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), **hook)
    b = daemon_factory(config(pg_server.dsn, name, "hostb"))
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    for rel, text in notes_.items():
        write(a, rel, text)
    wait_for(lambda: converged(a, b) and len(notes(b)) == 3, what="notes on b")
    shutil.rmtree(root(a) / "memory")
    wait_for(lambda: held(a) == 3, what="the deletions held on a")
    theirs = "# Ястреб 1\nbが書き直した\n"
    write(b, first, theirs)
    wait_for(lambda: content(pg_server, name, first) == theirs.encode()
             and settled(pg_server, name, b), what="b's edit on the server")
    wait_for(lambda: remote_status(a)["cursor"] == remote_status(b)["cursor"],
             what="b's edit read by a")

    answers: list[object] = []
    release = threading.Thread(target=lambda: answers.append(_release(a)))
    release.start()
    wait_for(lambda: (root(a) / first).exists()
             and (root(a) / first).read_text() == theirs, what="the held note written back")
    cut(a)
    a.stop()
    release.join(timeout=60)
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    wait_for(lambda: remote_status(a)["state"] == "online", what="a online again")
    mine = theirs + "and then a\n"
    write(a, first, mine)
    wait_for(lambda: (root(b) / first).read_text() == mine
             or remote_status(a)["conflicts"] > 0, what="a's edit on b, or a conflict")
    assert remote_status(a)["conflicts"] == 0, answers
    wait_for(lambda: remote_status(a)["outbox"] == 0, what="a's edit gone up")
    assert sorted(notes(b)) == sorted(notes_)  # no conflict copy
    return a


def _release(d: DaemonHandle) -> object:
    try:
        return d.call("remote.release", {"agent_id": "default", "action": "restore"})
    except Exception as exc:  # the daemon stopped under the call
        return exc
