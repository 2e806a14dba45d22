"""systemd integration (RELIABILITY 23): sd_notify, watchdog, reload and status lines
(socket activation: test_socket_activation.py)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio
from hooks import SESSIONS_HELD, start_hook
from test_warm_start import _open_writer
from waits import wait_for

from recalld.daemon.systemd import (
    MAX_NOTIFY_BYTES,
    MIN_WATCHDOG_PERIOD_S,
    Notifier,
    run_watchdog,
)

if TYPE_CHECKING:
    from conftest import DaemonFactory


class FakeSystemd:
    """A NOTIFY_SOCKET datagram socket that records every message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []
        #: The size of each datagram received (systemd drops one over MAX_NOTIFY_BYTES).
        self.sizes: list[int] = []

    def receive(self, timeout: float = 20.0) -> dict[str, str]:
        self.sock.settimeout(timeout)
        raw = self.sock.recv(1 << 16)
        self.sizes.append(len(raw))
        data = raw.decode()
        msg = dict(line.split("=", 1) for line in data.splitlines() if "=" in line)
        self.messages.append(msg)
        return msg

    def wait_for(self, key: str, timeout: float = 20.0) -> dict[str, str]:
        end = time.monotonic() + timeout
        while True:
            msg = self.receive(max(0.01, end - time.monotonic()))
            if key in msg:
                return msg

    def close(self) -> None:
        self.sock.close()


def test_ready_watchdog_and_stopping(daemon_factory: DaemonFactory, short_dir: Path) -> None:
    fake = FakeSystemd(short_dir / "notify")
    try:
        d = daemon_factory(wait=False, NOTIFY_SOCKET=str(fake.path), WATCHDOG_USEC="200000")
        ready = fake.wait_for("READY")
        assert ready["READY"] == "1"
        assert "serving 1 workspace" in ready["STATUS"]
        # READY=1 means the socket already listens: no retry needed.
        assert d.call("daemon.ping")["pong"] is True
        status = d.call("daemon.status")
        assert [w["state"] for w in status["workspaces"]] == ["ready"]
        # The watchdog is petted every WATCHDOG_USEC / 2 while the loop runs.
        pets = sum(1 for _ in range(3) if "WATCHDOG" in fake.wait_for("WATCHDOG", 5))
        assert pets == 3
        d.signal(signal.SIGTERM)
        stopping = fake.wait_for("STOPPING")
        assert stopping["STOPPING"] == "1"
        # systemd waits as long as the stop may take (2 x graceful_timeout_s, 5 s, and a
        # 30 s margin), also when that is longer than the unit's TimeoutStopSec.
        assert stopping["EXTEND_TIMEOUT_USEC"] == "40000000"
        assert d.proc.wait(timeout=15) == 0
        assert not d.socket_path.exists()
    finally:
        fake.close()


def test_stop_signals_repeated_while_it_stops_let_the_stop_end_cleanly(
        daemon_factory: DaemonFactory) -> None:
    # systemd, a process manager or an impatient user may signal again while the daemon
    # stops: a second SIGTERM stops at once, and whatever comes after the supervisor's
    # receiver has closed (or sits unread in it as it closes) must not kill the process
    # with the default action half-way through its exit.
    d = daemon_factory()
    assert d.call("daemon.ping")["pong"] is True
    d.signal(signal.SIGTERM)
    d.signal(signal.SIGTERM)  # a second (trio may merge it with the first)
    sent = 0
    while True:  # and more until it has exited
        try:
            code = d.proc.wait(timeout=0.002)
            break
        except subprocess.TimeoutExpired:
            d.signal((signal.SIGTERM, signal.SIGHUP, signal.SIGINT)[sent % 3])
            sent += 1
    assert code == 0, d.log()[-2000:]
    assert "recalld stopped" in d.log()


def test_no_watchdog_without_watchdog_usec(daemon_factory: DaemonFactory, short_dir: Path) -> None:
    fake = FakeSystemd(short_dir / "notify")
    try:
        d = daemon_factory(wait=False, NOTIFY_SOCKET=str(fake.path))
        fake.wait_for("READY")
        d.signal(signal.SIGTERM)
        fake.wait_for("STOPPING")
        assert d.proc.wait(timeout=15) == 0
        assert not any("WATCHDOG" in m for m in fake.messages)
    finally:
        fake.close()


def test_sighup_reload_reports_and_survives_bad_file(
    daemon_factory: DaemonFactory, short_dir: Path, tmp_path: Path
) -> None:
    fake = FakeSystemd(short_dir / "notify")
    try:
        d = daemon_factory("", wait=False, NOTIFY_SOCKET=str(fake.path))
        fake.wait_for("READY")
        extra = tmp_path / "elsewhere" / "beta"
        d.config_path.write_text(f'[workspaces.beta]\npath = "{extra}"\n'
                                 '[daemon]\nlog_level = "DEBUG"\n')
        d.signal(signal.SIGHUP)
        reloaded = fake.wait_for("STATUS")
        while "reloaded" not in reloaded["STATUS"]:
            reloaded = fake.wait_for("STATUS")
        listed = {w["agent_id"]: w for w in d.call("workspace.list")["workspaces"]}
        assert listed["beta"]["path"] == str(extra.resolve())
        assert (extra / "memory").is_dir()

        d.config_path.write_text("[daemon\nbroken")
        d.signal(signal.SIGHUP)
        failed = fake.wait_for("STATUS")
        while "reload failed" not in failed["STATUS"]:
            failed = fake.wait_for("STATUS")
        assert d.call("daemon.ping")["pong"] is True
        assert "reload failed" in d.log()
        assert d.stop() == 0
    finally:
        fake.close()


