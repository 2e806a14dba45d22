"""The RPC server's limits over real sockets (RELIABILITY 15-18): bad input, slow clients,
the connection cap, load, EMFILE on accept; and an idle daemon's CPU."""

from __future__ import annotations

import os
import random
import select
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
import trio
from anyio.abc import SocketAttribute, SocketStream
from rpc_stats import server_stats
from waits import wait_for

from recalld.ipc import errors
from recalld.ipc.aclient import AsyncClient
from recalld.ipc.client import Client

if TYPE_CHECKING:
    from conftest import DaemonFactory, DaemonHandle, RawConnection


def socket_count(pid: int) -> int:
    """How many sockets ``pid`` holds open. Only sockets: the daemon opens other
    descriptors in the background after its start (the watcher's inotify once the start
    is released), which a client's connection has nothing to do with."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # closed meanwhile
            pass
    return count


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


def test_a_last_frame_without_its_newline_is_run_and_answered(daemon: DaemonHandle) -> None:
    # As `printf '%s' '{...}' | socat - UNIX-CONNECT:...` sends it: the client ends its
    # side of the connection right after the last frame, without the newline.
    ping = {"jsonrpc": "2.0", "method": "daemon.ping"}
    with daemon.connect() as conn:
        conn.send({**ping, "id": 1})
        conn.send_bytes(orjson.dumps([{**ping, "id": 2}, {**ping, "id": "3"}]) + b" \r")
        conn.sock.shutdown(socket.SHUT_WR)
        assert conn.recv()["id"] == 1
        assert sorted(str(a["id"]) for a in conn.recv()) == ["2", "3"]
        assert conn.at_eof()
    note = {"jsonrpc": "2.0", "method": "memory.add_note",
            "params": {"agent_id": "default", "content": "the last words \u00e9"}}
    with daemon.connect() as conn:  # a notification: run, and nothing sent back
        conn.send_bytes(orjson.dumps(note))
        conn.sock.shutdown(socket.SHUT_WR)
        assert conn.at_eof()
    (listed,) = daemon.call("memory.list", {"agent_id": "default"})["files"]
    text = daemon.call("memory.read", {"agent_id": "default", "path": listed["path"]})["text"]
    assert "the last words \u00e9" in text
    with daemon.connect() as conn:  # cut short: it does not parse
        conn.send_bytes(b'{"jsonrpc":"2.0","method":"daemon.ping","id":4')
        conn.sock.shutdown(socket.SHUT_WR)
        assert conn.recv()["error"]["code"] == errors.PARSE_ERROR
        assert conn.at_eof()


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
    read = _big_read(d)
    assert len(d.call("memory.read", read["params"])["text"]) >= 399_000
    clients, requests_each, answer_mb = 24, 64, 0.4
    with d.connect() as pinger:
        for _ in range(20):  # warm: the ping path and the read path have run
            assert pinger.call("daemon.ping")["pong"] is True
        before = server_stats(d)
        peak_before_kib = _vm_kib(d.pid, "VmHWM")
        stuck = _unread_connections(d, clients, b"".join(
            orjson.dumps({**read, "id": i}) + b"\n" for i in range(requests_each)))
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


def _big_read(d: DaemonHandle) -> dict[str, object]:
    """A ``memory.read`` request (without its id) of a 400 KB note written for it."""
    ws = Path(d.call("workspace.list")["workspaces"][0]["path"])
    (ws / "memory" / "big.md").write_text(("y" * 999 + "\n") * 400)
    return {"jsonrpc": "2.0", "method": "memory.read",
            "params": {"agent_id": "default", "path": "memory/big.md"}}


def _unread_connections(d: DaemonHandle, n: int, data: bytes) -> list[RawConnection]:
    """``n`` connections that each send ``data`` and never read an answer."""
    out = []
    for _ in range(n):
        conn = d.connect()
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.send_bytes(data)
        out.append(conn)
    return out


def test_a_batch_of_large_answers_is_cut_and_memory_stays_bounded(
        daemon_factory: DaemonFactory) -> None:
    # A batch is answered in one frame: once its answers pass 1 MiB its other requests are
    # refused unrun (-32006), so a connection that sends batches of large reads and never
    # reads holds about a MiB, not the 40 MB a batch of 100 such reads makes.
    d = daemon_factory("[daemon]\nwrite_timeout_s = 3.0\n")
    read = _big_read(d)
    with d.connect() as conn:
        conn.send([{**read, "id": i} for i in range(10)]
                  + [{"jsonrpc": "2.0", "method": "daemon.ping"}])
        answers = sorted(conn.recv(), key=lambda a: a["id"])
        assert len(answers) == 10
        ran = [a for a in answers if "result" in a]
        assert 2 <= len(ran) <= 4 and all(len(a["result"]["text"]) >= 399_000 for a in ran)
        assert answers[:len(ran)] == ran  # in order: the first ones ran
        for refused in answers[len(ran):]:
            assert refused["error"]["code"] == errors.REQUEST_TOO_LARGE, refused
            assert "smaller batch" in refused["error"]["message"]
        assert conn.call("daemon.ping")["pong"] is True
    clients = 12
    batch = orjson.dumps([{**read, "id": i} for i in range(100)]) + b"\n"
    before = server_stats(d)
    peak_before_kib = _vm_kib(d.pid, "VmHWM")
    stuck = _unread_connections(d, clients, batch * 3)
    wait_for(lambda: server_stats(d)["timeouts_total"] - before["timeouts_total"] >= clients,
             "the connections that do not read to be cut")
    for conn in stuck:
        assert conn.at_eof(timeout=10)
        conn.close()
    grown_mb = (_vm_kib(d.pid, "VmHWM") - peak_before_kib) / 1024
    assert grown_mb < clients * 8 + 50, grown_mb
    assert d.call("daemon.ping")["pong"] is True


def test_connection_cap_answers_overloaded(daemon_factory: DaemonFactory) -> None:
    d = daemon_factory("[daemon]\nmax_connections = 3\n")
    conns = [_connect_admitted(d) for _ in range(3)]
    with d.connect() as extra:
        reply = extra.recv()
        assert reply == {"jsonrpc": "2.0", "id": None,
                         "error": {"code": errors.OVERLOADED, "message": "too many connections"}}
        assert extra.at_eof()
    # A client whose request comes after the daemon refused and closed its connection
    # (each time: a busy machine) says the daemon is overloaded, not that it closed.
    with pytest.raises(errors.Overloaded, match="too many connections"):
        _LateClient(d.socket_path).ping()

    async def late_async() -> None:
        async with _LateAsyncClient(d.socket_path) as client:
            await client.ping()

    with pytest.raises(errors.Overloaded, match="too many connections"):
        trio.run(late_async)
    conns.pop().close()
    wait_for(lambda: _ping_ok(d), what="a free slot")
    for c in conns:
        c.close()


def _closed_by_peer(sock: socket.socket) -> None:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    wait_for(lambda: any(ev & select.POLLHUP for _, ev in poller.poll(0)),
             "the daemon closes the connection it refused")


class _LateClient(Client):
    """Sends its requests only once the daemon has closed the connection."""

    def _open_socket(self) -> socket.socket:
        sock = super()._open_socket()
        _closed_by_peer(sock)
        return sock


class _LateAsyncClient(AsyncClient):
    async def _open_stream(self) -> SocketStream:
        stream = await super()._open_stream()
        _closed_by_peer(stream.extra(SocketAttribute.raw_socket))
        return stream


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
    # daemon.ping answers while the workspaces' later services still start; a status
    # call waits for the whole start (the connection sockets it opens are in place).
    daemon.call("daemon.status")
    baseline = socket_count(daemon.pid)
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
    wait_for(lambda: socket_count(daemon.pid) <= baseline, what="sockets back to baseline")
    # A connection's task counts itself out just after its socket is closed: wait for the
    # last ones (the status call itself is the one left open).
    wait_for(lambda: server_stats(daemon)["connections_open"] == 1,
               what="every client connection counted out")
    assert server_stats(daemon)["requests_total"] >= 5000


#: 1 GiB of address space (``ulimit -v``, systemd's LimitAS=): several times what the
#: daemon maps serving a small workspace.
SMALL_ADDRESS_SPACE_LAUNCHER = (
    sys.executable, "-c",
    "import os, resource, sys;"
    "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
    "os.execv(sys.executable, [sys.executable, '-m', 'recalld.daemon.main', *sys.argv[1:]])",
)


def test_a_restart_under_an_address_space_limit_reads_its_state(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The start under the limit reads the state the first one left (the workspaces it
    # served, the scheduler's state, the index's manifest): reading one of those small
    # files reserved a gigabyte of address space, so the daemon stopped on a MemoryError.
    root = tmp_path / "ws"
    (root / "memory" / "2026-09-03").mkdir(parents=True)
    (root / "memory" / "2026-09-03" / "log.md").write_text(
        "# Mittwoch\n\nDie Sternwarte öffnet um neun.\n", encoding="utf-8")
    config = f'[workspaces.c]\npath = "{root}"\ndream_cron_enabled = false\n'
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    for start in range(2):
        d = daemon_factory(config, launcher=SMALL_ADDRESS_SPACE_LAUNCHER if start else None,
                           **env)
        hits = d.call("memory.search", {"agent_id": "c", "query": "sternwarte",
                                        "sync": start == 0})["results"]
        assert [h["path"] for h in hits] == ["memory/2026-09-03/log.md"], (start, hits)
        assert d.stop() == 0


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
