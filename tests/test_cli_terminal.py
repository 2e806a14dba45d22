"""What the command line prints to a terminal cannot drive the terminal: control
characters in what the daemon sends (a note's text, a path, an error message) are shown
escaped, while a pipe gets a note's text as it is; Ctrl-C at a question ends it on a
line of its own. A real daemon, the real command on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import DaemonFactory, DaemonHandle
from ptyrun import on_a_terminal, read_chunk
from test_cli import SCRIPT, recalld
from waits import wait_for

# Set the window title, clear the screen, ring the bell, move to the line's start.
HOSTILE = "title \x1b]0;owned\x07 clear \x1b[2J bell \x07 back \rover \x9b1m end"
CONTROLS = ("\x1b", "\x07", "\x9b")


@pytest.fixture
def hostile_note(daemon: DaemonHandle) -> str:
    day = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-11-29"
    day.mkdir(parents=True)
    (day / "h.md").write_text(f"# Pangolin\n{HOSTILE}\n", encoding="utf-8")
    daemon.call("index.sync", {"agent_id": "default"})
    return "memory/2026-11-29/h.md"


@pytest.mark.parametrize("command", [["search", "pangolin"], ["read", "memory/2026-11-29/h.md"]])
def test_note_text_is_escaped_on_a_terminal_and_exact_in_a_pipe(
        daemon: DaemonHandle, hostile_note: str, command: list[str]) -> None:
    code, shown = on_a_terminal(command, daemon.env, stdout_too=True)
    assert code == 0, shown
    assert not any(c in shown for c in CONTROLS), repr(shown)
    assert "title \\x1b]0;owned\\x07 clear \\x1b[2J bell \\x07 back \\rover \\x9b1m end" \
        in shown
    assert "Pangolin" in shown
    cmd = [str(SCRIPT)] if SCRIPT.exists() else ["python", "-m", "recalld.ipc"]
    piped = subprocess.run([*cmd, *command], env=daemon.env, capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert piped.returncode == 0 and HOSTILE.encode() in piped.stdout


def test_paths_and_error_messages_are_escaped(daemon: DaemonHandle, tmp_path: Path) -> None:
    odd = tmp_path / "ws \x1b[31mred\x07"
    daemon.call("workspace.open", {"agent_id": "odd", "path": str(odd)})
    for command in (["status"], ["workspace", "list"],
                    ["read", "memory/\x1b]0;owned\x07.md"]):
        code, shown = on_a_terminal(command, daemon.env, stdout_too=True)
        assert not any(c in shown for c in CONTROLS), (command, repr(shown))
        assert "\\x1b" in shown, (command, shown)
    code, shown = on_a_terminal(["read", "memory/\x1b]0;owned\x07.md"], daemon.env,
                                stdout_too=True)
    assert code == 1
    assert shown == ("recalld: no such file in the workspace: memory/\\x1b]0;owned\\x07.md "
                     "(code -32008)\n")
    piped = recalld("read", "memory/\x1b[2J.md", env=daemon.env)  # one line on stderr too
    assert piped.returncode == 1 and "memory/\\x1b[2J.md" in piped.stderr


def test_a_locale_that_cannot_encode_a_note_gets_escapes_and_json_stays_utf8(
        daemon: DaemonHandle) -> None:
    # A note in Chinese, with an emoji and an accent, read by a shell whose locale cannot
    # encode it: text output shows escapes instead of a traceback; --json is UTF-8 always.
    text = "研究 pangolin 🚀 café"
    day = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-11-30"
    day.mkdir(parents=True)
    (day / "u.md").write_text(f"{text}\n", encoding="utf-8")
    daemon.call("index.sync", {"agent_id": "default"})
    encoding = "latin-1"  # de_DE.ISO-8859-1, say: é encodes, 研 and 🚀 do not
    env = {**daemon.env, "PYTHONIOENCODING": encoding}
    cmd = [str(SCRIPT)] if SCRIPT.exists() else ["python", "-m", "recalld.ipc"]
    for command in (["search", "pangolin"], ["read", "memory/2026-11-30/u.md"]):
        shown = subprocess.run([*cmd, *command], env=env, capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=60, check=False)
        assert shown.returncode == 0 and b"Traceback" not in shown.stderr, shown
        assert "\\u7814\\u7a76 pangolin \\U0001f680" in shown.stdout.decode(encoding), shown
        raw = subprocess.run([*cmd, "--json", *command], env=env, capture_output=True,
                             stdin=subprocess.DEVNULL, timeout=60, check=False)
        assert raw.returncode == 0, raw.stderr
        assert text in raw.stdout.decode("utf-8"), raw.stdout


def test_a_table_stays_aligned_where_the_locale_shows_escapes(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A workspace path the output's encoding cannot show is written with escapes
    # (\u65e5), wider than the characters: its column is padded by what is written.
    ws = tmp_path / "日本 über"
    daemon.call("workspace.open", {"agent_id": "jp", "path": str(ws)})
    cmd = [str(SCRIPT)] if SCRIPT.exists() else ["python", "-m", "recalld.ipc"]
    for encoding in ("ascii", "latin-1"):
        shown = subprocess.run([*cmd, "workspace", "list"], capture_output=True,
                               env={**daemon.env, "PYTHONIOENCODING": encoding},
                               stdin=subprocess.DEVNULL, timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.decode(encoding).splitlines()
        assert any("\\u65e5\\u672c" in line for line in lines), lines
        # Where the OPENED_AT column starts: its header, each row's first date.
        starts = {lines[0].index("OPENED_AT")}
        starts |= {m.start() + 2 for line in lines[1:] if (m := re.search(r"  \d{4}-", line))}
        assert len(starts) == 1, "\n".join(lines)


def test_a_file_name_with_a_line_break_stays_on_its_line_in_lists_of_files(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A restore asks before removing the files it lists: a name holding a line break
    # showed as two lines, neither of them the file it removes, and could forge a third.
    from recalld.ipc.cli_ops import verify_lines

    archive = tmp_path / "before.zip"
    assert recalld("backup", "create", "--out", str(archive), env=daemon.env).returncode == 0
    day = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-12-01"
    day.mkdir(parents=True)
    (day / "otter\n  remove kept.md").write_text("# Otter\n", encoding="utf-8")
    plan = recalld("backup", "restore", str(archive), "--dry-run", env=daemon.env)
    assert plan.returncode == 0, plan.stderr
    removes = [line for line in plan.stdout.splitlines() if line.startswith("  remove ")]
    assert removes == ["  remove memory/2026-12-01/otter\\n  remove kept.md"], removes
    # So in what verify lists (paths as index.verify answers them).
    assert verify_lines({"not_indexed": {"count": 1, "paths": ["memory/o\r\nx.md"]},
                          "generation": {"ok": True}}) == ["  not indexed: 1: memory/o\\r\\nx.md"]


def test_ctrl_c_at_a_confirmation_says_nothing_changed_on_a_line_of_its_own(
        daemon: DaemonHandle) -> None:
    # Ctrl-C at "Remove ...? [y/N]" put "recalld: interrupted" after the prompt, on its
    # line. The command runs on a terminal of its own, where Ctrl-C is a SIGINT.
    pid, master = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        try:
            # Ctrl-C acts as in a shell's foreground job, whatever this process has: a
            # test run started in a shell's background has SIGINT ignored, which an exec
            # keeps (^C then did nothing).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.execve(str(SCRIPT), [str(SCRIPT), "remote", "forget", "shared", "--dsn",
                                    "postgresql://127.0.0.1:1/db"], daemon.env)
        finally:
            os._exit(127)
    drawn = b""
    while (chunk := read_chunk(master, 60.0)) is not None:
        drawn += chunk
        if drawn.endswith(b"[y/N] "):
            # Once it waits for the answer: a SIGINT just before the read would leave it
            # set while the read waits on (the ^C itself taken from the input).
            wait_for(lambda: _state(pid) == "S",
                     what="the command waiting for the answer")
            os.write(master, b"\x03")  # what Ctrl-C sends
        assert chunk, drawn  # nothing for 60 s: the prompt never came
    os.close(master)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    lines = drawn.decode().replace("\r\n", "\n").splitlines()
    assert code == 130 and lines[-1] == "recalld: interrupted; nothing was changed", drawn
    assert lines[-2].endswith("[y/N] ^C"), drawn


def _state(pid: int) -> str:
    """The state of process ``pid`` ("S": sleeping, as in a read), from /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_doctor_keeps_a_path_with_a_line_break_on_its_check_line(
        daemon_factory: DaemonFactory) -> None:
    # A socket folder named with a line break split doctor's check lines in a pipe, the
    # rest of the path showing as a line of its own.
    env = daemon_factory.environment()
    d = daemon_factory(RECALLD_SOCKET=f"{env['XDG_RUNTIME_DIR']}/s\nx/r.sock")
    proc = recalld("doctor", env=d.env)
    lines = proc.stdout.splitlines()
    assert any("/s\\nx/r.sock mode 0600" in line for line in lines), proc.stdout
    assert [line for line in lines if not line.startswith(("[", "       fix: "))] == [
        lines[-1]], proc.stdout
    assert lines[-1].endswith("warning(s)"), proc.stdout
