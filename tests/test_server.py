"""The RPC server over real sockets (RELIABILITY 13-18): modes, peers, limits, load, EMFILE."""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio
import trio.testing
from waits import wait_for

from recalld.daemon.config import DaemonConfig
from recalld.daemon.rpc.connection import EVENT_QUEUE_SIZE, CallCounters, Connection
from recalld.daemon.rpc.dispatch import DaemonState, Dispatcher, Methods
from recalld.daemon.rpc.listener import bind_listener
from recalld.daemon.rpc.methods import build_methods
from recalld.daemon.rpc.server import (
    PeerCredentials,
    RpcServer,
    peer_allowed,
    peer_credentials,
)
from recalld.daemon.services import build_daemon_services
from recalld.ipc import errors
from recalld.ipc.protocol import Request

if TYPE_CHECKING:
    from conftest import DaemonFactory, DaemonHandle, RawConnection


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def server_stats(d: DaemonHandle) -> dict[str, Any]:
    return d.call("daemon.status")["queues"]["server"]  # type: ignore[no-any-return]


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
    assert d.proc.wait(timeout=60) == 1
    assert stat.S_IMODE(os.lstat(sock_dir).st_mode) == 0o755
    assert f"{sock_dir} is not private (mode 755)" in d.log()


def test_a_socket_in_home_leaves_home_alone(daemon_factory: DaemonFactory) -> None:
    # "~/x.sock": ~ is expanded, and $HOME (not private) is refused, never chmod-ed.
    home = daemon_factory.tmp_path / f"d{len(daemon_factory.handles)}"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    d = daemon_factory(RECALLD_SOCKET="~/x.sock", wait=False)
    assert d.home == home
    assert d.proc.wait(timeout=60) == 1
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
    assert d.proc.wait(timeout=20) == 1
    assert path.read_text() == "precious"
    assert "not a socket" in d.log()


def test_second_daemon_on_the_same_socket_exits_3(daemon_factory: DaemonFactory) -> None:
    first = daemon_factory()
    second = daemon_factory(XDG_RUNTIME_DIR=first.env["XDG_RUNTIME_DIR"], wait=False)
    assert second.proc.wait(timeout=20) == 3
    assert "already" in second.log() and str(first.socket_path) in second.log()
    assert first.call("daemon.ping")["pong"] is True


# ------------------------------------------------------------------- bad input (15, 16)


def test_oversize_frame_gets_one_error_and_a_close(daemon: DaemonHandle) -> None:
    with daemon.connect() as conn, daemon.connect() as other:
        assert other.call("daemon.ping")["pong"] is True
        try:
            # 1 MiB + a bit, without a newline: the daemon must not wait for the end.
            conn.send_bytes(b'{"jsonrpc":"2.0","method":"daemon.ping","params":{"x":"'
                            + b"a" * ((1 << 20) + 1000))
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = conn.recv()
        assert reply["id"] is None
        assert reply["error"]["code"] == errors.REQUEST_TOO_LARGE
        assert conn.at_eof()
        assert other.call("daemon.ping")["pong"] is True
    assert daemon.call("daemon.ping")["pong"] is True


def test_batch_over_the_limit_gets_one_error_and_a_close(daemon: DaemonHandle) -> None:
    ping = {"jsonrpc": "2.0", "method": "daemon.ping"}
    with daemon.connect() as conn:
        conn.send([{**ping, "id": i} for i in range(100)])
        answers = conn.recv()
        assert sorted(a["id"] for a in answers) == list(range(100))
        assert all(a["result"]["pong"] for a in answers)
        conn.send([{**ping, "id": i} for i in range(101)])
        reply = conn.recv()
        assert reply["id"] is None and reply["error"]["code"] == errors.REQUEST_TOO_LARGE
        assert conn.at_eof()


