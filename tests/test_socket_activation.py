"""Socket activation (RELIABILITY 14, 23): the sockets systemd passes (LISTEN_PID,
LISTEN_FDS, fd 3), adopted or refused, and the variables taken from the environment."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from waits import wait_for

from recalld.daemon.systemd import PassedSocketError, adopt_listener, take_environment

if TYPE_CHECKING:
    from conftest import DaemonFactory


def passing_fd_3(fd: int, listen_fds: str = "1", *more: int) -> tuple[str, ...]:
    """A launcher that plays systemd: ``fd`` becomes fd 3 (``more`` fd 4, ...),
    LISTEN_PID the exec'd pid."""
    dups = "".join(f"os.dup2({f}, {3 + i});" for i, f in enumerate((fd, *more)))
    return (
        sys.executable, "-c",
        f"import os, sys; {dups} os.environ['LISTEN_PID'] = str(os.getpid());"
        f"os.environ['LISTEN_FDS'] = {listen_fds!r};"
        "os.execv(sys.executable, [sys.executable, '-m', 'recalld.daemon.main', *sys.argv[1:]])",
    )


def test_socket_activation_adopts_fd_3(daemon_factory: DaemonFactory, short_dir: Path) -> None:
    path = short_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    fd = listener.fileno()
    launcher = passing_fd_3(fd)
    try:
        d = daemon_factory(launcher=launcher, pass_fds=(fd,), RECALLD_SOCKET=str(path))
        assert d.call("daemon.ping")["pong"] is True
        assert d.call("daemon.status")["socket"] == str(path)
        assert d.stop() == 0
        # systemd owns the socket: the daemon leaves it in place, still listening.
        assert path.exists()
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))
        probe.close()
    finally:
        listener.close()


