"""The operator's commands with inputs a person types: odd paths, listings across agents."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import signal
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
import trio
from conftest import DaemonFactory, DaemonHandle
from hooks import start_hook
from test_cli import as_json, assert_one_line_error, recalld
from test_cli_table import cli_main
from waits import wait_for

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client
from recalld.ipc.errors import InvalidParams, RequestTooLarge
from recalld.ipc.protocol import ClientProtocol

NO_USER = "~no-such-user-recalld"


def test_a_tilde_of_no_user_is_a_one_line_configuration_error(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    env = daemon_factory.environment()
    for args, extra in ((["--socket", f"{NO_USER}/s.sock", "status"], {}),
                        (["status"], {"RECALLD_SOCKET": f"{NO_USER}/s.sock"}),
                        (["serve", "--check-config"], {"RECALLD_DATA_DIR": f"{NO_USER}/d"})):
        line = assert_one_line_error(recalld(*args, env={**env, **extra}), 2)
        assert NO_USER in line and "configuration error" in line, line
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[workspaces.a]\npath = "{NO_USER}/ws"\n')
    line = assert_one_line_error(recalld("serve", "--check-config", "--config", str(cfg),
                                         env=env), 2)
    assert f"{cfg}: [workspaces.a] path" in line and NO_USER in line, line


def test_jobs_list_without_agent_lists_every_workspace(daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory("[workspaces.other]\n")
    env = daemon.env
    job_id = as_json(recalld("reindex", "--agent", "other", "--no-wait", "--json",
                             env=env))["job_id"]
    listed = as_json(recalld("jobs", "list", "--json", env=env))
    assert [(j["job_id"], j["agent_id"]) for j in listed] == [(job_id, "other")]
    shown = recalld("jobs", "list", env=env)
    assert shown.returncode == 0 and job_id in shown.stdout, shown
    assert as_json(recalld("jobs", "list", "--agent", "default", "--json", env=env)) == []


def test_serve_help_names_every_source_of_the_socket(daemon_factory: DaemonFactory) -> None:
    # The daemon finds its socket as the clients do: the config file's socket_path too.
    shown = recalld("serve", "--help", env=daemon_factory.environment())
    assert shown.returncode == 0, shown
    text = " ".join(shown.stdout.split())
    assert "$RECALLD_SOCKET, else [daemon] socket_path of the config file" in text, text


def test_closing_a_configured_workspace_says_it_comes_back(
        daemon_factory: DaemonFactory) -> None:
    # --forget drops a workspace from the record; one the config file names opens again
    # at the next start and at a reload all the same, and the command says so.
    daemon = daemon_factory("[workspaces.named]\n")
    env = daemon.env
    as_json(recalld("workspace", "open", "adhoc", "--json", env=env))
    closed = recalld("workspace", "close", "named", "--forget", env=env)
    assert closed.returncode == 0, closed
    assert "no longer reopens" not in closed.stdout, closed.stdout
    assert ("opens again at the next start or reload (the config names it: "
            "[workspaces.named])") in closed.stdout
    shown = recalld("workspace", "close", "default", "--json", env=env)
    assert as_json(shown)["configured"] is True
    gone = recalld("workspace", "close", "adhoc", "--forget", env=env)
    assert "the daemon no longer reopens it at start" in gone.stdout, gone


def test_workspace_help_says_where_a_workspace_opens_and_what_forget_does(
        daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()

    def shown(*args: str) -> str:
        proc = recalld(*args, "--help", env=env)
        assert proc.returncode == 0, proc
        return " ".join(proc.stdout.split())

    assert "else its config [workspaces.AGENT] path" in shown("workspace", "open")
    assert "(a configured one still opens)" in shown("workspace", "close")
    assert "open workspaces, and recorded or configured ones not open" in shown("workspace")


def test_a_command_on_a_failed_workspace_says_why_it_failed(
        daemon_factory: DaemonFactory) -> None:
    # A configured path refused at the start: every command on it names the reason, not
    # only "is failed".
    daemon = daemon_factory('[workspaces.sys]\npath = "/usr"\n')
    env = daemon.env
    for args in (["search", "x"], ["read", "memory/a.md"], ["verify"], ["note", "hi"]):
        line = assert_one_line_error(recalld(*args, "--agent", "sys", env=env), 1)
        assert "workspace 'sys' failed: /usr is a system folder" in line, (args, line)
    # A job is refused there too, rather than given an id no listing shows.
    for args in (["reindex"], ["reindex", "--no-wait"]):
        line = assert_one_line_error(recalld(*args, "--agent", "sys", env=env), 1)
        assert "workspace 'sys' failed: /usr is a system folder" in line, (args, line)
        assert "job" not in line, line
    # status's fix, followed, ends the problem: the config file names the workspace, so
    # close --forget alone would see it reopened (failed again) at the next reload; the
    # reload of a file that no longer names it (nor the record) drops it.
    shown = recalld("status", env=env).stdout
    assert "take [workspaces.sys] out of the config file" in shown, shown
    daemon.config_path.write_text("", encoding="utf-8")
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in daemon.log(), "the reload")
    line = assert_one_line_error(recalld("workspace", "close", "sys", "--forget", env=env), 1)
    assert "neither open nor recorded" in line, line
    assert "sys" not in [w["agent_id"] for w in as_json(recalld("status", "--json",
                                                               env=env))["workspaces"]]


def test_clients_take_the_request_limit_the_daemon_is_configured_with(
        daemon_factory: DaemonFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # [daemon] max_request_bytes raised to 2 MiB: a 1.5 MB batch of turns gets through the
    # blocking and the async client (they refused anything over the default 1 MiB).
    daemon = daemon_factory("[daemon]\nmax_request_bytes = 2097152\n")
    for key in ("XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "HOME"):
        monkeypatch.setenv(key, daemon.env[key])
    messages = [{"role": "user", "content": f"turn {i} " + "x" * 14_000} for i in range(100)]
    with Client(daemon.socket_path) as client:
        assert client.add_turns("default", "s1", messages)["added_messages"] == 100

    async def by_trio() -> int:
        async with AsyncClient(daemon.socket_path) as aclient:
            return (await aclient.add_turns("default", "s2", messages))["added_messages"]

    assert trio.run(by_trio) == 100
    # Over the configured limit: refused before sending, naming the limit.
    with Client(daemon.socket_path) as client, pytest.raises(RequestTooLarge, match="2097152"):
        client.add_turns("default", "s3", messages * 2)


def test_a_request_of_exactly_the_limit_is_sent(daemon: DaemonHandle,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The daemon takes a frame of max_request_bytes (its newline not counted); the
    # clients refused it, counting the newline, though it is one byte short of too large.
    for key in ("XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "HOME"):
        monkeypatch.setenv(key, daemon.env[key])
    _, empty = ClientProtocol().request("daemon.ping", {"pad": ""})
    at_limit = {"pad": "x" * ((1 << 20) - len(empty) + 1)}  # id 1: one digit, like 2 and 3
    over = {"pad": "x" * ((1 << 20) - len(empty) + 2)}
    with Client(daemon.socket_path) as client:
        with pytest.raises(InvalidParams, match="unknown param"):  # the daemon read it
            client.call("daemon.ping", at_limit)
        with pytest.raises(RequestTooLarge, match="request of 1048577 bytes"):
            client.call("daemon.ping", over)

    async def by_trio() -> None:
        async with AsyncClient(daemon.socket_path) as aclient:
            with pytest.raises(InvalidParams, match="unknown param"):
                await aclient.call("daemon.ping", at_limit)

    trio.run(by_trio)


def test_a_config_file_starting_with_a_byte_order_mark_is_read(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Saved by an editor that writes a UTF-8 BOM: the daemon and the clients read it as
    # the same file without one (it was "Invalid statement (at line 1, column 1)").
    sock = tmp_path / "s.sock"
    env = daemon_factory.environment()
    cfg = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_bytes(b"\xef\xbb\xbf" + f'[daemon]\nsocket_path = "{sock}"\n'.encode())
    proc = recalld("serve", "--check-config", env=env)
    assert proc.returncode == 0, proc.stderr
    down = assert_one_line_error(recalld("status", env=env), 3)
    assert f"daemon not running at {sock}" in down, down


def test_doctor_fails_a_named_config_file_that_is_gone(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Started with RECALLD_CONFIG naming a file that was removed since: a reload and a
    # restart refuse to run without it, so doctor must not say "the defaults apply".
    cfg = tmp_path / "named.toml"
    cfg.write_text("[daemon]\nlog_level = \"INFO\"\n")
    daemon = daemon_factory(RECALLD_CONFIG=str(cfg))
    cfg.unlink()
    proc = recalld("--json", "doctor", env=daemon.env)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["config file"]["status"] == "fail", checks["config file"]
    assert f"{cfg}: no such file" in checks["config file"]["detail"]
    assert proc.returncode == 1
    # With no daemon either: RECALLD_CONFIG names it, so recalld serve would refuse.
    assert daemon.stop() == 0
    proc = recalld("--json", "doctor", env=daemon.env)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["config file"]["status"] == "fail", checks["config file"]
    assert "RECALLD_CONFIG names it" in checks["config file"]["detail"]


def test_doctor_checks_the_config_file_of_this_shell_too(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The daemon runs on its file; this shell's RECALLD_CONFIG names another one, which
    # `recalld status` refuses (exit 2): doctor said "0 problem(s)", checking only the
    # daemon's file.
    daemon = daemon_factory("[daemon]\npersist_delay_s = 1.5\n")

    def shell_check(text: str | None) -> tuple[int, dict[str, dict[str, str]]]:
        env = dict(daemon.env)
        if text is not None:
            named = tmp_path / "shell.toml"
            named.write_text(text)
            env["RECALLD_CONFIG"] = str(named)
        proc = recalld("--json", "doctor", env=env)
        return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}

    # The commands read the file's syntax and socket_path only: a value only the daemon
    # refuses is one a `recalld serve` started here exits 2 on, not every command.
    serve_only = "a recalld serve started here exits 2 on it; recalld commands run"
    for text, said, who in (("[daemon]\ncpu_threads = -1\n", "cpu_threads = -1", serve_only),
                            ("[daemon\n", "line 1", "recalld commands here, which exit 2"),
                            ("[workspaces.\"../x\"]\n", "agent id", serve_only)):
        code, checks = shell_check(text)
        assert checks["config file"]["status"] == "ok", checks["config file"]
        check = checks["shell config"]
        assert code == 1 and check["status"] == "fail", check
        assert said in check["detail"] and str(daemon.config_path) in check["detail"], check
        assert who in check["detail"], check
        assert f"RECALLD_CONFIG={daemon.config_path}" in check["fix"], check
    env = dict(daemon.env, RECALLD_CONFIG=str(tmp_path / "shell.toml"))
    assert recalld("ping", env=env).returncode == 0  # ../x: the commands run, as said
    (tmp_path / "shell.toml").unlink()
    assert recalld("status", env=env).returncode == 2
    proc = recalld("--json", "doctor", env=env)
    check = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["shell config"]
    assert proc.returncode == 1 and check["status"] == "fail", check
    assert "no such file" in check["detail"], check
    _, checks = shell_check("[daemon]\npersist_delay_s = 2.5\n")
    assert checks["shell config"]["status"] == "warn", checks["shell config"]
    # The daemon's own file, named so or found by default: one check, no second.
    code, checks = shell_check(None)
    assert "shell config" not in checks and code == 0, checks
    env = dict(daemon.env, RECALLD_CONFIG=str(daemon.config_path))
    proc = recalld("--json", "doctor", env=env)
    assert "shell config" not in {c["name"] for c in json.loads(proc.stdout)["checks"]}


def test_a_path_argument_of_no_user_or_empty_is_a_usage_error(
        daemon_factory: DaemonFactory) -> None:
    # Paths given on the command line: a ~name of no user was a traceback (exit 1), and
    # an empty --path (an unset shell variable) opened the default folder silently (now
    # refused by the parser, as every empty value is: test_cli_table).
    env = daemon_factory().env
    for args in (["workspace", "open", "x", "--path", f"{NO_USER}/ws"],
                 ["import-qwenpaw", f"{NO_USER}/ws"],
                 ["import-qwenpaw", "/tmp", "--agent-json", f"{NO_USER}/a.json"],
                 ["backup", "create", "--out", f"{NO_USER}/b.zip"],
                 ["backup", "verify", f"{NO_USER}/b.zip"]):
        line = assert_one_line_error(recalld(*args, env=env), 2)
        assert "(code -32602)" in line, (args, line)
    assert recalld("workspace", "open", "x", "--path", "", env=env).returncode == 2
    listed = as_json(recalld("workspace", "list", "--json", env=env))
    assert [w["agent_id"] for w in listed] == ["default"]


@pytest.mark.parametrize("args", [["workspace", "open", "x", "--path", "-"],
                                  ["import-qwenpaw", "-"],
                                  ["import-qwenpaw", ".", "--agent-json", "-"],
                                  ["backup", "verify", "-"],
                                  ["backup", "restore", "-", "--dry-run"]])
def test_a_path_of_a_dash_is_a_usage_error_as_backup_out_is(
        daemon_factory: DaemonFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]) -> None:
    # `workspace open --path -` made a folder ./- where `backup create --out -` is refused:
    # "-" reads as standard input or output, which none of these paths is. Refused before
    # any daemon is asked (none runs here).
    monkeypatch.chdir(tmp_path)
    code, err = cli_main(args, daemon_factory.environment(), monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "-: a path is meant here, not standard input or output" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("agent_id", ["5", "null", "[\"paw\"]"])
def test_import_of_an_agent_json_whose_id_is_not_a_string_names_the_id(
        daemon_factory: DaemonFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path, agent_id: str) -> None:
    # It was refused as "workspace config: unknown field(s) id" (after the import had
    # taken "5" for the agent's name); refused before any daemon is asked (none runs).
    (tmp_path / "agent.json").write_text(f'{{"id": {agent_id}, "running": {{}}}}', "utf-8")
    code, err = cli_main(["import-qwenpaw", str(tmp_path)], daemon_factory.environment(),
                         monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{tmp_path / 'agent.json'}: id (the agent's id) must be a string" in err, err


def test_a_socket_directory_that_is_a_symlink_is_named_as_one(
        daemon_factory: DaemonFactory) -> None:
    # It is refused (as documented), with the reason: "not a directory" was all it said of
    # a link that `ls` shows as a directory.
    real = Path(tempfile.mkdtemp(prefix="rdl-", dir="/tmp"))
    link = real.with_name(real.name + "-link")
    try:
        real.chmod(0o700)
        link.symlink_to(real)
        env = daemon_factory.environment()
        line = assert_one_line_error(recalld("serve", "--socket", str(link / "s.sock"),
                                             env=env), 2)
        assert f"{link} is a symbolic link" in line and str(real) in line, line
    finally:
        link.unlink(missing_ok=True)
        shutil.rmtree(real, ignore_errors=True)


def test_dream_lists_its_runs_or_undoes_one_never_both(daemon: DaemonHandle) -> None:
    # Given both, it listed the runs and passed the undo by without a word.
    proc = recalld("dream", "--undo", "r1", "--runs", env=daemon.env)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr, proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(("args", "said"), [
    (["--force"], "dream --force goes only with --undo RUN, not alone"),
    (["--runs", "3", "--force"], "dream --force goes only with --undo RUN, not with --runs"),
    (["--undo", "20261129T230012Z-a1b2c3", "--no-wait"],
     "dream --no-wait goes only with a dream run now, not with --undo"),
    (["--runs", "--retry-failed"],
     "dream --retry-failed goes only with a dream run now, not with --runs")])
def test_a_dream_option_of_another_form_is_a_usage_error(
        daemon_factory: DaemonFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], args: list[str], said: str) -> None:
    # `dream --force` with its --undo RUN forgotten ran a dream (which changes notes)
    # instead of undoing one; refused before any daemon is asked (none runs here).
    code, err = cli_main(["dream", *args], daemon_factory.environment(), monkeypatch, capsys)
    assert code == 2 and err.startswith(f"recalld: {said}") and err.count("\n") == 1, err


@pytest.mark.parametrize("args", [["metrics", "--prometheus", "--json"],
                                  ["--json", "metrics", "--prometheus"]])
def test_metrics_in_two_formats_at_once_is_a_usage_error(
        daemon_factory: DaemonFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    # --json was passed by without a word: the Prometheus text came out where a script
    # asked for JSON. Refused before any daemon is asked (none runs here).
    code, err = cli_main(args, daemon_factory.environment(), monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("recalld: metrics --prometheus and --json are two formats"), err


def test_cancelling_a_job_that_has_ended_says_nothing_was_cancelled(
        daemon: DaemonHandle) -> None:
    # It printed the job's state and exited 0: read as "cancelled" by a person who asked
    # to stop a job that had ended before.
    assert recalld("reindex", env=daemon.env).returncode == 0  # followed to its end
    job = daemon.call("jobs.list", {"agent_id": "default"})["jobs"][-1]
    assert job["state"] == "succeeded", job
    proc = recalld("jobs", "cancel", job["job_id"], env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        "nothing cancelled: the job had already ended (succeeded)\n"), proc.stdout
    assert as_json(recalld("jobs", "cancel", job["job_id"], "--json",
                           env=daemon.env))["state"] == "succeeded"


def test_ctrl_d_at_a_confirmation_is_a_no(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Ctrl-D at "Restore ...? [y/N]" ended the command in an EOFError traceback.
    from recalld.ipc.cli_ops import Declined, confirm

    master, slave = pty.openpty()
    try:
        os.write(master, b"\x04")  # what Ctrl-D sends: the end of input, no answer
        with open(slave, encoding="utf-8", closefd=False) as terminal:
            monkeypatch.setattr(sys, "stdin", terminal)
            with pytest.raises(Declined, match="nothing was changed"):
                confirm("Restore b.zip over agent(s) default?", yes=False)
    finally:
        os.close(master)
        os.close(slave)
    assert capsys.readouterr().out == "Restore b.zip over agent(s) default? [y/N] \n"


def test_read_of_lines_past_the_end_says_so(daemon: DaemonHandle) -> None:
    # It printed nothing and exited 0, as if those lines were empty.
    note = daemon.call("memory.add_note", {"agent_id": "default",
                                           "content": "three\nshort\nlines"})["path"]
    total = daemon.call("memory.read", {"agent_id": "default", "path": note})["total_lines"]
    line = assert_one_line_error(recalld("read", note, "--lines", f"{total + 5}",
                                         env=daemon.env), 1)
    assert line == f"recalld: {note} has {total} line(s): none from line {total + 5} on"
    shown = recalld("read", note, "--lines", f"{total}-{total + 9}", env=daemon.env)
    assert shown.returncode == 0 and "lines" in shown.stdout, shown.stderr


def test_doctor_checks_the_disk_of_a_workspace_kept_on_another_file_system(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Only the data directory's file system was checked: a workspace on a full disk of
    # its own (its notes and derived state live there) was "disk: ok".
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system to keep a workspace on")
    away = Path(tempfile.mkdtemp(prefix="recalld-ws-", dir=other))
    try:
        d = daemon_factory(f'[workspaces.far]\npath = "{away}"\n')
        checks = json.loads(recalld("doctor", "--json", env=d.env).stdout)["checks"]
        assert d.stop() == 0
        disks = [c for c in checks if c["name"] == "disk"]
        assert len(disks) == 2, disks
        assert any(c["detail"].endswith(f"at {away} (workspace far)") for c in disks), disks
        assert any(c["detail"].endswith("(data directory, workspace default)")
                   for c in disks), disks
    finally:
        shutil.rmtree(away)


def test_a_backup_name_longer_than_a_file_name_may_be_is_one_clear_error(
        daemon_factory: DaemonFactory) -> None:
    # A bare archive name (one of the daemon's backups) too long for the file system: the
    # CLI's check whether it is a local file raised "[Errno 36] File name too long"; the
    # daemon, asked, finds no such archive.
    env = daemon_factory().env
    for name in ("é" * 140 + ".zip", "b" * 300 + ".zip"):
        for args in (["backup", "verify", name], ["backup", "restore", name, "--dry-run"]):
            proc = recalld(*args, env=env)
            line = assert_one_line_error(proc, proc.returncode)
            assert proc.returncode in (1, 2) and "Errno" not in line, (args, line)
            assert "no such file (code -32012)" in line, (args, line)


def test_hints_name_the_table_of_a_dotted_agent_id_as_toml_reads_it(
        daemon_factory: DaemonFactory) -> None:
    # A dot in a bare TOML key splits it ([workspaces.ops.team-2] is a table "ops" holding
    # "team-2"): every hint that names the table of such an agent quotes the id.
    daemon = daemon_factory('[workspaces."ops.team-2"]\npath = "/usr"\n'
                            '[workspaces."ops.b"]\n')
    env = daemon.env
    shown = recalld("status", env=env).stdout
    tables = set(re.findall(r"\[workspaces\.[^\]]*\]", shown))
    assert tables == {'[workspaces."ops.team-2"]'}, shown
    closed = recalld("workspace", "close", "ops.b", env=env)
    assert closed.returncode == 0, closed
    assert '(the config names it: [workspaces."ops.b"])' in closed.stdout, closed.stdout
    for header in (*tables, '[workspaces."ops.b"]'):
        [agent] = tomllib.loads(header)["workspaces"]
        assert agent in ("ops.team-2", "ops.b"), header


#: Start hook: the workspace of agent ``FAIL_AGENT`` fails right after its services
#: started, before ``workspace.open`` answers (as a link met at once stops it).
FAILS_ONCE_STARTED = "\n".join([
    "import os",
    "from recalld.daemon.registry import WorkspaceRegistry",
    "real = WorkspaceRegistry.moved",
    "async def moved(self, agent_id, root):",
    "    if agent_id == os.environ['FAIL_AGENT']:",
    "        self.find(agent_id).stop(f'{root}/mem_session is a symbolic link')",
    "    await real(self, agent_id, root)",
    "WorkspaceRegistry.moved = moved"])


def test_an_open_that_answers_failed_exits_non_zero(daemon_factory: DaemonFactory,
                                                    tmp_path: Path) -> None:
    daemon = daemon_factory("", **start_hook(tmp_path, FAILS_ONCE_STARTED),
                            FAIL_AGENT="brittle")
    env = daemon.env
    for extra in ([], ["--json"]):
        shown = recalld("workspace", "open", "brittle", "--path", str(tmp_path / "b"),
                        *extra, env=env)
        assert shown.returncode == 1, shown
        assert "failed" in shown.stdout and "is a symbolic link" in shown.stdout, shown
    # So does an import, which opens the folder as that agent's workspace.
    (tmp_path / "qp" / "memory").mkdir(parents=True)
    imported = recalld("import-qwenpaw", str(tmp_path / "qp"), "--agent", "brittle", env=env)
    assert imported.returncode == 1 and "is a symbolic link" in imported.stdout, imported
    assert "opened" not in imported.stdout, imported
    opened = recalld("workspace", "open", "sturdy", env=env)
    assert opened.returncode == 0 and "ready" in opened.stdout, opened
