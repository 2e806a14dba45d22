"""Exit codes of every client subcommand: 0 success, 1 failure (an error answered by the
daemon), 2 usage (ours or found by the daemon), 3 no daemon; a closed pipe ends quietly."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DaemonFactory, DaemonHandle
from test_cli import SCRIPT, as_json, assert_one_line_error, recalld

from recalld.ipc import __version__
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.cli import build_parser, main
from recalld.ipc.client import Client

NOTE = "memory/2026-07-23/commute.md"
# One row per subcommand: (name, success, usage error, daemon error). None: that outcome
# cannot be provoked from the command line (the reason is in the comment).
ROWS: list[tuple[str, list[str], list[str], list[str] | None]] = [
    ("status", ["status"], ["status", "extra"], None),  # no error status can answer
    ("ping", ["ping"], ["ping", "--timeout", "-1"], None),  # ping always answers
    # Refusals of workspace.open are about its params (exit 2); a workspace another daemon
    # serves (-32002, exit 1) needs a second daemon: test_lock.
    ("workspace open", ["workspace", "open", "t1"], ["workspace", "open", "bad/id"], None),
    ("workspace list", ["workspace", "list"], ["workspace", "list", "x"], None),  # nothing fails
    ("workspace close", ["workspace", "close", "t1"], ["workspace", "close"],
     ["workspace", "close", "nobody"]),
    ("read", ["read", NOTE], ["read", NOTE, "--lines", "5-2"], ["read", "nofile.md"]),
    ("search", ["search", "bike"], ["search", "bike", "-n", "0"],
     ["search", "bike", "--agent", "nobody"]),
    ("reindex", ["reindex"], ["reindex", "--agent"], ["reindex", "--agent", "nobody"]),
    ("dream", ["dream", "--runs"], ["dream", "--runs", "x"], ["dream"]),  # no chat model
    ("jobs list", ["jobs", "list"], ["jobs"], ["jobs", "list", "--agent", "nobody"]),
    ("jobs get", ["jobs", "get", "JOB"], ["jobs", "get"], ["jobs", "get", "no-such-job"]),
    ("jobs cancel", ["jobs", "cancel", "JOB"], ["jobs", "cancel"],
     ["jobs", "cancel", "no-such-job"]),
    ("inbox list", ["inbox", "list"], ["inbox", "list", "--since"],
     ["inbox", "list", "--agent", "nobody"]),
    ("inbox ack", ["inbox", "ack", "--all"], ["inbox", "ack"], ["inbox", "ack", "nope"]),
    ("note", ["note", "bike on Mondays"], ["note", " "], ["note", "x", "--agent", "nobody"]),
    ("changes", ["changes"], ["changes", "-n", "0"], ["changes", "--agent", "nobody"]),
    ("backup create", ["backup", "create", "--out", "OUT"], ["backup"],
     ["backup", "create", "--agent", "nobody"]),
    ("backup list", ["backup", "list"], ["backup", "list", "x"], None),  # nothing fails
    # An archive the daemon refuses (not a zip here; missing, hostile, bad checksums in
    # test_refused_archives_exit_1_naming_the_archive) is a failure: the command line was
    # right, the archive is bad (-32012, exit 1).
    ("backup verify", ["backup", "verify", "OUT"], ["backup", "verify"],
     ["backup", "verify", "BAD"]),
    ("backup restore", ["backup", "restore", "OUT", "--yes"], ["backup", "restore", "OUT"],
     ["backup", "restore", "BAD", "--yes"]),
    ("backup rollback", ["backup", "rollback", "--yes"], ["backup", "rollback", "x"],
     None),  # succeeds after the restore above; its failure is in test_ops
    ("verify", ["verify"], ["verify", "--agent"], ["verify", "--agent", "nobody"]),
    ("compact", ["compact"], ["compact", "x"], ["compact", "--agent", "nobody"]),
    ("metrics", ["metrics"], ["metrics", "--prometheus", "x"], None),  # nothing fails
    # Its refusals are about the folder or the agent.json named (exit 2).
    ("import-qwenpaw", ["import-qwenpaw", "QWS", "--agent", "qw1"], ["import-qwenpaw", "BAD"],
     None),
]
# Commands that do not talk to a running daemon the usual way, tested on their own:
# serve (test_cli), mcp (test_mcp), install-service and uninstall-service (test_cli_paths),
# doctor (below and test_ops).
# Tested on their own: ``remote release`` needs a shared workspace (test_remote_guard),
# ``remote forget`` a PostgreSQL server (test_remote_forget); ``stop`` ends the daemon the
# table runs against (test_cli_stop).
OWN_TESTS = {"serve", "mcp", "install-service", "uninstall-service", "doctor", "remote release",
             "remote forget", "stop"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands() -> set[str]:
    names = set()
    for name, child in _subcommands(build_parser()).items():
        nested = _subcommands(child)
        names |= {f"{name} {n}" for n in nested} if nested else {name}
    return names


def test_the_table_covers_every_subcommand() -> None:
    covered = {name for name, *_ in ROWS} | OWN_TESTS
    assert _commands() <= covered, sorted(_commands() - covered)


def test_every_command_s_help_says_what_it_does() -> None:
    # `recalld workspace open --help` showed its usage and options but no line saying
    # what the command does, which every other command's help had.
    def undescribed(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found = []
        for name, child in _subcommands(parser).items():
            if not child.description:
                found.append(f"{path}{name}")
            found += undescribed(child, f"{path}{name} ")
        return found

    assert undescribed(build_parser(), "") == []


def _fill(args: list[str], **values: str) -> list[str]:
    return [values.get(a, a) for a in args]


def cli_main(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit code and stderr of ``recalld ARGS`` run by the command's ``main`` in this
    process, under ``env`` (a process start each would cost 0.1-1 s, the most of a call)."""
    capsys.readouterr()
    with monkeypatch.context() as m:
        for name in set(os.environ) - set(env):
            m.delenv(name)
        for name, value in env.items():
            m.setenv(name, value)
        m.setattr(sys, "stdout", sys.stdout)  # main wraps it for the command's output
        code = main(args)
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_exit_codes_of_every_subcommand(daemon: DaemonHandle, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Success and the daemon's errors run the command as a process; a usage error runs
    # its main in process: its code is what the command exits with.
    note = daemon.data_dir / "workspaces" / "default" / NOTE
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("# Commute\nbike on Mondays\ntrain otherwise\n", encoding="utf-8")
    bad_zip = tmp_path / "bad.zip"
    bad_zip.write_bytes(b"not a zip")
    qws = tmp_path / "qwenpaw"
    qws.mkdir()
    values = {"OUT": str(tmp_path / "b.zip"), "BAD": str(bad_zip), "QWS": str(qws)}
    env = daemon.env
    for name, success, usage, error in ROWS:
        if name.startswith("jobs ") and name != "jobs list" and "JOB" not in values:
            # One job for both rows: a second reindex submitted while the first still runs
            # is refused (one reindex at a time), and cancelling a finished job is no error.
            submitted = recalld("reindex", "--no-wait", "--json", env=env)
            values["JOB"] = submitted.stdout.split('"job_id": "')[1].split('"')[0]
        ok = recalld(*_fill(success, **values), env=env)
        assert ok.returncode == 0, (name, ok.stdout, ok.stderr)
        code, stderr = cli_main(_fill(usage, **values), env, monkeypatch, capsys)
        assert code == 2 and stderr.strip(), (name, stderr)
        if error is not None:
            failed = recalld(*_fill(error, **values), env=env)
            # A followed job's progress lines may come first; the error is the last line.
            *progress, line = failed.stderr.splitlines() or [""]
            assert failed.returncode == 1 and line.startswith("recalld: "), (name, failed)
            assert all(p.startswith(name.split()[0]) or p.startswith("auto_dream ")
                       for p in progress), (name, failed.stderr)
            assert "(code -3" in line or "no job" in line or "no inbox item" in line, (name, line)


def test_every_subcommand_says_daemon_down_with_3(
        daemon_factory: DaemonFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    env = daemon_factory.environment()
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    values = {"OUT": str(tmp_path / "b.zip"), "BAD": str(tmp_path / "b.zip"), "JOB": "j",
              "QWS": str(tmp_path)}
    for name, success, _, _ in ROWS:
        code, stderr = cli_main(_fill(success, **values), env, monkeypatch, capsys)
        assert code == 3 and stderr.startswith("recalld: daemon not running at "), (name, stderr)
        assert stderr.count("\n") == 1, (name, stderr)
    proc = recalld("doctor", env=env)  # doctor reports instead: the daemon check fails
    assert proc.returncode == 1 and "[FAIL] daemon: no daemon answers" in proc.stdout


@pytest.mark.parametrize("refusing", ["full", "reader gone"])
def test_a_stderr_that_refuses_the_error_line_keeps_the_exit_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusing: str) -> None:
    # `recalld ping 2>/dev/full`, or stderr a pipe whose reader has gone: the line saying
    # what failed cannot be written, but the status still tells it (3 here: no daemon),
    # never 0 as for a reader of the answer gone away, nor a traceback's 1.
    if refusing == "full":
        err = open("/dev/full", "w", encoding="utf-8")
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)
        err = open(write_end, "w", encoding="utf-8")
    with err:
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(sys, "stdout", sys.stdout)  # main wraps it for the output
        for args, code in ((["--socket", str(tmp_path / "none.sock"), "ping"], 3),
                           (["--socket", str(tmp_path / "none.sock"), "read", "x.md"], 3),
                           (["--timeout", "-1", "ping"], 2)):
            assert main(args) == code, args


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["backup", "create", "--help"],
                                  ["serve", "--help"]])
