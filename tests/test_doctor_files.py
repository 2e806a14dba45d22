"""What ``recalld doctor`` says of the files a daemon start needs: the socket it would
answer on, the data directory it would write to (no daemon running: checked in process)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import run_recalld

from recalld.ipc.doctor import Doctor


def test_doctor_does_not_call_a_killed_daemons_socket_ok(tmp_path: Path) -> None:
    # A daemon killed leaves its socket file: mode 0600 in a 0700 folder, but nothing
    # listens. "[ok] socket" above "[FAIL] daemon" read as a daemon that hangs.
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    left = run / "recalld.sock"
    with socket.socket(socket.AF_UNIX) as gone:
        gone.bind(str(left))  # bound, never listening, then closed: as a killed daemon's
    left.chmod(0o600)
    check = Doctor(left, {"HOME": str(tmp_path)}).socket()
    assert check.status == "warn" and "nothing listens" in check.detail, check
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(run / "live.sock"))
        live.listen()
        (run / "live.sock").chmod(0o600)
        assert Doctor(run / "live.sock", {"HOME": str(tmp_path)}).socket().status == "ok"


def test_doctor_fails_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    # With no daemon running, the data directory is this shell's: one that is a file
    # (RECALLD_DATA_DIR set wrong) is one recalld serve refuses, not "[ok] disk".
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "data").write_text("not a folder")
    env = {"HOME": str(tmp_path), "RECALLD_DATA_DIR": str(tmp_path / "data"),
           "RECALLD_CONFIG": str(tmp_path / "config.toml")}
    [check] = Doctor(tmp_path / "none.sock", env).disks()
    assert check.name == "data dir" and check.status == "fail", check
    assert "not a directory" in check.detail and "RECALLD_DATA_DIR" in check.fix
    # So is a file on its way (XDG_DATA_HOME=~/file/x), where serve refuses too.
    del env["RECALLD_DATA_DIR"]
    env["XDG_DATA_HOME"] = str(tmp_path / "data" / "x")
    [check] = Doctor(tmp_path / "none.sock", env).disks()
    assert check.status == "fail", check
    assert check.detail.startswith(f"{tmp_path / 'data'} is not a directory"), check


def test_doctor_reports_a_file_in_the_way_of_the_socket_folder(tmp_path: Path) -> None:
    # XDG_RUNTIME_DIR naming a file: doctor ended in "recalld: [Errno 20] Not a
    # directory" instead of its report.
    runtime = tmp_path / "run"
    runtime.write_text("")
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "doctor"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and proc.stderr == "", proc
    for name in ("socket_dir", "socket"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"[FAIL] {name}:"))
        assert line.endswith(f"{runtime} is not a directory"), line
    assert f"fix: {runtime} must be a folder of yours" in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", ["systemd", "stuck-one"])
def test_doctor_names_what_listens_on_a_socket_that_does_not_answer(
        tmp_path: Path, name: str) -> None:
    # A listener that never answers: a socket unit (systemd listens) whose service does
    # not start or hangs, or a process stuck. Doctor says which it is, and for a socket
    # unit's where to look: at the service, not at a daemon that may not run at all.
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    path = run / "recalld.sock"
    code = ("import ctypes, socket, sys; ctypes.CDLL(None).prctl(15, sys.argv[2].encode(),"
            " 0, 0, 0); s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4);"
            " print('up', flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", code, str(path), name],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"up\n"
            check = Doctor(path, {"HOME": str(tmp_path)}, timeout_s=0.5).daemon()
            # The commands said only "daemon.status: no answer within 0.5 s".
            status = run_recalld(["status", "--socket", str(path), "--timeout", "0.5"],
                                 env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
        finally:
            holder.kill()
    assert check.status == "fail", check
    assert check.detail.endswith(f"(pid {holder.pid} ({name}) listens on {path})"), check
    assert status.returncode == 1, status
    assert status.stderr == (
        f"recalld: daemon.status: no answer within 0.5 s (pid {holder.pid} ({name}) listens "
        f"on {path}: a busy daemon answers with a longer --timeout; anything else there, "
        "stop it; recalld doctor says more)\n"), status.stderr
    if name == "systemd":
        assert "systemctl --user status recalld.service" in check.fix, check
    else:
        assert check.fix == "see journalctl --user -u recalld", check


@pytest.mark.parametrize("link", ["to nothing", "into a loop"])
def test_a_broken_link_as_runtime_or_data_folder_is_named_by_serve_and_doctor(
        tmp_path: Path, link: str) -> None:
    # XDG_RUNTIME_DIR or XDG_DATA_HOME a symbolic link that leads nowhere: serve said
    # only "... is not a directory", and doctor took the folder for one not made yet
    # ("[WARN] ... daemon never started?", "[ok] disk"): to start the daemon, which
    # could not start.
    runtime, data = tmp_path / "run", tmp_path / "data"
    if link == "to nothing":
        for place in (runtime, data):
            place.symlink_to(tmp_path / "gone")
        why = f"is a symbolic link to {tmp_path / 'gone'}, which leads to nothing"
    else:
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        for place in (runtime, data):
            place.symlink_to(tmp_path / "a")
        why = f"is a symbolic link to {tmp_path / 'a'} that leads into a loop of links"
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime), "XDG_DATA_HOME": str(data),
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PATH": "/usr/bin:/bin"}
    serve = run_recalld(["serve"], env=env)
    assert serve.returncode == 2, serve
    assert serve.stderr.strip().splitlines()[-1] == (
        f"recalld: cannot create the socket: cannot create {runtime / 'recalld'}: "
        f"{runtime} {why}"), serve.stderr
    doctor = Doctor(runtime / "recalld" / "recalld.sock", env)
    check = doctor.socket_dir()
    assert check.status == "fail", check
    # (a loop is met looking at the folder: "cannot reach"; a link to nothing is not)
    assert check.detail.endswith(f" {runtime / 'recalld'}: {runtime} {why}"), check
    assert check.fix.startswith(f"{runtime} must be a folder of yours"), check
    assert "start the daemon" not in (doctor.socket().fix or "")
    [check] = doctor.disks()
    assert check.name == "data dir" and check.status == "fail", check
    assert check.detail == f"{data} {why}: recalld serve would refuse to start", check
    env["XDG_RUNTIME_DIR"] = str(tmp_path)  # the socket's folder fine, the data one not
    serve = run_recalld(["serve"], env=env)
    assert serve.returncode == 2, serve
    assert serve.stderr.strip().splitlines()[-1] == (
        f"recalld: cannot use the data directory {data / 'recalld'}: {data} {why}"), serve
