"""The command line finds the daemon the way the daemon chose its socket: the same config
file, the same precedence; install-service writes that socket into the units. A path
given on the command line is the caller's, wherever the daemon runs."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DaemonFactory, DaemonHandle
from test_cli import assert_one_line_error, recalld
from waits import wait_for


def test_config_socket_is_found_by_status_doctor_and_install_service(
        daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    sock = Path(env["XDG_RUNTIME_DIR"]) / "elsewhere" / "r.sock"
    d = daemon_factory(f'[daemon]\nsocket_path = "{sock}"\n', wait=False)
    d.socket_path = sock
    d.wait_ready()
    env = d.env

    status = json.loads(recalld("status", "--json", env=env).stdout)
    assert status["socket_path"] == str(sock) and status["pid"] == d.pid
    human = recalld("status", env=env)
    assert human.returncode == 0 and str(sock) in human.stdout

    doctor = json.loads(recalld("doctor", "--json", env=env).stdout)
    checks = {c["name"]: c for c in doctor["checks"]}
    assert checks["daemon"]["status"] == "ok", checks["daemon"]
    assert checks["socket"]["status"] == "ok" and str(sock) in checks["socket"]["detail"]

    written = json.loads(recalld("install-service", "--write-only", "--json",
                                 env=env).stdout)["written"]
    units = {Path(p).name: Path(p).read_text() for p in written}
    assert f"ListenStream={sock}\n" in units["recalld.socket"]
    assert f" serve --socket {sock}\n" in units["recalld.service"]


def test_install_service_honours_socket_option(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    other = Path(env["XDG_RUNTIME_DIR"]) / "x%y.sock"
    proc = recalld("install-service", "--write-only", "--socket", str(other), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "systemctl --user enable --now recalld.socket recalld.service" in proc.stdout
    units = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    socket_unit = (units / "recalld.socket").read_text()
    assert f"ListenStream={str(other).replace('%', '%%')}\n" in socket_unit
    # doctor, looking for the socket without --socket, says the unit listens elsewhere;
    # with the same socket the unit is fine.
    doctor = json.loads(recalld("--json", "doctor", env=env).stdout)
    unit = next(c for c in doctor["checks"] if c["name"] == "unit")
    assert unit["status"] == "warn" and f"listens on {other}, but clients look for" in \
        unit["detail"], unit
    doctor = json.loads(recalld("--json", "--socket", str(other), "doctor", env=env).stdout)
    assert next(c for c in doctor["checks"] if c["name"] == "unit")["status"] == "ok"
    # The default socket keeps systemd's own specifier.
    assert recalld("install-service", "--write-only", env=env).returncode == 0
    assert "ListenStream=%t/recalld/recalld.sock\n" in (units / "recalld.socket").read_text()
    assert "serve\n" in (units / "recalld.service").read_text()
    doctor = json.loads(recalld("--json", "doctor", env=env).stdout)
    assert next(c for c in doctor["checks"] if c["name"] == "unit")["status"] == "ok"
    # The environment the units run from moved away: doctor says so, and installing
    # the units again (what it advises) makes them right.
    service = units / "recalld.service"
    service.write_text(re.sub(r"(?m)^ExecStart=\S+", 'ExecStart="/gone/my env/bin/recalld"',
                              service.read_text()))
    doctor = json.loads(recalld("--json", "doctor", env=env).stdout)
    unit = next(c for c in doctor["checks"] if c["name"] == "unit")
    assert unit["status"] == "fail" and "runs /gone/my env/bin/recalld" in unit["detail"]
    assert "install-service" in unit["fix"] and doctor["ok"] is False
    assert recalld("install-service", "--write-only", env=env).returncode == 0
    doctor = json.loads(recalld("--json", "doctor", env=env).stdout)
    assert next(c for c in doctor["checks"] if c["name"] == "unit")["status"] == "ok"


def test_install_service_without_user_systemd_says_what_to_do(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A PATH whose systemctl cannot reach a user manager, as on a machine without one.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    systemctl = fake_bin / "systemctl"
    systemctl.write_text("#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\n"
                         "exit 1\n")
    systemctl.chmod(0o755)
    env = daemon_factory.environment()
    env["PATH"] = f"{fake_bin}:{env['PATH']}"
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    line = assert_one_line_error(recalld("install-service", env=env), 1)
    assert "no user systemd answers" in line and "--write-only" in line
    assert "systemctl --user enable --now" in line and "Traceback" not in line
    units = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    assert not units.exists() or not any(units.iterdir()), "nothing is written"
    line = assert_one_line_error(recalld("uninstall-service", env=env), 1)
    assert "no user systemd answers" in line
    # doctor does not advise the install-service that was just refused.
    doctor = json.loads(recalld("--json", "doctor", env=env).stdout)
    unit = next(c for c in doctor["checks"] if c["name"] == "unit")
    assert unit["status"] == "warn" and "install-service --write-only" in unit["fix"], unit
    # With --write-only: truthful about what was (not) there.
    proc = recalld("uninstall-service", "--write-only", env=env)
    assert proc.returncode == 0 and "no recalld units were installed" in proc.stdout


def test_bad_config_in_a_client_is_a_usage_error(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    cfg = Path(env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('[daemon]\nsocket_path = ["a"]\n')
    line = assert_one_line_error(recalld("status", env=env), 2)
    assert f"{cfg}: [daemon] socket_path = [\"a\"]" in line
    line = assert_one_line_error(recalld("status", env={**env, "RECALLD_SOCKET": "rel.sock"}), 2)
    assert "RECALLD_SOCKET" in line and "absolute" in line


def test_a_typo_in_the_config_file_does_not_cut_agents_off_the_daemon(
        daemon_factory: DaemonFactory) -> None:
    """The daemon runs on the file it read; the file is then broken by an edit. The
    client library (every agent's middleware) still reaches the daemon at the default
    socket, saying why in a warning; status shows it too, with what is wrong (exit 2)."""
    d = daemon_factory("[workspace_defaults]\nauto_memory_interval = 4\n")
    for broken in ("[workspace_defaults\nauto_memory_interval = 4\n",  # TOML syntax
                   '[daemon]\nsocket_path = "relative.sock"\n',  # a value no start takes
                   "\udcff"):  # not UTF-8 at all
        d.config_path.write_bytes(broken.encode("utf-8", "surrogateescape"))
        script = ("import asyncio\nfrom recalld.ipc.client import Client\n"
                  "from recalld.ipc.aclient import AsyncClient\n"
                  "with Client() as c:\n    print(c.ping()['pong'])\n"
                  "async def main():\n    async with AsyncClient() as c:\n"
                  "        print((await c.ping())['pong'])\n"
                  "asyncio.run(main())\n")
        proc = subprocess.run([sys.executable, "-c", script], env=d.env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 0 and proc.stdout.split() == ["True", "True"], proc.stderr
        assert f"configuration error: {d.config_path}" in proc.stderr, proc.stderr
        status = recalld("status", env=d.env)
        assert status.returncode == 2 and "Traceback" not in status.stderr, status.stderr
        assert f"pid {d.pid}" in status.stdout, status.stdout
        assert f"config file: {d.config_path}: " in status.stdout, status.stdout
        # --json says it on stdout too, where a script reads why the exit status is 2.
        status = recalld("status", "--json", env=d.env)
        assert status.returncode == 2 and "Traceback" not in status.stderr, status.stderr
        answer = json.loads(status.stdout)
        refused = answer["config_refused"]
        assert answer["pid"] == d.pid and refused["path"] == str(d.config_path), answer
        assert refused["error"].startswith(f"{d.config_path}: "), refused
        assert f"configuration error: {refused['error']}" in status.stderr, status.stderr
        assert "a reload or restart would refuse it" in refused["what"], refused
        assert refused["fix"].startswith("mend the file"), refused


def _client_reaches(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = ("from recalld.ipc.client import Client\n"
              "with Client() as c:\n    print(c.ping()['pong'])\n")
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def test_a_typo_in_a_file_naming_the_socket_leaves_the_daemon_in_view(
        daemon_factory: DaemonFactory) -> None:
    """A file that names its socket and then no longer parses (a table header cut short,
    a table declared twice, a value left out): status and doctor still find the daemon at
    the socket the file's own line names, show its state with the error (where in the
    file) and that it keeps what it read; so does the client library. A file that cannot
    be read at all (a folder in its place, a RECALLD_CONFIG naming none): at the socket
    the daemon of the data directory recorded there."""
    env = daemon_factory.environment()
    sock = Path(env["XDG_RUNTIME_DIR"]) / "elsewhere" / "r.sock"
    good = f'[daemon]\nsocket_path = "{sock}"\n[workspace_defaults]\nauto_memory_interval = 4\n'
    d = daemon_factory(good, wait=False)
    d.socket_path = sock
    d.wait_ready()
    for broken, where in ((f"[daemon\n{good}", "line 1"),
                          (f'{good}[daemon]\nlog_level = "DEBUG"\n', "line 5"),
                          (f'daemon.socket_path = "{sock}"\ndaemon.max_batch = \n', "line 2")):
        d.config_path.write_text(broken, encoding="utf-8")
        status = recalld("status", env=d.env)
        assert status.returncode == 2, (status.stdout, status.stderr)
        assert f"pid {d.pid}" in status.stdout and f"socket: {sock}" in status.stdout
        said = next(line for line in status.stdout.splitlines() if "config file:" in line)
        assert str(d.config_path) in said and f"(at {where}, column" in said, said
        assert "the running daemon keeps the configuration it last read" in said, said
        doctor = json.loads(recalld("doctor", "--json", env=d.env).stdout)
        checks = {c["name"]: c for c in doctor["checks"]}
        assert checks["daemon"]["status"] == "ok", checks["daemon"]
        assert checks["config file"]["status"] == "fail" and where in \
            checks["config file"]["detail"], checks["config file"]
        proc = _client_reaches(d.env)
        assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr
    last = d.config_path.read_bytes()
    d.config_path.unlink()
    d.config_path.mkdir()
    gone = d.config_path.with_name("gone.toml")
    for env, why in ((d.env, f"{d.config_path}: not a regular file (a directory)"),
                     ({**d.env, "RECALLD_CONFIG": str(gone)}, f"{gone}: no such file")):
        status = recalld("status", env=env)
        assert status.returncode == 2, (status.stdout, status.stderr)
        assert f"pid {d.pid}" in status.stdout and f"socket: {sock}" in status.stdout
        assert f"config file: {why}" in status.stdout, status.stdout
        said = next(line for line in status.stdout.splitlines() if "config file:" in line)
        if env is not d.env:  # not the daemon's file: its reload never reads this one
            assert "would refuse it" not in said and (
                f"the daemon reads {d.config_path}, which a reload or restart reads "
                "again") in said, said
            assert f"fix: fix {gone}, or export RECALLD_CONFIG={d.config_path}" in \
                status.stdout, status.stdout
        doctor = json.loads(recalld("doctor", "--json", env=env).stdout)
        checks = {c["name"]: c for c in doctor["checks"]}
        assert checks["daemon"]["status"] == "ok", checks["daemon"]
        assert checks["socket"]["status"] == "ok" and str(sock) in checks["socket"]["detail"]
        assert why in checks["config file"]["detail"] + checks.get(
            "shell config", {"detail": ""})["detail"], checks
    d.config_path.rmdir()
    d.config_path.write_bytes(last)
    # A reload of it fails and says so: status says it once.
    d.signal(signal.SIGHUP)
    wait_for(lambda: "reload failed" in d.log(), "the reload fails")
    status = recalld("status", env=d.env)
    assert status.returncode == 2 and status.stdout.count("(at line 2, column") == 1, \
        status.stdout
    # Without a daemon, the command says what is wrong with the file, as before.
    assert d.stop() == 0
    line = assert_one_line_error(recalld("status", env=d.env), 2)
    assert f"configuration error: {d.config_path}" in line, line


def test_a_socket_path_naming_a_folder_or_a_file_says_so(daemon_factory: DaemonFactory,
                                                          tmp_path: Path) -> None:
    # `--socket` given the socket's folder (or a file that is no socket) was "daemon not
    # running", with a `recalld serve --socket` there that the daemon refuses.
    env = daemon_factory.environment()
    (tmp_path / "afile").write_text("not a socket\n")
    for place, what in ((tmp_path, "a folder"), (tmp_path / "afile", "a file")):
        for args, where in ((["ping", "--socket", str(place)], env),
                            (["status"], {**env, "RECALLD_SOCKET": str(place)})):
            line = assert_one_line_error(recalld(*args, env=where), 3)
            assert f"cannot connect to {place}: it is {what}, not a socket" in line, line
            assert "start it with" not in line, line
    # A symbolic link there (leading nowhere, or to a socket nobody listens on) said
    # "start it with: recalld serve --socket <link>", which the daemon refuses too.
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as unbound:
        unbound.bind(str(stale))
    for target, gone in ((tmp_path / "nothing", ", which leads to nothing"), (stale, "")):
        link = tmp_path / f"to-{target.name}"
        link.symlink_to(target)
        line = assert_one_line_error(recalld("ping", "--socket", str(link), env=env), 3)
        assert (f"cannot connect to {link}: it is a symbolic link to {target}{gone}, "
                "not a socket") in line, line
        assert "never through a link" in line and "start it with" not in line, line
        assert not target.exists() or stat.S_ISSOCK(target.lstat().st_mode)


def test_a_config_path_that_is_no_file_is_refused_not_waited_on(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A FIFO would hold every reader until a writer came; a folder said "Is a directory".
    env = daemon_factory.environment()
    (tmp_path / "fifo.toml").parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "folder.toml").mkdir()
    for name, kind in (("fifo.toml", "a FIFO"), ("folder.toml", "a directory")):
        cfg = tmp_path / name
        named = {**env, "RECALLD_CONFIG": str(cfg)}
        for args in (["status"], ["serve"], ["serve", "--check-config"]):
            line = assert_one_line_error(recalld(*args, env=named), 2)
            assert f"{cfg}: not a regular file ({kind})" in line, (args, line)
        doctor = json.loads(recalld("doctor", "--json", env=named).stdout)
        checks = {c["name"]: c for c in doctor["checks"]}
        assert f"not a regular file ({kind})" in checks["config file"]["detail"], checks
    # Nor is a unit file doctor reads.
    units = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    units.mkdir(parents=True)
    os.mkfifo(units / "recalld.service")
    doctor = json.loads(recalld("doctor", "--json", env=env).stdout)
    assert any(c["name"] == "unit" for c in doctor["checks"]), doctor


def test_a_request_limit_the_daemon_would_refuse_is_not_the_clients(tmp_path: Path) -> None:
    # The client takes [daemon] max_request_bytes from the file the daemon reads, but only
    # a value the daemon starts with: below 64 KiB or past 1 GiB it keeps the default
    # (max_request_bytes = 1 failed every command: "request of 59 bytes exceeds ...").
    from recalld.ipc import paths

    config = tmp_path / "config.toml"
    for value, taken in ((1, None), (65535, None), (65536, 65536), (2 << 20, 2 << 20),
                         ((1 << 30) + 1, None), (-5, None), ("1MB", None)):
        shown = f'"{value}"' if isinstance(value, str) else value
        config.write_text(f"[daemon]\nmax_request_bytes = {shown}\n", encoding="utf-8")
        assert paths.max_request_bytes({"RECALLD_CONFIG": str(config)}) == taken, value


def test_a_relative_passfile_is_taken_from_the_callers_folder(
        daemon: DaemonHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``remote forget --passfile pgpass`` names the file in the folder the command runs
    in, as every other path on the command line does; the daemon, which reads it, runs
    elsewhere. The server here refuses connections: what is left is that error, not a
    refusal of the path."""
    from test_cli_table import cli_main

    here = tmp_path / "caller's folder"
    here.mkdir()
    (here / "pgpass").write_text("*:*:*:*:secret\n", "utf-8")
    (here / "pgpass").chmod(0o600)
    monkeypatch.chdir(here)
    code, err = cli_main(["--socket", str(daemon.socket_path), "remote", "forget", "shared",
                          "--dsn", "postgresql://127.0.0.1:1/db", "--passfile", "pgpass",
                          "--yes"], daemon.env, monkeypatch, capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "the server cannot be reached" in err and "passfile" not in err, err


def test_a_shells_unusable_config_path_is_not_told_as_the_daemons_file(
        daemon: DaemonHandle) -> None:
    """``RECALLD_CONFIG=rel.toml recalld status``: the variable of this shell, which no
    daemon starts with, was told as the daemon's file that "a reload or restart would
    refuse", to mend and reload. It is what the commands here refuse, next to the file
    the daemon reads, as for a readable file that is not the daemon's."""
    status = recalld("status", "--json", env={**daemon.env, "RECALLD_CONFIG": "rel.toml"})
    assert status.returncode == 2 and "Traceback" not in status.stderr, status.stderr
    refused = json.loads(status.stdout)["config_refused"]
    assert refused["path"] is None and "RECALLD_CONFIG" in refused["error"], refused
    assert "read by recalld commands here" in refused["what"], refused
    assert "would refuse it" not in refused["what"], refused
    running = json.loads(recalld("status", "--json", env=daemon.env).stdout)["config_path"]
    assert refused["fix"].endswith(f"export RECALLD_CONFIG={running}"), refused


def test_a_socket_path_changed_in_the_file_leaves_the_running_daemon_in_view(
        daemon_factory: DaemonFactory) -> None:
    """A daemon keeps the socket it started on until it is restarted, also when a
    reload reads another ``socket_path``: the commands and the client library still find
    it there (where its data directory's lock file says it serves), not a "daemon not
    running" that points at a ``recalld serve`` the lock would refuse. Where a daemon
    would listen (install-service) is still the file's socket."""
    d = daemon_factory("")
    moved = Path(d.env["XDG_RUNTIME_DIR"]) / "moved" / "r.sock"
    d.config_path.write_text(f'[daemon]\nsocket_path = "{moved}"\n', encoding="utf-8")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "the daemon keeps" in d.log(), "the reload keeps its socket")
    status = recalld("status", "--json", env=d.env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pid"] == d.pid
    listed = recalld("workspace", "list", env=d.env)
    assert listed.returncode == 0 and "default" in listed.stdout, listed.stderr
    doctor = json.loads(recalld("doctor", "--json", env=d.env).stdout)
    checks = {c["name"]: c for c in doctor["checks"]}
    assert checks["daemon"]["status"] == "ok", checks["daemon"]
    proc = _client_reaches(d.env)
    assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr
    assert recalld("stop", env=d.env).returncode == 0
    assert d.stop() == 0
    # With no daemon, the commands look where the file says, as a start would listen.
    line = assert_one_line_error(recalld("status", env=d.env), 3)
    assert f"daemon not running at {moved} (start it with: recalld serve)" in line, line


def _from_deleted_cwd(tmp_path: Path, env: dict[str, str],
                      *args: str) -> subprocess.CompletedProcess[str]:
    """``recalld ARGS`` run in a folder deleted before it starts (a shell left in a
    removed build or temp folder)."""
    gone = tmp_path / "gone"
    gone.mkdir(exist_ok=True)
    return subprocess.run(
        ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
         sys.executable, "-m", "recalld.ipc", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False)


def test_relative_paths_from_a_deleted_current_directory_say_so(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    d = daemon_factory()
    for args in (["backup", "create", "--out", "mine.zip"],
                 ["workspace", "open", "coder", "--path", "notes/coder"],
                 ["--socket", "r.sock", "ping"]):
        line = assert_one_line_error(_from_deleted_cwd(tmp_path, d.env, *args), 2)
        assert "a relative path, but the current directory no longer exists" in line, line
    # A bare backup name still names one in the daemon's backups folder.
    made = json.loads(recalld("backup", "create", "--json", env=d.env).stdout)["file"]
    proc = _from_deleted_cwd(tmp_path, d.env, "backup", "verify", Path(made).name)
    assert proc.returncode == 0 and f"ok: {made}" in proc.stdout, proc.stderr


@pytest.mark.parametrize("home", ["", "relative/home"])
def test_a_home_that_is_empty_or_relative_is_not_taken_from_the_current_directory(
        tmp_path: Path, home: str) -> None:
    # HOME="" made the default paths relative: install-service wrote its units into
    # ./.config/systemd/user of whatever folder it ran in, and the config file and data
    # folder a command looked for depended on that folder too. Such a HOME is passed by,
    # as ~ is with no HOME: the home the password database names.
    import pwd

    own = Path(pwd.getpwuid(os.getuid()).pw_dir)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"PATH": os.environ["PATH"], "HOME": home, "XDG_RUNTIME_DIR": str(runtime)}
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "doctor", "--json"],
                          env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert str(own / ".config" / "recalld" / "config.toml") in checks["config file"]["detail"]
    assert str(own / ".config" / "systemd" / "user") in checks["unit"]["detail"] + checks[
        "unit"]["fix"], checks["unit"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_unusable_socket_is_refused_naming_what_each_caller_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client library, its AgentScope middleware, the command line and the MCP
    bridge each name the socket setting their own user set: a Python caller's error
    said ``--socket``, a flag it never passed, and the bridge run as a module ended in
    a traceback."""
    from recalld.ipc.aclient import AsyncClient
    from recalld.ipc.client import Client

    too_long = str(tmp_path / ("s" * 110))
    for value in ("", too_long):
        for library in (Client, AsyncClient):
            with pytest.raises(ValueError) as raised:
                library(value)
            said = str(raised.value)
            assert said.startswith("socket_path = "), said
            assert "--socket" not in said, said
        if value:
            assert "a shorter one with the socket_path argument, RECALLD_SOCKET" in said
    agentscope = pytest.importorskip("recalld.ipc.agentscope")
    with pytest.raises(ValueError, match=r"^socket_path = .* bytes, longer than"):
        agentscope.RecalldMemoryMiddleware(socket_path=too_long)
    monkeypatch.setenv("RECALLD_SOCKET", too_long)
    with pytest.raises(ValueError) as raised:
        Client()
    assert str(raised.value).startswith("RECALLD_SOCKET = "), raised.value
    assert "with the socket_path argument, RECALLD_SOCKET" in str(raised.value)
    monkeypatch.delenv("RECALLD_SOCKET")
    env = dict(os.environ)
    # The command line, and the MCP bridge however it is started, name --socket.
    for argv in (["ping", "--socket", too_long], ["mcp", "--socket", too_long]):
        line = assert_one_line_error(recalld(*argv, env=env), 2)
        assert line.startswith(f'recalld: configuration error: --socket = "{too_long}"'), line
        assert "a shorter one with --socket, RECALLD_SOCKET" in line, line
    bridge = subprocess.run([sys.executable, "-m", "recalld.ipc.mcp", "--socket", too_long],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=120, check=False, env=env)
    line = assert_one_line_error(bridge, 2)
    assert line.startswith(f'recalld: configuration error: --socket = "{too_long}"'), line
    assert bridge.stdout == "", bridge.stdout
