"""``recalld stop``: the daemon found by its socket is stopped cleanly, and the command
returns once it has ended."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from conftest import DaemonFactory
from test_cli import as_json, assert_one_line_error, recalld
from test_socket_activation import passing_fd_3


def test_stop_ends_the_daemon_cleanly_and_waits_for_it(daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory()
    recalld("workspace", "open", "w", env=daemon.env)
    proc = recalld("stop", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"stopped recalld (pid {daemon.pid}) on {daemon.socket_path}\n"
    # Gone when the command returns: its socket removed, its exit a clean one.
    assert not daemon.socket_path.exists()
    assert daemon.proc.wait(timeout=5) == 0
    assert "recalld stopped" in daemon.log()
    # Nothing left to stop: said in one line, exit 3 as for any command without a daemon.
    line = assert_one_line_error(recalld("stop", env=daemon.env), 3)
    assert str(daemon.socket_path) in line


def test_stop_in_json_names_the_pid(daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory()
    # A wait past what the clock can count (1e300 s: "as long as it takes") waits as
    # long as it can, as every other command's, not an OverflowError traceback.
    answer = as_json(recalld("--json", "--timeout", "1e300", "stop", env=daemon.env))
    assert answer == {"stopped": True, "pid": daemon.pid, "socket": str(daemon.socket_path)}
    assert daemon.proc.wait(timeout=5) == 0
    assert not os.path.exists(daemon.socket_path)


def test_stop_of_a_socket_activated_daemon_signals_the_daemon_not_the_socket_owner(
        daemon_factory: DaemonFactory) -> None:
    # The listening socket is this test process's here, as it is systemd's under a socket
    # unit: its peer credentials name that process. Only the daemon may be signalled.
    short = Path(tempfile.mkdtemp(prefix="rds-", dir="/tmp"))
    path = short / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(16)
        fd = listener.fileno()
        daemon = daemon_factory(launcher=passing_fd_3(fd), pass_fds=(fd,),
                                RECALLD_SOCKET=str(path))
        proc = recalld("stop", env=daemon.env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"stopped recalld (pid {daemon.pid}) on {path}\n"
        assert daemon.proc.wait(timeout=5) == 0
    finally:
        listener.close()
        shutil.rmtree(short, ignore_errors=True)


def test_stop_help_gives_the_wait_stop_has_by_default() -> None:
    # --timeout of stop waits for the daemon to end, 60 s unless given: its help says
    # so, while the other commands' help keeps their 30 s wait for an answer.
    env = {**os.environ, "COLUMNS": "200"}
    stop = recalld("stop", "--help", env=env)
    assert stop.returncode == 0, stop.stderr
    timeout_line = next(ln for ln in stop.stdout.splitlines()
                        if ln.lstrip().startswith("--timeout S"))
    assert "until the daemon has ended (default 60)" in timeout_line
    ping = recalld("ping", "--help", env=env)
    assert "--timeout S" in ping.stdout and "for an answer (default 30)" in ping.stdout
