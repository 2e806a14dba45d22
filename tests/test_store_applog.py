"""Append-only logs (RELIABILITY 5, 7): torn tails truncated, bad lines reported."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from crash.damage import extend, flip, restore, temp_files, truncate

from recalld.daemon.store.applog import AppendLog, encode_line, replay
from recalld.daemon.store.errors import DiskFull, StorageError
from recalld.daemon.store.failingfs import FailingFS

RECORDS: list[dict[str, Any]] = [
    {"job": i, "kind": "embed", "texts": ["记忆", "x" * i]} for i in range(5)
]


def written(tmp_path: Path, records: list[dict[str, Any]] = RECORDS) -> Path:
    path = tmp_path / "queue" / "pending.log"
    with AppendLog(path) as log:
        log.append(records[:2])
        log.append(records[2:])
    return path


def test_append_and_replay(tmp_path: Path) -> None:
    path = written(tmp_path)
    records, report = replay(path)
    assert records == RECORDS
    assert report.bad_lines == [] and report.truncated_at is None
    lines = path.read_bytes().splitlines()
    assert len(lines) == len(RECORDS)
    assert all(len(line.split(b" ", 1)[0]) == 8 for line in lines)
    with AppendLog(path) as log:
        assert log.opened[0] == RECORDS
        log.append([{"job": 99}], sync=False)
        log.sync()
    assert replay(path)[0] == [*RECORDS, {"job": 99}]


def test_missing_log_replays_empty(tmp_path: Path) -> None:
    records, report = replay(tmp_path / "none.log")
    assert records == [] and report.bad_lines == [] and report.truncated_at is None
    assert not (tmp_path / "none.log").exists()


def test_torn_tail_is_truncated_on_recovery(tmp_path: Path) -> None:
    path = written(tmp_path)
    good = path.read_bytes()
    extend(path, encode_line({"job": 5})[:-7])  # a crash in the middle of an append
    records, report = replay(path, repair=False)
    assert records == RECORDS
    assert report.truncated_at == len(good) and report.bad_lines == []
    assert path.read_bytes() != good  # repair=False leaves the file alone
    with AppendLog(path) as log:
        assert log.opened[1].truncated_at == len(good)
        assert path.read_bytes() == good
        log.append([{"job": 6}])
    assert replay(path)[0] == [*RECORDS, {"job": 6}]


@pytest.mark.parametrize("tail", [b"\0" * 4096, b"\0\0\0\n", b"deadbeef {}\n", b"\n\n"])
def test_garbage_after_the_last_good_line_is_cut(tmp_path: Path, tail: bytes) -> None:
    path = written(tmp_path)
    good = path.read_bytes()
    extend(path, tail)
    records, report = replay(path)
    assert records == RECORDS and report.bad_lines == []
    assert report.truncated_bytes == len(tail)
    assert path.read_bytes() == good


def test_bad_committed_line_is_reported_with_offset_and_skipped(tmp_path: Path) -> None:
    path = written(tmp_path)
    data = path.read_bytes()
    offset = data.index(b"\n", data.index(b"\n") + 1) + 1  # start of the third line
    flip(path, offset + 20)
    records, report = replay(path)
    assert records == RECORDS[:2] + RECORDS[3:]
    assert [(b.offset, b.reason) for b in report.bad_lines] == [(offset, "CRC mismatch")]
    assert report.truncated_at is None
    assert path.read_bytes()[offset:].startswith(data[offset : offset + 20])


def test_every_flip_yields_only_real_records(tmp_path: Path) -> None:
    path = written(tmp_path)
    original = path.read_bytes()
    for offset in range(len(original)):
        flip(path, offset, 0x10)
        records, report = replay(path, repair=False)
        # A subsequence of the real records, in order; one damaged line (two when its
        # newline was hit and it merged with the next) is lost and accounted for.
        positions = [RECORDS.index(r) for r in records]
        assert positions == sorted(positions), offset
        assert len(RECORDS) - 2 <= len(records) < len(RECORDS), offset
        assert report.bad_lines or report.truncated_at is not None, offset
        restore(path, original)


def test_every_truncation_recovers_a_prefix(tmp_path: Path) -> None:
    path = written(tmp_path)
    original = path.read_bytes()
    ends = [i + 1 for i, b in enumerate(original) if b == ord("\n")]
    for size in range(len(original)):
        truncate(path, size)
        records, report = replay(path)
        complete = sum(1 for end in ends if end <= size)
        assert records == RECORDS[:complete]
        assert path.stat().st_size == (ends[complete - 1] if complete else 0)
        assert report.bad_lines == []
        restore(path, original)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("op", ["write", "fsync"])
def test_disk_full_append_is_rolled_back(tmp_path: Path, persistent: bool, op: str) -> None:
    path = written(tmp_path)
    good = path.read_bytes()
    fs = FailingFS(1, persistent=persistent, ops=[op])
    log = AppendLog(path, fs)
    log.open()
    with pytest.raises(DiskFull) as info:
        log.append([{"job": 7}, {"job": 8}])
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == good  # no half line left behind
    if persistent:
        with pytest.raises(DiskFull):
            log.append([{"job": 9}])
        log.fs = fs.__class__(10**9)
    log.append([{"job": 9}])
    log.close()
    assert replay(path)[0] == [*RECORDS, {"job": 9}]


def test_rewrite_compacts_atomically(tmp_path: Path) -> None:
    path = written(tmp_path)
    with AppendLog(path) as log:
        log.rewrite(RECORDS[3:])
        log.append([{"job": 10}])
    assert replay(path)[0] == [*RECORDS[3:], {"job": 10}]
    assert temp_files(path.parent) == []
    log = AppendLog(path, FailingFS(1, ops=["write"]))
    log.open()
    with pytest.raises(DiskFull):
        log.rewrite([])
    log.close()
    assert replay(path)[0] == [*RECORDS[3:], {"job": 10}]
    assert temp_files(path.parent) == []


# Rewrites the log at argv[1] to nothing, SIGKILLed just before it renames the new file.
KILLED_REWRITE = """
import os, signal, sys
from pathlib import Path
from recalld.daemon.store import fsio
from recalld.daemon.store.applog import AppendLog

