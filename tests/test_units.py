"""systemd unit files (RELIABILITY 24) and install-service."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recalld.ipc import install, paths

ROOT = Path(__file__).resolve().parent.parent

# Options that need a mount namespace or privileges a user manager does not have.
NOT_FOR_USER_UNITS = {
    "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateNetwork",
    "PrivateUsers", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
    "ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "User", "Group",
    "CapabilityBoundingSet", "AmbientCapabilities", "DynamicUser", "ProtectClock",
}
KNOWN = {
    "Unit": {"Description", "Requires", "After"},
    "Service": {
        "Type", "NotifyAccess", "ExecStart", "ExecReload", "Restart", "RestartSec",
        "RestartPreventExitStatus", "WatchdogSec", "TimeoutStartSec", "TimeoutStopSec",
        "UMask", "NoNewPrivileges", "LockPersonality", "RestrictRealtime", "RestrictSUIDSGID",
        "SystemCallArchitectures",
    },
    "Socket": {"ListenStream", "SocketMode", "DirectoryMode"},
    "Install": {"WantedBy"},
}


def parse_unit(text: str) -> dict[str, dict[str, str]]:
    """A strict reader of the unit syntax we use: sections, key=value, comments."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1]
            assert name not in sections, f"line {number}: duplicate section {name}"
            current = sections.setdefault(name, {})
            continue
        assert current is not None, f"line {number}: key outside a section"
        key, sep, value = line.partition("=")
        assert sep and key.strip() == key and key, f"line {number}: not key=value: {raw!r}"
        assert key not in current, f"line {number}: duplicate key {key}"
        current[key] = value
    return sections


def test_repository_units_are_the_rendered_templates() -> None:
    for name, text in install.render_units(install.PLACEHOLDER_EXEC).items():
        assert (ROOT / "systemd" / name).read_text(encoding="utf-8") == text, name


