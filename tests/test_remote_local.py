"""The replica's local pieces, without a server: confinement, outbox and state logs, error
texts."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from recalld.daemon.remote import outbox
from recalld.daemon.remote.localfs import Confinement, EditedMeanwhile, LocalFile, conflict_name
from recalld.daemon.remote.outbox import COMPACT_AFTER_LINES, Change, Outbox
from recalld.daemon.remote.searcher import one_line
from recalld.daemon.remote.state import Base, ReplicaState
from recalld.ipc.errors import PathOutsideWorkspace, RecalldError


@pytest.fixture
def fs(tmp_path: Path) -> Confinement:
    for d in ("memory", "digest", "mem_metadata"):
        (tmp_path / "ws" / d).mkdir(parents=True)
    return Confinement(tmp_path / "ws", ("memory", "digest"))


@pytest.mark.parametrize("path", [
    "memory/2026-07-23/a.md", "digest/wiki/plan.md",
    "digest/wiki/plan.sync-conflict-20261201-153216-laptop.md",
])
def test_replicated_paths(fs: Confinement, path: str) -> None:
    assert fs.accepts(path)


@pytest.mark.parametrize("path", [
    "mem_metadata/index/MANIFEST-000001.json", "mem_metadata/x.md", "resource/a.md",
    "memory/../mem_metadata/x.md", "/etc/passwd.md", "memory/.hidden.md", "memory/a.txt",
    "memory//a.md", "memory/./a.md", "a.md", "memory/a\x00.md", "",
])
def test_paths_outside_the_replicated_folders_are_refused(fs: Confinement, path: str) -> None:
    assert not fs.accepts(path)
    with pytest.raises(RecalldError):
        fs.write(path, b"x")
    with pytest.raises(RecalldError):
        fs.remove(path)


def test_writes_never_follow_a_symlink_out(fs: Confinement, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, fs.root / "memory" / "2026-07-23")
    with pytest.raises(PathOutsideWorkspace):
        fs.write("memory/2026-07-23/a.md", b"x")
    (outside / "b.md").write_text("keep")
    fs.remove("memory/2026-07-23/b.md")  # a link on the way: nothing is removed
    assert (outside / "b.md").read_text() == "keep" and list(outside.iterdir()) == [
        outside / "b.md"]


def test_write_read_remove(fs: Confinement) -> None:
    stat = fs.write("memory/2026-07-23/a.md", b"# A\n")
    f = fs.read("memory/2026-07-23/a.md")
    assert f.data == b"# A\n" and f.stat == stat and f.hash is not None
    fs.write("memory/2026-07-24/deep/b.md", b"# B\n")
    fs.write("memory/2026-07-24/c.md", b"# C\n")
    fs.remove("memory/2026-07-23/a.md")
    assert not fs.read("memory/2026-07-23/a.md").exists
    # The folders a deletion leaves empty go too, up to the replicated one; no others.
    fs.remove("memory/2026-07-24/deep/b.md")
    assert sorted(p.name for p in (fs.root / "memory").iterdir()) == ["2026-07-24"]
    assert [p.name for p in (fs.root / "memory" / "2026-07-24").iterdir()] == ["c.md"]


def test_a_run_of_files_is_put_and_refused_as_a_whole(fs: Confinement, tmp_path: Path) -> None:
    fs.write("digest/wiki/old.md", b"old")
    run: list[tuple[str, bytes | None]] = [
        ("memory/2026-07-01/a.md", b"# A\n"), ("memory/2026-07-02/b.md", b"# B\n"),
        ("digest/wiki/old.md", None), ("memory/2026-07-01/c.md", b"# C\n")]
    stats = fs.put(run)
    assert stats[2] is None and not fs.read("digest/wiki/old.md").exists
    for (path, data), stat in zip(run, stats, strict=True):
        if data is not None:
            f = fs.read(path)
            assert (f.data, f.stat) == (data, stat)
    # A path the replica does not own refuses the run before anything is written.
    with pytest.raises(RecalldError):
        fs.put([("memory/2026-07-03/d.md", b"d"), ("mem_metadata/x.md", b"x")])
    assert not (fs.root / "memory" / "2026-07-03").exists()
    # A link on the way stops the run there: what came before it is published.
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, fs.root / "memory" / "2026-07-04")
    with pytest.raises(PathOutsideWorkspace):
        fs.put([("memory/2026-07-05/e.md", b"e"), ("memory/2026-07-04/f.md", b"f")])
    assert fs.read("memory/2026-07-05/e.md").data == b"e" and list(outside.iterdir()) == []


def test_a_save_made_after_the_read_is_not_overwritten(fs: Confinement) -> None:
    """The server's content replaces (or removes) a note only if it still holds what the
    replica read: an editor's save in between is left as saved and reported."""
    notes = {"memory/2026-07-01/a.md": "旧的笔记\n", "digest/wiki/b.md": "# B\nold\n",
             "memory/2026-07-01/c.md": "# C\n", "memory/2026-07-02/d.md": "# D\n"}
    for path, text in notes.items():
        fs.write(path, text.encode())
    read = {path: fs.read(path).hash for path in notes}
    # Saved by an editor (temp file and rename) or removed after the replica read them.
    (fs.root / "memory/2026-07-01/.a.md.swp").write_text("编辑器保存的版本\n")
    os.replace(fs.root / "memory/2026-07-01/.a.md.swp", fs.root / "memory/2026-07-01/a.md")
    (fs.root / "digest/wiki/b.md").write_text("# B\nsaved in place\n")
    (fs.root / "memory/2026-07-02/d.md").unlink()
    edited: list[LocalFile] = []
    stats = fs.put([("memory/2026-07-01/a.md", "服务器的版本\n".encode()),
                    ("digest/wiki/b.md", None), ("memory/2026-07-01/c.md", b"# C2\n"),
                    ("memory/2026-07-02/d.md", b"# D2\n")],
                   expect=read, edited=edited)
    assert fs.read("memory/2026-07-01/a.md").data == "编辑器保存的版本\n".encode()
    assert fs.read("digest/wiki/b.md").data == b"# B\nsaved in place\n"
    assert not fs.read("memory/2026-07-02/d.md").exists  # the removal is kept too
    assert fs.read("memory/2026-07-01/c.md").data == b"# C2\n"  # unchanged: written
    assert [(f.path, f.data) for f in edited] == [
        ("memory/2026-07-01/a.md", "编辑器保存的版本\n".encode()),
        ("digest/wiki/b.md", b"# B\nsaved in place\n"), ("memory/2026-07-02/d.md", None)]
    assert stats[0] is None and stats[2] is not None
    # No temp file is left beside the notes; without ``edited`` the save is an error.
    assert sorted(p.name for p in (fs.root / "memory/2026-07-01").iterdir()) == [
        "a.md", "c.md"]
    with pytest.raises(EditedMeanwhile):
        fs.write("memory/2026-07-01/a.md", b"x", read["memory/2026-07-01/a.md"])
    assert fs.read("memory/2026-07-01/a.md").data == "编辑器保存的版本\n".encode()


