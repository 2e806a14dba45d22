"""A full disk, as an operator meets it: a real daemon on a small file system of its own
(a tmpfs, so these tests need the right to mount one: root), filled to the last block
or inode."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DaemonFactory
from test_cli import assert_one_line_error, recalld

from recalld.ipc.errors import DiskFull


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs with 64 inodes, unmounted afterwards (skips where none can be)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=64", "tmpfs",
                           str(mount)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a small file system here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_blocks(mount: Path) -> None:
    with open(mount / "filler", "wb", buffering=0) as filler:
        with pytest.raises(OSError, match="No space left"):
            while True:
                filler.write(b"\0" * 4096)


def fill_inodes(mount: Path) -> None:
    with pytest.raises(OSError, match="No space left"):
        for i in range(1 << 16):
            (mount / f"i{i}").touch()


def test_a_full_disk_does_not_keep_the_daemon_from_starting_or_serving(
        daemon_factory: DaemonFactory, small_fs: Path) -> None:
    # The lock files are emptied when a daemon lets go of them, so writing the pid into
    # them at the next start needs a block: on a full disk the daemon did not start
    # ("cannot use the data directory ...: No space left on device: None"), and a
    # workspace there could not be opened ("cannot lock workspace"), nor opened again
    # once space was freed (its lock was left held by the daemon itself).
    data = small_fs / "data"
    data.mkdir(mode=0o700)
    note = data / "workspaces" / "default" / "memory" / "2026-03-01" / "heron.md"
    note.parent.mkdir(parents=True)
    note.write_text("# Heron\nthe grey heron nests by the weir\n", encoding="utf-8")
    d = daemon_factory(RECALLD_DATA_DIR=str(data))
    assert "heron.md" in recalld("search", "heron", "--sync", env=d.env).stdout
    assert d.stop() == 0
    fill_blocks(small_fs)
    d = daemon_factory(RECALLD_DATA_DIR=str(data))  # waits for it to be ready
    found = recalld("search", "heron", env=d.env)
    assert found.returncode == 0 and "memory/2026-03-01/heron.md" in found.stdout, found
    opened = recalld("workspace", "open", "ducks", env=d.env)
    assert opened.returncode == 0, opened.stderr
    assert d.stop() == 0


def test_a_data_folder_a_full_disk_keeps_from_being_made_is_retried(
        daemon_factory: DaemonFactory, small_fs: Path) -> None:
    # A full disk is not the person's mistake in the config: exit 1, which systemd's
    # Restart=on-failure retries (2 would stop it for good), with one line naming it.
    fill_inodes(small_fs)
    data = small_fs / "data"
    daemon = daemon_factory(RECALLD_DATA_DIR=str(data), wait=False)
    assert daemon.proc.wait(timeout=60) == 1
    lines = daemon.log().strip().splitlines()
    assert lines[-1].startswith(f"recalld: cannot use the data directory {data}: No space"), \
        lines
    assert "Traceback" not in daemon.log()


def test_a_workspace_with_no_room_for_its_folders_is_a_failure_not_a_usage_error(
        daemon_factory: DaemonFactory, small_fs: Path) -> None:
    # Its folders cannot be made on a disk out of inodes: that was answered as invalid
    # params (exit 2), as if the command had been typed wrong.
    fill_inodes(small_fs)
    d = daemon_factory()
    line = assert_one_line_error(
        recalld("workspace", "open", "full", "--path", str(small_fs / "ws"), env=d.env), 1)
    assert "No space left on device" in line and line.endswith("(code -32011)"), line
    assert d.stop() == 0


def test_a_restore_whose_snapshot_finds_no_room_says_what_to_do(
        daemon_factory: DaemonFactory, small_fs: Path, tmp_path: Path) -> None:
    # The snapshot goes to <data>/backups: on a full disk the restore was refused with
    # only "disk full writing pre-restore-....zip", not that nothing was restored, where
    # to free space, or that --no-snapshot restores without it.
    data = small_fs / "data"
    data.mkdir(mode=0o700)
    ws = tmp_path / "far"
    (ws / "memory" / "d").mkdir(parents=True)
    (ws / "memory" / "d" / "kept.md").write_text("# Kept\nin the backup\n", encoding="utf-8")
    d = daemon_factory(f'[workspaces.far]\npath = "{ws}"\n', RECALLD_DATA_DIR=str(data))
    archive = tmp_path / "far.zip"
    made = recalld("backup", "create", "--agent", "far", "--out", str(archive), env=d.env)
    assert made.returncode == 0, made.stderr
    later = ws / "memory" / "d" / "later.md"
    later.write_text("# Later\nnot in the backup\n", encoding="utf-8")
    fill_blocks(small_fs)
    refused = recalld("backup", "restore", str(archive), "--yes", env=d.env)
    line = refused.stderr.splitlines()[-1]
    assert refused.returncode == 1 and line.endswith("(code -32011)"), refused
    assert "nothing was restored" in line and f"free space in {data / 'backups'}" in line, line
    assert "--no-snapshot" in line and later.exists(), line
    # Without a snapshot the restore still writes its journal first (a start after a kill
    # finishes it): with no room for that either, it says so, and restores nothing.
    refused = recalld("backup", "restore", str(archive), "--yes", "--no-snapshot", env=d.env)
    line = refused.stderr.splitlines()[-1]
    assert refused.returncode == 1 and line.endswith("(code -32011)"), refused
    assert "no room for the restore's journal" in line, line
    assert f"nothing was restored: free space in {data / 'backups'}" in line, line
    assert later.exists()
    (small_fs / "filler").unlink()
    done = recalld("backup", "restore", str(archive), "--yes", "--no-snapshot", env=d.env)
    assert done.returncode == 0 and not later.exists(), done.stderr
    assert d.stop() == 0


def test_a_backup_to_a_full_disk_names_the_archive_and_leaves_nothing(
        daemon_factory: DaemonFactory, small_fs: Path, tmp_path: Path) -> None:
    # An --out of the person's own on a full disk was named by its base name only.
    d = daemon_factory()
    notes = tmp_path / "ws" / "memory" / "2026-03-01"
    notes.mkdir(parents=True)
    (notes / "noise.md").write_bytes(os.urandom(1 << 19).hex().encode())
    d.call("workspace.open", {"agent_id": "w", "path": str(tmp_path / "ws")})
    out = small_fs / "b.zip"
    with pytest.raises(DiskFull) as full:
        d.call("backup.create", {"agents": ["w"], "out": str(out)})
    assert full.value.message == f"disk full writing the backup to {out}: nothing was written"
    assert list(small_fs.iterdir()) == []


def test_a_note_the_full_disk_refused_shows_in_status_until_one_is_written(
        daemon_factory: DaemonFactory, small_fs: Path) -> None:
    # A note refused with "disk full" left status saying "OK" and health "clean": only
    # doctor's free-space check told, and nothing said that writes were failing.
    d = daemon_factory()
    ws = small_fs / "ws"
    opened = recalld("workspace", "open", "kestrel", "--path", str(ws), env=d.env)
    assert opened.returncode == 0, opened.stderr
    first = recalld("note", "--agent", "kestrel", "the kestrel hovers over the verge", env=d.env)
    assert first.returncode == 0, first.stderr
    fill_blocks(small_fs)
    refused = recalld("note", "--agent", "kestrel", "Турманы кружат над крышей, "
                      "鸽子在屋顶上盘旋 " * 40, env=d.env)
    assert refused.returncode == 1 and refused.stderr.endswith("(code -32011)\n"), refused
    health = next(w["health"] for w in d.call("daemon.status")["workspaces"]
                  if w["agent_id"] == "kestrel")
    assert health["state"] == "degraded", health
    [failing] = health["write_errors"]
    assert failing["errno"] == "ENOSPC" and failing["count"] == 1, failing
    assert any(r.startswith("writing notes fails: the disk is full") for r in health["reasons"])
    shown = recalld("status", env=d.env).stdout
    block = shown[shown.index("kestrel:"):]
    assert block.startswith("kestrel: 1 problem(s)"), shown
    assert "[FAIL] writing notes fails: the disk is full (ENOSPC" in block, block
    assert f"fix: free space on the file system of {ws}" in block, block
    doctor = recalld("doctor", env=d.env).stdout
    assert "[FAIL] workspace kestrel: writing notes fails: the disk is full" in doctor, doctor
    (small_fs / "filler").unlink()
    again = recalld("note", "--agent", "kestrel", "the kestrel is back", env=d.env)
    assert again.returncode == 0, again.stderr
    health = next(w["health"] for w in d.call("daemon.status")["workspaces"]
                  if w["agent_id"] == "kestrel")
    assert health["write_errors"] == [], health
    assert not any(r.startswith("writing notes fails") for r in health["reasons"]), health
    assert d.stop() == 0


def test_a_workspace_on_a_read_only_file_system_is_told_how_to_be_served(
        daemon_factory: DaemonFactory, small_fs: Path, tmp_path: Path) -> None:
    # A workspace refused as read-only (EROFS) was shown with the fix "recalld workspace
    # open NAME", which fails the same way as long as the folder stays read-only.
    kept = small_fs / "kept"  # served before: its folders are there, its lock is not
    for folder in ("memory/2026-03-01", "digest", "mem_session", "resource", "mem_metadata"):
        (kept / folder).mkdir(parents=True)
    (kept / "memory" / "2026-03-01" / "tern.md").write_text("# Tern\nterns dive\n", "utf-8")
    done = subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], capture_output=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    d = daemon_factory()
    for agent, root in (("fresh", small_fs / "fresh"), ("kept", kept)):
        line = assert_one_line_error(
            recalld("workspace", "open", agent, "--path", str(root), env=d.env), 2)
        assert "Read-only file system" in line, line
    shown = recalld("status", env=d.env).stdout
    for agent, root in (("fresh", small_fs / "fresh"), ("kept", kept)):
        block = shown.split(f"\n{agent}: ", 1)[1].split("\n\n", 1)[0]
        assert f"fix: {root} is on a read-only file system: remount it read-write" in block, \
            block
        assert f"recalld workspace open {agent} --path DIR" in block, block
    info = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "kept")
    assert info["state"] == "failed" and info["error_errno"] == "EROFS", info
    # What the fix says works: served from a writable folder.
    assert recalld("workspace", "close", "fresh", env=d.env).returncode == 0
    moved = recalld("workspace", "open", "fresh", "--path", str(tmp_path / "rw"), env=d.env)
    assert moved.returncode == 0, moved.stderr
    assert d.stop() == 0


def test_status_says_a_workspace_is_low_on_space_before_a_write_fails(
        daemon_factory: DaemonFactory, small_fs: Path) -> None:
    # Status said OK on a full disk until a note was refused: only doctor measured free
    # space. It measures now as it answers, by doctor's rule, once per file system.
    d = daemon_factory()
    ws = small_fs / "ws"
    opened = recalld("workspace", "open", "godwit", "--path", str(ws), env=d.env)
    assert opened.returncode == 0, opened.stderr
    fill_blocks(small_fs)
    [low] = [disk for disk in d.call("daemon.status")["disks"] if disk["level"] != "ok"]
    assert low["path"] == str(ws) and low["holds"] == ["workspace godwit"], low
    assert low["level"] == "fail" and low["free_bytes"] < 64 << 10, low
    shown = recalld("status", env=d.env).stdout
    [line] = [ln for ln in shown.splitlines() if "low on disk space" in ln]
    assert line.startswith("  [FAIL] low on disk space: "), line
    assert line.endswith(f"0 MiB free of 0 MiB at {ws} (workspace godwit)"), line
    assert f"fix: free space on the file system of {ws}" in shown, shown
    doctor = recalld("doctor", env=d.env).stdout
    assert doctor.count(f"at {ws} (workspace godwit)") == 1, doctor
    assert d.stop() == 0


def test_status_says_a_file_system_out_of_inodes_is_full(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Bytes to spare but no inode left refuses every new note (ENOSPC) all the same:
    # status and doctor rated only the bytes, and said OK.
    roomy = tmp_path / "roomy"
    roomy.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g,nr_inodes=64", "tmpfs",
                           str(roomy)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a file system here (needs root)")
    try:
        d = daemon_factory()
        ws = roomy / "ws"
        d.call("workspace.open", {"agent_id": "knot", "path": str(ws)})
        fill_inodes(roomy)
        [low] = [disk for disk in d.call("daemon.status")["disks"] if disk["level"] != "ok"]
        assert low["path"] == str(ws) and low["level"] == "fail", low
        assert low["free_inodes"] == 0 and low["free_bytes"] > 1 << 30, low
        shown = recalld("status", env=d.env).stdout
        [line] = [ln for ln in shown.splitlines() if "low on disk space" in ln]
        assert line.startswith("  [FAIL] low on disk space: no inode free (of 64), "), line
        assert line.endswith(f" MiB at {ws} (workspace knot)"), line
        doctor = recalld("doctor", env=d.env).stdout
        assert "[FAIL] disk: no inode free (of 64), " in doctor, doctor
        assert d.stop() == 0
    finally:
        subprocess.run(["umount", "-l", str(roomy)], check=False)
