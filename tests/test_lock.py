"""One writer per data directory (RELIABILITY 8)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from clirun import run_recalld

from recalld.daemon.lock import AlreadyServing, FileLock, data_dir_lock, read_owner_pid
from recalld.ipc.client import Client
from recalld.ipc.errors import DaemonNotRunning

if TYPE_CHECKING:
    from conftest import DaemonFactory


def test_second_lock_is_refused_with_the_owner_pid(tmp_path: Path) -> None:
    first = data_dir_lock(tmp_path, tmp_path / "data")
    first.acquire()
    try:
        assert read_owner_pid(tmp_path / "daemon.lock") == os.getpid()
        pattern = rf"already running for .*data \(pid {os.getpid()}\)"
        with pytest.raises(AlreadyServing, match=pattern):
            data_dir_lock(tmp_path, tmp_path / "data").acquire()
    finally:
        first.release()
    assert not first.held
    with FileLock(tmp_path / "daemon.lock", "x") as again:
        assert again.held


def test_lock_dies_with_its_process(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path;"
         "from recalld.daemon.lock import FileLock;"
         "l = FileLock(Path(sys.argv[1]), 'x'); l.acquire(); print('held', flush=True);"
         "time.sleep(60)", str(tmp_path / "lock")],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(AlreadyServing, match=f"pid {holder.pid}"):
            FileLock(tmp_path / "lock", "x").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
    lock = FileLock(tmp_path / "lock", "x")
    lock.acquire()  # a SIGKILLed owner leaves no stale lock
    lock.release()


def test_second_daemon_on_the_same_data_exits_3_at_once(daemon_factory: DaemonFactory) -> None:
    first = daemon_factory()
    started = time.monotonic()
    second = daemon_factory(RECALLD_DATA_DIR=str(first.data_dir), wait=False)
    assert second.proc.wait(timeout=20) == 3
    assert time.monotonic() - started < 15
    message = second.log().strip().splitlines()
    # Its own socket is not the first one's: what a client there would not find, said.
    assert message == [f"recalld is already running for {first.data_dir} (pid {first.pid}), "
                       f"but no daemon answers on {second.socket_path}: it is stopping, listens on "
                       "another socket, or its socket file was removed (stop it, then start "
                       "again)"]
    # The first one is unaffected.
    assert first.call("daemon.ping")["pong"] is True
    assert first.call("daemon.status")["pid"] == first.pid
    assert first.stop() == 0


def test_a_start_beside_a_daemon_on_the_same_socket_says_only_who_runs(
        daemon_factory: DaemonFactory) -> None:
    first = daemon_factory()
    second = daemon_factory(RECALLD_DATA_DIR=str(first.data_dir),
                            RECALLD_SOCKET=str(first.socket_path), wait=False)
    assert second.proc.wait(timeout=20) == 3
    assert second.log().strip().splitlines() == [
        f"recalld is already running for socket {first.socket_path} (pid {first.pid})"]
    # Its socket file removed (a tidied runtime folder): clients say that the daemon
    # runs without it, not that none runs; a start fails and says why, and what to do.
    first.socket_path.unlink()
    with pytest.raises(DaemonNotRunning) as lost:
        Client(first.socket_path).ping()
    assert str(lost.value) == (
        f"a daemon (pid {first.pid}) holds the lock of {first.socket_path} but does not "
        "answer there: its socket file was removed or replaced while it ran (stop it, then "
        "start it again)")
    # doctor says the same, and to stop that daemon: a start, as it told, was refused.
    doctor = run_recalld(["doctor"], env=first.env)
    assert doctor.returncode == 1, doctor.stdout
    stop = f"fix: kill {first.pid} (or systemctl --user stop recalld.socket recalld.service)"
    assert f"[FAIL] daemon: {lost.value}\n" in doctor.stdout, doctor.stdout
    assert doctor.stdout.count(stop) == 2 and "start the daemon" not in doctor.stdout, \
        doctor.stdout
    third = daemon_factory(RECALLD_DATA_DIR=str(first.data_dir),
                           RECALLD_SOCKET=str(first.socket_path), wait=False)
    assert third.proc.wait(timeout=20) == 3
    (line,) = third.log().strip().splitlines()
    assert line.endswith(f"(pid {first.pid}), but no daemon answers on {first.socket_path}: "
                         "it is stopping, listens on another socket, or its socket file was "
                         "removed (stop it, then start again)"), line
    assert first.stop() == 0
    with pytest.raises(DaemonNotRunning, match=r"^daemon not running at .*start it with"):
        Client(first.socket_path).ping()


def test_a_daemon_claims_its_socket_before_its_long_start_and_clients_say_starting(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Right after `recalld serve &`, clients said "daemon not running ... start it with:
    # recalld serve" for seconds (the daemon imports its modules before anything shows).
    # Its log file is a FIFO here: the daemon stops at opening it, after its claim, until
    # this test opens the other end.
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    daemon = daemon_factory(wait=False, args=["--log-file", str(fifo)])
    reader = os.open(fifo, os.O_RDONLY)  # returns once the daemon opens it to write
    try:
        lock = daemon.socket_path.with_name(daemon.socket_path.name + ".lock")
        assert read_owner_pid(lock) == daemon.pid
        with pytest.raises(AlreadyServing):  # held, not only written
            FileLock(lock, "socket").acquire()
    finally:
        os.close(reader)  # its log lines now fail; it serves all the same
    daemon.wait_ready()
    assert daemon.stop() == 0


def test_a_socket_claimed_by_a_daemon_not_yet_listening_is_starting(
        daemon_factory: DaemonFactory) -> None:
    # What a client finds while a daemon imports: the socket's lock held, no socket yet,
    # and the lock file does not say "listening".
    env = daemon_factory.environment()
    socket_path = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    socket_path.parent.mkdir(mode=0o700)
    with FileLock(socket_path.with_name(socket_path.name + ".lock"), "socket"):
        code = ("from recalld.ipc.client import Client\n"
                "from recalld.ipc.errors import DaemonNotRunning\n"
                "try:\n"
                "    Client().ping()\n"
                "except DaemonNotRunning as exc:\n"
                "    print(exc.message)\n")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
    assert proc.stdout.strip() == (
        f"recalld (pid {os.getpid()}) is starting and does not answer on {socket_path} "
        "yet; try again in a moment"), proc


def test_a_start_beside_one_still_starting_says_it_starts_not_to_stop_it(
        daemon_factory: DaemonFactory) -> None:
    # Several `recalld serve` at once (a login script and a unit, say): the ones that
    # lost the socket's claim said its winner "is stopping ... (stop it, then start
    # again)" while it was only loading. The claim is held here as a loading daemon holds
    # it: locked, its lock file not saying "listening".
    env = daemon_factory.environment()
    socket_path = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    socket_path.parent.mkdir(mode=0o700)
    with FileLock(socket_path.with_name(socket_path.name + ".lock"), "socket"):
        second = run_recalld(["serve"], env=env)
    assert second.returncode == 3, second
    assert second.stderr.strip().splitlines() == [
        f"recalld is already running for socket {socket_path} (pid {os.getpid()}), which "
        f"is starting and answers on {socket_path} in a moment (no second start is "
        "needed)"], second.stderr


def test_a_daemon_started_after_one_was_killed_is_starting_before_it_writes_its_pid(
        daemon_factory: DaemonFactory) -> None:
    # A daemon killed with SIGKILL leaves its lock file saying its pid and "listening",
    # and its socket file. The next one locks that file, then writes its own pid: in
    # between, clients said its socket "was removed or replaced while it ran".
    killed = daemon_factory()
    killed.kill()
    lock = killed.socket_path.with_name(killed.socket_path.name + ".lock")
    assert lock.read_text().splitlines() == [str(killed.pid), "listening"]  # the case
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, its pid not yet written
        with pytest.raises(DaemonNotRunning) as starting:
            Client(killed.socket_path).ping()
    finally:
        os.close(fd)
    assert starting.value.message == (
        f"recalld (pid {os.getpid()}) is starting and does not answer on "
        f"{killed.socket_path} yet; try again in a moment")


def test_the_owner_is_read_from_the_locked_file_not_from_what_took_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Between the second open and its flock, a link to another file took the lock
    # file's name: the owner named in the refusal was read through it.
    from hooks import run_first

    from recalld.daemon import lock as lock_module

    path = tmp_path / "daemon.lock"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("4242\n")
    first = FileLock(path, "x")
    first.acquire()
    try:
        def swap() -> None:
            path.rename(tmp_path / "daemon.lock.held")
            path.symlink_to(elsewhere)

        run_first(monkeypatch, lock_module.fcntl, "flock", swap)
        with pytest.raises(AlreadyServing, match=rf"\(pid {os.getpid()}\)"):
            FileLock(path, "x").acquire()
        monkeypatch.undo()
        # Read by name, a link or a FIFO there names no owner.
        assert read_owner_pid(path) is None
        path.unlink()
        os.mkfifo(path)
        assert read_owner_pid(path) is None
    finally:
        first.release()
