"""The ``recalld`` command as a person runs it: a real process against a real daemon."""

from __future__ import annotations

import codecs
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from clirun import run_recalld
from conftest import DaemonFactory, DaemonHandle
from waits import wait_for, wait_gone, wait_log

from recalld.daemon.memory.inbox import Inbox
from recalld.ipc._core import lock_holder

SCRIPT = Path(sys.executable).parent / "recalld"


def recalld(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return run_recalld(args, env=env, timeout=timeout)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("recalld: ")
    return lines[0]


def test_status_shows_daemon_and_default_workspace(daemon: DaemonHandle) -> None:
    proc = recalld("status", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert f"pid {daemon.pid}" in proc.stdout
    assert str(daemon.socket_path) in proc.stdout
    assert "default: OK  (ready, " in proc.stdout
    assert str(daemon.data_dir / "workspaces" / "default") in proc.stdout
    config = str(daemon.config_path) + ("" if daemon.config_path.exists()
                                        else " (no such file: the defaults apply)")
    assert f"  config: {config}\n" in proc.stdout, proc.stdout

    status = as_json(recalld("status", "--json", env=daemon.env))
    assert status["pid"] == daemon.pid
    assert [w["agent_id"] for w in status["workspaces"]] == ["default"]
    assert status["config_refused"] is None  # the config file is read (or left out)
    # The global position of --json works too.
    assert as_json(recalld("--json", "status", env=daemon.env))["pid"] == daemon.pid


def test_not_running_is_one_line_and_exit_3(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    sock = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    for args in (["status"], ["ping", "--json"], ["workspace", "list"], ["read", "x.md"],
                 ["search", "q"]):
        proc = recalld(*args, env=env)
        line = assert_one_line_error(proc, 3)
        assert line == f"recalld: daemon not running at {sock} (start it with: recalld serve)"
        assert proc.stdout == ""
    # --socket names another socket, and the message names it.
    other = Path(env["XDG_RUNTIME_DIR"]) / "elsewhere.sock"
    line = assert_one_line_error(recalld("--socket", str(other), "status", env=env), 3)
    assert str(other) in line
    # ...and how to start a daemon there: `recalld serve` alone would serve elsewhere.
    assert line.endswith(f"(start it with: recalld serve --socket {other})"), line


def test_workspace_commands_round_trip(daemon: DaemonHandle, tmp_path: Path) -> None:
    env = daemon.env
    place = tmp_path / "qwenpaw-ws"
    opened = as_json(recalld("workspace", "open", "bob", "--path", str(place), "--config-json",
                             '{"auto_memory_interval": 3}', "--json", env=env))
    assert opened["agent_id"] == "bob" and Path(opened["path"]) == place
    assert opened["settings"]["auto_memory_interval"] == 3
    # Open already: other settings are not taken, and the command says so.
    again = recalld("workspace", "open", "bob", "--path", str(place), "--config-json",
                    '{"auto_memory_interval": 7}', env=env)
    assert again.returncode == 0
    assert "settings not in use: bob was open already" in again.stdout, again.stdout
    assert "  auto_memory_interval = 3\n" in again.stdout, again.stdout
    listed = as_json(recalld("workspace", "list", "--json", env=env))
    assert sorted(w["agent_id"] for w in listed) == ["bob", "default"]
    table = recalld("workspace", "list", env=env)
    assert table.stdout.splitlines()[0].split()[:3] == ["AGENT_ID", "STATE", "PATH"]
    assert any(line.startswith("bob ") for line in table.stdout.splitlines())
    closed = recalld("workspace", "close", "bob", env=env)
    assert closed.returncode == 0 and "bob" in closed.stdout
    listed = as_json(recalld("workspace", "list", "--json", env=env))
    # Closed, still recorded: reopened at the next start unless forgotten.
    assert [(w["agent_id"], w["state"]) for w in listed] == [("default", "ready"),
                                                             ("bob", "closed")]


def test_bad_workspace_config_is_one_line(daemon: DaemonHandle) -> None:
    line = assert_one_line_error(
        recalld("workspace", "open", "x", "--config-json", "[1", env=daemon.env), 2)
    assert "--config-json" in line
    line = assert_one_line_error(
        recalld("workspace", "open", "x", "--config-json", '{"no_such_field": 1}',
                env=daemon.env), 2)
    assert "no_such_field" in line and "(code -32602)" in line
    line = assert_one_line_error(
        recalld("workspace", "open", "x", "--config-json", '{"dream_cron": "0 25 * * *"}',
                env=daemon.env), 2)
    assert 'dream_cron = "0 25 * * *"' in line and "(code -32602)" in line


def test_read(daemon: DaemonHandle) -> None:
    note = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-23" / "commute.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("# Commute\nbike on Mondays\ntrain otherwise\n", encoding="utf-8")
    rel = "memory/2026-07-23/commute.md"
    proc = recalld("read", rel, "--lines", "2-3", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "bike on Mondays\ntrain otherwise\n"
    got = as_json(recalld("read", rel, "--agent", "default", "--json", env=daemon.env))
    assert got["text"] == note.read_text(encoding="utf-8") and got["path"] == rel
    line = assert_one_line_error(recalld("read", "../../etc/passwd", env=daemon.env), 1)
    assert line.endswith("(code -32005)")
    line = assert_one_line_error(recalld("read", "x.md", "--agent", "nobody", env=daemon.env), 1)
    assert "(code -32001); no workspace 'nobody' is configured or recorded" in line, line


def test_ping_and_usage_errors(daemon: DaemonHandle) -> None:
    assert as_json(recalld("ping", "--json", env=daemon.env))["pong"] is True
    assert recalld("ping", env=daemon.env).stdout.startswith("pong")
    proc = recalld("read", "x.md", "--lines", "5-2", env=daemon.env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert recalld("no-such-command", env=daemon.env).returncode == 2


def test_search_and_reindex(daemon: DaemonHandle) -> None:
    note = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-23" / "commute.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("# Commute\nthe VPN says ECONNREFUSED on Mondays\n", encoding="utf-8")
    proc = recalld("search", "ECONNREFUSED", "--sync", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    assert header.startswith("========== memory/2026-07-23/commute.md:1-2 [score=")
    assert "ECONNREFUSED on Mondays" in proc.stdout
    answer = as_json(recalld("search", "ECONNREFUSED", "-n", "1", "--json", env=daemon.env))
    assert [r["path"] for r in answer["results"]] == ["memory/2026-07-23/commute.md"]
    assert "no results" in recalld("search", "zzzunfindable", env=daemon.env).stdout

    job = as_json(recalld("reindex", "--json", env=daemon.env))
    assert job["state"] == "succeeded" and job["kind"] == "reindex"
    assert job["progress"]["done"] == job["progress"]["total"]
    proc = recalld("reindex", env=daemon.env)
    assert proc.returncode == 0 and "succeeded" in proc.stdout, proc.stderr
    submitted = as_json(recalld("reindex", "--no-wait", "--json", env=daemon.env))
    assert submitted["job_id"]
    # A workspace not open: the one line says how to open it, once it is a known one.
    for args in (["search", "ECONNREFUSED", "--agent", "ops.team-2"],
                 ["note", "--agent", "ops.team-2", "the VPN is back"],
                 ["reindex", "--agent", "ops.team-2"], ["jobs", "list", "--agent", "ops.team-2"],
                 ["jobs", "get", "j1", "--agent", "ops.team-2"]):
        line = assert_one_line_error(recalld(*args, env=daemon.env), 1)
        assert line.endswith("(recalld workspace list shows them; recalld workspace open "
                             "ops.team-2 makes a new one)"), line
    assert recalld("workspace", "open", "ops.team-2", env=daemon.env).returncode == 0
    assert recalld("workspace", "close", "ops.team-2", env=daemon.env).returncode == 0
    line = assert_one_line_error(recalld("reindex", "--agent", "ops.team-2", env=daemon.env), 1)
    assert line.endswith("is not open (code -32001); open it with: "
                         "recalld workspace open ops.team-2"), line
    # Closing one that is not open: nothing to open (the daemon's one line, no hint).
    line = assert_one_line_error(recalld("workspace", "close", "ops.team-2", env=daemon.env), 1)
    assert line.endswith("is not open (code -32001)"), line


def test_jobs_inbox_and_note_commands(daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    # An item as a job that changed memory leaves it, written by the daemon's own class.
    inbox = Inbox(root / "mem_metadata" / "inbox" / "inbox.jsonl", "w", publish=None,
                  push_enabled=lambda: True)

    async def push() -> None:
        await inbox.open()
        await inbox.push("auto_dream", "2 nodes refined", ["digest/wiki/vpn.md"])
        # A conflict on a note whose name holds a line break and an escape sequence.
        odd = "memory/2026-01-02/a\n- forged.md\x1b[2J"
        await inbox.push("sync_conflict", f"{odd} was changed on another host first",
                         [odd, f"{odd}.conflict"])

    trio.run(push)
    daemon = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    env = daemon.env

    proc = recalld("note", "the office VPN says ECONNREFUSED", "--agent", "w", env=env)
    assert proc.returncode == 0 and "searchable now" in proc.stdout, proc.stderr
    found = as_json(recalld("search", "ECONNREFUSED", "--agent", "w", "--json", env=env))
    assert [r["path"] for r in found["results"]] == [proc.stdout.split()[-3]]
    assert_one_line_error(recalld("note", "-", "--agent", "w", env=env), 2)  # empty stdin

    job_id = as_json(recalld("reindex", "--agent", "w", "--no-wait", "--json", env=env))["job_id"]
    job = as_json(recalld("jobs", "get", job_id, "--agent", "w", "--json", env=env))
    assert job["kind"] == "reindex" and job["state"] in ("queued", "running", "succeeded")
    # Job ids are unique across agents: --agent is not needed.
    assert as_json(recalld("jobs", "get", job_id, "--json", env=env))["job_id"] == job_id
    listed = recalld("jobs", "list", "--agent", "w", env=env)
    assert listed.returncode == 0 and job_id in listed.stdout and "reindex" in listed.stdout
    cancelled = as_json(recalld("jobs", "cancel", job_id, "--agent", "w", "--json", env=env))
    assert cancelled["state"] in ("cancelled", "succeeded")
    assert_one_line_error(recalld("jobs", "get", "no-such-job", "--agent", "w", env=env), 1)
    assert "no job no-such-job" in assert_one_line_error(
        recalld("jobs", "get", "no-such-job", env=env), 1)

    shown = recalld("inbox", "list", "--agent", "w", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "auto_dream" in shown.stdout and "2 nodes refined" in shown.stdout
    assert "- digest/wiki/vpn.md" in shown.stdout
    odd = "memory/2026-01-02/a\\n- forged.md\\x1b[2J"
    assert f"  {odd} was changed on another host first\n  - {odd}\n  - {odd}.conflict\n" \
        in shown.stdout, shown.stdout
    assert_one_line_error(recalld("inbox", "ack", "--agent", "w", env=env), 2)  # nothing named
    acked = recalld("inbox", "ack", "--all", "--agent", "w", env=env)
    assert "marked 2 item(s) seen" in acked.stdout, acked.stderr
    assert recalld("inbox", "list", "--agent", "w", env=env).stdout == "inbox empty\n"
    assert "(seen)" in recalld("inbox", "list", "--all", "--agent", "w", env=env).stdout
    again = recalld("inbox", "ack", "--all", "--agent", "w", env=env)  # nothing left: fine
    assert again.returncode == 0 and "marked 0 item(s) seen" in again.stdout, again.stderr
    unknown = recalld("inbox", "ack", "nope", "--agent", "w", env=env)
    assert "no inbox item(s) nope for agent w" in assert_one_line_error(unknown, 1)


def test_dream_answers_or_fails_in_one_line(daemon: DaemonHandle) -> None:
    # auto_dream is a job kind that later components add; until then one line, exit 1.
    proc = recalld("dream", "--json", env=daemon.env)
    if proc.returncode == 0:
        assert json.loads(proc.stdout)["kind"] == "auto_dream"
    else:
        # JSON progress lines of the followed job may come first; the error is one line.
        *progress, line = proc.stderr.splitlines()
        assert proc.returncode == 1 and line.startswith("recalld: "), proc.stderr
        assert all(json.loads(p)["event"] == "progress" for p in progress)


def test_serve_when_already_running_exits_3(daemon: DaemonHandle) -> None:
    proc = recalld("serve", env=daemon.env)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert as_json(recalld("ping", "--json", env=daemon.env))["pong"] is True


def test_install_service_write_only(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    written = as_json(recalld("install-service", "--write-only", "--json", env=env))["written"]
    units = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    assert sorted(Path(p).name for p in written) == ["recalld.service", "recalld.socket"]
    assert all(Path(p).parent == units and Path(p).is_file() for p in written)
    proc = recalld("uninstall-service", "--write-only", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not any(units.iterdir())


AUTOSTART = {
    "sync": ("import json; from recalld.ipc.client import Client\n"
             "with Client(autostart=True) as c:\n"
             "    print(json.dumps(c.status()))\n"),
    "trio": ("import json, trio; from recalld.ipc.aclient import AsyncClient\n"
             "async def main():\n"
             "    async with AsyncClient(autostart=True) as c:\n"
             "        print(json.dumps(await c.status()))\n"
             "trio.run(main)\n"),
    "asyncio": ("import json, asyncio; from recalld.ipc.aclient import AsyncClient\n"
                "async def main():\n"
                "    async with AsyncClient(autostart=True) as c:\n"
                "        print(json.dumps(await c.status()))\n"
                "asyncio.run(main())\n"),
}


@pytest.mark.parametrize("flavour", sorted(AUTOSTART))
def test_client_autostart(flavour: str, daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    code = AUTOSTART[flavour]
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    pid = json.loads(proc.stdout)["pid"]
    try:
        assert as_json(recalld("ping", "--json", env=env))["pong"] is True
        # It logs to a file under the state dir, not to /dev/null.
        log = Path(env["XDG_DATA_HOME"]) / "recalld" / "state" / "recalld.log"
        wait_log(log, "recalld serving on", "the daemon's log file")
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_gone(pid, "the auto-started daemon to stop on SIGTERM")
    assert_one_line_error(recalld("status", env=env), 3)


#: A daemon that holds its socket's lock, as each does while it loads, until the pipe
#: whose reading end is its descriptor HELD_FD is closed.
HELD_START = (
    sys.executable, "-c",
    "import os, sys\n"
    "from pathlib import Path\n"
    "from recalld.daemon.rpc.listener import claim_socket\n"
    "claim_socket(Path(os.environ['XDG_RUNTIME_DIR']) / 'recalld' / 'recalld.sock')\n"
    "os.read(int(os.environ['HELD_FD']), 1)\n"
    "from recalld.daemon.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n",
)


@pytest.mark.parametrize("flavour", sorted(AUTOSTART))
def test_an_autostart_waits_for_a_daemon_another_client_is_starting(
        flavour: str, daemon_factory: DaemonFactory) -> None:
    # Agents started together each start a daemon: the first holds the socket's lock
    # while it loads, and the others exit at once, refused. Their clients gave up then
    # ("it exited: recalld is already running"); they wait for the one starting.
    read_end, write_end = os.pipe()
    try:
        d = daemon_factory(launcher=HELD_START, wait=False, pass_fds=(read_end,),
                           HELD_FD=str(read_end))
    finally:
        os.close(read_end)
    env = d.env
    sock = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    wait_for(lambda: lock_holder(sock.with_name(sock.name + ".lock")) == d.pid,
             "the daemon starting to hold its socket's lock")
    start_log = Path(env["XDG_DATA_HOME"]) / "recalld" / "state" / "recalld-start.log"
    code = "from recalld.ipc import _core\n_core.AUTOSTART_WAIT_S = 600.0\n" + AUTOSTART[flavour]
    client = subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_log(start_log, "recalld is already running", "the client's daemon refused")
    finally:
        os.close(write_end)
    try:
        d.wait_ready()
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 0, err
    assert json.loads(out)["pid"] == d.pid


@pytest.mark.parametrize("args", [["--help"], ["workspace", "--help"]])
def test_help(args: list[str], daemon_factory: DaemonFactory) -> None:
    proc = recalld(*args, env=daemon_factory.environment())
    assert proc.returncode == 0 and "usage: recalld" in proc.stdout


def test_autostart_of_a_misconfigured_daemon_says_why_at_once(
        daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    cfg = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("[daemon]\ncpu_threads = 0\n")
    code = ("from recalld.ipc.client import Client\n"
            "from recalld.ipc.errors import DaemonNotRunning\n"
            "try:\n"
            "    Client(autostart=True).ping()\n"
            "except DaemonNotRunning as exc:\n"
            "    print(exc.message)\n"
            "from recalld.ipc._core import autostart_logs\n"
            "print(autostart_logs()[1])\n")
    started = time.monotonic()
    # A umask that lets others read what a program creates (a common login default).
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, check=False, umask=0o022)
    assert proc.returncode == 0, proc.stderr
    assert "cpu_threads = 0: must be from 1 to 256" in proc.stdout, proc.stdout
    assert "recalld-start.log" in proc.stdout
    start_log = Path(proc.stdout.splitlines()[-1])
    assert "configuration error" in start_log.read_text()
    assert stat.S_IMODE(start_log.stat().st_mode) == 0o600
    # It does not wait out the whole autostart deadline for a daemon that cannot start.
    assert time.monotonic() - started < 25


@pytest.mark.parametrize("flavour", sorted(AUTOSTART))
def test_autostart_with_a_file_as_data_folder_says_what_is_in_the_way(
        flavour: str, daemon_factory: DaemonFactory) -> None:
    # XDG_DATA_HOME a file: the client raised "[Errno 17] File exists: ..." making the
    # auto-started daemon's log folder, not an error of its own family naming the file.
    env = daemon_factory.environment()
    data = Path(env["XDG_DATA_HOME"])
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("not a folder")
    proc = subprocess.run([sys.executable, "-c", AUTOSTART[flavour]], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    sock = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    assert proc.stderr.splitlines()[-1] == (
        f"recalld.ipc.errors.DaemonNotRunning: cannot start a daemon for {sock}: cannot "
        f"make {data / 'recalld' / 'state'}: {data} is not a directory; move what is in "
        "the way, or name another data directory (RECALLD_DATA_DIR, [daemon] data_dir)"), \
        proc.stderr


def test_text_that_is_not_utf8_is_a_usage_error_in_one_line(daemon: DaemonHandle) -> None:
    # Bytes that are not UTF-8 reach Python as lone surrogates (argv, a UTF-8 or C locale's
    # stdin): they cannot be sent as JSON. One line and exit 2, never a traceback.
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    for args, stdin in ((["note", "-"], b"caf\xe9 latin-1 text\n"),
                        ([b"search", b"caf\xe9"], b""),
                        ([b"note", b"\xff\xfe"], b"")):
        proc = subprocess.run([*cmd, *args], env=daemon.env, input=stdin,
                              capture_output=True, timeout=60, check=False)
        shown = subprocess.CompletedProcess(proc.args, proc.returncode,
                                            proc.stdout.decode(errors="replace"),
                                            proc.stderr.decode(errors="replace"))
        line = assert_one_line_error(shown, 2)
        assert "UTF-8" in line, line
    # The daemon was never asked: no note was written.
    assert not list((daemon.data_dir / "workspaces" / "default" / "memory").rglob("*.md"))
    # A number past the 64 bits JSON carries is one line too, about the number.
    for args in (["search", "q", "-n", "99999999999999999999"],
                 ["read", "memory/a.md", "--lines", "1-99999999999999999999"]):
        line = assert_one_line_error(recalld(*args, env=daemon.env), 2)
        assert "numbers must lie within" in line and "UTF-8" not in line, line


def test_a_note_piped_in_with_a_byte_order_mark_is_read_past_it(daemon: DaemonHandle) -> None:
    # As Windows editors save text: UTF-8 with a mark, UTF-16 and UTF-32 with theirs.
    # The mark is no part of the note: its first line stays a Markdown heading.
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    text = "# Boiler room\n- the valve 弁 is under the stairs\n"
    for n, data in enumerate((codecs.BOM_UTF8 + text.encode(), text.encode("utf-16"),
                              text.encode("utf-32"), text.encode("utf-16-be"))):
        marked = data if n < 3 else codecs.BOM_UTF16_BE + data
        proc = subprocess.run([*cmd, "note", "-", "--name", f"boiler-{n}", "--json"],
                              input=marked, capture_output=True, env=daemon.env, timeout=60,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        note = daemon.data_dir / "workspaces" / "default" / json.loads(proc.stdout)["path"]
        assert note.read_text(encoding="utf-8").endswith("\n---\n" + text), n
    # Bytes its mark's encoding cannot read: one line and exit 2, naming it.
    proc = subprocess.run([*cmd, "note", "-"], input=codecs.BOM_UTF16_LE + b"\x00\xd8",
                          capture_output=True, env=daemon.env, timeout=60, check=False)
    line = assert_one_line_error(subprocess.CompletedProcess(
        proc.args, proc.returncode, "", proc.stderr.decode()), 2)
    assert "not UTF-16 text after its byte order mark" in line, line


def test_note_from_stdin_in_any_locale_and_a_closed_stdin(daemon: DaemonHandle,
                                                           tmp_path: Path) -> None:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    # A UTF-8 file piped in keeps its characters under an ASCII locale; text typed in a
    # Latin-1 terminal is taken in its encoding.
    umbrella = "雨伞 in the hall 🌂"
    for encoding, stdin, kept in (("ascii", f"{umbrella}\n".encode(), umbrella),
                                  ("latin-1", b"gr\xfcn umbrella\n", "grün umbrella")):
        proc = subprocess.run([*cmd, "note", "-", "--json"], input=stdin, capture_output=True,
                              env={**daemon.env, "PYTHONIOENCODING": encoding}, timeout=60,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        note = daemon.data_dir / "workspaces" / "default" / json.loads(proc.stdout)["path"]
        assert kept in note.read_text(encoding="utf-8")
    # stdin closed from the start (<&-): one line and exit 2, for a note as for a restore.
    archive = tmp_path / "b.zip"
    assert recalld("backup", "create", "--out", str(archive), env=daemon.env).returncode == 0
    for args in (["note", "-"], ["backup", "restore", str(archive)]):
        proc = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *cmd, *args],
                              env=daemon.env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        line = proc.stderr.splitlines()[-1]  # after a restore's progress lines
        assert line.startswith("recalld: ") and "stdin" in line, proc.stderr


def test_a_note_whose_answer_stdout_refuses_says_it_was_written(daemon: DaemonHandle) -> None:
    # `recalld note ... > /dev/full`: the daemon wrote the note before stdout refused the
    # answer; a bare "[Errno 28]" had it taken for a failure and written twice.
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*cmd, "note", "kettle descaled on tuesday"], stdout=full,
                              stderr=subprocess.PIPE, env=daemon.env, text=True,
                              timeout=60, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "No space left" in proc.stderr and "carried the command out" in proc.stderr
    notes = (daemon.data_dir / "workspaces" / "default" / "memory").rglob("*.md")
    assert any("kettle descaled" in n.read_text(encoding="utf-8") for n in notes)