def test_garbage_never_crashes_the_daemon(daemon: DaemonHandle) -> None:
    rng = random.Random(1234)
    nasty = [
        b"{", b"}", b"[]", b"[1,2]", b"null", b'"x"', b"\xff\xfe\xfd", b"\x00\x00",
        b'{"jsonrpc":"2.0","method":"daemon.ping","id":1',
        b'{"jsonrpc":"2.0","method":1,"id":1}', b'{"jsonrpc":"1.0","method":"a","id":1}',
        b'{"jsonrpc":"2.0","method":"daemon.ping","id":[1]}',
        b'{"jsonrpc":"2.0","method":"daemon.ping","params":5,"id":1}',
        b'{"jsonrpc":"2.0","method":"daemon.ping","params":[1,2],"id":1}',
        b'{"jsonrpc":"2.0","method":"memory.read","params":{"agent_id":"default",'
        b'"path":"x","start_line":"a"},"id":2}',
        "{\"jsonrpc\":\"2.0\",\"method\":\"\u00e9\",\"id\":3}".encode(),
        b'{"jsonrpc":"2.0","method":"daemon.ping","params":{"bogus":1},"id":4}',
    ]
    nasty += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))).replace(b"\n", b"")
              for _ in range(50)]
    with daemon.connect() as conn:
        for blob in nasty:
            conn.send_bytes(blob + b"\n")
            reply = conn.recv()
            items = reply if isinstance(reply, list) else [reply]
            for item in items:
                assert "error" in item, (blob, item)
                assert item["error"]["code"] in errors.CODE_NAMES
                assert "Traceback" not in item["error"]["message"]
        # The connection is still good after all that.
        assert conn.call("daemon.ping")["pong"] is True


def test_notifications_get_no_answer(daemon: DaemonHandle) -> None:
    with daemon.connect() as conn:
        conn.send({"jsonrpc": "2.0", "method": "daemon.ping"})
        conn.send([{"jsonrpc": "2.0", "method": "daemon.ping"},
                   {"jsonrpc": "2.0", "method": "no.such.method"}])
        assert conn.call("daemon.status")["pid"] == daemon.pid  # the first answer is ours


# -------------------------------------------------------------------- slow clients (17)

LIMITS = """
[daemon]
idle_timeout_s = 1.0
write_timeout_s = 0.5
max_connections = 4
"""