def test_units_are_well_formed_and_user_safe() -> None:
    units = install.render_units("/opt/recalld/bin/recalld")
    service = parse_unit(units["recalld.service"])
    socket_ = parse_unit(units["recalld.socket"])
    for unit in (service, socket_):
        for section, keys in unit.items():
            assert section in KNOWN, section
            assert set(keys) <= KNOWN[section], set(keys) - KNOWN[section]
            assert not set(keys) & NOT_FOR_USER_UNITS
    s = service["Service"]
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"
    assert s["ExecStart"] == "/opt/recalld/bin/recalld serve"
    assert s["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert s["Restart"] == "on-failure" and int(s["WatchdogSec"]) == 30
    assert int(s["TimeoutStopSec"]) > 5  # above the default graceful_timeout_s
    assert set(s["RestartPreventExitStatus"].split()) == {"2", "3"}
    assert s["UMask"] == "0077" and s["NoNewPrivileges"] == "yes"
    sock = socket_["Socket"]
    assert sock["ListenStream"] == "%t/recalld/recalld.sock"
    assert (sock["SocketMode"], sock["DirectoryMode"]) == ("0600", "0700")


def test_exec_start_quotes_paths_with_spaces() -> None:
    units = install.render_units(install._quote("/home/a b/venv/bin/recalld"))
    service = parse_unit(units["recalld.service"])
    assert service["Service"]["ExecStart"] == '"/home/a b/venv/bin/recalld" serve'


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = tmp_path / "bin" / "recalld"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    _verify(tmp_path, install.render_units(str(exe)))


def test_a_percent_or_dollar_in_the_paths_stays_literal(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # An environment in "my%20env" (a URL-encoded folder name) or under "$dir": systemd
    # would read a specifier or a variable there and refuse the unit.
    bin_dir = tmp_path / "my%20env$HOME" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "recalld"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(install.sys, "executable", str(bin_dir / "python"))
    sock = tmp_path / "50%$x" / "r.sock"
    units = install.render_units(socket_path=sock)
    exec_start = parse_unit(units["recalld.service"])["Service"]["ExecStart"]
    literal = str(bin_dir / "recalld").replace("%", "%%")  # no variables in the command
    assert exec_start == (f"{literal} serve --socket "
                          f"{str(sock).replace('%', '%%').replace('$', '$$')}")
    _verify(tmp_path, units)


def _verify(tmp_path: Path, units: dict[str, str]) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; the unit syntax is still checked above")
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    for name, text in units.items():
        (unit_dir / name).write_text(text)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    proc = subprocess.run(
        [analyze, "--user", "verify", "recalld.service", "recalld.socket"],
        cwd=unit_dir, capture_output=True, text=True, timeout=60,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path)},
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # verify only warns about unknown or misplaced keys; treat any remark as a failure.
    assert "recalld" not in output and "Unknown" not in output, output


def test_install_service_write_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    written = install.install_service(write_only=True)
    target = tmp_path / "cfg" / "systemd" / "user"
    assert sorted(written) == [str(target / "recalld.service"), str(target / "recalld.socket")]
    service = parse_unit((target / "recalld.service").read_text())
    exec_start = service["Service"]["ExecStart"]
    assert exec_start.startswith(str(Path(sys.executable).parent)) or sys.executable in exec_start
    assert exec_start.endswith(" serve")
    assert not list(target.glob(".*.tmp"))
    # As `systemctl --user enable` links them; uninstalling without systemctl removes those
    # links too, not only the files they point at.
    for wants, name in (("default.target.wants", "recalld.service"),
                        ("sockets.target.wants", "recalld.socket")):
        (target / wants).mkdir()
        (target / wants / name).symlink_to(target / name)
    install.uninstall_service(write_only=True)
    assert not (target / "recalld.service").exists()
    assert not (target / "recalld.socket").exists()
    assert not [p for p in target.rglob("recalld.*") if p.is_symlink()]


def test_unit_dir_defaults_to_home_config() -> None:
    assert install.unit_dir({"HOME": "/home/u"}) == Path("/home/u/.config/systemd/user")
    assert install.unit_dir({"HOME": "/h", "XDG_CONFIG_HOME": "/x"}) == Path("/x/systemd/user")


def test_the_service_reads_the_config_and_data_the_installing_shell_names(
        tmp_path: Path) -> None:
    # A service started by systemd does not see the installing shell's variables: with
    # RECALLD_DATA_DIR or RECALLD_CONFIG set there, the CLI and the service would use
    # different memory. The units carry them (a "%" kept literal, spaces quoted).
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "RECALLD_DATA_DIR": str(tmp_path / "team memory 50%"),
           "RECALLD_CONFIG": str(tmp_path / "recalld.toml"), "PATH": "/usr/bin",
           "XDG_DATA_HOME": ""}
    install.install_service(write_only=True, environ=env)
    text = (tmp_path / "cfg" / "systemd" / "user" / "recalld.service").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("Environment=")]
    assert lines == [
        f"Environment=RECALLD_CONFIG={tmp_path}/recalld.toml",
        f'Environment="RECALLD_DATA_DIR={tmp_path}/team memory 50%%"',
        f"Environment=XDG_CONFIG_HOME={tmp_path}/cfg"]
    units = {name: (tmp_path / "cfg" / "systemd" / "user" / name).read_text()
             for name in ("recalld.service", "recalld.socket")}
    _verify(tmp_path, units)


@pytest.mark.parametrize("in_the_way", ["recalld.service", "recalld.socket"])
def test_a_folder_in_place_of_a_unit_file_is_refused_and_leaves_nothing(
        tmp_path: Path, in_the_way: str) -> None:
    from test_cli import assert_one_line_error, recalld

    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    env.pop("RECALLD_CONFIG", None)
    env.pop("RECALLD_DATA_DIR", None)
    target = tmp_path / "cfg" / "systemd" / "user"
    (target / in_the_way).mkdir(parents=True)
    # A temp file of the fixed name an earlier version used, left as a folder: no hindrance.
    (target / ".recalld.service.tmp").mkdir()
    line = assert_one_line_error(recalld("install-service", "--write-only", env=env), 1)
    assert f"{target / in_the_way}: a folder is in the place of the unit file" in line, line
    assert sorted(p.name for p in target.iterdir()) == [".recalld.service.tmp", in_the_way]
    (target / in_the_way).rmdir()
    written = recalld("install-service", "--write-only", env=env)
    assert written.returncode == 0, written
    assert sorted(p.name for p in target.iterdir()) == [
        ".recalld.service.tmp", "recalld.service", "recalld.socket"]
    assert all(((target / n).stat().st_mode & 0o777) == 0o644
               for n in ("recalld.service", "recalld.socket"))


