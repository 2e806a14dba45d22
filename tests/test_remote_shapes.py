"""Shared workspaces: notes whose shape on disk changes (a note replaced by a folder of
its name, and back) reach the other host, and nothing else waits behind them.

Two daemons ("two hosts") share one workspace on the server of ``pg_server``, as in
tests/test_remote.py.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import psycopg
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import cli, config, converged, notes, pair, remote_status, root, write
from waits import wait_for

from recalld.daemon.memory.secret_names import mask_path
from recalld.daemon.remote.filesync import BLOCKED_RETRY_S

GITHUB = "ghp_Zr4Tq9Lm2Xw7Ks3Vn8Bp1Dh6Fy0Jc5Ga2Ue9"


def test_a_note_replaced_by_a_folder_of_its_name_and_back_converges(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, _ = pair(daemon_factory, pg_server)
    write(a, "digest/topics.md", "# Topics\none file\n")
    wait_for(lambda: converged(a, b) and "digest/topics.md" in notes(b), what="note on b")

    # The note becomes a folder of notes: its deletion and the new notes go up, and so
    # does what is written after them.
    # (a stopped meanwhile: it finds the folder when it reads the path).
    a.signal(signal.SIGSTOP)
    try:
        (root(a) / "digest/topics.md").unlink()
        write(a, "digest/topics.md/birds.md", "# Birds\nkestrel\n")
    finally:
        a.signal(signal.SIGCONT)
    write(a, "memory/2026-07-25/later.md", "# Later\nwritten after the folder\n")
    wait_for(lambda: converged(a, b) and "memory/2026-07-25/later.md" in notes(b),
             what="the folder of notes on b")
    assert sorted(notes(b)) == ["digest/topics.md/birds.md", "memory/2026-07-25/later.md"]
    assert (root(b) / "digest/topics.md/birds.md").read_text() == "# Birds\nkestrel\n"
    assert remote_status(a)["state"] == "online", remote_status(a)

    # And back: the folder's notes deleted, a note takes its name. b removes the folder
    # its deletions emptied, so the note can land (no folder is left in its way).
    (root(a) / "digest/topics.md/birds.md").unlink()
    (root(a) / "digest/topics.md").rmdir()
    write(a, "digest/topics.md", "# Topics\none file again\n")
    wait_for(lambda: converged(a, b) and "digest/topics.md" in notes(b),
             what="the note back on b")
    assert (root(b) / "digest/topics.md").read_text() == "# Topics\none file again\n"
    # While the note's row waited for the folder's deletion, b said so (blocked, failing);
    # that passes once the row is written, within the catch-up that writes it.
    wait_for(lambda: (lambda s: s["state"] == "online" and not s["blocked"])(remote_status(b)),
             what="b online with nothing blocked")


def test_a_deletion_that_loses_to_an_edit_where_a_folder_now_is_holds_back_only_itself(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, _ = pair(daemon_factory, pg_server)
    write(a, "digest/plan.md", "# Plan\nfirst\n")
    wait_for(lambda: converged(a, b) and "digest/plan.md" in notes(b), what="plan on b")

    # a edits the note while b (stopped) makes it a folder of notes: b's deletion loses,
    # and a's version cannot be written back on b while the folder holds a note.
    uploaded = remote_status(a)["uploaded"]
    b.signal(signal.SIGSTOP)
    try:
        write(a, "digest/plan.md", "# Plan\nedited on a\n")
        wait_for(lambda: remote_status(a)["uploaded"] > uploaded
                 and remote_status(a)["outbox"] == 0, what="a uploaded")
        (root(b) / "digest/plan.md").unlink()
        write(b, "digest/plan.md/steps.md", "# Steps\nfrom b\n")
    finally:
        b.signal(signal.SIGCONT)
    write(b, "memory/2026-07-26/later.md", "# Later\nwritten on b after\n")
    # Only that path waits (shown as blocked); b's other changes go up. (a cannot write
    # b's note in the folder either, where its note is: that one waits on a.)
    wait_for(lambda: "memory/2026-07-26/later.md" in notes(a)
             and remote_status(b)["outbox"] == 0, what="b's notes on a")
    wait_for(lambda: list(remote_status(b)["blocked"]) == ["digest/plan.md"],
             what="the path shown blocked on b")
    assert remote_status(b)["state"] == "failing"
    # a names it once the catch-up that met it ends (b's later note may land first).
    wait_for(lambda: list(remote_status(a)["blocked"]) == ["digest/plan.md/steps.md"],
             what="b's note in the folder shown blocked on a")
    assert (root(a) / "digest/plan.md").read_text() == "# Plan\nedited on a\n"

    # The folder moved away, a's version lands by itself and both are online again.
    (root(b) / "digest/plan.md").rename(root(b) / "digest/plan-steps")
    wait_for(lambda: converged(a, b) and remote_status(a)["state"] == "online"
             and remote_status(b)["state"] == "online", what="plan back on b")
    assert (root(b) / "digest/plan.md").read_text() == "# Plan\nedited on a\n"
    assert (root(a) / "digest/plan-steps/steps.md").read_text() == "# Steps\nfrom b\n"


def test_note_folders_deeper_than_one_level_are_replicated(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    folders = 'daily_dir = "notes/daily"\ndigest_dir = "notes/digest"\n'
    a, b, _ = pair(daemon_factory, pg_server, settings=folders)
    write(a, "notes/daily/2026-07-27/walk.md", "# Walk\nheron by the canal\n")
    write(a, "notes/digest/birds.md", "# Birds\nheron\n")
    wait_for(lambda: (root(b) / "notes/daily/2026-07-27/walk.md").exists()
             and (root(b) / "notes/digest/birds.md").exists(), what="notes on b")
    # A deletion removes the folders it empties, never a note folder itself.
    (root(b) / "notes/daily/2026-07-27/walk.md").unlink()
    (root(b) / "notes/digest/birds.md").unlink()
    wait_for(lambda: not (root(a) / "notes/daily/2026-07-27").exists()
             and not (root(a) / "notes/digest/birds.md").exists(), what="deletions on a")
    assert (root(a) / "notes/daily").is_dir() and (root(a) / "notes/digest").is_dir()


def test_notes_behind_a_linked_folder_are_not_deleted_on_the_other_hosts(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    # A folder moved to another disk and linked back: the replica does not follow the
    # link (nor does the index), and what it cannot see is unknown, not deleted.
    a, b, name = pair(daemon_factory, pg_server)
    for rel in ("memory/proj/one.md", "memory/proj/two.md", "memory/2026-08-01/top.md"):
        write(a, rel, f"# Note\n{rel}\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 3, what="notes on b")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    a.signal(signal.SIGSTOP)  # moved and linked before a looks
    try:
        (root(a) / "memory/proj").rename(elsewhere / "proj")
        (root(a) / "memory/proj").symlink_to(elsewhere / "proj")
    finally:
        a.signal(signal.SIGCONT)
    write(a, "memory/2026-08-01/later.md", "# Later\nafter the link\n")
    wait_for(lambda: "memory/2026-08-01/later.md" in notes(b), what="a's later note on b")
    assert "memory/proj/one.md" in notes(b)
    # And the whole memory/ folder, while a is stopped.
    a.stop()
    (root(a) / "memory").rename(elsewhere / "memory")
    (root(a) / "memory").symlink_to(elsewhere / "memory")
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    wait_for(lambda: remote_status(a)["state"] == "online", what="a online")
    (elsewhere / "memory/2026-08-01/top.md").write_text("# Note\nedited behind the link\n")
    write(a, "digest/after.md", "# After\nwritten after the edit\n")
    wait_for(lambda: "digest/after.md" in notes(b), what="a's note after the edit on b")
    assert sorted(notes(b)) == ["digest/after.md", "memory/2026-08-01/later.md",
                                "memory/2026-08-01/top.md", "memory/proj/one.md",
                                "memory/proj/two.md"]
    # What b writes there cannot land on a: a's fault, named.
    write(b, "memory/proj/three.md", "# Three\nfrom b\n")
    status = wait_for(lambda: (lambda s: s if s["blocked"] else None)(remote_status(a)),
                      what="the note held back on a")
    assert status["state"] == "failing", status
    assert "memory is a symbolic link" in status["blocked"]["memory/proj/three.md"], status
    assert not (elsewhere / "memory/proj/three.md").exists()
    # Said once by each of a's watchers (the index's, the replica's), not at each retry of
    # their watch; the notes behind the link stay known.
    said = a.log().count("memory (it is a symbolic link leading out of the workspace)")
    assert 1 <= said <= 2, a.log()
    assert "memory/proj/one.md" in notes(b)


def feed_rows_read(pg: PgServer) -> int:
    """Rows of the files table the server has read so far (its statistics, which a busy
    backend reports at the end of a call a second or more after its last report)."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)"
                           " FROM pg_stat_user_tables WHERE relname = 'recalld_files'"
                           ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_row_held_back_is_tried_again_alone_not_with_the_feed_after_it(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # Each retry (every few seconds) of a note b cannot write fetches that note: the
    # 300 notes after it, applied already, are not read again each time.
    a, b, _ = pair(daemon_factory, pg_server)
    # Named by a token: status and the log name it masked, as search shows it.
    plan = f"digest/wiki/plan-{GITHUB}.md"
    (root(b) / plan).mkdir(parents=True)
    write(a, plan, "# Plan\nblocked on b\n")
    for i in range(300):
        write(a, f"memory/2026-07-24/n{i}.md", f"# N{i}\nnote {i}\n")
    wait_for(lambda: len(notes(b)) == 300 and remote_status(b)["state"] == "failing",
             what="the rest on b")

    def woken(n: int) -> None:  # a's change wakes b, whose catch-up tries again
        write(a, f"memory/2026-07-25/w{n}.md", f"# W{n}\nwake {n}\n")
        wait_for(lambda: (root(b) / f"memory/2026-07-25/w{n}.md").exists(),
                 what="a catch-up")

    woken(0)
    before = feed_rows_read(pg_server)
    for n in range(1, 4):
        woken(n)
    # Then a retry on the timer: a backend reports its statistics at most once a second,
    # so the counts of quick catch-ups come with this later one.
    last = remote_status(b)["last_pull"]
    wait_for(lambda: remote_status(b)["last_pull"] != last, what="a retry",
             deadline_s=BLOCKED_RETRY_S * 6)
    # Reading the feed after the held row again would be 300 rows a retry (1,200 here).
    # A backend may report its statistics late (the first pass's 300 rows, say): one
    # such report fits under the bound, a read of the feed at every retry does not.
    assert feed_rows_read(pg_server) - before < 650
    status = remote_status(b)
    assert status["blocked"] == {mask_path(plan): status["last_error"]}, status
    assert status["last_error"].startswith(f"cannot write {mask_path(plan)}: "), status
    assert GITHUB[4:20] not in str(status) and GITHUB[4:20] not in b.log(), status
    (root(b) / plan).rmdir()
    # The retry on the timer is shown above: a's change wakes this one.
    woken(4)
    wait_for(lambda: converged(a, b) and remote_status(b)["state"] == "online",
             what="b online again")
    assert (root(b) / plan).read_text() == "# Plan\nblocked on b\n"


def test_hosts_naming_other_folders_are_told_and_catch_up_once_they_agree(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # b's daily notes go to 日记/ (a config of its own), a's to memory/: neither takes
    # the other's, which was only logged, note by note, and never read again.
    name = "t" + uuid.uuid4().hex[:12]
    a = daemon_factory(config(pg_server.dsn, name, "hosta"))
    b = daemon_factory(config(pg_server.dsn, name, "hostb") + 'daily_dir = "日记"\n')
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    for i in range(3):
        write(a, f"memory/2026-08-05/a{i}.md", f"# A{i}\n来自 a 的笔记 {i}\n")
    write(b, "日记/2026-08-05/b.md", "# B\n来自 b 的笔记\n")
    write(a, "digest/wiki/shared.md", "# Shared\nboth hosts take the digest\n")
    wait_for(lambda: "digest/wiki/shared.md" in notes(b), what="the digest on b")
    status = wait_for(lambda: (lambda s: s if s["outside"]["notes"] == 3 else None)(
        remote_status(b)), what="a's notes counted outside on b")
    assert status["outside"]["example"] == "memory/2026-08-05/a0.md", status
    wait_for(lambda: remote_status(a)["outside"] == {"notes": 1,
                                                      "example": "日记/2026-08-05/b.md"})
    shown = cli(b, "doctor")
    assert "3 note(s) of" in shown and "lie outside this host's daily_dir" in shown, shown
    assert b.log().count("lie outside this host's folders") == 1  # not once a note
    # b given a's folders: the feed is read again, a's notes come down, b's stays put.
    b.stop()
    b = daemon_factory(config(pg_server.dsn, name, "hostb"), RECALLD_DATA_DIR=str(b.data_dir))
    wait_for(lambda: {f"memory/2026-08-05/a{i}.md" for i in range(3)} <= notes(b).keys()
             and remote_status(b)["outside"]["notes"] == 1, what="a's notes on b")
    assert (root(b) / "日记/2026-08-05/b.md").exists()
    assert (root(b) / "memory/2026-08-05/a1.md").read_text() == "# A1\n来自 a 的笔记 1\n"


def test_a_note_whose_name_is_not_utf8_is_said_to_stay_on_its_host(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    write(a, "memory/2026-07-26/plain.md", "# Plain\nshared\n")
    wait_for(lambda: converged(a, b) and len(notes(b)) == 1, what="the plain note on b")
    folder = bytes(root(a) / "memory/2026-07-26")
    for raw in (b"/r\xe9sum\xe9.md", b"/\xff\xfe.md", b"/caf\xe9.txt"):  # the last no note
        with open(folder + raw, "wb") as f:
            f.write(b"# Latin-1 name\nstays here\n")
    a.stop()  # found by the startup scan
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    wait_for(lambda: remote_status(a)["state"] == "online", what="a online again")
    unshared = wait_for(lambda: remote_status(a)["unshared"]["notes"] == 2 and
                        remote_status(a)["unshared"], what="two notes not shared")
    assert unshared["example"] == "memory/2026-07-26/r\\xe9sum\\xe9.md", unshared
    assert "not shared with the other hosts either" in a.log()
    assert "caf\\xe9.txt" not in a.log()  # no note: nothing to say
    assert "2 note(s) stay on this host, not shared" in cli(a, "doctor")
    assert list(notes(b)) == ["memory/2026-07-26/plain.md"]
    assert remote_status(a)["outbox"] == 0 and remote_status(a)["state"] == "online"
    # Renamed, it is shared (status counts what the last scan found).
    os.rename(folder + b"/r\xe9sum\xe9.md", folder + b"/resume.md")
    wait_for(lambda: len(notes(b)) == 2, what="the renamed note on b")