def test_idle_and_half_frame_clients_are_cut_off(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory(LIMITS)
    with d.connect() as silent, d.connect() as half, d.connect() as good:
        half.send_bytes(b'{"jsonrpc":"2.0","method":"daemon.pi')
        for _ in range(6):
            assert good.call("daemon.ping")["pong"] is True
            time.sleep(0.2)  # the good client keeps sending complete frames
        assert silent.at_eof(timeout=5)
        assert half.at_eof(timeout=5)
        assert good.call("daemon.ping")["pong"] is True
    assert server_stats(d)["timeouts_total"] >= 2


def test_a_client_that_never_reads_is_cut_off(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory(LIMITS)
    ws = Path(d.call("workspace.list")["workspaces"][0]["path"])
    (ws / "memory" / "big.md").write_text(("x" * 1000 + "\n") * 600)
    stuck = d.connect()
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    read = {"jsonrpc": "2.0", "method": "memory.read",
            "params": {"agent_id": "default", "path": "memory/big.md"}}
    stuck.send_bytes(b"".join(orjson.dumps({**read, "id": i}) + b"\n" for i in range(8)))
    # Others are served while the stuck client holds its answers hostage.
    for _ in range(5):
        assert d.call("daemon.ping")["pong"] is True
    wait_for(lambda: server_stats(d)["timeouts_total"] >= 1, what="write timeout")
    wait_for(lambda: server_stats(d)["connections_open"] == 1, what="stuck client dropped")
    assert stuck.at_eof(timeout=5)
    stuck.close()


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


@pytest.mark.slow
def test_clients_that_never_read_keep_memory_bounded(daemon_factory: DaemonFactory) -> None:
    # Many connections pipeline large reads and never read an answer: each stops being
    # read from after a few calls (back pressure), is cut after write_timeout_s, and the
    # daemon's peak memory grows by a few answers per connection, not by every request;
    # meanwhile another client's pings are answered at once.
    d = daemon_factory("[daemon]\nwrite_timeout_s = 3.0\n")
    ws = Path(d.call("workspace.list")["workspaces"][0]["path"])
    (ws / "memory" / "big.md").write_text(("y" * 999 + "\n") * 400)  # 400 KB
    read = {"jsonrpc": "2.0", "method": "memory.read",
            "params": {"agent_id": "default", "path": "memory/big.md"}}
    assert len(d.call("memory.read", read["params"])["text"]) >= 399_000
    clients, requests_each, answer_mb = 24, 64, 0.4
    with d.connect() as pinger:
        for _ in range(20):  # warm: the ping path and the read path have run
            assert pinger.call("daemon.ping")["pong"] is True
        before = server_stats(d)
        peak_before_kib = _vm_kib(d.pid, "VmHWM")
        stuck = []
        for _ in range(clients):
            conn = d.connect()
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.send_bytes(b"".join(orjson.dumps({**read, "id": i}) + b"\n"
                                     for i in range(requests_each)))
            stuck.append(conn)
        latencies: list[float] = []
        end = time.monotonic() + 60
        while True:
            started = time.perf_counter()
            assert pinger.call("daemon.ping")["pong"] is True
            latencies.append(time.perf_counter() - started)
            if len(latencies) % 10 == 0:
                stats = pinger.call("daemon.status")["queues"]["server"]
                if stats["timeouts_total"] - before["timeouts_total"] >= clients:
                    break
            assert time.monotonic() < end, "stuck clients were never cut off"
        for conn in stuck:
            assert conn.at_eof(timeout=10)
            conn.close()
        after = server_stats(d)
    reads_run = after["requests_total"] - before["requests_total"] - len(latencies) - (
        len(latencies) // 10)
    grown_mb = (_vm_kib(d.pid, "VmHWM") - peak_before_kib) / 1024
    # Without back pressure each connection runs every request its 32 call slots allow
    # (768 reads here) and holds their answers: several hundred MB.
    assert reads_run <= clients * 8, reads_run
    assert grown_mb < clients * 8 * answer_mb * 2 + 50, grown_mb
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.05, latencies[len(latencies) // 2]
    assert latencies[-1] < 5.0, latencies[-1]
    assert d.call("daemon.ping")["pong"] is True


def test_connection_cap_answers_overloaded(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory("[daemon]\nmax_connections = 3\n")
    conns = [_connect_admitted(d) for _ in range(3)]
    with d.connect() as extra:
        reply = extra.recv()
        assert reply == {"jsonrpc": "2.0", "id": None,
                         "error": {"code": errors.OVERLOADED, "message": "too many connections"}}
        assert extra.at_eof()
    conns.pop().close()
    wait_for(lambda: _ping_ok(d), what="a free slot")
    for c in conns:
        c.close()


def _connect_admitted(d: DaemonHandle) -> RawConnection:
    """A connection that the daemon counted (earlier short-lived ones may linger a moment)."""
    def admitted() -> RawConnection | None:
        conn = d.connect()
        try:
            assert conn.call("daemon.ping")["pong"] is True
            return conn
        except errors.Overloaded:
            conn.close()
            return None
    return wait_for(admitted, "a free connection slot")


def _ping_ok(d: DaemonHandle) -> bool:
    try:
        return bool(d.call("daemon.ping")["pong"])
    except (errors.RecalldError, OSError, EOFError):
        return False


# ----------------------------------------------------------------------- load (18)


async def test_100_clients_50_requests_each(daemon: DaemonHandle) -> None:
    # daemon.ping answers while the workspaces' later services still start (and open
    # their files); a status call waits for the whole start.
    daemon.call("daemon.status")
    baseline = fd_count(daemon.pid)
    failures: list[str] = []

    async def client(n: int) -> None:
        stream = await trio.open_unix_socket(str(daemon.socket_path))
        async with stream:
            ids = [f"c{n}-{i}" for i in range(50)]
            # Pipelined: all 50 requests go out before any answer is read.
            await stream.send_all(b"".join(
                orjson.dumps({"jsonrpc": "2.0", "method": "daemon.ping", "id": id_}) + b"\n"
                for id_ in ids
            ))
            buf = b""
            seen: list[str] = []
            while len(seen) < len(ids):
                chunk = await stream.receive_some(1 << 16)
                if not chunk:
                    failures.append(f"client {n}: EOF after {len(seen)} answers")
                    return
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = orjson.loads(line)
                    if msg.get("result", {}).get("pong") is not True:
                        failures.append(f"client {n}: {msg}")
                    seen.append(msg["id"])
            if sorted(seen) != sorted(ids):
                failures.append(f"client {n}: ids {seen[:3]}...")

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for n in range(100):
                nursery.start_soon(client, n)
    assert failures == []
    wait_for(lambda: fd_count(daemon.pid) <= baseline, what="fds back to baseline")
    # A connection's task counts itself out just after its socket is closed: wait for the
    # last ones (the status call itself is the one left open).
    wait_for(lambda: server_stats(daemon)["connections_open"] == 1,
               what="every client connection counted out")
    assert server_stats(daemon)["requests_total"] >= 5000


LOW_FD_LAUNCHER = (
    sys.executable, "-c",
    "import os, resource, sys;"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48));"
    "os.execv(sys.executable, [sys.executable, '-m', 'recalld.daemon.main', *sys.argv[1:]])",
)


def test_emfile_on_accept_is_survived(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory(launcher=LOW_FD_LAUNCHER)
    assert d.call("daemon.ping")["pong"] is True
    held = []
    for _ in range(80):  # more than the daemon has descriptors left
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(d.socket_path))
        held.append(s)
    # Let the daemon hit EMFILE a few times; it must neither die nor spin.
    time.sleep(0.5)
    assert d.proc.poll() is None
    for s in held:
        s.close()
    wait_for(lambda: _ping_ok(d), what="daemon to recover")
    stats = server_stats(d)
    assert stats["accept_errors_total"] >= 1
    assert "accept failed" in d.log()


# ------------------------------------------------- in-process: one connection, or the server
#
# A connection moves bytes on its socket's descriptor (ADR 0018), so the nearest thing to an
# in-memory stream it can run on is a socket pair: no path, no listener, no accept, no peer
# check. The tests of the server itself (draining, the grace period, accept failures) run
# it on a real listening socket.


class LineClient:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, message: Any) -> None:
        await self.stream.send_all(orjson.dumps(message) + b"\n")

    async def recv(self) -> Any:
        while b"\n" not in self.buf:
            chunk = await self.stream.receive_some(1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return orjson.loads(line)

    async def aclose(self) -> None:
        await self.stream.aclose()


class InProcess:
    """The real API plus test methods, for an :class:`RpcServer` on a real socket
    (:meth:`connect`) or one :class:`Connection` on a socket pair (:meth:`connection`)."""

    def __init__(self, short: Path, **limits: Any) -> None:
        self.config = DaemonConfig(socket_path=short / "s.sock", data_dir=short / "data",
                                   config_path=short / "none.toml", **limits)
        self.release = trio.Event()
        self.started: list[int] = []
        self._block_started = trio.Event()
        test_methods = Methods()

        @test_methods.add("test.block")
        async def block(ctx: Any, params: dict[str, Any]) -> Any:
            self.started.append(params["n"])
            self._block_started.set()
            await self.release.wait()
            return params["n"]

        @test_methods.add("test.maybe",
                          immediate_when=lambda state, params: params.get("now") is True)
        async def maybe(ctx: Any, params: dict[str, Any]) -> Any:
            return params["n"]

        @test_methods.add("test.echo")
        async def echo(ctx: Any, params: dict[str, Any]) -> Any:
            await trio.lowlevel.checkpoint()  # a call task that really yields
            return params["n"]

        @test_methods.add("test.boom")
        async def boom(ctx: Any, params: dict[str, Any]) -> Any:
            raise RuntimeError("secret detail /home/someone/.ssh")

        @test_methods.add("test.publish")
        async def publish(ctx: Any, params: dict[str, Any]) -> Any:
            for i in range(params["count"]):
                ctx.state.events.publish("job.progress", {"i": i})
            return True

        self.state = DaemonState(services=build_daemon_services(self.config),
                                 methods=build_methods([test_methods]))
        self.dispatch = Dispatcher(self.state)
        self.counters = CallCounters()

    async def wait_started(self, count: int) -> None:
        """Until ``count`` test.block calls have started."""
        while len(self.started) < count:
            self._block_started = trio.Event()
            await self._block_started.wait()

    async def connect(self) -> LineClient:
        return LineClient(await trio.open_unix_socket(str(self.config.socket_path)))

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[LineClient]:
        """A :class:`Connection` serving one end of a socket pair; the client the other."""
        ours, theirs = trio.socket.socketpair()
        stream = trio.SocketStream(ours)
        conn = Connection(stream, connection_id=1, peer_pid=None, config=self.config,
                          dispatch=self.dispatch, answers_now=self.dispatch.is_immediate,
                          counters=self.counters)
        client = LineClient(trio.SocketStream(theirs))
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(conn.serve)
            try:
                yield client
            finally:
                await client.aclose()
                nursery.cancel_scope.cancel()


@pytest.fixture
def short_dir() -> Any:
    path = Path(tempfile.mkdtemp(prefix="rdi-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_handler_exceptions_do_not_leak(short_dir: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    app = InProcess(short_dir)
    async with app.connection() as client:
        await client.send({"jsonrpc": "2.0", "method": "test.boom", "id": 7})
        reply = await client.recv()
        assert reply == {"jsonrpc": "2.0", "id": 7,
                         "error": {"code": errors.INTERNAL_ERROR, "message": "internal error"}}
        assert "secret detail" in caplog.text  # logged for the operator, not sent


async def test_calls_run_concurrently_within_the_limit(short_dir: Path) -> None:
    app = InProcess(short_dir, max_concurrent_calls_per_connection=2)
    async with app.connection() as client:
        for n in (1, 2, 3):
            await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": n},
                               "id": n})
        await client.send({"jsonrpc": "2.0", "method": "daemon.ping", "id": 4})
        with trio.fail_after(5):
            await app.wait_started(2)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(app.started) == [1, 2]  # the third waits for a slot
        app.release.set()
        with trio.fail_after(5):
            replies = [await client.recv() for _ in range(4)]
        assert sorted(r["id"] for r in replies) == [1, 2, 3, 4]
        assert all(r["result"] == r["id"] for r in replies if r["id"] != 4)


async def test_immediate_calls_answer_while_every_slot_is_busy(short_dir: Path) -> None:
    # daemon.ping is marked immediate: it runs on the reader and needs no call slot.
    app = InProcess(short_dir, max_concurrent_calls_per_connection=2)
    assert app.dispatch.is_immediate(Request("daemon.ping", {}, 1))
    assert not app.dispatch.is_immediate(Request("test.block", {}, 1))
    assert not app.dispatch.is_immediate(Request("no.such.method", {}, 1))
    async with app.connection() as client:
        for n in (1, 2):
            await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": n},
                               "id": n})
        with trio.fail_after(10):
            await app.wait_started(2)
        # Both slots are held until release: the batch must not need one.
        await client.send([{"jsonrpc": "2.0", "method": "daemon.ping", "id": 3},
                           {"jsonrpc": "2.0", "method": "daemon.status", "id": 4}])
        with trio.fail_after(10):
            batch = await client.recv()
        assert sorted(r["id"] for r in batch) == [3, 4]
        # A method immediate only when its predicate says so: runs now, or waits for a slot.
        assert app.dispatch.is_immediate(Request("test.maybe", {"now": True}, 5))
        assert not app.dispatch.is_immediate(Request("test.maybe", [True], 5))
        await client.send({"jsonrpc": "2.0", "method": "test.maybe",
                           "params": {"now": True, "n": 5}, "id": 5})
        with trio.fail_after(10):
            assert (await client.recv())["result"] == 5
        await client.send({"jsonrpc": "2.0", "method": "test.maybe",
                           "params": {"now": False, "n": 6}, "id": 6})
        with trio.move_on_after(0.2) as waiting:
            await client.recv()
        assert waiting.cancelled_caught  # no slot free: not answered yet
        assert not app.release.is_set()
        app.release.set()
        with trio.fail_after(5):
            replies = [await client.recv() for _ in range(3)]
        assert sorted((r["id"], r["result"]) for r in replies) == [(1, 1), (2, 2), (6, 6)]


async def test_call_tasks_are_reused_and_stay_concurrent(short_dir: Path) -> None:
    app = InProcess(short_dir, max_concurrent_calls_per_connection=3)
    async with app.connection() as client:
        # A pipelined burst far above the slot limit: every call answered exactly once.
        await client.stream.send_all(b"".join(
            orjson.dumps({"jsonrpc": "2.0", "method": "test.echo", "params": {"n": n},
                          "id": n}) + b"\n"
            for n in range(300)
        ))
        with trio.fail_after(20):
            burst = [await client.recv() for _ in range(300)]
        assert sorted(r["result"] for r in burst) == list(range(300))
        assert all(r["id"] == r["result"] for r in burst)
        # The (now idle) call tasks still run blocking calls side by side, round after round.
        for round_ in range(3):
            app.release = trio.Event()
            app.started.clear()
            ids = [10 * round_ + k for k in range(3)]
            for n in ids:
                await client.send({"jsonrpc": "2.0", "method": "test.block",
                                   "params": {"n": n}, "id": n})
            with trio.fail_after(5):
                await app.wait_started(3)
            app.release.set()
            with trio.fail_after(5):
                replies = [await client.recv() for _ in range(3)]
            assert sorted(r["result"] for r in replies) == ids


async def test_graceful_shutdown_answers_in_flight_calls(short_dir: Path) -> None:
    app = InProcess(short_dir, graceful_timeout_s=5.0)
    server_scope = trio.CancelScope()

    async def run_server(*, task_status: trio.TaskStatus[None]) -> None:
        with server_scope:
            await RpcServer(app.config, app.dispatch).run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run_server)
        client = await app.connect()
        await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": 9},
                           "id": 1})
        with trio.fail_after(5):
            await app.wait_started(1)
        # Stop the server while the call runs; the call still answers.
        server_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert not app.config.socket_path.exists()  # no longer accepting
        with pytest.raises(OSError):
            await trio.open_unix_socket(str(app.config.socket_path))
        app.release.set()
        with trio.fail_after(5):
            assert await client.recv() == {"jsonrpc": "2.0", "result": 9, "id": 1}
            with pytest.raises(EOFError):
                await client.recv()
        await client.aclose()


