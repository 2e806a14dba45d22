"""A daemon that may not write a file past some size (``ulimit -f``, systemd's
``LimitFSIZE=``, or the largest file its file system holds: FAT's 4 GiB): a pre-restore
backup or pre-restore snapshot that would pass it says so and writes or restores nothing,
and the daemon serves on."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import DaemonFactory
from hooks import start_hook
from test_backup import write_tree
from test_cli import recalld

LIMIT = 8 << 20
#: Start hook: the daemon may write no file past LIMIT bytes (the hard limit as it is).
FILE_SIZE_LIMIT = "\n".join([
    "import resource",
    "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]",
    f"resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, hard))"])


def test_a_snapshot_past_the_file_size_limit_restores_nothing_and_says_so(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Refused with only "I/O error on pre-restore-....zip: File too large" (an internal
    # error), not that nothing was restored or that --no-snapshot restores without it.
    d = daemon_factory(**start_hook(tmp_path, FILE_SIZE_LIMIT))
    ws = tmp_path / "ws"
    write_tree(ws, {"memory/2026-07-23/kept.md": "# Kept\nin the backup\n"})
    d.call("workspace.open", {"agent_id": "w", "path": str(ws)})
    archive = tmp_path / "w.zip"
    d.call("backup.create", {"agents": ["w"], "out": str(archive)})
    dump = ws / "resource" / "dump.bin"  # random bytes: stored whole, past the limit
    dump.write_bytes(os.urandom(LIMIT + (1 << 20)))
    later = ws / "memory" / "2026-07-23" / "later.md"
    later.write_text("# Later\nnot in the backup\n", encoding="utf-8")
    # A backup past the limit names it and the file, and leaves nothing behind.
    for out in (tmp_path / "big.zip", None):
        made = recalld("backup", "create", *(["--out", str(out)] if out else []), env=d.env)
        line = made.stderr.splitlines()[-1]
        assert made.returncode == 1 and "Traceback" not in made.stderr, made
        assert "the backup is larger than a file at " in line, line
        assert "nothing was written" in line and "file size limit" in line, line
        assert str(out) in line if out else "/" not in line.split(" at ")[1], line
    assert set(tmp_path.glob("*.zip")) == {archive} and not list(tmp_path.glob(".*"))
    assert not list((d.data_dir / "backups").glob("*"))
    refused = recalld("backup", "restore", str(archive), "--yes", env=d.env)
    line = refused.stderr.splitlines()[-1]
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused
    assert line.startswith("recalld: no pre-restore snapshot can be taken: "), line
    assert "File too large" in line and "nothing was restored" in line, line
    assert f"written in {d.data_dir / 'backups'}" in line and "--no-snapshot" in line, line
    assert later.exists() and dump.stat().st_size == LIMIT + (1 << 20)
    assert not list((d.data_dir / "backups").glob("pre-restore-*"))
    assert not list((d.data_dir / "backups").glob(".*"))  # no temp file left either
    done = recalld("backup", "restore", str(archive), "--yes", "--no-snapshot", env=d.env)
    assert done.returncode == 0 and not later.exists() and not dump.exists(), done.stderr
    assert d.stop() == 0
