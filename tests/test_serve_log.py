"""``recalld serve --log-file``: the log names workspaces, notes and queries, so it and
its rotations are the owner's only (0600), whatever the umask of the shell that started
the daemon; a log or rotation an earlier start left readable is tightened."""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

from conftest import DaemonFactory

from recalld.daemon import main as serve


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_log_file_is_private_under_a_loose_umask(daemon_factory: DaemonFactory,
                                                    tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    old = logs / "recalld.log.2"  # rotated away by an earlier, looser start
    old.write_text("2020-01-01 INFO recalld: opened workspace /home/x/secret-project\n")
    os.chmod(old, 0o644)
    umask_022 = ["sh", "-c", 'umask 022 && exec "$@"', "sh",
                 sys.executable, "-m", "recalld.daemon.main"]
    d = daemon_factory(args=["--log-file", str(logs / "recalld.log")], launcher=umask_022)
    d.call("memory.add_note", {"agent_id": "default", "content": "the heron fishes at dawn"})
    assert d.stop() == 0
    log = logs / "recalld.log"
    assert "recalld serving on" in log.read_text(encoding="utf-8")
    assert _mode(log) == 0o600
    assert _mode(old) == 0o600


def test_every_rotation_is_created_private(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        handler = serve.rotating_log(str(tmp_path / "d" / "r.log"))
    finally:
        os.umask(before)
    handler.maxBytes = 200  # type: ignore[attr-defined]
    record = logging.LogRecord("recalld", logging.INFO, __file__, 1,
                               "searched notes/2024/ledger.md for %s", ("salary",), None)
    before = os.umask(0o022)
    try:
        for _ in range(20):
            handler.emit(record)
    finally:
        os.umask(before)
        handler.close()
    made = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert made == ["r.log", "r.log.1", "r.log.2", "r.log.3"], made
    assert {p.name: _mode(p) for p in (tmp_path / "d").iterdir()} == dict.fromkeys(made, 0o600)