def test_a_reload_during_the_start_leaves_ready_to_its_end(
    daemon_factory: DaemonFactory, short_dir: Path, tmp_path: Path
) -> None:
    # The sessions store holds the start until a writer comes (as in test_warm_start).
    root = tmp_path / "ws"
    held = tmp_path / "hold"
    os.mkfifo(held)
    fake = FakeSystemd(short_dir / "notify")
    writer = None
    try:
        d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n', wait=False,
                           **start_hook(tmp_path, SESSIONS_HELD), HOLD=str(held),
                           HOLD_AGENT="w",
                           NOTIFY_SOCKET=str(fake.path))
        writer = wait_for(lambda: _open_writer(held), "the sessions store opens the FIFO")
        d.signal(signal.SIGHUP)
        reloaded = fake.wait_for("STATUS")
        while "reloaded" not in reloaded["STATUS"]:
            reloaded = fake.wait_for("STATUS")
        assert not any("READY" in m or "RELOADING" in m for m in fake.messages), fake.messages
        os.close(writer)
        writer = None
        ready = fake.wait_for("READY")
        assert ready["READY"] == "1"
        assert d.stop() == 0
    finally:
        if writer is not None:
            os.close(writer)
        fake.close()


def test_notifier_without_socket_is_a_no_op() -> None:
    n = Notifier(None)
    assert not n.enabled
    assert n.ready("x") is False


def test_notifier_abstract_socket() -> None:
    name = f"recalld-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        n = Notifier("@" + name)
        assert n.status("line one\nline two")
        assert sock.recv(100) == b"STATUS=line one line two"
        n.close()
    finally:
        sock.close()