def test_a_save_landing_while_the_replica_compares_is_not_lost(
        fs: Confinement, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save made while the replica compares the file with what it read, before its
    rename (or unlink): the comparison was made on the file, then the rename replaced
    (the unlink removed) whatever had been saved meanwhile."""
    from recalld.daemon.remote import localfs

    hashed = localfs.content_hash
    saves: dict[str, bytes] = {}

    def save_while_hashing(data: bytes) -> str:
        # An editor saves (temp file, rename) while the replica hashes what it found.
        for path, text in list(saves.items()):
            tmp = fs.root / path.replace(".md", ".md~")
            tmp.write_bytes(text)
            os.replace(tmp, fs.root / path)
            del saves[path]
        return hashed(data)

    notes = {"memory/2026-07-03/écluse.md": "Die Schleuse öffnet um 6 Uhr.\n",
             "digest/wiki/闸门.md": "# 闸门\n旧的\n"}
    for path, text in notes.items():
        fs.write(path, text.encode())
    read = {path: fs.read(path).hash for path in notes}
    monkeypatch.setattr(localfs, "content_hash", save_while_hashing)
    saves["memory/2026-07-03/écluse.md"] = "Die Schleuse öffnet um 5 Uhr!\n".encode()
    saves["digest/wiki/闸门.md"] = "# 闸门\n编辑器刚保存\n".encode()
    edited: list[LocalFile] = []
    fs.put([("memory/2026-07-03/écluse.md", b"vom Server\n"),
            ("digest/wiki/闸门.md", None)], expect=read, edited=edited)
    assert not saves  # both saves were made, mid-compare
    # Each save is on disk (over the server's version, made just after it): it goes up.
    assert fs.read("memory/2026-07-03/écluse.md").data == "Die Schleuse öffnet um 5 Uhr!\n".encode()
    assert fs.read("digest/wiki/闸门.md").data == "# 闸门\n编辑器刚保存\n".encode()
    assert sorted(p.name for p in (fs.root / "memory/2026-07-03").iterdir()) == ["écluse.md"]
    assert sorted(p.name for p in (fs.root / "digest/wiki").iterdir()) == ["闸门.md"]
    # Saved before the compare and again during it: the newest save holds the path.
    read = {path: fs.read(path).hash for path in notes}
    (fs.root / "memory/2026-07-03/écluse.md").write_text("erste Speicherung\n")
    saves["memory/2026-07-03/écluse.md"] = b"zweite Speicherung\n"
    edited.clear()
    fs.put([("memory/2026-07-03/écluse.md", b"vom Server\n")], expect=read,
           edited=edited)
    assert not saves
    assert fs.read("memory/2026-07-03/écluse.md").data == b"zweite Speicherung\n"
    assert [f.data for f in edited] == [b"zweite Speicherung\n"]
    assert sorted(p.name for p in (fs.root / "memory/2026-07-03").iterdir()) == ["écluse.md"]


def test_a_note_made_where_the_replica_found_none_is_not_replaced(fs: Confinement) -> None:
    (fs.root / "memory/2026-07-05").mkdir()
    (fs.root / "memory/2026-07-05/neu.md").write_text("vom Editor\n")
    with pytest.raises(EditedMeanwhile) as caught:
        fs.write("memory/2026-07-05/neu.md", b"from the server\n", None)
    assert caught.value.found.data == b"vom Editor\n"
    assert sorted(p.name for p in (fs.root / "memory/2026-07-05").iterdir()) == ["neu.md"]


def test_without_exchanging_renames_a_save_is_still_kept(
        fs: Confinement, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without ``renameat2``'s flags (NFS: EINVAL) gets the file compared
    just before a plain rename or unlink."""
    from recalld.daemon.memory import confined

    def unsupported(*_args: object, **_kw: object) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    notes = {"memory/2026-07-04/a.md": b"# A\n", "memory/2026-07-04/b.md": b"# B\n",
             "memory/2026-07-04/c.md": b"# C\n"}
    for path, data in notes.items():
        fs.write(path, data)
    read = {path: fs.read(path).hash for path in notes}
    monkeypatch.setattr(confined, "renameat2", unsupported)
    (fs.root / "memory/2026-07-04/b.md").write_bytes(b"# B saved\n")
    edited: list[LocalFile] = []
    fs.put([("memory/2026-07-04/a.md", b"# A2\n"), ("memory/2026-07-04/b.md", b"# B2\n"),
            ("memory/2026-07-04/c.md", None), ("memory/2026-07-04/new.md", b"# N\n")],
           expect={**read, "memory/2026-07-04/new.md": None}, edited=edited)
    assert [(f.path, f.data) for f in edited] == [("memory/2026-07-04/b.md", b"# B saved\n")]
    assert sorted(p.name for p in (fs.root / "memory/2026-07-04").iterdir()) == [
        "a.md", "b.md", "new.md"]
    assert fs.read("memory/2026-07-04/a.md").data == b"# A2\n"


def test_conflict_names_follow_syncthing() -> None:
    t = 1_700_000_000.0
    assert conflict_name("digest/wiki/plan.md", t, "laptop") == (
        "digest/wiki/plan.sync-conflict-20231114-221320-laptop.md")
    assert conflict_name("memory/x/README", t, "h", 2) == (
        "memory/x/README.sync-conflict-20231114-221320-h-2")


def test_outbox_survives_reopen_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "outbox.log"
    box = Outbox(path)
    box.open()
    changes = [Change(f"id{i}", f"memory/d/n{i % 3}.md", b"x" * i if i % 4 else None,
                      None if i % 4 == 0 else f"h{i}", float(i)) for i in range(12)]
    box.add(changes)
    for c in changes[:5]:
        box.done([c.id])
    box.close()
    # A torn append (a crash mid-write) is cut off; what was committed stays.
    with open(path, "ab") as f:
        f.write(b"0000 {\"op\": \"add\"")
    box = Outbox(path)
    box.open()
    assert [c.id for c in box.pending()] == [c.id for c in changes[5:]]
    assert box.pending()[3].data == changes[8].data and box.pending()[3].deleted
    assert box.pending_for("memory/d/n0.md") and len(box) == 7
    for c in changes[5:]:
        box.done([c.id])
    assert not box.pending_for("memory/d/n0.md") and box.head_run(1, 0) == []
    many = [Change(f"m{i}", "memory/d/m.md", b"y", "h", 0.0) for i in range(COMPACT_AFTER_LINES)]
    box.add(many)
    for c in many:
        box.done([c.id])
    box.close()
    # Compacted on the way: far fewer lines than the 2 x 2,000 records written.
    assert len(path.read_bytes().splitlines()) < COMPACT_AFTER_LINES
    box = Outbox(path)
    box.open()
    assert len(box) == 0


def test_outbox_runs_stop_at_a_repeated_path_and_their_size(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.log")
    box.open()
    paths = ["a", "b", "c", "b", "d"]
    changes = [Change(f"id{i}", f"memory/d/{p}.md", b"x" * 10 if i != 2 else None,
                      None if i == 2 else "h", 0.0) for i, p in enumerate(paths)]
    box.add(changes)
    # Up to the second change of b: its base is the version the first one makes.
    assert [c.id for c in box.head_run(10, 1 << 20)] == ["id0", "id1", "id2"]
    assert [c.id for c in box.head_run(2, 1 << 20)] == ["id0", "id1"]
    assert [c.id for c in box.head_run(10, 15)] == ["id0"]
    assert [c.id for c in box.head_run(10, 0)] == ["id0"]  # the first goes, whatever its size
    box.done(["id0", "id1", "id2"])
    assert [c.id for c in box.head_run(10, 1 << 20)] == ["id3", "id4"]
    box.close()
    box = Outbox(tmp_path / "outbox.log")
    box.open()
    assert [c.id for c in box.pending()] == ["id3", "id4"]
    box.done(["id3", "id4"])
    assert box.head_run(10, 1 << 20) == [] and len(box) == 0


def test_a_path_saved_again_and_again_keeps_two_changes_in_the_outbox(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "COMPACT_AFTER_STALE_BYTES", 1000, raising=False)
    path = tmp_path / "outbox.log"
    box = Outbox(path)
    box.open()

    def save(i: int, note: str = "p", size: int = 100) -> Change:
        change = Change(f"id{i}", f"memory/d/{note}.md", bytes([i]) * size, f"h{i}", float(i))
        box.add([change])
        return change

    save(0)
    save(1, "q")
    save(2)
    for i in range(3, 40):  # never sent: only the first change of a path goes up
        save(i)
    assert [(c.id, c.data) for c in box.pending()] == [
        ("id0", bytes([0]) * 100), ("id1", bytes([1]) * 100), ("id2", bytes([39]) * 100)]
    assert box.count_for("memory/d/p.md") == 2 and len(box) == 3
    assert [c.id for c in box.head_run(10, 1 << 20)] == ["id0", "id1"]
    # The replaced versions' bytes are compacted away: the log holds the three changes.
    assert len(path.read_bytes().splitlines()) < 10
    box.close()
    box = Outbox(path)
    box.open()
    assert [(c.id, c.data, c.time) for c in box.pending()] == [
        ("id0", bytes([0]) * 100, 0.0), ("id1", bytes([1]) * 100, 1.0),
        ("id2", bytes([39]) * 100, 39.0)]
    # A replaced change goes last, as the latest save; the first of a path (it may be on
    # the wire) is never replaced, and after it is done the next save is a change of its own.
    save(40, "q")
    save(41, "q")
    assert [(c.id, c.data[0]) for c in box.pending()] == [
        ("id0", 0), ("id1", 1), ("id2", 39), ("id40", 41)]
    box.done(["id0", "id1"])
    save(42)
    save(43, "q")
    expected = [("id2", 39), ("id40", 41), ("id42", 42), ("id43", 43)]
    assert [(c.id, c.data[0]) for c in box.pending()] == expected
    box.close()
    box = Outbox(path)
    box.open()
    assert [(c.id, c.data[0]) for c in box.pending()] == expected


def test_state_keeps_bases_landings_and_identity(tmp_path: Path) -> None:
    path = tmp_path / "state.log"
    st = ReplicaState(path)
    st.open()
    assert st.adopt("team/1/t0") is False
    st.land([("memory/d/a.md", "ha"), ("memory/d/b.md", "hb")])
    st.record([("memory/d/a.md", Base(3, "ha", (1, 2)))], cursor=3)
    st.record([("memory/d/c.md", Base(4, "hc", None, redirect="memory/d/c.x.md",
                                      settle=True))])
    st.close()
    st = ReplicaState(path)
    st.open()
    assert st.cursor == 3 and st.ident == "team/1/t0"
    assert st.bases["memory/d/a.md"] == Base(3, "ha", (1, 2))
    assert st.bases["memory/d/c.md"].redirect == "memory/d/c.x.md"
    assert st.bases["memory/d/c.md"].settle
    assert st.landing == {"memory/d/b.md": "hb"}  # a's landing ended with its base
    # Another shared workspace: everything agreed with the old one is dropped.
    assert st.adopt("other/9/t1") is True
    st.close()
    st = ReplicaState(path)
    st.open()
    assert (st.ident, st.cursor, st.bases, st.landing) == ("other/9/t1", 0, {}, {})


def test_an_error_shows_on_one_line_with_the_password_masked() -> None:
    # What status (last_error, search.last_error) and the log show of a server error.
    exc = OSError("connection to server failed:\n\tFATAL:  password s3cret was refused")
    assert one_line(exc, ["s3cret"]) == ("connection to server failed: FATAL: password *** "
                                          "was refused")
    assert one_line(TimeoutError(), ["s3cret"]) == "TimeoutError"


def test_note_folders_deeper_than_one_level(tmp_path: Path) -> None:
    fs = Confinement(tmp_path, ("notes/daily", "digest"))
    assert fs.accepts("notes/daily/2026-07-27/walk.md") and fs.accepts("notes/daily/a.md")
    for path in ("notes/a.md", "notes/daily.md", "notes/dailyx/a.md", "notes/daily"):
        assert not fs.accepts(path), path
    fs.write("notes/daily/2026-07-27/walk.md", b"# Walk\n")
    fs.remove("notes/daily/2026-07-27/walk.md")
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["daily"]
    assert list((tmp_path / "notes" / "daily").iterdir()) == []


def test_a_note_that_cannot_be_opened_now_is_not_read_as_deleted(fs: Confinement) -> None:
    # Out of file descriptors (or an I/O error), a note is not absent: reading it must
    # fail, or the replica would send its deletion to every host.
    import resource

    fs.write("memory/2026-07-23/a.md", b"# A\n")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare = [os.open("/dev/null", os.O_RDONLY)]
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (spare[0] + 1, hard))
        with pytest.raises(OSError) as caught:
            fs.read("memory/2026-07-23/a.md")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in spare:
            os.close(fd)
    assert caught.value.errno == errno.EMFILE
    assert fs.read("memory/2026-07-23/a.md").data == b"# A\n"
    # A link, a folder or nothing there is no note.
    (fs.root / "memory/2026-07-23/dir.md").mkdir()
    os.symlink(fs.root / "memory/2026-07-23/a.md", fs.root / "memory/2026-07-23/link.md")
    for path in ("dir.md", "link.md", "none.md", "a.md/x.md"):
        assert not fs.read(f"memory/2026-07-23/{path}").exists, path
