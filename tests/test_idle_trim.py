"""A workspace nobody searched for ``idle_trim_s`` lets go of the pages of its mapped
index files (a real daemon, its ``/proc/<pid>/smaps``): the pages searches faulted in
leave the daemon's resident memory, and the next search maps back what it needs."""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from markers import marker
from waits import wait_for, workspace_status
from watcher_harness import inline

from recalld.daemon import maintenance
from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.records import note_stamp
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.maintenance import Health
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.watchsource import ScriptedChangeSource
from recalld.daemon.workspaces import Workspace

NOTES = 400


def mapped_kb(pid: int, metadata: Path) -> int:
    """Resident KB of the daemon's mappings of files under ``metadata``."""
    total, inside = 0, False
    prefix = str(metadata.resolve())
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line
                fields = line.split(None, 5)
                inside = len(fields) == 6 and fields[5].startswith(prefix)
            elif inside and head == "Rss:":
                total += int(line.split()[1])
    return total


def index_status(d: Any) -> dict[str, Any]:
    ws = workspace_status(d, "w")
    assert ws is not None, "workspace w is not open"
    index: dict[str, Any] = ws["index"]
    return index


def search(d: Any, query: str) -> list[str]:
    answer = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": 5})
    return [r["path"] for r in answer["results"]]


def test_an_unsearched_workspace_lets_go_of_its_mapped_pages(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    words = ["harbour", "lantern", "meadow", "orchard", "quarry", "saddle", "thimble"]
    for i in range(NOTES):
        note = root / "memory" / f"2026-03-{i % 28 + 1:02d}" / f"n{i}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        body = " ".join(f"{words[(i + j) % len(words)]}{j % 13}" for j in range(120))
        note.write_text(f"# Note {i}\nEntry {i}: {marker(i, 'token')} {body}\n", encoding="utf-8")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n'
                       '[daemon]\npersist_delay_s = 0.05\nidle_trim_s = 1.5\n')
    d.call("index.sync", {"agent_id": "w"})
    # Served from the committed files: the commit maps them.
    wait_for(lambda: index_status(d).get("last_commit") and
             not index_status(d)["uncommitted_changes"], "the first build committed")
    trims = wait_for(lambda: index_status(d)["idle_trims"] or None,
                     "the idle trim after the build")
    # Searches fault in pages of the mapped files; unused for idle_trim_s, they go.
    for i in range(0, NOTES, 7):
        assert search(d, marker(i, "token")) == [f"memory/2026-03-{i % 28 + 1:02d}/n{i}.md"]
    metadata = root / "mem_metadata"
    touched = mapped_kb(d.pid, metadata)
    assert touched > 0, "the searches read no mapped page"
    wait_for(lambda: mapped_kb(d.pid, metadata) <= touched // 2,
             "the mapped pages let go of after the searches")
    wait_for(lambda: index_status(d)["idle_trims"] > trims, "the idle trim counted")
    # The next search maps back the pages it reads and finds what it found before.
    assert search(d, marker(21, "token")) == ["memory/2026-03-22/n21.md"]
    assert mapped_kb(d.pid, metadata) > 0
    wait_for(lambda: index_status(d)["idle_trims"] > trims + 1, "another trim once idle")


IDLE_TRIM_S = 30.0


def unit_index(tmp_path: Path, idle_trim_s: float = IDLE_TRIM_S) -> tuple[
        Workspace, WorkspaceIndex, trio.CapacityLimiter]:
    """A one-note workspace and its (unstarted) index, watched through a scripted source,
    rescanned every 5 minutes, never committed."""
    root = tmp_path / "ws"
    (root / "memory" / "2026-07-01").mkdir(parents=True)
    (root / "memory" / "2026-07-01" / "a.md").write_text("# Seen\n\nthe heron at dusk\n")
    ws = Workspace("w", root, WorkspaceSettings())
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", idle_trim_s=idle_trim_s,
                       # No commit within the tests' virtual days: its worker threads
                       # would hold the index lock while the autojump clock runs on.
                       persist_delay_s=3600.0 * 24 * 30)
    cpu = trio.CapacityLimiter(2)
    index = WorkspaceIndex(ws, cfg, cpu=cpu)
    # The watcher's disk work inline: its rescans run at their virtual times (the autojump
    # clock jumps while a real thread runs).
    index.watcher = Watcher(root, ["memory", "digest"], apply=index.apply_paths,
                            known=lambda: index.state.known(), source=ScriptedChangeSource(),
                            config=WatcherConfig(reconcile_interval_s=300.0), limiter=cpu,
                            wall=trio.current_time, run_sync=inline, stamp=note_stamp)
    return ws, index, cpu


async def trims_reach(index: WorkspaceIndex, count: int) -> None:
    """Wait (virtual time) until ``index`` trimmed ``count`` times. The startup reconcile's
    apply runs in a worker thread, and the autojump clock moves on while it does: when the
    trim after it comes is not known to the virtual second, only that it comes."""
    with trio.fail_after(7 * 24 * 3600):
        while index.idle_trims < count:
            await trio.sleep(1)


async def find(index: WorkspaceIndex) -> None:
    found = await index.candidates("heron", 5, Filters(), None)
    assert [index.state.chunks[key].path for key, _ in found.keyword] == [
        "memory/2026-07-01/a.md"]


@pytest.fixture
def virtual_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Health tells a fresh scan by the wall clock: make it follow trio's virtual one, so
    its periodic scans run as they would over the hours the autojump clock skips."""
    base = time.time()
    monkeypatch.setattr(maintenance, "time", types.SimpleNamespace(
        time=lambda: base + trio.current_time(), monotonic=time.monotonic))


async def test_housekeeping_does_not_wake_the_idle_trim(
        tmp_path: Path, autojump_clock: trio.testing.MockClock,
        virtual_wall_clock: None) -> None:
    ws, index, cpu = unit_index(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)  # its startup reconcile applied the note
        await nursery.start(Health(ws, index, cpu).run)
        await trims_reach(index, 1)  # after the startup reconcile applied the note
        # An hour of health scans and watcher rescans (every 5 minutes), no search.
        await trio.sleep(3600)
        assert index.watcher.status()["last_reconcile"]["reason"] != "startup"
        assert index.idle_trims == 1
        nursery.cancel_scope.cancel()


async def test_searches_closer_than_idle_trim_s_keep_the_pages(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    _, index, _ = unit_index(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await trims_reach(index, 1)  # after the startup reconcile applied the note
        for _ in range(30):  # 10 minutes of searches 20 s apart
            await find(index)
            await trio.sleep(IDLE_TRIM_S * 2 / 3)
        assert index.idle_trims == 1
        await trims_reach(index, 2)  # once they stopped
        await trio.sleep(3600)
        assert index.idle_trims == 2  # one trim per use, not a timer
        nursery.cancel_scope.cancel()


async def test_idle_trim_s_zero_never_trims(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    _, index, _ = unit_index(tmp_path, idle_trim_s=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await find(index)
        await trio.sleep(3600)
        assert index.idle_trims == 0
        nursery.cancel_scope.cancel()