def test_notifier_reports_failures_and_never_blocks(short_dir: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    # A manager that never reads: the receive queue fills, sends fail at once (no block).
    fake = FakeSystemd(short_dir / "notify")
    n = Notifier(str(fake.path))
    try:
        sent = 0
        t0 = time.monotonic()
        while n.status("é 记忆 " + "x" * 200):  # UTF-8, as systemd reads it
            sent += 1
            assert sent < 100_000, "the receive queue never filled"
        assert time.monotonic() - t0 < 10
        assert sent > 0
        first = fake.receive(timeout=5)
        assert first["STATUS"].startswith("é 记忆 ")
        assert any("sd_notify STATUS failed" in r.getMessage() for r in caplog.records)
    finally:
        n.close()
        fake.close()
    # A socket that is gone: False and a warning, not an exception and not silence.
    caplog.clear()
    gone = Notifier(str(short_dir / "gone"))
    assert gone.enabled and gone.ready("x") is False
    assert any("sd_notify READY failed" in r.getMessage() for r in caplog.records)
    # Said once, not at every watchdog ping while it stays gone.
    assert not any(gone.watchdog() for _ in range(20))
    assert sum("sd_notify" in r.getMessage() and r.levelno >= logging.WARNING
               for r in caplog.records) == 1
    gone.close()


async def test_watchdog_pets_at_half_the_interval(autojump_clock: trio.testing.MockClock) -> None:
    sent: list[float] = []

    class Recorder(Notifier):
        def watchdog(self) -> bool:
            sent.append(trio.current_time())
            return True

    start = trio.current_time()
    with trio.move_on_after(10.0):
        await run_watchdog(Recorder(None), 4.0)
    assert [round(t - start, 6) for t in sent] == [0.0, 2.0, 4.0, 6.0, 8.0]


async def test_watchdog_of_a_microsecond_is_no_busy_loop(
        autojump_clock: trio.testing.MockClock) -> None:
    # WATCHDOG_USEC=1 cannot be met; petting every half microsecond would only burn a core.
    sent: list[float] = []

    class Recorder(Notifier):
        def watchdog(self) -> bool:
            sent.append(trio.current_time())
            return True

    start = trio.current_time()
    with trio.move_on_after(5.5 * MIN_WATCHDOG_PERIOD_S):
        await run_watchdog(Recorder(None), 1e-6)
    assert [round((t - start) / MIN_WATCHDOG_PERIOD_S, 6) for t in sent] == [0, 1, 2, 3, 4, 5]


def test_ready_status_names_a_workspace_that_failed_to_open(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # systemctl status shows the STATUS= line: a configured workspace that did not open is
    # named there, not only in the log and recalld status.
    fake = FakeSystemd(short_dir / "notify")
    try:
        d = daemon_factory('[workspaces.sys]\npath = "/usr"\n', wait=False,
                           NOTIFY_SOCKET=str(fake.path))
        ready = fake.wait_for("READY")
        assert ready["STATUS"].startswith("serving 1 workspace(s) on "), ready
        assert ready["STATUS"].endswith("; 1 failed: sys (recalld status says why)"), ready
        assert d.stop() == 0
    finally:
        fake.close()


def test_ready_naming_many_failed_workspaces_still_fits_what_systemd_reads(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # systemd drops a notification over 4096 bytes whole: a READY=1 whose STATUS= names
    # every workspace that failed (a disk not mounted) would leave the unit starting until
    # TimeoutStartSec killed it, and restarted, and killed it again.
    blocker = short_dir / "a-file"
    blocker.write_text("not a folder")
    tables = "".join(f'[workspaces.w{i:03d}-{"x" * 59}]\npath = "{blocker}/w{i}"\n'
                     for i in range(70))
    fake = FakeSystemd(short_dir / "notify")
    try:
        d = daemon_factory(tables, wait=False, NOTIFY_SOCKET=str(fake.path))
        ready = fake.wait_for("READY", timeout=60)
        assert fake.sizes[-1] <= MAX_NOTIFY_BYTES
        assert ready["READY"] == "1"
        assert ready["STATUS"].startswith("serving 1 workspace(s) on "), ready
        # A few named and the others counted, so the line keeps its hint whole.
        named = ", ".join(f'w{i:03d}-{"x" * 59}' for i in range(5))
        assert ready["STATUS"].endswith(
            f"; 70 failed: {named} and 65 more (recalld status says why)"), ready
        assert d.stop() == 0
    finally:
        fake.close()


def test_notifier_cuts_a_long_status_to_what_systemd_reads(short_dir: Path) -> None:
    fake = FakeSystemd(short_dir / "notify")
    n = Notifier(str(fake.path))
    try:
        for status in ("记忆" * 3000, "x" * 5000, "é" * (MAX_NOTIFY_BYTES // 2)):
            assert n.stopping(status, extend_s=40)
            msg = fake.receive(timeout=5)
            assert fake.sizes[-1] <= MAX_NOTIFY_BYTES  # and it decoded as UTF-8
            assert msg["STOPPING"] == "1" and msg["EXTEND_TIMEOUT_USEC"] == "40000000"
            assert status.startswith(msg["STATUS"][:-1]) and msg["STATUS"].endswith("\u2026")
            assert fake.sizes[-1] > MAX_NOTIFY_BYTES - 4  # cut no shorter than it must be
        # A status that fits is sent as it is.
        assert n.ready("s" * 4000)
        assert fake.receive(timeout=5)["STATUS"] == "s" * 4000
    finally:
        n.close()
        fake.close()


def test_status_follows_workspaces_opened_and_closed_by_clients(
        daemon_factory: DaemonFactory, short_dir: Path) -> None:
    # systemctl status shows the last STATUS= line: after the start it follows what
    # clients open and close, not the count at the start.
    fake = FakeSystemd(short_dir / "notify")
    try:
        d = daemon_factory(wait=False, NOTIFY_SOCKET=str(fake.path))
        assert fake.wait_for("READY")["STATUS"].startswith("serving 1 workspace(s) on ")

        def status_saying(text: str) -> dict[str, str]:
            while text not in (msg := fake.wait_for("STATUS")).get("STATUS", ""):
                pass
            return msg

        for agent in ("ada", "bo"):
            d.call("workspace.open", {"agent_id": agent})
        status_saying("serving 3 workspace(s) on ")
        d.call("workspace.close", {"agent_id": "ada"})
        status_saying("serving 2 workspace(s) on ")
        assert d.stop() == 0
        assert "STOPPING" in fake.wait_for("STOPPING")
    finally:
        fake.close()


def test_ctrl_c_while_the_daemon_starts_stops_it_without_a_traceback(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # SIGINT (Ctrl-C on `recalld serve`) before the event loop runs, while the daemon
    # reads its configuration or imports its modules: a KeyboardInterrupt traceback and
    # status -2, where the same key a moment later is a clean stop. The start is held
    # here as it reads its configuration.
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    held = start_hook(
        tmp_path,
        "import os, signal",
        # SIGINT at its default action, as a terminal starts the daemon, also when this
        # suite runs with SIGINT ignored (a background job), which its children inherit.
        "signal.signal(signal.SIGINT, signal.default_int_handler)",
        "from recalld.daemon import config",
        "load = config.load",
        "def held(*args, **kw):",
        "    open(os.environ['HOLD'], 'rb').read()",
        "    return load(*args, **kw)",
        "config.load = held")
    d = daemon_factory("", **held, wait=False, HOLD=str(fifo))
    writer = wait_for(lambda: _open_writer(fifo), "the start held before the supervisor")
    try:
        d.signal(signal.SIGINT)
        assert d.proc.wait(timeout=30) == 0, d.log()
    finally:
        os.close(writer)
    assert "Traceback" not in d.log() and "KeyboardInterrupt" not in d.log(), d.log()
    assert d.log().strip().splitlines()[-1] == "recalld: stopped while it started (interrupted)"
    assert not d.socket_path.exists()
