"""After a commit the index serves private copies of the files it just wrote (ADR 0020):
searches are answered while those copies are made, not held behind the index lock."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import trio
from hooks import run_first

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.store import arrays
from recalld.daemon.watchrecords import WatcherConfig
from recalld.daemon.workspaces import Workspace
from recalld.ipc.cli_status import COMMIT_WAIT_SHOWN_S, render_internals


@pytest.mark.parametrize("notes", [40, 600])  # an edit's commit; a large pass's (reload)
async def test_a_search_is_answered_while_a_commit_copies_its_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, notes: int) -> None:
    root = tmp_path / "ws"
    for i in range(notes):
        path = root / f"memory/2026-07-{i // 100 + 1:02d}/n{i:04d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {i}\n\nmarker{i} and common words\n", encoding="utf-8")
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    index = WorkspaceIndex(Workspace("w", root, WorkspaceSettings()), cfg,
                           cpu=trio.CapacityLimiter(2),
                           watcher_config=WatcherConfig(reconcile_interval_s=3600.0,
                                                        apply_batch_max=1 << 30))
    # The copies of the first commit's files wait until the search below was answered
    # (or gave up: then the copies were made under the lock it waits for).
    copying, release = threading.Event(), threading.Event()

    def hold() -> None:
        copying.set()
        release.wait(120)

    run_first(monkeypatch, arrays, "map_arrays", hold)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(index.run)
            await index.sync()
            with trio.fail_after(120):
                while not copying.is_set():
                    await trio.sleep(0.01)
            found = None
            with trio.move_on_after(30):  # answered at once unless it waits for the copy
                found = await index.candidates("marker7", 5, Filters(), None)
            release.set()
            assert found is not None, "the search waited for the copy"
            assert [found.chunks[k].path for k, _ in found.keyword][:1] == [
                "memory/2026-07-01/n0007.md"]
            with trio.fail_after(120):  # the commit then serves its files
                while not index.state.mapped:
                    await trio.sleep(0.01)
            assert index.last_commit is not None and index.last_commit["files"] == notes
            found = await index.candidates("marker7", 5, Filters(), None)
            assert [found.chunks[k].path for k, _ in found.keyword][:1] == [
                "memory/2026-07-01/n0007.md"]
            nursery.cancel_scope.cancel()
    finally:
        release.set()


async def test_a_commit_waits_for_background_work_and_leaves_a_token_for_edits(
        tmp_path: Path) -> None:
    # Two CPU tokens, one of them for background work, as on two cores. A scan nobody
    # waits for (health's, a reconcile's) holds the background token and a CPU token: the
    # commit of an edit is background work too, so it waits, and the next edit is applied
    # and found with the CPU token left.
    root = tmp_path / "ws"
    note = root / "memory/2026-07-01/n.md"
    note.parent.mkdir(parents=True)
    note.write_text("# Note\n\nfirst words\n", encoding="utf-8")
    cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "d",
                       config_path=tmp_path / "c.toml", persist_delay_s=0.01)
    cpu, background = trio.CapacityLimiter(2), trio.CapacityLimiter(1)
    index = WorkspaceIndex(Workspace("w", root, WorkspaceSettings()), cfg, cpu=cpu,
                           background=background,
                           watcher_config=WatcherConfig(reconcile_interval_s=3600.0,
                                                        apply_batch_max=1 << 30))
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await index.sync()
        with trio.fail_after(60):  # the first build's commit, and nothing left to commit
            while index.last_commit is None or index.status()["uncommitted_changes"]:
                await trio.sleep(0.01)
        first = index.last_commit["generation"]
        async with background, cpu:  # a long scan
            note.write_text("# Note\n\nsecond words\n", encoding="utf-8")
            await index.sync()
            with trio.fail_after(60):  # the commit waits for the background token
                while background.statistics().tasks_waiting != 1:
                    await trio.sleep(0.01)
            seen_waiting = time.monotonic()
            assert cpu.borrowed_tokens == 1 and background.borrowed_tokens == 1
            assert index.last_commit["generation"] == first
            # The status says a commit waits, and for how long so far.
            waiting = index.status()["commit_waiting_s"]
            assert waiting is not None
            note.write_text("# Note\n\nthird words\n", encoding="utf-8")
            with trio.fail_after(60):
                await index.sync()
                found = await index.candidates("third", 5, Filters(), None)
            assert [found.chunks[k].path for k, _ in found.keyword] == [
                "memory/2026-07-01/n.md"]
            later = index.status()["commit_waiting_s"]
            assert later is not None and later > waiting
            released = time.monotonic()
        with trio.fail_after(60):  # the scan ended: the commit goes on
            while index.last_commit["generation"] == first:
                await trio.sleep(0.01)
        # It waited at least while the scan held the token after it was seen waiting,
        # and nothing waits now.
        assert index.last_commit["waited_s"] >= max(later, released - seen_waiting) - 1e-3
        assert index.status()["commit_waiting_s"] is None
        assert index.last_commit["waited_s"] < 60
        nursery.cancel_scope.cancel()


def test_status_verbose_names_a_commit_that_waited_a_second_or_more() -> None:
    def shown(waiting: float | None) -> str:
        return render_internals({"workspaces": [{  # type: ignore[typeddict-item]
            "agent_id": "w", "health": {},
            "index": {"uncommitted_changes": 4, "commit_waiting_s": waiting}}]})

    assert "w: 4 change(s) not saved yet: their commit has waited 12 s" in shown(12.3)
    assert "not saved yet" not in shown(COMMIT_WAIT_SHOWN_S - 0.01)
    assert "not saved yet" not in shown(None)
