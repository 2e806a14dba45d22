"""A shared workspace's replica knows a local note by its last change (the later of its
modification and status-change times) with its size, as the index does: a note replaced
while the daemon was down by another version of the same size whose modification time
was kept (``cp -p``, ``rsync -a``, ``tar x``, a tool that restores times) still goes up
to the other hosts."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import changes_by, config, converged, notes, pair, remote_status, root, write
from waits import wait_for

from recalld.daemon.index.records import note_stamp
from recalld.daemon.remote.state import ReplicaState


def state_log(d: DaemonHandle) -> Path:
    return root(d) / "mem_metadata/remote/state.log"


def agreed_stat(d: DaemonHandle, rel: str) -> list[int] | None:
    """The stat the replica state last recorded for ``rel`` (read only: each line is
    ``<crc> <json>``; the last record of a path wins)."""
    found = None
    for line in state_log(d).read_bytes().splitlines():
        rec = json.loads(line.partition(b" ")[2] or b"{}")
        if rec.get("p") == rel:
            found = rec.get("m")
    return found


def test_a_note_rewritten_at_its_size_with_its_old_time_kept_goes_up(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    rel = "digest/wiki/Ωmega/计划.md"
    old, new = "# Plan\nβ: первый вариант\n", "# Plan\nβ: второй вариант\n"
    assert len(old.encode()) == len(new.encode())
    write(a, rel, old)
    wait_for(lambda: converged(a, b) and rel in notes(b), what="the note on b")
    a.stop()
    path = root(a) / rel
    st = os.stat(path)
    # Replaced as a copy that keeps the old times would replace it, the daemon down.
    tmp = path.with_name(".restored.tmp")
    tmp.write_text(new, encoding="utf-8")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    tmp.replace(path)
    assert (os.stat(path).st_mtime_ns, os.stat(path).st_size) == (st.st_mtime_ns, st.st_size)
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    want = hashlib.sha256(new.encode()).hexdigest()
    wait_for(lambda: notes(b).get(rel) == want and converged(a, b),
             what="the rewritten note on b", deadline_s=60)
    assert changes_by(pg_server, name, "hosta") == (2, 2)
    # Restarted again, nothing unchanged goes up a second time.
    a.stop()
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    wait_for(lambda: remote_status(a)["state"] == "online", what="a online again")
    assert remote_status(a)["outbox"] == 0 and changes_by(pg_server, name, "hosta") == (2, 2)


def test_a_state_saved_with_modification_times_reads_each_note_once_and_uploads_none(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, name = pair(daemon_factory, pg_server)
    paths = [f"memory/2026-12-0{i}/заметка {i}.md" for i in range(1, 4)]
    for i, rel in enumerate(paths):
        write(a, rel, f"# Note {i}\nnever changed {i}\n")
    wait_for(lambda: converged(a, b) and set(paths) <= set(notes(b)), what="the notes on b")
    a.stop()
    # The state as a release that knew files by their modification time saved it.
    # Their modification times an hour back, as a copy keeping the times leaves them:
    # their last change is later, so the stat recorded differs from the one read now.
    for rel in paths:
        st = os.stat(root(a) / rel)
        os.utime(root(a) / rel, ns=(st.st_atime_ns, st.st_mtime_ns - 3_600 * 10**9))
    state = ReplicaState(state_log(a))
    state.open()
    old = {rel: os.stat(root(a) / rel) for rel in paths}
    assert all(note_stamp(st) != (st.st_mtime_ns, st.st_size) for st in old.values())
    state.record([(rel, replace(state.bases[rel], stat=(st.st_mtime_ns, st.st_size)))
                  for rel, st in old.items()])
    state.close()
    a = daemon_factory(config(pg_server.dsn, name, "hosta"), RECALLD_DATA_DIR=str(a.data_dir))
    # Each note is read once and its stat taken over; none goes up again.
    wait_for(lambda: all(agreed_stat(a, rel) == list(note_stamp(os.stat(root(a) / rel)))
                         for rel in paths), what="the new stats recorded", deadline_s=60)
    assert remote_status(a)["outbox"] == 0
    assert changes_by(pg_server, name, "hosta") == (3, 3)