async def test_grace_period_is_bounded(short_dir: Path) -> None:
    app = InProcess(short_dir, graceful_timeout_s=0.2)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(RpcServer(app.config, app.dispatch).run)
            client = await app.connect()
            await client.send({"jsonrpc": "2.0", "method": "test.block", "params": {"n": 1},
                               "id": 1})
            await app.wait_started(1)
            nursery.cancel_scope.cancel()  # the call never ends: cut after 0.2 s
        with pytest.raises(EOFError):
            await client.recv()
        await client.aclose()


async def test_slow_subscriber_gets_dropped_event(short_dir: Path) -> None:
    app = InProcess(short_dir)
    async with app.connection() as client:
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.*"]}, "id": 1})
        assert (await client.recv())["result"] == {"subscribed": ["job.*"]}
        # One handler publishes more than the queue holds without yielding in between.
        await client.send({"jsonrpc": "2.0", "method": "test.publish",
                           "params": {"count": EVENT_QUEUE_SIZE + 50}, "id": 2})
        seen: list[int] = []
        with trio.fail_after(10):
            while True:
                msg = await client.recv()
                if msg.get("id") == 2:
                    continue
                if msg["params"]["topic"] == "events.dropped":
                    break
                seen.append(msg["params"]["i"])
        # A prefix in order (one event may go straight to the waiting pump), then the drop.
        assert seen == list(range(len(seen)))
        assert EVENT_QUEUE_SIZE <= len(seen) < EVENT_QUEUE_SIZE + 50
        assert app.state.events.statistics().subscriptions == 0
        # The client can subscribe again and keeps working.
        await client.send({"jsonrpc": "2.0", "method": "events.subscribe",
                           "params": {"topics": ["job.*"]}, "id": 3})
        assert (await client.recv())["id"] == 3


