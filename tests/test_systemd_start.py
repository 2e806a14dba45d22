"""A start with long work before READY=1 under systemd (a restore the daemon was killed
in, finished at the next start): systemd hears that it goes on, and of one that stopped
moving it hears nothing more, so its start timeout ends it."""

from __future__ import annotations

import os
from pathlib import Path

import trio
import trio.testing
from conftest import DaemonFactory, DaemonHandle
from hooks import start_hook
from test_restore_killed import killed_restore
from test_systemd import FakeSystemd
from test_warm_start import _open_writer
from waits import wait_for

from recalld.daemon.systemd import Notifier, StartProgress

# Launcher lines: the start tells systemd every 50 ms, finds itself stuck after
# $STUCK_AFTER seconds without a step, and the restore's 5th rename into place waits
# until a writer opened the FIFO $HOLD and closed it.
RESTORE_HELD = (
    "import os",
    "from recalld.daemon import backup_restore, systemd",
    "systemd.START_EXTEND_PERIOD_S = 0.05",
    "systemd.START_STUCK_AFTER_S = float(os.environ['STUCK_AFTER'])",
    "real, calls = backup_restore.in_folder, []",
    "def held(*args, **kwargs):",
    "    calls.append(1)",
    "    if len(calls) == 5:",
    "        open(os.environ['HOLD'], 'rb').read()",
    "    return real(*args, **kwargs)",
    "backup_restore.in_folder = held",
)


def held_recovery(daemon_factory: DaemonFactory, tmp_path: Path, short_dir: Path,
                  stuck_after: str) -> tuple[DaemonHandle, FakeSystemd, Path]:
    """A restore killed partway, and the next start, under a fake systemd, held in its
    recovery: that daemon, the fake systemd and the FIFO that holds it."""
    d, *_ = killed_restore(daemon_factory, tmp_path, "in_folder", 60)
    hold = short_dir / "hold"
    os.mkfifo(hold)
    fake = FakeSystemd(short_dir / "notify")
    d2 = daemon_factory(**start_hook(tmp_path, *RESTORE_HELD), wait=False,
                        HOLD=str(hold), STUCK_AFTER=stuck_after, NOTIFY_SOCKET=str(fake.path),
                        XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    return d2, fake, hold


def release(hold: Path) -> None:
    os.close(wait_for(lambda: _open_writer(hold), "the recovery waits on the FIFO"))


def test_a_long_recovery_before_ready_extends_the_start_timeout(
        daemon_factory: DaemonFactory, tmp_path: Path, short_dir: Path) -> None:
    # Only READY=1 ended the start's timeout: a recovery longer than TimeoutStartSec was
    # killed, and the next start began it again, forever.
    d, fake, hold = held_recovery(daemon_factory, tmp_path, short_dir, "300")
    try:
        msg = fake.wait_for("EXTEND_TIMEOUT_USEC")
        while "interrupted restore" not in msg.get("STATUS", ""):
            msg = fake.wait_for("EXTEND_TIMEOUT_USEC")
        assert int(msg["EXTEND_TIMEOUT_USEC"]) >= 100_000
        assert not any("READY" in m for m in fake.messages)
        release(hold)
        fake.wait_for("READY")
        # READY=1 ends what systemd hears of the start: up to the status line of a
        # workspace opened since, no more extensions.
        d.call("workspace.open", {"agent_id": "v", "path": str(tmp_path / "v")})
        msg = fake.wait_for("STATUS")
        while "serving 3 workspace(s)" not in msg["STATUS"]:  # default, w and v
            assert "EXTEND_TIMEOUT_USEC" not in msg
            msg = fake.wait_for("STATUS")
        assert "EXTEND_TIMEOUT_USEC" not in msg
        assert d.call("daemon.status")["restore_recovery"]["outcome"] == "finished"
    finally:
        fake.close()


def test_a_recovery_that_stops_moving_is_no_longer_extended(
        daemon_factory: DaemonFactory, tmp_path: Path, short_dir: Path) -> None:
    _, fake, hold = held_recovery(daemon_factory, tmp_path, short_dir, "0.5")
    try:
        # (Under load a slow step before the recovery may be said stuck too.)
        msg = fake.wait_for("STATUS")
        while not (msg["STATUS"].startswith("no progress for")
                   and "interrupted restore" in msg["STATUS"]):
            msg = fake.wait_for("STATUS")
        assert "EXTEND_TIMEOUT_USEC" not in msg
        release(hold)  # it moves again, and ends
        fake.wait_for("READY")
    finally:
        fake.close()


async def test_the_start_is_extended_while_it_moves_and_not_after(
        autojump_clock: trio.testing.MockClock, short_dir: Path) -> None:
    fake = FakeSystemd(short_dir / "notify")
    notifier = Notifier(str(fake.path))
    progress = StartProgress()
    scope = trio.CancelScope()
    got: list[str] = []
    first_at: list[float] = []

    async def receive() -> None:  # as systemd does, or its queue of 10 would drop some
        while True:
            await trio.lowlevel.wait_readable(fake.sock)
            got.append(fake.sock.recv(4096).decode())
            first_at.append(trio.current_time())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            nursery.start_soon(notifier.tell_start, progress, scope)
            progress.phase("restoring w", total=40)
            for _ in range(39):  # 390 s of steps
                await trio.sleep(10)
                progress.advance()
            await trio.sleep(610)  # then none
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        # At once, before a period: a unit's TimeoutStartSec may be shorter.
        assert "EXTEND_TIMEOUT_USEC=30000000" in got[0] and first_at[0] == 0
        extended = [m for m in got if "EXTEND_TIMEOUT_USEC=30000000" in m]
        assert len(extended) >= 60 and "restoring w 39/40" in extended[-1]
        assert got[-1].startswith("STATUS=no progress for")  # the last 300 s: none
        assert sum("no progress" in m for m in got) >= 25
    finally:
        notifier.close()
        fake.close()