def _unit_env(tmp_path: Path) -> dict[str, str]:
    """A shell whose unit folder is under ``tmp_path`` (this process's own is not)."""
    return {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}


@pytest.mark.parametrize("earlier", [None, "# the units of an earlier install\n"])
def test_a_failed_write_of_the_second_unit_puts_the_first_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, earlier: str | None) -> None:
    env = _unit_env(tmp_path)
    target = install.unit_dir(env)
    target.mkdir(parents=True)
    if earlier is not None:
        for name in install.UNIT_NAMES:
            (target / name).write_text(earlier + name)
    publish = install.write_unit
    calls: list[Path] = []

    def full_disk_at_the_second(path: Path, text: str | bytes) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(path))
        publish(path, text)

    monkeypatch.setattr(install, "write_unit", full_disk_at_the_second)
    with pytest.raises(install.ServiceError, match="No space left on device"):
        install.install_service(write_only=True, environ=env)
    assert len(calls) >= 2
    if earlier is None:
        assert sorted(p.name for p in target.iterdir()) == []
    else:
        assert sorted(p.name for p in target.iterdir()) == sorted(install.UNIT_NAMES)
        for name in install.UNIT_NAMES:
            assert (target / name).read_text() == earlier + name


@pytest.mark.parametrize("in_the_way", ["recalld.service", "recalld.socket"])
def test_uninstall_refuses_a_folder_in_place_of_a_unit_and_removes_nothing(
        tmp_path: Path, in_the_way: str) -> None:
    # The folder of the environment it is given, like install_service: not this
    # process's (whose XDG_CONFIG_HOME is not under tmp_path).
    env = _unit_env(tmp_path)
    target = install.unit_dir(env)
    install.install_service(write_only=True, environ=env)
    (target / in_the_way).unlink()
    (target / in_the_way).mkdir()
    with pytest.raises(install.ServiceError,
                       match=f"{target / in_the_way}: a folder is in the place"):
        install.uninstall_service(write_only=True, environ=env)
    assert sorted(p.name for p in target.iterdir()) == sorted(install.UNIT_NAMES)
    (target / in_the_way).rmdir()
    removed = install.uninstall_service(write_only=True, environ=env)
    assert removed == [str(target / n) for n in install.UNIT_NAMES if n != in_the_way]
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("where", ["socket", "RECALLD_DATA_DIR", "RECALLD_CONFIG"])
def test_a_control_character_in_a_path_is_refused_not_written_as_a_new_line(
        tmp_path: Path, where: str) -> None:
    # A newline ended the setting: the rest of the path became a line of its own in the
    # unit, read by systemd as another setting (here an ExecStartPre=).
    env = _unit_env(tmp_path)
    odd = f"{tmp_path}/x\nExecStartPre=/bin/touch {tmp_path}/ran\n.sock"
    socket_path = Path(odd) if where == "socket" else None
    if where != "socket":
        env[where] = odd.replace("\n", "\r", 1)
    with pytest.raises(paths.PathError, match="holds a control character"):
        install.install_service(write_only=True, socket_path=socket_path, environ=env)
    assert not install.unit_dir(env).exists() or list(install.unit_dir(env).iterdir()) == []
    # From the command line, a configuration error (exit 2) like any unusable path.
    from test_cli import assert_one_line_error, recalld

    args = ["--socket", "/tmp/x\ny.sock"] if where == "socket" else []
    line = assert_one_line_error(recalld("install-service", "--write-only", *args,
                                         env={"PATH": os.environ["PATH"], **env}), 2)
    assert line.startswith("recalld: configuration error: "), line
    # (A config file named so is not there: the CLI says that first.)
    assert "control character" in line or where == "RECALLD_CONFIG", line



@pytest.mark.parametrize("end", [" ", "   "])
def test_a_socket_path_ending_in_white_space_is_refused_not_cut_by_systemd(
        tmp_path: Path, end: str) -> None:
    # systemd strips a setting's value: ListenStream= would name the path without its
    # last blanks while serve --socket keeps them, so the daemon would not serve where
    # the socket unit listens. Refused before anything is written, as a configuration
    # error.
    env = _unit_env(tmp_path)
    odd = Path(f"{tmp_path}/r.sock{end}")
    with pytest.raises(paths.PathError, match="ends in white space"):
        install.install_service(write_only=True, socket_path=odd, environ=env)
    assert not install.unit_dir(env).exists() or list(install.unit_dir(env).iterdir()) == []
    from test_cli import assert_one_line_error, recalld

    line = assert_one_line_error(recalld("install-service", "--write-only", "--socket",
                                         str(odd), env={"PATH": os.environ["PATH"], **env}), 2)
    assert line.startswith("recalld: configuration error: ") and "white space" in line, line
    # White space inside the path is kept: systemd reads it as part of the path.
    inner = Path(f"{tmp_path}/a{end}b/r.sock")
    units = install.render_units(socket_path=inner)
    assert f"ListenStream={inner}\n" in units[install.SOCKET_NAME]


