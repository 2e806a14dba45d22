"""Archives left unfinished outside the backups folder: a writer killed while it wrote an
archive to a folder a client named leaves its temp file where no start of the daemon
looks; the next backup to that folder removes it, and never a live writer's."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from test_backup import NOTES, write_tree

# A backup writer in its own process: it lists the workspace, starts writing the archive,
# says so on stdout, then is killed ("die") or waits for its stdin to close ("wait").
WRITER = r"""
import os, signal, sys
from pathlib import Path
from recalld.daemon import backup as bk

class Stop:
    def phase(self, name, total=None, bytes_total=None):
        self.writing = name == "writing the archive"
    def advance(self, n=1, nbytes=0):
        if getattr(self, "writing", False):
            print("writing", flush=True)
            self.writing = False
            if sys.argv[1] == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.stdin.read()

source = bk.AgentSource("w", Path(sys.argv[3]), {"daily_dir": "memory"})
bk.create_backup(Path(sys.argv[2]), [source], progress=Stop())
"""


def _writer(how: str, out: Path, root: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, how, str(out), str(root)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "writing\n"  # its temp file is there, being written
    return proc


def test_a_killed_writers_archive_is_removed_by_the_next_backup_to_its_folder(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write_tree(root, NOTES)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    outside = tmp_path / "outside"
    outside.mkdir()
    mine = outside / ".notes.zip.tmp-0123456789ab"  # another program's temp file
    mine.write_bytes(b"not the daemon's")
    with _writer("wait", outside / "live.zip", root) as live:
        live_temp = [p for p in outside.iterdir() if p != mine]
        with _writer("die", outside / "dead.zip", root) as dead:
            assert dead.wait() < 0
        left = [p for p in outside.iterdir() if p not in (mine, *live_temp)]
        assert len(left) == 1 and left[0].stat().st_size > 0  # what the kill left
        made = daemon.call("backup.create", {"agents": ["w"],
                                             "out": str(outside / "next.zip")})
        assert made["file"] == str(outside / "next.zip")
        assert not left[0].exists()  # the dead writer's, gone
        assert len(live_temp) == 1 and live_temp[0].exists()  # the live one's, kept
        assert mine.read_bytes() == b"not the daemon's"
        assert f"removed {left[0]}" in daemon.log()
        assert live.stdin is not None
        live.stdin.close()
        assert live.wait() == 0
    # The live writer went on and published its archive whole.
    with zipfile.ZipFile(outside / "live.zip") as zf:
        assert zf.testzip() is None and "meta.json" in zf.namelist()
    assert sorted(p.name for p in outside.iterdir()) == [
        mine.name, "live.zip", "next.zip"]


def test_a_start_removes_a_killed_writers_archive_in_backups_and_keeps_a_live_ones(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The start's tidy of backups/ removed every temp file there without the lock check:
    # an archive another daemon was writing into this data directory's backups folder
    # (one a client named as the place of its backup) lost its temp file, and the writer
    # published nothing (or failed) once done.
    root = tmp_path / "ws"
    write_tree(root, NOTES)
    data = tmp_path / "data"
    backups = data / "backups"
    backups.mkdir(parents=True, mode=0o700)
    data.chmod(0o700)
    left = backups / ".rollback.json.tmp-0123456789ab"  # a kill while the record was written
    left.write_bytes(b"{")
    with _writer("wait", backups / "live.zip", root) as live:
        live_temp = [p for p in backups.iterdir() if p != left]
        with _writer("die", backups / "dead.zip", root) as dead:
            assert dead.wait() < 0
        dead_temp = [p for p in backups.iterdir() if p not in (left, *live_temp)]
        assert len(live_temp) == 1 and len(dead_temp) == 1
        d = daemon_factory(RECALLD_DATA_DIR=str(data))
        assert d.call("daemon.ping")
        assert live_temp[0].exists()  # the live writer's, kept
        assert not dead_temp[0].exists() and not left.exists()  # the killed ones', gone
        assert dead_temp[0].name in d.log() and left.name in d.log()
        assert live.stdin is not None
        live.stdin.close()
        assert live.wait() == 0
    with zipfile.ZipFile(backups / "live.zip") as zf:
        assert zf.testzip() is None and "meta.json" in zf.namelist()
    assert sorted(p.name for p in backups.iterdir()) == ["live.zip"]


def test_unfinished_archives_of_a_killed_daemon_are_removed_at_start(
        daemon_factory: DaemonFactory) -> None:
    # A daemon killed while it wrote a backup leaves it under a temp name, as large as
    # the memory: the next start removes it (and a state file's), nothing else.
    env = daemon_factory.environment()
    data = Path(env["XDG_DATA_HOME"]) / "recalld"
    left = [data / "backups" / ".recalld-20261203-170117-072-all.zip.tmp-bdb1b287bb8c",
            data / "state" / ".workspaces.json.tmp-0123456789ab"]
    kept = data / "backups" / "mine.zip"
    for path in (*left, kept):
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        path.write_bytes(b"partial")
    d = daemon_factory()
    assert d.data_dir == data
    assert [p for p in left if p.exists()] == [] and kept.exists()
    assert "removed 1 unfinished file(s) in" in d.log()