class FlakyListener(trio.abc.Listener[trio.SocketStream]):
    """A real listener whose first accepts fail with EMFILE."""

    def __init__(self, inner: trio.SocketListener, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def accept(self) -> trio.SocketStream:
        if self.failures:
            self.failures -= 1
            await trio.sleep(0)
            raise OSError(errno.EMFILE, "Too many open files")
        return await self.inner.accept()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_emfile_in_process_backs_off_and_recovers(short_dir: Path) -> None:
    app = InProcess(short_dir)
    bound = bind_listener(app.config.socket_path)
    listener = FlakyListener(trio.SocketListener(trio.socket.from_stdlib_socket(bound.sock)), 4)
    server = RpcServer(app.config, app.dispatch, listener=listener)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            with trio.fail_after(5):
                client = await app.connect()
                await client.send({"jsonrpc": "2.0", "method": "daemon.ping", "id": 1})
                assert (await client.recv())["result"]["pong"] is True
            assert server.statistics().accept_errors_total == 4
            await client.aclose()
            nursery.cancel_scope.cancel()
    finally:
        bound.close()


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (all threads)


def test_an_idle_daemon_uses_no_cpu(daemon: DaemonHandle) -> None:
    # Let start-up work (initial scans) finish: two quiet samples in a row.
    previous = _cpu_ticks(daemon.pid)
    for _ in range(20):
        time.sleep(0.5)
        now = _cpu_ticks(daemon.pid)
        if now - previous <= 1:
            break
        previous = now
    start = _cpu_ticks(daemon.pid)
    time.sleep(2.0)
    used = _cpu_ticks(daemon.pid) - start
    hz = os.sysconf("SC_CLK_TCK")
    # No polling loop anywhere: well under 2% of one core while nobody talks to it.
    assert used <= 0.02 * 2.0 * hz, f"{used} ticks in 2 s"


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
    assert d.proc.wait(timeout=30) == 1
    assert f"belongs to uid {OTHER_UID}" in d.log()
