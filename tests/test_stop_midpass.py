"""A stop while notes of megabytes are read for the index: the pass ends at its next note
instead of reading them all first (tens of MB took longer than systemd's stop timeout),
and the next start reads them and finds every one; inside a note being masked, at the
masking's next check. A stop that still takes long says in
the log what it waits for."""

from __future__ import annotations

import logging
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from test_prepare_given_up import keys_note
from waits import wait_value, workspace_status

from recalld.daemon.stopreport import STOP_SLOW_S, report_slow_stop

NOTES = 6


def long_note(i: int, size: int) -> str:
    """About ``size`` characters of prose in sections, with ``marker<i>`` in its last
    line only."""
    rng = random.Random(i)
    words = [f"{w}{k}" for k in range(40) for w in ("trolley", "ledger", "orchard", "quay")]
    block = "\n".join(" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(60))
    sections = [f"## Section {k}\n\n{block}\n" for k in range(size // len(block) + 1)]
    return f"# Long note {i}\n\n" + "\n".join(sections) + f"\nThe last line holds marker{i}.\n"


def test_a_stop_during_a_pass_ends_it_and_the_next_start_indexes_every_note(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("index.sync", {"agent_id": "w"})
    # Written beside the workspace and moved in at once: one pass reads them all.
    staged = tmp_path / "staged"
    staged.mkdir()
    for i in range(NOTES):
        (staged / f"long{i}.md").write_text(long_note(i, 200_000), encoding="utf-8")
    staged.rename(root / "memory" / "long")
    wait_value(lambda: (workspace_status(d, "w") or {}).get("index", {}).get("preparing", 0),
               bool, "the moved notes being prepared", poll_s=0.01)
    assert d.stop() == 0
    # The thread reading them ended at its next note: nothing was waited for.
    assert "w: stopped preparing" in d.log()

    # Nothing of them was saved half-done: the next start reads them all.
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    d2.call("index.sync", {"agent_id": "w"})
    index = (workspace_status(d2, "w") or {})["index"]
    assert (index["files"], index["preparing"]) == (NOTES, 0)
    for i in (0, NOTES - 1):
        found = d2.call("memory.search", {"agent_id": "w", "query": f"marker{i}"})
        assert [r["path"] for r in found["results"]][:1] == [f"memory/long/long{i}.md"]


async def test_a_slow_stop_names_its_stage_and_what_it_waits_for(
        autojump_clock: object, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="recalld.daemon.stopreport")
    entered, release = threading.Event(), threading.Event()

    def write_the_last_generation() -> None:
        entered.set()
        release.wait()

    async def closing_workspace() -> None:
        await trio.to_thread.run_sync(write_the_last_generation)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(closing_workspace)
        await trio.to_thread.run_sync(entered.wait)
        nursery.start_soon(report_slow_stop, lambda: "stopping: closing workspaces")
        # Said once the stop has taken STOP_SLOW_S, again at twice that; not before.
        await trio.sleep(STOP_SLOW_S * 2.5)
        release.set()
        nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" (")[0] for m in said] == [
        f"stopping for {STOP_SLOW_S:.0f} s", f"stopping for {2 * STOP_SLOW_S:.0f} s"]
    for message in said:
        assert "(stopping: closing workspaces)" in message
        assert "tasks: " in message and ".closing_workspace" in message
        assert "worker threads: write_the_last_generation (for " in message
        assert "report_slow_stop" not in message


def _cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has used so far (/proc/PID/stat: user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_stop_while_a_note_of_keys_is_masked_ends_the_masking(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Masking 4 MB of keys takes some 6 s of CPU: a stop ends it at its next check (every
    # few hundred tokens), not after it. CPU time, not wall time, is compared: a loaded
    # machine stretches the one, not the other.
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("index.sync", {"agent_id": "w"})
    keys = keys_note(72_000)
    staged = tmp_path / "keys.md"
    staged.write_text(keys, encoding="utf-8")
    staged.rename(root / "memory" / "keys.md")
    wait_value(lambda: (workspace_status(d, "w") or {}).get("index", {}).get("preparing", 0),
               bool, "the note being prepared", poll_s=0.01)
    pid = d.proc.pid
    # Masking under way (the stop comes after the check before it): the daemon busy.
    busy = _cpu_s(pid) + 0.3
    at_start = wait_value(lambda: _cpu_s(pid), lambda cpu: cpu >= busy, "masking under way",
                          poll_s=0.01)
    used, done = [at_start], threading.Event()

    def follow() -> None:  # the daemon's CPU time until it is gone
        while not done.is_set():
            try:
                used[0] = _cpu_s(pid)
            except (OSError, IndexError, ValueError):
                return
            done.wait(0.005)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        assert d.stop() == 0
    finally:
        done.set()
        follower.join()
    assert "w: stopped preparing" in d.log()
    assert used[0] - at_start < 2.5, (at_start, used[0])
