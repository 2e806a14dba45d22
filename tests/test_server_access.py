"""Who may reach the RPC server over its real socket (RELIABILITY 8, 13, 14): the socket's
and its directory's modes, peer credentials, stale sockets and their owners, other users."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from rpc_stats import server_stats

from recalld.daemon.rpc.listener import SocketPlaceRefused, remove_if_stale
from recalld.daemon.rpc.server import (
    PeerCredentials,
    peer_allowed,
    peer_credentials,
)

if TYPE_CHECKING:
    from conftest import DaemonFactory, DaemonHandle


# ------------------------------------------------------------------ who may connect (13)


def test_socket_is_0600_in_a_0700_directory(daemon: DaemonHandle) -> None:
    st = os.lstat(daemon.socket_path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    dst = os.lstat(daemon.socket_path.parent)
    assert stat.S_IMODE(dst.st_mode) == 0o700
    assert dst.st_uid == os.getuid()


def test_loose_socket_directory_is_refused_not_chmodded(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    sock_dir = Path(env["XDG_RUNTIME_DIR"]) / "recalld"
    sock_dir.mkdir(mode=0o755)
    os.chmod(sock_dir, 0o755)
    d = daemon_factory(XDG_RUNTIME_DIR=env["XDG_RUNTIME_DIR"], wait=False)
    # A configuration error (2): systemd's RestartPreventExitStatus=2 does not retry it.
    assert d.proc.wait(timeout=60) == 2
    assert stat.S_IMODE(os.lstat(sock_dir).st_mode) == 0o755
    assert d.log().strip().splitlines()[-1].startswith(
        f"recalld: configuration error: cannot create the socket: {sock_dir} is not "
        "private (mode 755)"), d.log()


def test_a_socket_in_home_leaves_home_alone(daemon_factory: DaemonFactory) -> None:
    # "~/x.sock": ~ is expanded, and $HOME (not private) is refused, never chmod-ed.
    home = daemon_factory.tmp_path / f"d{len(daemon_factory.handles)}"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    d = daemon_factory(RECALLD_SOCKET="~/x.sock", wait=False)
    assert d.home == home
    assert d.proc.wait(timeout=60) == 2
    assert stat.S_IMODE(os.lstat(d.home).st_mode) == 0o755
    assert f"{d.home} is not private" in d.log()
    assert not (d.home / "x.sock").exists()


def test_peer_check_refuses_other_users() -> None:
    me = os.getuid()
    assert peer_allowed(PeerCredentials(pid=1, uid=me, gid=0), me)
    assert not peer_allowed(PeerCredentials(pid=1, uid=me + 1, gid=0), me)
    assert not peer_allowed(None, me)


def test_peer_credentials_of_a_real_connection(daemon: DaemonHandle) -> None:
    with daemon.connect() as conn:
        cred = peer_credentials(conn.sock)
        assert cred.uid == os.getuid()
        assert cred.pid == daemon.pid  # the daemon is the peer of our end
        assert conn.call("daemon.ping")["pong"] is True


# ------------------------------------------------------------ stale sockets, owners (8, 14)


def test_a_socket_path_of_the_longest_length_is_served(daemon_factory: DaemonFactory) -> None:
    # 107 bytes, the most a Unix socket path may have (and what the configuration
    # allows): the name bound before the rename into place must fit too.
    sock_dir = Path(daemon_factory.environment()["XDG_RUNTIME_DIR"]) / "long"
    sock_dir.mkdir(mode=0o700)
    path = sock_dir / ("s" * (107 - len(os.fsencode(sock_dir)) - 1))
    assert len(os.fsencode(path)) == 107
    d = daemon_factory(RECALLD_SOCKET=str(path))
    assert d.socket_path == path and d.call("daemon.ping")["pong"] is True
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert sorted(p.name for p in sock_dir.iterdir()) == [path.name, f"{path.name}.lock"]


def test_stale_socket_is_replaced(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    path = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    path.parent.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # bound, never listening: connect is refused, like a killed daemon
    dead.close()
    d = daemon_factory(XDG_RUNTIME_DIR=env["XDG_RUNTIME_DIR"])
    assert d.call("daemon.ping")["pong"] is True
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert d.call("daemon.status")["pid"] == d.pid


def test_socket_of_a_sigkilled_daemon_is_replaced(daemon_factory: DaemonFactory) -> None:
    first = daemon_factory()
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    assert first.socket_path.exists()  # left behind
    second = daemon_factory(XDG_RUNTIME_DIR=first.env["XDG_RUNTIME_DIR"],
                            RECALLD_DATA_DIR=str(first.data_dir))
    assert second.call("daemon.status")["pid"] == second.pid


def test_a_regular_file_in_the_way_is_not_touched(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    path = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    path.parent.mkdir(mode=0o700)
    path.write_text("precious")
    d = daemon_factory(XDG_RUNTIME_DIR=env["XDG_RUNTIME_DIR"], wait=False)
    assert d.proc.wait(timeout=20) == 2
    assert path.read_text() == "precious"
    assert "not a socket" in d.log()


def test_a_symbolic_link_at_the_socket_path_is_refused_as_one(tmp_path: Path) -> None:
    # A link there was "exists and is not a socket", even when it led to a socket.
    sock = tmp_path / "real.sock"
    with socket.socket(socket.AF_UNIX) as unbound:
        unbound.bind(str(sock))
    for target in (sock, tmp_path / "nothing"):
        link = tmp_path / f"to-{target.name}"
        link.symlink_to(target)
        with pytest.raises(SocketPlaceRefused, match="is a symbolic link: recalld makes its "
                           "socket at the socket path itself, never through a link"):
            remove_if_stale(link)
        assert link.is_symlink() and os.readlink(link) == str(target)
    assert stat.S_ISSOCK(sock.lstat().st_mode)


def test_second_daemon_on_the_same_socket_exits_3(daemon_factory: DaemonFactory) -> None:
    first = daemon_factory()
    second = daemon_factory(XDG_RUNTIME_DIR=first.env["XDG_RUNTIME_DIR"], wait=False)
    assert second.proc.wait(timeout=20) == 3
    assert "already" in second.log() and str(first.socket_path) in second.log()
    assert first.call("daemon.ping")["pong"] is True


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
OTHER_UID = 54321


def _as_other_user(socket_path: Path) -> str:
    """Connect from a child running as another uid; return what it observed."""
    code = (
        "import os, socket, sys\n"
        f"os.setgid({OTHER_UID}); os.setuid({OTHER_UID})\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    print('permission denied'); sys.exit()\n"
        "try:\n"
        "    s.sendall(b'{\"jsonrpc\":\"2.0\",\"method\":\"daemon.ping\",\"id\":1}\\n')\n"
        "    print('closed' if s.recv(100) == b'' else 'answered')\n"
        "except (ConnectionResetError, BrokenPipeError):\n"
        "    print('closed')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(socket_path)],
                          capture_output=True, text=True, timeout=30, check=False)
    return proc.stdout.strip() or proc.stderr


@needs_root
def test_other_users_cannot_reach_the_socket(daemon: DaemonHandle) -> None:
    assert _as_other_user(daemon.socket_path) == "permission denied"


def _refused_request_as_other_user(d: DaemonHandle) -> str:
    """Send a ping from another uid and report what came back ('closed' or 'answered').

    The daemon is frozen (SIGSTOP) while the child connects and writes, so the whole
    request is in the socket buffer before the daemon can accept the connection and
    look at its credentials. Without that, the daemon's close races the child's write
    and the child may see its write fail (EPIPE) instead of the refusal it came to
    observe. With it, the order is fixed: request queued, then refused, then read.
    """
    code = (
        "import os, socket, sys\n"
        f"os.setgid({OTHER_UID}); os.setuid({OTHER_UID})\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10)\n"
        "s.connect(sys.argv[1])\n"
        "s.sendall(b'{\"jsonrpc\":\"2.0\",\"method\":\"daemon.ping\",\"id\":1}\\n')\n"
        "print('sent', flush=True)\n"
        "try:\n"
        "    data = s.recv(100)\n"
        "except ConnectionResetError:\n"
        "    data = b''  # closed with our request unread: the kernel reports a reset\n"
        "print('closed' if data == b'' else 'answered', flush=True)\n"
    )
    d.signal(signal.SIGSTOP)
    try:
        child = subprocess.Popen([sys.executable, "-c", code, str(d.socket_path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            sent = child.stdout.readline().strip()
        except BaseException:
            child.kill()
            child.wait()
            raise
    finally:
        d.signal(signal.SIGCONT)
    out, err = child.communicate(timeout=30)
    assert sent == "sent", err
    return out.strip() or err


@needs_root
def test_other_users_are_refused_by_peer_credentials(daemon: DaemonHandle) -> None:
    # Open the file-system gates on purpose: SO_PEERCRED must still say no.
    os.chmod(daemon.socket_path.parent.parent, 0o711)
    os.chmod(daemon.socket_path.parent, 0o711)
    os.chmod(daemon.socket_path, 0o666)
    before = server_stats(daemon)
    assert _refused_request_as_other_user(daemon) == "closed"
    after = server_stats(daemon)
    assert after["rejected_peer_total"] == before["rejected_peer_total"] + 1
    # The refused ping never reached a handler: only the status call above was counted.
    assert after["requests_total"] == before["requests_total"] + 1
    assert daemon.call("daemon.ping")["pong"] is True


@needs_root
def test_socket_directory_of_another_user_is_refused(daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    sock_dir = Path(env["XDG_RUNTIME_DIR"]) / "recalld"
    sock_dir.mkdir(mode=0o700)
    os.chown(sock_dir, OTHER_UID, OTHER_UID)
    d = daemon_factory(XDG_RUNTIME_DIR=env["XDG_RUNTIME_DIR"], wait=False)
    assert d.proc.wait(timeout=30) == 2
    assert f"belongs to uid {OTHER_UID}" in d.log()