def test_a_listener_in_the_way_of_a_start_is_named_with_its_process(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # A socket unit (systemd listens on the path until it stops) or another program holds
    # the socket path of a daemon started by hand: the start fails saying which process
    # listens there and how to clear the way, not that a recalld serves it.
    path = short_dir / "held.sock"
    with subprocess.Popen(
            [sys.executable, "-c",
             "import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]);"
             "s.listen(4); print('up', flush=True); sys.stdin.read()", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"up\n"
            d = daemon_factory(wait=False, RECALLD_SOCKET=str(path))
            assert d.proc.wait(timeout=60) == 3, d.log()
            said = d.log()
            assert f"something else already listens on {path}: pid {holder.pid} (python" \
                in said, said
            assert "systemctl --user stop recalld.socket" in said and "Traceback" not in said
            assert path.exists()  # left to its owner
        finally:
            holder.kill()


def test_a_passed_socket_elsewhere_than_configured_is_named_and_warned(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # A socket unit whose ListenStream= is not the configured socket: the daemon serves
    # on the passed one, status names it, and the log says why clients do not find it.
    path = short_dir / "passed.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    try:
        d = daemon_factory(launcher=passing_fd_3(listener.fileno()),
                           pass_fds=(listener.fileno(),), wait=False,
                           RECALLD_SOCKET=str(short_dir / "configured.sock"))
        d.socket_path = path
        d.wait_ready()
        assert d.call("daemon.status")["socket_path"] == str(path)
        assert f"the socket systemd passed is {path}, but clients look for" in d.log()
        assert f"serving on {path}" in d.log()
        # A reload finds the same configured socket: nothing to say (a restart would be
        # passed the same socket again).
        d.signal(signal.SIGHUP)
        wait_for(lambda: "configuration reloaded" in d.log(), "the reload")
        assert "reload: socket_path" not in d.log(), d.log()
        assert d.stop() == 0
    finally:
        listener.close()


@pytest.mark.parametrize("passed", ["datagram", "pipe"])
def test_a_passed_descriptor_that_cannot_serve_is_a_configuration_error(
        daemon_factory: DaemonFactory, short_dir: Path, passed: str) -> None:
    # A .socket unit with ListenDatagram= (or a descriptor that is no socket): one line
    # and exit status 2, which the unit does not restart, not an unexpected error.
    if passed == "datagram":
        held = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        held.bind(str(short_dir / "dgram.sock"))
        fd = held.fileno()
    else:
        fd, writer = os.pipe()
    launcher = passing_fd_3(fd)
    try:
        d = daemon_factory(launcher=launcher, pass_fds=(fd,), wait=False,
                           RECALLD_SOCKET=str(short_dir / "r.sock"))
        assert d.proc.wait(timeout=60) == 2, d.log()
        assert "recalld: configuration error:" in d.log()
        assert "Traceback" not in d.log()
    finally:
        if passed == "datagram":
            held.close()
        else:
            os.close(fd)
            os.close(writer)


def test_a_listen_fds_naming_descriptors_not_open_is_a_configuration_error(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # fd 3 listens, but LISTEN_FDS counts far more descriptors than were passed: one
    # line naming the first that is not open, and exit status 2, not a traceback.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(short_dir / "passed.sock"))
    listener.listen(16)
    try:
        d = daemon_factory(launcher=passing_fd_3(listener.fileno(), "99999999999999999999"),
                           pass_fds=(listener.fileno(),), wait=False,
                           RECALLD_SOCKET=str(short_dir / "r.sock"))
        assert d.proc.wait(timeout=60) == 2, d.log()
        assert "recalld: configuration error: descriptor " in d.log()
        assert "passed by systemd (LISTEN_FDS=99999999999999999999) is not open" in d.log()
        assert "Traceback" not in d.log()
    finally:
        listener.close()


def test_more_than_one_passed_socket_is_a_configuration_error(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # A .socket unit with two ListenStream=: serving the first alone would leave the
    # clients of the second queued where no one accepts. One line naming both, exit 2.
    listeners = []
    for name in ("first.sock", "second.sock"):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(short_dir / name))
        listener.listen(16)
        listeners.append(listener)
    fds = tuple(lst.fileno() for lst in listeners)
    try:
        d = daemon_factory(launcher=passing_fd_3(fds[0], "2", fds[1]), pass_fds=fds,
                           wait=False, RECALLD_SOCKET=str(short_dir / "first.sock"))
        assert d.proc.wait(timeout=60) == 2, d.log()
        assert ("recalld: configuration error: systemd passed 2 sockets (LISTEN_FDS=2), "
                f"'{short_dir / 'first.sock'}', '{short_dir / 'second.sock'}'; recalld "
                "serves one: the .socket unit needs exactly one ListenStream=") in d.log()
        assert "Traceback" not in d.log()
    finally:
        for listener in listeners:
            listener.close()


@pytest.mark.parametrize("listen_fds", ["²", "-1", "one", "1 "])
def test_take_environment_refuses_a_listen_fds_that_is_no_count(listen_fds: str) -> None:
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": listen_fds,
           "NOTIFY_SOCKET": "/run/user/1/systemd/notify", "KEEP": "1"}
    with pytest.raises(PassedSocketError, match=f"LISTEN_FDS={listen_fds!r} is not a count"):
        take_environment(env)
    assert env == {"KEEP": "1"}  # cleared all the same


@pytest.mark.parametrize("env", [
    {"NOTIFY_SOCKET": "/run/user/1/systemd/notify", "WATCHDOG_USEC": "²"},
    {"NOTIFY_SOCKET": "/run/user/1/systemd/notify", "WATCHDOG_USEC": "-5"},
    {"WATCHDOG_USEC": "1000000"},  # no one to pet
])
def test_take_environment_ignores_a_watchdog_it_cannot_keep(env: dict[str, str]) -> None:
    assert take_environment(env).watchdog_interval_s is None
    assert env == {}


def test_take_environment_reads_and_clears() -> None:
    env = {
        "NOTIFY_SOCKET": "/run/user/1/systemd/notify", "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": str(os.getpid()), "LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0",
        "LISTEN_FDNAMES": "recalld.socket", "KEEP": "1",
    }
    got = take_environment(env)
    assert got.notify_socket == "/run/user/1/systemd/notify"
    assert got.watchdog_interval_s == 30.0
    assert got.listen_fds == ()
    assert env == {"KEEP": "1"}  # nothing left for a child to inherit


def test_take_environment_ignores_variables_meant_for_another_pid() -> None:
    other = str(os.getpid() + 1)
    env = {"WATCHDOG_USEC": "1000", "WATCHDOG_PID": other, "LISTEN_PID": other,
           "LISTEN_FDS": "1"}
    got = take_environment(env)
    assert got.watchdog_interval_s is None
    assert got.listen_fds == ()
    assert got.ignored_listen == f"LISTEN_FDS='1' is meant for pid {other!r}, not this " \
                                 f"process ({os.getpid()})"
    assert env == {}


def test_adopt_listener_refuses_a_non_listening_socket() -> None:
    a, b = socket.socketpair()
    try:
        with pytest.raises(PassedSocketError, match="not listening"):
            adopt_listener((a.fileno(),))
        assert adopt_listener(()) is None
    finally:
        a.close()
        b.close()


def test_adopt_listener_refuses_an_abstract_socket() -> None:
    # ListenStream=@name: it listens, but clients look for a socket file.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(f"\0recalld-test-{os.getpid()}")
        listener.listen(1)
        with pytest.raises(PassedSocketError, match=rf"@recalld-test-{os.getpid()}, is not a "
                           r"socket file \(the .socket unit needs ListenStream= with a path"):
            adopt_listener((listener.fileno(),))
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)  # not closed
    finally:
        listener.close()


def test_a_passed_socket_whose_path_is_not_utf8_is_a_configuration_error(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # A configured socket_path that is not UTF-8 is refused (status could not say where
    # the daemon serves); a passed one, which takes its place, follows the same rule,
    # rather than serving while every daemon.status call fails.
    path = os.fsencode(short_dir) + b"/s\xe9.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    fd = listener.fileno()
    try:
        d = daemon_factory(launcher=passing_fd_3(fd), pass_fds=(fd,), wait=False,
                           RECALLD_SOCKET=str(short_dir / "r.sock"))
        assert d.proc.wait(timeout=60) == 2, d.log()
        assert "recalld: configuration error: the socket passed by systemd = " \
               f"{short_dir}/s\\xe9.sock: is not valid UTF-8" in d.log(), d.log()
        assert "Traceback" not in d.log()
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)  # left to systemd
    finally:
        listener.close()