fsio.FS.replace = lambda self, src, dst: os.kill(os.getpid(), signal.SIGKILL)
with AppendLog(Path(sys.argv[1])) as log:
    log.rewrite([])
"""


def test_a_rewrite_killed_before_its_rename_is_tidied_at_the_next_open(
        tmp_path: Path) -> None:
    # The temp file stayed for good (a compacted embedding cache is as large as the cache).
    path = written(tmp_path)
    other = written(tmp_path / "b").replace(path.parent / "other.log")
    for log in (path, other):
        killed = subprocess.run([sys.executable, "-c", KILLED_REWRITE, str(log)], check=False)
        assert killed.returncode == -signal.SIGKILL
    assert len(temp_files(path.parent)) == 2
    (path.parent / ".note.txt").write_text("not a temp file")
    with AppendLog(path) as log:
        assert log.opened[0] == RECORDS  # the rewrite never happened
    (left,) = temp_files(path.parent)  # only this log's own: the other's is its to tidy
    assert left.startswith(".other.log.tmp-")
    assert (path.parent / ".note.txt").exists()
    with AppendLog(other) as log:
        assert log.opened[0] == RECORDS
    assert temp_files(path.parent) == []


def test_a_rewrite_to_the_same_records_keeps_the_file(tmp_path: Path) -> None:
    # The rewrite after a start's recovery, of a log nothing was added to since.
    path = written(tmp_path)
    before = path.stat()
    fs = FailingFS(10**6, ops=["write", "replace", "fsync_dir", "fsync"])
    with AppendLog(path, fs) as log:
        log.rewrite(log.opened[0])
        assert fs.calls == 1  # one fsync of the open file: no temp file, rename, folder sync
        log.append([{"job": 10}])
    assert (path.stat().st_ino, path.stat().st_dev) == (before.st_ino, before.st_dev)
    assert replay(path)[0] == [*RECORDS, {"job": 10}]
    empty = tmp_path / "empty.log"
    with AppendLog(empty) as log:
        ino = empty.stat().st_ino
        log.rewrite([])
    assert empty.stat().st_ino == ino and empty.read_bytes() == b""
    # Other bytes, a torn tail cut at the open, or a log whose file was removed under it:
    # replaced, and published at its path.
    with AppendLog(path) as log:
        log.rewrite(RECORDS[:1])
        assert path.stat().st_ino != before.st_ino
        path.unlink()
        log.rewrite(RECORDS[:1])
    assert replay(path)[0] == RECORDS[:1]
    assert temp_files(path.parent) == []


def test_append_requires_open(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="not open"):
        AppendLog(tmp_path / "x.log").append([{"a": 1}])


def test_quarantine_sets_aside_bad_lines_and_the_tail_then_rewrites(tmp_path: Path) -> None:
    import base64

    path = tmp_path / "log.jsonl"
    aside = tmp_path / "q" / "log.quarantine.jsonl"
    good = [encode_line({"n": n}) for n in range(3)]
    bad = b"0badc0de {\"n\": 99}\n"
    path.write_bytes(good[0] + bad + good[1] + good[2] + b"00000000 {\"tor")
    with AppendLog(path, quarantine=aside) as log:
        records, report = log.opened
        assert [r["n"] for r in records] == [0, 1, 2]
        assert report.quarantined == 2 and len(report.bad_lines) == 1
        log.append([{"n": 3}])
    set_aside, _ = replay(aside)
    assert [r["reason"] for r in set_aside] == ["CRC mismatch", "torn or garbled tail"]
    assert base64.b64decode(set_aside[0]["raw_b64"]) == bad.rstrip(b"\n")
    assert set_aside[0]["offset"] == len(good[0])
    # Rewritten: the next open finds nothing to set aside and keeps the append.
    with AppendLog(path, quarantine=aside) as log:
        records, report = log.opened
        assert [r["n"] for r in records] == [0, 1, 2, 3] and report.quarantined == 0
    assert len(replay(aside)[0]) == 2


def test_a_damaged_piece_too_big_to_copy_keeps_the_whole_log(tmp_path: Path) -> None:
    """A log with gigabytes of garbage (here just over the limit) is not copied into the
    quarantine as one base64 JSON string: the whole log is kept under another name."""
    from recalld.daemon.store.applog import MAX_PIECE_BYTES

    path = tmp_path / "log.jsonl"
    aside = tmp_path / "log.quarantine.jsonl"
    good = encode_line({"n": 1})
    with path.open("wb") as f:
        f.write(good)
        f.truncate(len(good) + MAX_PIECE_BYTES + 1)  # a tail of zero bytes
    original = path.read_bytes()
    with AppendLog(path, quarantine=aside) as log:
        records, report = log.opened
        assert records == [{"n": 1}] and report.quarantined == 1
        log.append([{"n": 2}])
    [piece], _ = replay(aside)
    assert piece["raw_b64"] == "" and piece["length"] == MAX_PIECE_BYTES + 1
    assert (tmp_path / piece["kept_in"]).read_bytes() == original
    assert aside.stat().st_size < 1024
    assert [r["n"] for r in replay(path)[0]] == [1, 2]


def test_a_log_made_in_place_of_a_link_is_made_durable(tmp_path: Path) -> None:
    # A link at the log's path (set aside by the replay) was taken for the log's file:
    # the file made in its place had its folder's entry left unsynced.
    from recalld.daemon.store import confine
    from recalld.daemon.store.fsio import FS

    class Synced(FS):
        def __init__(self) -> None:
            self.folder_syncs: list[tuple[Path, list[str]]] = []

        def fsync_dir(self, path: Path) -> None:
            self.folder_syncs.append((path, sorted(p.name for p in path.iterdir())))
            super().fsync_dir(path)

    (tmp_path / "elsewhere.log").write_bytes(encode_line({"job": 1}))
    path = tmp_path / "queue" / "pending.log"
    path.parent.mkdir()
    path.symlink_to(tmp_path / "elsewhere.log")
    fs = Synced()
    confine.guard(tmp_path)  # as an open workspace's folder
    try:
        with AppendLog(path, fs) as log:
            assert log.opened[0] == []  # nothing read through the link
            log.append([{"job": 2}])
    finally:
        confine.release(tmp_path)
    assert path.is_file() and not path.is_symlink()
    # The last sync of the folder came once the new log was there.
    last = [names for folder, names in fs.folder_syncs if folder == path.parent][-1]
    assert "pending.log" in last, fs.folder_syncs