@pytest.mark.parametrize("runtime", [None, "relative/run"])
def test_a_shell_without_a_runtime_folder_installs_the_default_socket(
        tmp_path: Path, runtime: str | None) -> None:
    # `install-service --write-only` where no XDG_RUNTIME_DIR is set (su, ssh without a
    # login session: the machines --write-only is for). The client's fallback socket
    # there (/tmp/recalld-<uid>, or /run/user/<uid>) is no choice of the user's: pinned in
    # the units, the service would listen where no client of a login session looks.
    from test_cli import recalld

    env = {"PATH": os.environ["PATH"], **_unit_env(tmp_path)}
    if runtime is not None:
        env["XDG_RUNTIME_DIR"] = runtime  # ignored, as if unset
    proc = recalld("install-service", "--write-only", env=env)
    assert proc.returncode == 0, proc.stderr
    target = install.unit_dir(env)
    service = parse_unit((target / "recalld.service").read_text())["Service"]
    assert service["ExecStart"].endswith(" serve"), service["ExecStart"]
    socket_ = parse_unit((target / "recalld.socket").read_text())["Socket"]
    assert socket_["ListenStream"] == install.DEFAULT_LISTEN
    # One the user chose is kept, in this shell too.
    chosen = tmp_path / "chosen.sock"
    proc = recalld("install-service", "--write-only", env={**env, "RECALLD_SOCKET": str(chosen)})
    assert proc.returncode == 0, proc.stderr
    service = parse_unit((target / "recalld.service").read_text())["Service"]
    assert service["ExecStart"].endswith(f" serve --socket {chosen}"), service["ExecStart"]
    assert parse_unit((target / "recalld.socket").read_text())["Socket"]["ListenStream"] == \
        str(chosen)


@pytest.mark.parametrize("folder", ["env %h 50%", "%%h", "%t%"])
def test_doctor_reads_the_units_paths_as_systemd_does(tmp_path: Path, folder: str) -> None:
    # A "%" in the environment's or the socket's path is written "%%" in the units; doctor
    # replaced "%h" before "%%", so "%%h" became "%" + the home folder: the program
    # could not be told, and a unit running a recalld long gone was "ok".
    from recalld.ipc.doctor import Doctor

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**_unit_env(tmp_path), "XDG_RUNTIME_DIR": str(runtime)}
    exe = tmp_path / folder / "bin" / "recalld"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    sock = runtime / folder / "r.sock"
    target = install.unit_dir(env)
    target.mkdir(parents=True)
    for name, text in install.render_units(install._quote(install._literal(str(exe))),
                                           sock).items():
        (target / name).write_text(text)
    doctor = Doctor(sock, env)
    assert doctor.unit().status == "ok", doctor.unit()
    assert doctor._unit_program(target / "recalld.service") == exe
    assert doctor._unit_socket(target / "recalld.socket") == sock
    exe.unlink()  # the environment moved away
    check = doctor.unit()
    assert check.status == "fail" and f"runs {exe}, which is missing" in check.detail, check


@pytest.mark.parametrize("value", ["rel/data", " ", "~nosuchuser/x"])
def test_a_data_dir_variable_the_daemon_would_refuse_is_not_written_into_the_units(
        tmp_path: Path, value: str) -> None:
    # The service reads the RECALLD_DATA_DIR the units carry; one the daemon refuses (a
    # relative path) made units whose every start failed with exit status 2.
    from recalld.ipc import paths

    env = {**_unit_env(tmp_path), "RECALLD_DATA_DIR": value}
    with pytest.raises(paths.PathError, match="RECALLD_DATA_DIR"):
        install.install_service(write_only=True, environ=env)
    assert not install.unit_dir(env).exists()
