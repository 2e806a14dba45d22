"""Client-named paths cannot leave the workspace (RELIABILITY 19)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from recalld.daemon.restore_folders import open_folder
from recalld.daemon.safepath import (
    open_confined,
    open_inside,
    open_parent,
    read_lines,
    split_relative,
)
from recalld.ipc.errors import InvalidParams, NotFound, PathOutsideWorkspace


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory" / "2026-01-01").mkdir(parents=True)
    (root / "memory" / "2026-01-01" / "note.md").write_text("one\ntwo\nthree\n")
    (tmp_path / "outside.md").write_text("SECRET\n")
    return root


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in sorted(path.rglob("*")):
        st = os.lstat(p)
        out[str(p.relative_to(path))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("bad", [
    "../outside.md", "memory/../../outside.md", "/etc/passwd", "memory/\x00note.md",
    "..", "memory/2026-01-01/../../..",
])
def test_textual_escapes_are_refused(ws: Path, bad: str) -> None:
    before = snapshot(ws.parent)
    with pytest.raises(PathOutsideWorkspace):
        read_lines(ws, bad)
    assert snapshot(ws.parent) == before


def test_refusals_are_invalid_params_kind() -> None:
    assert issubclass(PathOutsideWorkspace, InvalidParams)
    with pytest.raises(InvalidParams):
        split_relative(".")
    with pytest.raises(InvalidParams):
        split_relative(42)
    assert split_relative("./memory//a.md") == ["memory", "a.md"]
    # A part the file system could not name (NAME_MAX), in characters or in bytes.
    assert split_relative("memory/" + "a" * 252 + ".md")[1] == "a" * 252 + ".md"
    for long in ("a" * 253 + ".md", "记" * 86):
        with pytest.raises(InvalidParams, match="longer than 255 bytes"):
            split_relative(f"memory/{long}")


def test_symlinks_are_refused_everywhere(ws: Path) -> None:
    (ws / "link.md").symlink_to(ws.parent / "outside.md")
    (ws / "inside-link.md").symlink_to(ws / "memory" / "2026-01-01" / "note.md")
    (ws / "dirlink").symlink_to(ws.parent)
    before = snapshot(ws.parent)
    for name in ("link.md", "inside-link.md", "dirlink/outside.md", "dirlink/ws/link.md"):
        with pytest.raises(PathOutsideWorkspace):
            read_lines(ws, name)
    assert snapshot(ws.parent) == before


def test_missing_and_special_files(ws: Path) -> None:
    with pytest.raises(NotFound):
        read_lines(ws, "memory/none.md")
    with pytest.raises(NotFound):
        read_lines(ws, "memory/2026-01-01/note.md/deeper")
    with pytest.raises(InvalidParams, match="not a regular file"):
        read_lines(ws, "memory")
    os.mkfifo(ws / "fifo")
    with pytest.raises(InvalidParams, match="not a regular file"):
        read_lines(ws, "fifo")  # and it does not hang waiting for a writer


def test_line_ranges_are_one_based_inclusive(ws: Path) -> None:
    note = "memory/2026-01-01/note.md"
    whole = read_lines(ws, note)
    assert (whole.start_line, whole.end_line, whole.total_lines) == (1, 3, 3)
    assert whole.text == "one\ntwo\nthree\n" and not whole.truncated
    mid = read_lines(ws, note, start_line=2, end_line=2)
    assert (mid.text, mid.end_line) == ("two\n", 2)
    clamped = read_lines(ws, note, start_line=2, end_line=99)
    assert (clamped.text, clamped.end_line) == ("two\nthree\n", 3)
    past = read_lines(ws, note, start_line=10)
    assert (past.text, past.end_line, past.total_lines) == ("", 9, 3)
    (ws / "empty.md").write_text("")
    empty = read_lines(ws, "empty.md")
    assert (empty.text, empty.start_line, empty.end_line, empty.total_lines) == ("", 1, 0, 0)
    (ws / "nonl.md").write_text("a\nb")
    assert read_lines(ws, "nonl.md", start_line=2).text == "b"
    assert read_lines(ws, "nonl.md").total_lines == 2


def test_large_files_are_truncated_with_a_flag(ws: Path) -> None:
    (ws / "big.md").write_text("".join(f"line {i:05d}\n" for i in range(1, 20001)))
    got = read_lines(ws, "big.md", max_bytes=1000)
    assert got.truncated and got.total_lines == 20000
    assert got.end_line == 1000 // len("line 00001\n")
    assert got.text.splitlines()[-1] == f"line {got.end_line:05d}"
    (ws / "oneline.md").write_text("x" * 5000)
    head = read_lines(ws, "oneline.md", max_bytes=100)
    assert head.truncated and head.text == "x" * 100 and head.end_line == 1
    # A head cut inside a character ends before it, not in a replacement character.
    (ws / "cjk.md").write_text("记" * 5000, encoding="utf-8")
    for cap in (100, 101, 102):
        head = read_lines(ws, "cjk.md", max_bytes=cap)
        assert head.truncated and head.text == "记" * (cap // 3), cap


def test_invalid_utf8_is_replaced_not_fatal(ws: Path) -> None:
    # (Not Western text in Windows-1252 either: notetext.py reads that as such.)
    (ws / "bin.md").write_bytes(b"ok\n\xff\xfe\xfd\n")
    assert read_lines(ws, "bin.md").text == "ok\n\ufffd\ufffd\ufffd\n"


def test_symlink_swapped_mid_walk_never_escapes(ws: Path) -> None:
    """A directory on the path flips between a real dir and a symlink to the outside.

    Whatever the interleaving, a read returns the inside text or is refused; it never
    returns the outside file.
    """
    secret_dir = ws.parent / "secret"
    secret_dir.mkdir()
    (secret_dir / "note.md").write_text("SECRET\n")
    real = ws / "flip"
    real.mkdir()
    (real / "note.md").write_text("inside\n")
    parked = ws / "flip.real"
    stop = threading.Event()

    def flipper() -> None:
        link = ws / "flip.link"
        while not stop.is_set():
            os.rename(real, parked)
            os.symlink(secret_dir, link)
            os.rename(link, real)  # atomically a symlink now
            time.sleep(0.0002)
            os.unlink(real)
            os.rename(parked, real)  # and a directory again
            time.sleep(0.0002)

    thread = threading.Thread(target=flipper)
    thread.start()
    outcomes: dict[str, int] = {}
    try:
        for _ in range(3000):
            try:
                text = read_lines(ws, "flip/note.md").text
                key = "inside" if text == "inside\n" else f"LEAK {text!r}"
            except PathOutsideWorkspace:
                key = "refused"
            except NotFound:
                key = "missing"
            outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        stop.set()
        thread.join()
    assert not [k for k in outcomes if k.startswith("LEAK")], outcomes
    # Both states were really observed, so the race was exercised.
    assert outcomes.get("inside", 0) > 0 and outcomes.get("refused", 0) > 0, outcomes


def test_open_confined_returns_a_regular_file_fd(ws: Path) -> None:
    fd = open_confined(ws, "memory/2026-01-01/note.md")
    try:
        assert os.read(fd, 3) == b"one"
    finally:
        os.close(fd)


def test_open_inside_follows_directory_links_only_inside(ws: Path, tmp_path: Path) -> None:
    # The indexer's opener, with the root resolved by the caller (once for a batch of
    # files) or by itself: the same answers either way.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "out.md").write_text("SECRET\n")
    os.symlink(tmp_path / "elsewhere", ws / "memory" / "away")
    os.symlink(ws / "memory" / "2026-01-01", ws / "memory" / "alias")
    for real_root in (None, os.path.realpath(ws)):
        fd = open_inside(ws, "memory/alias/note.md", real_root)
        try:
            assert os.read(fd, 3) == b"one"
        finally:
            os.close(fd)
        with pytest.raises(PathOutsideWorkspace):
            open_inside(ws, "memory/away/out.md", real_root)
        with pytest.raises(FileNotFoundError):
            open_inside(ws, "memory/none.md", real_root)


def test_a_walk_that_makes_folders_refuses_links_as_a_reading_one_does(
        ws: Path, tmp_path: Path) -> None:
    # The walk a restore writes through makes the folders missing on the way; a link on
    # the way, at a missing folder's place or put there between its making and its
    # opening, is refused, and nothing is made where a link leads.
    outside = tmp_path / "outside"
    outside.mkdir()
    made: list[str] = []
    fd = open_folder(ws, "digest/wiki/deep", "digest/wiki/deep/a.md", made)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(ws / "digest/wiki/deep"))
    finally:
        os.close(fd)
    assert made == ["digest", "digest/wiki", "digest/wiki/deep"]
    (ws / "memory" / "away").symlink_to(outside)
    (ws / "memory" / "dangling").symlink_to(outside / "none")
    for folder in ("memory/away", "memory/away/x", "memory/dangling/x"):
        with pytest.raises(PathOutsideWorkspace, match="symbolic link"):
            open_folder(ws, folder, f"{folder}/a.md", made)
        with pytest.raises(PathOutsideWorkspace, match="symbolic link"):
            open_folder(ws, folder, f"{folder}/a.md")
    assert not (outside / "none").exists() and list(outside.iterdir()) == []
    with pytest.raises(NotFound):
        open_folder(ws, "memory/missing", "memory/missing/a.md")
    assert not (ws / "memory" / "missing").exists()

    def swapped(parent: int, name: str, walked: str) -> None:
        os.symlink(outside, name, dir_fd=parent)  # another program, just after the mkdir

    with pytest.raises(PathOutsideWorkspace, match="symbolic link"):
        open_parent(ws, ["resource", "late", "a.md"], "resource/late/a.md", swapped)
    assert list(outside.iterdir()) == []