def test_help_or_version_that_stdout_refuses_is_an_error(tmp_path: Path,
                                                         args: list[str]) -> None:
    # `recalld --version > /dev/full` ended with status 0, its text lost without a word
    # (argparse passes over a failed write). It is one line and status 1, as a refused
    # answer is; a reader gone away (`| head -1`) still ends it quietly with 0.
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open("/dev/full", "wb") as full:
        for stdout, code in ((full, 1), (write_end, 0)):
            proc = subprocess.run([str(SCRIPT), *args], stdout=stdout, stderr=subprocess.PIPE,
                                  text=True, timeout=60, check=False, cwd=tmp_path)
            assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr
            assert proc.stderr == ("" if code == 0 else "recalld: the text could not be "
                                   "written to standard output ([Errno 28] No space left "
                                   "on device)\n"), proc.stderr
    os.close(write_end)


def test_usage_errors_found_locally(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    for args in (["--timeout", "-1", "status"], ["status", "--timeout", "0"],
                 ["status", "--timeout", "inf"], ["doctor", "x"], ["no-such-command"],
                 # JSON has no nan or inf: sent, they would mean no minimum at all.
                 ["search", "q", "--min-score", "nan"], ["search", "q", "--min-score", "inf"],
                 # A restore of FILE is not a rollback: the one flag must not drop the other.
                 ["backup", "restore", "b.zip", "--rollback"],
                 ["backup", "restore", "--rollback", "--agent", "a"]):
        proc = recalld(*args, env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
    version = recalld("--version", env=env)
    assert version.returncode == 0 and version.stdout == f"recalld {__version__}\n"


def test_a_timeout_longer_than_the_clock_can_count_waits_as_long_as_it_can(
        daemon: DaemonHandle) -> None:
    # 1e300 s ("forever"), or any wait past the ~292 years a socket or lock wait can
    # hold, waits that long instead of ending in an OverflowError traceback.
    for args in (["--timeout", "1e300", "ping"], ["--timeout", "1e10", "--json", "status"],
                 ["--timeout", "1e300", "reindex"]):
        proc = recalld(*args, env=daemon.env)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    with Client(daemon.socket_path, timeout_s=1e300, connect_timeout_s=1e300) as client:
        assert client.ping()["pong"]
        client.subscribe(["job.*"])
        job = client.call("jobs.submit", {"agent_id": "default", "kind": "reindex"})
        first = next(client.events(timeout_s=1e300))  # the job's first event
        assert first.topic.startswith("job.") and first.data["job_id"] == job["job_id"], first


@pytest.mark.parametrize("value", [float("nan"), -1.0, 0, "30", True])
@pytest.mark.parametrize("name", ["timeout_s", "connect_timeout_s"])
def test_a_client_wait_that_is_no_positive_number_is_refused_at_once(
        name: str, value: object) -> None:
    # A NaN timeout was taken and failed every call, each with another error (a NaN
    # deadline, a negative or zero one timed every call out at once).
    for flavour in (Client, AsyncClient):
        with pytest.raises(ValueError, match=f"^{name} must be a number of seconds"):
            flavour("/tmp/unused.sock", **{name: value})


@pytest.mark.parametrize("value", [float("nan"), -0.5, "5", True, [1]])
def test_an_events_wait_that_is_no_number_of_seconds_is_refused_at_once(value: object) -> None:
    # A NaN or a string failed inside the wait with anyio's or the standard library's
    # error ("deadline must not be NaN", "unsupported operand type(s)"), and only once
    # iterated; a negative one was taken for 0.
    said = "^timeout_s must be a number of seconds, 0 or more"
    with pytest.raises(ValueError, match=said):
        Client("/tmp/unused.sock").events(timeout_s=value)
    aclient = AsyncClient("/tmp/unused.sock")
    with pytest.raises(ValueError, match=said):
        aclient.events(timeout_s=value)
    with pytest.raises(ValueError, match=said):
        asyncio.run(aclient.next_event(timeout_s=value))
    # 0 takes the events already arrived: none here, and no wait for a connection.
    assert asyncio.run(aclient.next_event(timeout_s=0)) is None


@pytest.mark.parametrize("lines", [80_001])
def test_read_of_a_long_note_is_complete_and_a_closed_pipe_is_quiet(
        daemon: DaemonHandle, lines: int) -> None:
    note = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-23" / "long.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"line {i} of a long note\n" for i in range(1, lines + 1))
    note.write_text(text, encoding="utf-8")
    rel = "memory/2026-07-23/long.md"
    proc = recalld("read", rel, env=daemon.env, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == text
    tail = recalld("read", rel, "--lines", f"{lines - 1}-{lines}", env=daemon.env)
    assert tail.stdout == f"line {lines - 1} of a long note\nline {lines} of a long note\n"

    # `recalld read ... | head -1`: the reader goes away after one line.
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    with subprocess.Popen([*cmd, "read", rel], env=daemon.env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) as piped:
        assert piped.stdout is not None and piped.stderr is not None
        assert piped.stdout.readline() == b"line 1 of a long note\n"
        piped.stdout.close()
        code = piped.wait(timeout=120)
        err = piped.stderr.read().decode()
    assert code == 0 and err == "", (code, err)


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_stream_closed_from_the_start_is_quiet(daemon: DaemonHandle, closed: str) -> None:
    # `recalld status >&-`: nothing to print to is not a failure, and never a traceback.
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    redirect = ">&-" if closed == "stdout" else "2>&-"
    for args in (["status"], ["search", "bike"], ["reindex"]):
        proc = subprocess.run(["sh", "-c", f'exec "$@" {redirect}', "sh", *cmd, *args],
                              env=daemon.env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, check=False)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr


def test_workspace_close_forget_is_not_reopened_at_start(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory()
    for agent in ("kept", "gone"):
        assert recalld("workspace", "open", agent, env=d.env).returncode == 0
    kept = recalld("workspace", "close", "kept", env=d.env)
    assert kept.returncode == 0 and kept.stdout == "closed workspace kept\n"
    gone = recalld("workspace", "close", "gone", "--forget", env=d.env)
    assert gone.returncode == 0 and "no longer reopens it" in gone.stdout, gone
    listed = recalld("workspace", "list", "--json", env=d.env)
    assert listed.returncode == 0 and '"gone"' not in listed.stdout and '"kept"' in listed.stdout
    assert d.stop() == 0
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    agents = {w["agent_id"] for w in d2.call("workspace.list")["workspaces"]}
    assert "kept" in agents and "gone" not in agents
    # Forgetting one that was never served is the daemon's refusal: exit 1, one line.
    again = recalld("workspace", "close", "never", "--forget", env=d2.env)
    assert again.returncode == 1 and again.stderr.startswith("recalld: "), again


def test_refused_archives_exit_1_naming_the_archive(daemon: DaemonHandle,
                                                    tmp_path: Path) -> None:
    from test_backup import GOOD, hostile

    folder = tmp_path / "архив с пробелами"  # a path with spaces and Cyrillic
    folder.mkdir()
    good = hostile(folder / "good.zip", [GOOD, ("agents/w/digest/b.md", b"y" * 5000, 0o100644)])
    cut = folder / "cut.zip"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    text = folder / "notes.zip"
    text.write_text("plain text, not a zip\n")
    (loop := folder / "loop.zip").symlink_to(loop.name)  # "no such file" though listed
    cases = {
        "missing": (folder / "nowhere.zip", "no such file"),
        "link loop": (loop, "cannot be read: Too many levels of symbolic links"),
        "not a zip": (text, "unreadable archive"),
        "truncated": (cut, "unreadable archive"),
        "traversal": (hostile(folder / "up.zip", [GOOD, (
            "agents/w/memory/../../../../etc/evil.md", b"x", 0o100644)]), "'..'"),
        "foreign": (hostile(folder / "foreign.zip", [("README.txt", b"x", 0o100644)],
                            meta=False), "not a recalld backup"),
        "checksum": (hostile(folder / "lie.zip", [GOOD], lie={GOOD[0]: "0" * 64}),
                     "checksum mismatch"),
    }
    for name, (archive, reason) in cases.items():
        for args in (["backup", "verify", str(archive)],
                     ["backup", "restore", str(archive), "--yes"],
                     ["backup", "restore", str(archive), "--dry-run"],
                     ["backup", "restore", str(archive), "--yes", "--json"]):
            proc = recalld(*args, env=daemon.env)
            line = proc.stderr.splitlines()[-1] if proc.stderr else ""
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, (name, args, proc)
            assert line.startswith(f"recalld: refusing backup {archive}: "), (name, line)
            assert reason in line and line.endswith("(code -32012)"), (name, line)
    assert not (daemon.data_dir / "backups").exists() or not list(
        (daemon.data_dir / "backups").glob("pre-restore-*")), "a refusal takes no snapshot"


def test_an_empty_value_is_a_usage_error_never_a_default(daemon: DaemonHandle) -> None:
    # `--socket "$SOCK"` or `--undo "$RUN"` with the variable unset: taken as not given,
    # the first talked to the default daemon (another memory) and the second ran a dream.
    env = daemon.env
    for args in (["--socket", "", "ping"], ["ping", "--socket", ""],
                 ["dream", "--undo", ""], ["changes", "--show", ""],
                 ["jobs", "get", "j", "--agent", ""], ["note", "hi", "--name", ""],
                 ["backup", "create", "--agent", "default", "--agent", ""],
                 ["mcp", "--socket", ""], ["search", ""],
                 ["serve", "--socket", "", "--check-config"],
                 ["serve", "--config", "", "--check-config"],
                 ["serve", "--log-file", "", "--check-config"]):
        proc = recalld(*args, env=env)
        assert proc.returncode == 2, (args, proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.rstrip().endswith("must not be empty"), (args, proc.stderr)
    listed = as_json(recalld("--json", "jobs", "list", env=env))
    assert listed == [], "an empty --undo ran something"
    with pytest.raises(ValueError, match="non-empty"):
        Client("")


def test_a_value_that_is_not_utf8_is_a_usage_error_naming_it(daemon: DaemonHandle) -> None:
    # Typed in a Latin-1 terminal, or a file name in another encoding: the daemon's
    # refusal of the request ("the params cannot be sent") named no argument.
    env = daemon.env
    latin1 = os.fsdecode(b"caf\xe9 cr\xe8me")
    for args, name in ((["note", latin1], "content"), (["search", latin1], "query"),
                       (["search", "q", "--agent", latin1], "--agent"),
                       (["read", f"memory/{latin1}.md"], "path"),
                       (["note", "hi", "--name", latin1], "--name"),
                       (["workspace", "open", latin1], "agent"),
                       (["--socket", f"/tmp/{latin1}.sock", "ping"], "--socket")):
        proc = recalld(*args, env=env)
        assert proc.returncode == 2, (args, proc.returncode, proc.stdout, proc.stderr)
        line = proc.stderr.splitlines()[-1]
        assert f"argument {name}: is not valid UTF-8 text: " in line, (args, line)
        assert "caf\\xe9 cr\\xe8me" in line and "(byte 0xe9)" in line, (args, line)
    said = recalld("note", "café crème ☕", "--json", env=env)
    assert said.returncode == 0, said.stderr
    # A file the command opens itself may be named in any encoding.
    log = daemon.data_dir.parent / f"{latin1}.log"
    checked = recalld("serve", "--log-file", str(log), "--check-config", env=env)
    assert "UTF-8" not in checked.stderr and checked.returncode == 0, checked.stderr


def test_an_archive_of_a_later_format_says_to_upgrade(daemon: DaemonHandle,
                                                      tmp_path: Path) -> None:
    # "unsupported backup version 2" did not say that the archive is newer than this
    # recalld, nor what to do; a version that only equals 1 (true, 1.0) is no version 1.
    import zipfile

    import orjson

    for version, made_by, said in (
            (2, "9.1.0", "backup format version 2 (written by recalld 9.1.0) is newer than "
                         "this recalld reads (1): upgrade recalld to restore it"),
            (True, "", "unsupported backup version True"),
            (1.0, "0.1.0", "unsupported backup version 1.0 (written by recalld 0.1.0)")):
        archive = tmp_path / f"v{version}.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("meta.json", orjson.dumps({
                "format": "recalld-backup", "version": version, "recalld_version": made_by,
                "created": 0.0, "agents": {}, "files": []}))
        for args in (["backup", "verify", str(archive)],
                     ["backup", "restore", str(archive), "--dry-run"]):
            line = assert_one_line_error(recalld(*args, env=daemon.env), 1)
            assert line == f"recalld: refusing backup {archive}: {said} (code -32012)", line


def test_a_line_longer_than_one_answer_does_not_swallow_the_next(daemon: DaemonHandle) -> None:
    # Its head is shown (the daemon hands out at most 512 KiB at once), and each line
    # after it on a line of its own, in the text and in --json.
    note = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-07-24" / "dump.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("# Dump\n" + "ű" * 400_000 + "\nthe pump is in bay 4\nend\n",
                    encoding="utf-8")
    rel = "memory/2026-07-24/dump.md"
    proc = recalld("read", rel, env=daemon.env)
    assert proc.returncode == 1 and "line(s) 2 of" in proc.stderr, proc.stderr
    shown = proc.stdout.split("\n")
    assert shown[0] == "# Dump" and set(shown[1]) == {"ű"}, shown[1][-40:]
    assert shown[2:] == ["the pump is in bay 4", "end", ""], shown[2:]
    as_text = recalld("read", rel, "--json", env=daemon.env)
    assert as_text.returncode == 1, as_text.stderr  # as without --json
    got = json.loads(as_text.stdout)
    assert got["truncated"] and got["text"].split("\n")[2:] == shown[2:]


def test_a_number_past_64_bits_is_a_usage_error_naming_its_option(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # No request can carry it: refused while parsing (no daemon needed), naming the
    # option, not by the wire's "Integer exceeds 64-bit range" with no word of which.
    huge, digits = str(2**64), "9" * 5000  # Python reads no more than 4300 digits
    env = {"RECALLD_SOCKET": "/nonexistent/recalld.sock"}
    for args, option in ((["search", "q", "-n", huge], "-n/--max-results"),
                         (["read", NOTE, "--lines", f"1-{huge}"], "--lines"),
                         (["dream", "--runs", digits], "--runs"),
                         (["changes", "-n", f"-{huge}"], "-n/--limit")):
        code, stderr = cli_main(args, env, monkeypatch, capsys)
        assert code == 2 and len(stderr.splitlines()) == 1, stderr
        assert f"argument {option}: too large" in stderr and len(stderr) < 200, stderr


def test_a_count_below_1_is_a_usage_error_naming_its_option(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Refused while parsing (no daemon needed), naming the option the user typed, not
    # the daemon's "param 'limit' must be at least 1", a name found nowhere on the line.
    env = {"RECALLD_SOCKET": "/nonexistent/recalld.sock"}
    for args, option in ((["search", "q", "-n", "0"], "-n/--max-results"),
                         (["dream", "--runs", "0"], "--runs"),
                         (["changes", "--limit", "-3"], "-n/--limit")):
        code, stderr = cli_main(args, env, monkeypatch, capsys)
        assert code == 2, stderr
        assert stderr.splitlines()[-1].endswith(
            f"argument {option}: must be at least 1, not {args[-1]}"), stderr
