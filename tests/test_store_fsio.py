"""The filesystem seam and atomic publish (RELIABILITY 1 and 7 at the file level)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from crash.damage import temp_files

from recalld.daemon.store.errors import CorruptState, DiskFull, StorageError, StorageIOError
from recalld.daemon.store.failingfs import FailingFS
from recalld.daemon.store.fsio import (
    REAL,
    TEMP_RE,
    adopt_file,
    atomic_write,
    atomic_writer,
    checksum,
    ensure_dir,
    publish_copy,
    read_verified,
    remove_temp_files,
    temp_name,
    temp_prefix,
    verify_file,
)
from recalld.daemon.store.leftovers import file_times_now, remove_left_over


def test_atomic_write_publishes_and_reports_entry(tmp_path: Path) -> None:
    target = tmp_path / "a.bin"
    entry = atomic_write(REAL, target, b"hello")
    assert target.read_bytes() == b"hello"
    assert (entry.name, entry.size, entry.checksum) == ("a.bin", 5, checksum(b"hello"))
    atomic_write(REAL, target, b"second version")
    assert target.read_bytes() == b"second version"
    assert temp_files(tmp_path) == []


def test_temp_names_match_the_cleanup_pattern() -> None:
    name = temp_name("file_chunks_default_v1.jsonl.zst")
    assert name.startswith(".file_chunks_default_v1.jsonl.zst.tmp-")
    assert TEMP_RE.match(name)
    assert not TEMP_RE.match("file_chunks_default_v1.jsonl.zst")
    assert temp_name("x") != temp_name("x")


@pytest.mark.parametrize("op", ["open_write", "write", "fsync", "replace"])
@pytest.mark.parametrize("persistent", [False, True])
def test_failure_before_publish_keeps_old_file(tmp_path: Path, op: str, persistent: bool) -> None:
    target = tmp_path / "state.bin"
    atomic_write(REAL, target, b"old")
    fs = FailingFS(1, persistent=persistent, ops=[op])
    with pytest.raises(DiskFull) as info:
        atomic_write(fs, target, b"new content")
    assert info.value.errno == errno.ENOSPC
    assert isinstance(info.value, StorageError)
    assert target.read_bytes() == b"old"
    assert temp_files(tmp_path) == []
    # Once: the retry succeeds. Persistent: the disk is still full.
    if persistent:
        with pytest.raises(DiskFull):
            atomic_write(fs, target, b"new content")
        assert target.read_bytes() == b"old"
    else:
        atomic_write(fs, target, b"new content")
        assert target.read_bytes() == b"new content"
    assert temp_files(tmp_path) == []


def test_failing_fsync_of_directory_after_rename_reports_error(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    atomic_write(REAL, target, b"old")
    with pytest.raises(DiskFull):
        atomic_write(FailingFS(1, ops=["fsync_dir"]), target, b"new")
    # The rename happened; durability is unknown, and the error says so. No temp remains.
    assert target.read_bytes() == b"new"
    assert temp_files(tmp_path) == []


def test_every_kth_write_of_a_streamed_file(tmp_path: Path) -> None:
    target = tmp_path / "big.bin"
    atomic_write(REAL, target, b"old")
    for k in range(1, 12):
        fs = FailingFS(k)
        try:
            with atomic_writer(fs, target) as out:
                for i in range(10):
                    out.write(bytes([i]) * 1000)
        except DiskFull:
            assert target.read_bytes() == b"old"
        else:
            assert k == 11 and fs.failures == 0
        assert temp_files(tmp_path) == []
    assert target.read_bytes() == b"".join(bytes([i]) * 1000 for i in range(10))


def test_error_inside_the_block_discards_the_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "x"
    atomic_write(REAL, target, b"old")
    with pytest.raises(ValueError, match="boom"), atomic_writer(REAL, target) as out:
        out.write(b"partial")
        raise ValueError("boom")
    assert target.read_bytes() == b"old"
    assert temp_files(tmp_path) == []


def test_other_errors_are_storage_io_errors(tmp_path: Path) -> None:
    with pytest.raises(StorageIOError) as info:
        atomic_write(FailingFS(1, err=errno.EIO), tmp_path / "x", b"data")
    assert not isinstance(info.value, DiskFull)
    assert info.value.errno == errno.EIO
    assert temp_files(tmp_path) == []


def test_edquot_counts_as_disk_full(tmp_path: Path) -> None:
    with pytest.raises(DiskFull):
        atomic_write(FailingFS(1, err=errno.EDQUOT), tmp_path / "x", b"data")


def test_publish_copy_links_or_copies(tmp_path: Path) -> None:
    src = tmp_path / "gen.g000001.bin"
    atomic_write(REAL, src, b"generation bytes")
    dst = tmp_path / "fixed" / "name.bin"
    ensure_dir(REAL, dst.parent)
    publish_copy(REAL, src, dst)
    assert os.stat(src).st_ino == os.stat(dst).st_ino
    # Where hard links are refused (another filesystem), it copies atomically.
    other = tmp_path / "fixed" / "copy.bin"
    publish_copy(FailingFS(1, ops=["link"], err=errno.EXDEV), src, other)
    assert other.read_bytes() == b"generation bytes"
    assert os.stat(src).st_ino != os.stat(other).st_ino
    assert temp_files(dst.parent) == []


def test_adopt_file_publishes_a_natively_written_file(tmp_path: Path) -> None:
    tmp = tmp_path / temp_name("index.hnsw")
    tmp.write_bytes(b"native index bytes")
    entry = adopt_file(REAL, tmp, tmp_path / "index.hnsw")
    assert not tmp.exists()
    verify_file(tmp_path / "index.hnsw", entry)
    failing = tmp_path / temp_name("other.hnsw")
    failing.write_bytes(b"x")
    with pytest.raises(DiskFull):
        adopt_file(FailingFS(1, ops=["replace"]), failing, tmp_path / "other.hnsw")
    assert not failing.exists() and not (tmp_path / "other.hnsw").exists()


def test_read_verified_and_verify_file_detect_damage(tmp_path: Path) -> None:
    path = tmp_path / "f"
    entry = atomic_write(REAL, path, b"0123456789")
    assert read_verified(path, entry) == b"0123456789"
    path.write_bytes(b"0123456780")
    for check in (lambda: read_verified(path, entry), lambda: verify_file(path, entry)):
        with pytest.raises(CorruptState, match="checksum"):
            check()
    path.write_bytes(b"01234")
    with pytest.raises(CorruptState, match="size"):
        verify_file(path, entry)
    path.unlink()
    with pytest.raises(CorruptState, match="missing"):
        read_verified(path, entry)


def test_remove_temp_files_only_removes_temp_names(tmp_path: Path) -> None:
    (tmp_path / temp_name("a.bin")).write_bytes(b"")
    (tmp_path / "a.bin").write_bytes(b"")
    (tmp_path / ".hidden").write_bytes(b"")
    (tmp_path / "notes.tmp").write_bytes(b"")
    removed = remove_temp_files(REAL, tmp_path)
    assert len(removed) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", "a.bin", "notes.tmp"]
    assert remove_temp_files(REAL, tmp_path / "missing") == []


def test_remove_left_over_takes_only_files_of_the_daemons_naming_dated_before(
        tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    ours = [tmp_path / temp_name("x.json"), deep / temp_name("y.jsonl")]
    theirs = [tmp_path / ".draft.tmp-notes", deep / "y.jsonl", tmp_path / "z.tmp-0123abcd"]
    for path in [*ours, *theirs]:
        path.write_bytes(b"")
    link, folder = deep / temp_name("link"), deep / temp_name("folder")
    link.symlink_to(ours[0])
    folder.mkdir()
    # Changed after the time given (written by a live writer): kept.
    assert remove_left_over(tmp_path, 0) == []
    # With a prefix: that file's own, in the folder itself.
    assert remove_left_over(tmp_path, file_times_now() + 10**9,
                            prefix=temp_prefix("y.jsonl")) == []
    assert remove_left_over(tmp_path, file_times_now() + 10**9,
                            prefix=temp_prefix("x.json")) == [ours[0].name]
    assert remove_left_over(tmp_path, file_times_now() + 10**9) == [
        str(ours[1].relative_to(tmp_path))]
    assert all(path.exists() for path in theirs)
    assert link.is_symlink() and folder.is_dir()
    assert remove_left_over(tmp_path / "missing", file_times_now()) == []


def test_ensure_dir_creates_parents_durably(tmp_path: Path) -> None:
    fs = FailingFS(10**9, ops=["mkdir", "fsync_dir"])
    ensure_dir(fs, tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert fs.calls == 6  # three mkdirs, each followed by an fsync of its parent
    with pytest.raises(DiskFull):
        ensure_dir(FailingFS(1, ops=["mkdir"]), tmp_path / "d")


def test_a_left_over_temp_file_of_a_name_with_a_line_break_is_removed(
        tmp_path: Path) -> None:
    # The temp file of a note whose name holds a line break (dropped in by hand, or
    # written by a client) did not match the temp files' pattern: a kill between its
    # write and its rename left it there for good. A name that only ends like a temp
    # file's, with a line break after it, is not one of the daemon's.
    ours = [tmp_path / temp_name(name) for name in ("two\nlines.md", "\n", "end\r\n.md")]
    theirs = [tmp_path / ".x.md.tmp-0a1b2c3d4e5f\n", tmp_path / ".x.md.tmp-\n0a1b2c3d"]
    for path in [*ours, *theirs]:
        path.write_bytes(b"")
        assert bool(TEMP_RE.match(path.name)) == (path in ours), path.name
    assert remove_left_over(tmp_path, file_times_now() + 10**9) == sorted(p.name for p in ours)
    assert sorted(tmp_path.iterdir()) == sorted(theirs)
