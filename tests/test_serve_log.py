"""``recalld serve --log-file``: the log names workspaces, notes and queries, so it and
its rotations are the owner's only (0600), whatever the umask of the shell that started
the daemon; a log or rotation an earlier start left readable is tightened.

Each record is one line: a note or file name holding a line break (or another control
character) cannot split a record or forge one, and a name whose bytes are not UTF-8 is
written escaped, not lost with a "Logging error" on stderr."""

from __future__ import annotations

import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from hooks import start_hook
from waits import wait_value

from recalld.daemon import logfile
from recalld.daemon import main as serve
from recalld.daemon.logformat import LineFormatter

FORGED = "2026-01-01 00:00:00,000 ERROR recalld: forged"
#: A note named by what looks like a credential: the log shows its name masked.
TOKEN = "ghp_" + "Zq8" * 12
#: Where a record starts: the daemon's LOG_FORMAT.
RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _startup_reconcile(d: DaemonHandle) -> dict[str, object]:
    def watcher() -> dict[str, object]:
        ws = d.call("daemon.status")["workspaces"][0]
        return ws["index"]["watcher"]  # type: ignore[no-any-return]

    return wait_value(watcher, lambda w: (w.get("last_reconcile") or {}).get("reason")
                      == "startup", "the startup reconcile")


def _hostile_names(d: DaemonFactory) -> bytes:
    """The default workspace's day folder the daemon to start finds, holding a note the
    watcher passes by (its name is not UTF-8), named to forge a record, and the temp file
    of a write a kill cut short, removed (and logged) at the start, of a note named by
    a credential and of one whose name is not UTF-8."""
    day = os.fsencode(Path(d.environment()["XDG_DATA_HOME"])
                      / "recalld/workspaces/default/memory/2026-01-02")
    os.makedirs(day)
    with open(day + f"/n\n{FORGED} \x1b[2J\u2028".encode() + b"\xff.md", "wb") as fh:
        fh.write(b"the heron fishes at dawn\n")
    for temp in (b"/.caf\xe9.md.tmp-0123abcd", f"/.{TOKEN}.md.tmp-0123abcd".encode()):
        with open(day + temp, "wb") as fh:
            fh.write(b"x")
    return day


def test_the_log_file_is_private_and_one_record_a_line(daemon_factory: DaemonFactory,
                                                       tmp_path: Path) -> None:
    day = _hostile_names(daemon_factory)
    logs = tmp_path / "logs"
    logs.mkdir()
    old = logs / "recalld.log.2"  # rotated away by an earlier, looser start
    old.write_text("2020-01-01 INFO recalld: opened workspace /home/x/secret-project\n")
    os.chmod(old, 0o644)
    d = daemon_factory(args=["--log-file", str(logs / "recalld.log")],
                       **start_hook(tmp_path, "os.umask(0o022)"))
    assert "\nUmask:\t0022\n" in Path(f"/proc/{d.pid}/status").read_text()
    d.call("memory.add_note", {"agent_id": "default", "content": "the heron fishes at dawn"})
    assert _startup_reconcile(d)["misnamed"]
    assert not os.path.exists(day + b"/.caf\xe9.md.tmp-0123abcd")
    assert d.stop() == 0
    log = logs / "recalld.log"
    lines = log.read_text(encoding="utf-8").splitlines()
    assert [line for line in lines if "recalld serving on" in line]
    assert _mode(log) == 0o600
    assert _mode(old) == 0o600
    assert all(RECORD.match(line) for line in lines), lines
    passed = [line for line in lines if "passing by" in line]
    assert len(passed) == 1, lines
    assert f"memory/2026-01-02/n\\n{FORGED} \\x1b[2J\\u2028\\xff.md: its name" in passed[0]
    left_over = [line for line in lines if "left over by a write cut short" in line]
    assert [line for line in left_over if "/.caf\\xe9.md.tmp-0123abcd" in line], lines
    assert [line for line in left_over if "/.[REDACTED].md.tmp-0123abcd" in line], lines
    assert TOKEN not in "\n".join(lines)
    assert "Logging error" not in d.log(), d.log()


def test_every_rotation_is_created_private(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        handler = logfile.rotating_log(str(tmp_path / "d" / "r.log"))
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


def test_a_traceback_keeps_its_lines_after_its_one_line_record() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record = logging.LogRecord("recalld", logging.ERROR, __file__, 1,
                                   "note %s failed", ("a\r\nb\x00\ud800",), sys.exc_info())
    text = LineFormatter(serve.LOG_FORMAT).format(record)
    first, *rest = text.split("\n")
    assert first.endswith(" ERROR recalld: note a\\r\\nb\\x00\\ud800 failed"), first
    assert rest[0] == "Traceback (most recent call last):", rest
    assert rest[-2:] == ["ValueError: bad", "thing"], rest


def test_a_log_file_that_names_no_place_is_a_one_line_configuration_error(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A ~name of no user, and a relative name from a current directory since deleted:
    # a one-line configuration error naming --log-file, from a start and a check alike.
    env = daemon_factory.environment()
    gone = tmp_path / "gone"
    for extra in ([], ["--check-config"]):
        for log_file, says in (("~no-such-user-x9/r.log", "names no user's home"),
                               ("r.log", "the current directory no longer exists")):
            gone.mkdir()
            proc = subprocess.run(
                ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
                 sys.executable, "-m", "recalld.daemon.main", "serve", *extra,
                 "--log-file", log_file],
                env=env, capture_output=True, text=True, timeout=60, check=False)
            assert proc.returncode == 2, proc.stderr
            [line] = proc.stderr.splitlines()
            assert line.startswith("recalld: configuration error: --log-file = "), line
            assert log_file in line and says in line, line
