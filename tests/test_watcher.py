"""The workspace watcher: coalescing, directory expansion, reconcile, sync cookies.

Unit tests drive a scripted change source under the autojump clock; integration tests
run the real watchfiles notifier on tmp_path with real (short) time.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from watchfiles import Change

from recalld.daemon.watcher import Watcher
from recalld.daemon.watchrecords import ReconcileResult, WatcherConfig
from recalld.daemon.watchsource import COOKIE_PREFIX, ScriptedChangeSource, WatchfilesSource
from recalld.ipc.errors import UnknownWorkspace

ROOTS = ("memory", "digest")


class FakeIndex:
    """A consumer that re-reads each path it is given, as the real index does."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.docs: dict[str, tuple[int, int, str]] = {}
        self.batches: list[set[str]] = []
        self.fail_next = 0

    def known(self) -> dict[str, tuple[int, int]]:
        return {p: (m, s) for p, (m, s, _) in self.docs.items()}

    async def apply(self, paths: set[str]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise OSError(28, "No space left on device")
        self.batches.append(set(paths))
        for rel in paths:
            path = self.workspace / rel
            try:
                st = path.stat()
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                self.docs.pop(rel, None)
                continue
            self.docs[rel] = (st.st_mtime_ns, st.st_size, text)

    def texts(self) -> dict[str, str]:
        return {p: t for p, (_, _, t) in self.docs.items()}

    def applied_paths(self) -> set[str]:
        return set().union(*self.batches) if self.batches else set()


def disk_notes(workspace: Path) -> dict[str, str]:
    """What the index should hold: visible *.md files under the roots."""
    out = {}
    for root in ROOTS:
        for path in (workspace / root).rglob("*.md"):
            rel = path.relative_to(workspace).as_posix()
            parts = rel.split("/")
            if path.is_file() and not any(p.startswith(".") or p == "mem_metadata" for p in parts):
                out[rel] = path.read_text(encoding="utf-8")
    return out


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


async def eventually(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not pred():
            await trio.sleep(max(0.01, timeout_s / 1000))


async def inline(fn: Callable[..., Any], *args: Any, limiter: object = None) -> Any:
    # The autojump clock jumps while a real thread runs; scripted tests stay in one thread.
    await trio.lowlevel.checkpoint()
    return fn(*args)


def make(
    tmp_path: Path, source: object | None = None,
    background: trio.CapacityLimiter | None = None, **cfg: object
) -> tuple[Watcher, FakeIndex, ScriptedChangeSource]:
    index = FakeIndex(tmp_path)
    src = source if source is not None else ScriptedChangeSource()
    config = WatcherConfig(**{"reconcile_interval_s": 300.0, **cfg})  # type: ignore[arg-type]
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=src, config=config, wall=trio.current_time,  # type: ignore[arg-type]
                      background=background, run_sync=inline)
    return watcher, index, src  # type: ignore[return-value]


# -- scripted source, autojump clock --------------------------------------------------------


async def test_startup_reconcile_is_incremental(tmp_path: Path, autojump_clock: object) -> None:
    for i in range(5):
        write(tmp_path / "memory" / "2026-07-01" / f"n{i}.md", f"note {i}")
    write(tmp_path / "memory" / "2026-07-01" / ".hidden.md", "hidden")
    write(tmp_path / "memory" / "2026-07-01" / "n0.md~", "backup")
    write(tmp_path / "memory" / "mem_metadata" / "x.md", "derived")
    watcher, index, _ = make(tmp_path)
    # A previous run indexed n0..n3; n3 changed since, n4 is new, gone.md was deleted.
    await index.apply({f"memory/2026-07-01/n{i}.md" for i in range(4)})
    index.docs["memory/gone.md"] = (1, 1, "old")
    write(tmp_path / "memory" / "2026-07-01" / "n3.md", "note 3, edited while down")
    index.batches.clear()

    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert (tmp_path / "digest").is_dir()  # created when missing
        assert index.applied_paths() == {
            "memory/2026-07-01/n3.md", "memory/2026-07-01/n4.md", "memory/gone.md"}
        assert index.texts() == disk_notes(tmp_path)
        status = watcher.status()
        assert status["state"] == "watching"
        assert status["last_reconcile"]["reason"] == "startup"
        assert status["last_reconcile"]["found"] == {"added": 1, "changed": 1, "deleted": 1}
        nursery.cancel_scope.cancel()


async def test_a_held_watcher_starts_at_once_and_watches_after_its_hold(
    tmp_path: Path, autojump_clock: object,
) -> None:
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    index = FakeIndex(tmp_path)
    hold = trio.Event()
    source = ScriptedChangeSource()
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=source,
                      config=WatcherConfig(reconcile_before_ready=False),
                      wall=trio.current_time, run_sync=inline, hold=hold.wait)
    # The startup scan comes after the watch is set up: a change made between the two is
    # seen by the scan, none is lost.
    watched_at_scan: list[bool] = []
    watcher.scan_reached = (1, lambda: watched_at_scan.append(source.running.is_set()))
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        # Started with the startup reconcile owed; no watch, no scan, no apply yet, and a
        # sync waits for the watch.
        status = watcher.status()
        assert status["rescan_owed"] == "startup" and status["state"] == "starting", status
        write(tmp_path / "memory" / "2026-07-01" / "n1.md", "note 1, written while held")
        await trio.testing.wait_all_tasks_blocked()
        assert index.batches == [] and watcher.status()["last_reconcile"] is None
        synced = trio.Event()

        async def sync() -> None:
            await watcher.sync()
            synced.set()

        nursery.start_soon(sync)
        await trio.testing.wait_all_tasks_blocked()
        assert not synced.is_set() and index.batches == []
        hold.set()
        await eventually(lambda: watcher.status()["last_reconcile"] is not None)
        status = watcher.status()
        assert status["state"] == "watching" and status["rescan_owed"] is None, status
        assert status["last_reconcile"]["reason"] == "startup"
        assert status["last_reconcile"]["found"] == {"added": 2, "changed": 0, "deleted": 0}
        assert index.texts() == disk_notes(tmp_path)
        assert watched_at_scan and all(watched_at_scan), watched_at_scan
        # (The scripted source delivers no cookie: the sync ends by its own reconcile.)
        with trio.fail_after(60):
            await synced.wait()
        nursery.cancel_scope.cancel()


async def test_a_sync_of_a_watcher_stopped_during_its_hold_fails(
    tmp_path: Path, autojump_clock: object,
) -> None:
    # The workspace failed or closed during the daemon's start: a search that syncs
    # gets an error, not a wait for a watch that never comes.
    index = FakeIndex(tmp_path)
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=ScriptedChangeSource(),
                      config=WatcherConfig(reconcile_before_ready=False),
                      wall=trio.current_time, run_sync=inline, hold=trio.sleep_forever)
    failed: list[BaseException] = []

    async def sync() -> None:
        try:
            await watcher.sync()
        except UnknownWorkspace as exc:
            failed.append(exc)

    async with trio.open_nursery() as outer:
        outer.start_soon(sync)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(watcher.run)
                await trio.testing.wait_all_tasks_blocked()
                assert not failed
                scope.cancel()
        with trio.fail_after(60):
            while not failed:
                await trio.sleep(1)
    assert "stopped before it was watched" in str(failed[0])


def test_a_scan_tells_when_it_has_found_many_notes(tmp_path: Path) -> None:
    for i in range(7):
        write(tmp_path / "memory" / f"2026-07-0{i % 3 + 1}" / f"n{i}.md", f"note {i}")
    write(tmp_path / "memory" / "2026-07-01" / ".hidden.md", "hidden")
    write(tmp_path / "memory" / "2026-07-01" / "n0.md~", "backup")
    watcher, _, _ = make(tmp_path)
    found: list[int] = []
    # Called from the scan itself (a worker thread in the daemon), once per scan, as the
    # scan's listing reaches that many notes, not after it.
    reached = (5, lambda: found.append(len(found)))
    assert len(watcher.scan(reached)) == 7 and found == [0]
    assert len(watcher.scan(reached)) == 7 and found == [0, 1]
    assert len(watcher.scan((8, lambda: found.append(-1)))) == 7 and found == [0, 1]  # never


async def test_only_a_reconcile_scan_tells_it_found_many_notes(
    tmp_path: Path, autojump_clock: object,
) -> None:
    for i in range(7):
        write(tmp_path / "memory" / f"2026-07-0{i % 3 + 1}" / f"n{i}.md", f"note {i}")
    watcher, _, _ = make(tmp_path)
    found: list[str] = []
    watcher.scan_reached = (5, lambda: found.append("reached"))
    assert len(watcher.scan()) == 7 and found == []  # health's, verify's, a rebuild's
    await watcher.reconcile()
    assert found == ["reached"]


async def test_editor_saves_renames_and_deletes(tmp_path: Path, autojump_clock: object) -> None:
    day = tmp_path / "memory" / "2026-07-23"
    note = write(day / "commute.md", "v1")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert index.texts() == {"memory/2026-07-23/commute.md": "v1"}

        # Save through a temp file and a rename.
        tmp = write(day / "commute.md.tmp.1234", "v2")
        os.replace(tmp, note)
        src.emit([(Change.added, tmp), (Change.deleted, tmp), (Change.added, note)])
        await eventually(lambda: index.texts().get("memory/2026-07-23/commute.md") == "v2")

        # vim: swap file, probe file 4913, original renamed to a backup, new file, cleanup.
        swap = write(day / ".commute.md.swp", "swap")
        probe = write(day / "4913", "")
        probe.unlink()
        backup = day / "commute.md~"
        os.replace(note, backup)
        write(note, "v3")
        backup.unlink()
        swap.unlink()
        src.emit([(Change.added, swap), (Change.added, probe), (Change.deleted, probe),
                  (Change.deleted, note), (Change.added, backup), (Change.added, note),
                  (Change.deleted, backup), (Change.deleted, swap)])
        await eventually(lambda: index.texts().get("memory/2026-07-23/commute.md") == "v3")

        # Rename, then delete.
        renamed = day / "commute-home.md"
        os.replace(note, renamed)
        src.emit([(Change.deleted, note), (Change.added, renamed)])
        await eventually(lambda: "memory/2026-07-23/commute.md" not in index.docs)
        assert index.texts() == disk_notes(tmp_path) == {"memory/2026-07-23/commute-home.md": "v3"}
        renamed.unlink()
        src.emit([(Change.deleted, renamed)])
        await eventually(lambda: not index.docs)

        # The consumer never saw editor litter, and the event path did the work.
        junk = {p for p in index.applied_paths() if not p.endswith(".md") or "/." in p}
        assert junk == set()
        assert watcher.status()["last_reconcile"]["reason"] == "startup"
        nursery.cancel_scope.cancel()


async def test_directory_moves_expand_to_their_files(
    tmp_path: Path, autojump_clock: object
) -> None:
    outside = tmp_path / "outside"
    for i in range(3):
        write(tmp_path / "memory" / "2026-07-01" / f"a{i}.md", f"a{i}")
        write(outside / "2026-07-02" / "sub" / f"b{i}.md", f"b{i}")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert len(index.docs) == 3

        # Out of the watched root: one event for the directory, none for its files.
        old = tmp_path / "memory" / "2026-07-01"
        shutil.move(old, outside / "2026-07-01")
        src.emit([(Change.deleted, old)])
        await eventually(lambda: not index.docs)

        # Into the watched root: files inside were never reported by the kernel.
        new = tmp_path / "memory" / "2026-07-02"
        shutil.move(outside / "2026-07-02", new)
        src.emit([(Change.added, new)])
        await eventually(lambda: len(index.docs) == 3)

        # Renamed inside the root.
        renamed = tmp_path / "memory" / "2026-07-03"
        os.replace(new, renamed)
        src.emit([(Change.deleted, new), (Change.added, renamed)])
        await eventually(lambda: all(p.startswith("memory/2026-07-03/") for p in index.docs))
        assert index.texts() == disk_notes(tmp_path)
        assert len(index.docs) == 3

        # A metadata event on a directory re-applies only what differs from the snapshot.
        index.batches.clear()
        write(renamed / "sub" / "b0.md", "b0 edited!")
        src.emit([(Change.modified, renamed)])
        await eventually(lambda: bool(index.batches))
        assert index.batches == [{"memory/2026-07-03/sub/b0.md"}]
        assert watcher.status()["last_reconcile"]["reason"] == "startup"
        nursery.cancel_scope.cancel()


async def test_event_storm_uses_bounded_memory(tmp_path: Path, autojump_clock: object) -> None:
    day = tmp_path / "memory" / "2026-07-04"
    real = [write(day / f"n{i:03d}.md", f"n{i}") for i in range(300)]
    # Most of the storm is files that came and went (a checkout, a sync tool).
    transient = [day / "tmp" / f"t{i:05d}.md" for i in range(9_700)]
    # No periodic reconcile in sight: only the overflow can make the index converge.
    watcher, index, src = make(tmp_path, max_pending=1_000, reconcile_interval_s=1e6)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert len(index.docs) == 300
        for i, path in enumerate(real):
            path.write_text(f"edited {i}", encoding="utf-8")
        for _ in range(3):
            src.emit([(Change.added, p) for p in transient] + [(Change.modified, p) for p in real])
        status = watcher.status()
        assert status["max_pending_seen"] <= 1_000 + 1
        assert status["overflows"] >= 1
        await eventually(lambda: watcher.status()["last_reconcile"]["reason"]
                         == "pending set overflow")
        assert index.texts() == disk_notes(tmp_path)
        assert watcher.pending_count() == 0
        nursery.cancel_scope.cancel()


async def test_repeated_paths_count_once(tmp_path: Path, autojump_clock: object) -> None:
    watcher, _, src = make(tmp_path, max_pending=20_000)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        paths = [tmp_path / "memory" / "d" / f"{i}.md" for i in range(10_000)]
        for change in (Change.added, Change.modified, Change.deleted):
            src.emit([(change, p) for p in paths])
        assert watcher.pending_count() == 10_000
        assert watcher.status()["overflows"] == 0
        await eventually(lambda: watcher.pending_count() == 0)
        nursery.cancel_scope.cancel()


async def test_repeated_events_coalesce_into_one_batch(
    tmp_path: Path, autojump_clock: object
) -> None:
    note = write(tmp_path / "digest" / "wiki" / "trio.md", "x")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        index.batches.clear()
        # Many events in one tick: the flush task has not run in between.
        for _ in range(50):
            src.emit([(Change.modified, note)])
        assert watcher.pending_count() == 1
        await eventually(lambda: len(index.batches) >= 1)
        assert index.batches == [{"digest/wiki/trio.md"}]
        nursery.cancel_scope.cancel()


async def test_silent_source_converges_within_one_reconcile_period(
    tmp_path: Path, autojump_clock: object
) -> None:
    write(tmp_path / "memory" / "d" / "keep.md", "keep")
    gone = write(tmp_path / "memory" / "d" / "gone.md", "gone")
    watcher, index, src = make(tmp_path, reconcile_interval_s=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        start = trio.current_time()
        src.silent = True  # inotify overflow: events vanish without a word
        gone.unlink()
        write(tmp_path / "memory" / "d" / "keep.md", "keep, edited")
        write(tmp_path / "digest" / "new.md", "new")
        assert not src.emit([(Change.added, tmp_path / "digest" / "new.md")])
        await eventually(lambda: index.texts() == disk_notes(tmp_path), timeout_s=120)
        status = watcher.status()
        assert status["last_reconcile"]["reason"] == "periodic"
        assert status["last_reconcile"]["found"] == {"added": 1, "changed": 1, "deleted": 1}
        assert status["last_reconcile"]["time"] - start <= 60.0 + 1.0
        nursery.cancel_scope.cancel()


async def test_sync_waits_for_the_cookie_batch(tmp_path: Path, autojump_clock: object) -> None:
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        note = write(tmp_path / "memory" / "d" / "fresh.md", "fresh")

        async def kernel() -> None:
            # The note's event, then the cookie's: delivered in write order.
            src.emit([(Change.added, note)])
            while not src.emit_cookies():
                await trio.sleep(0.001)

        nursery.start_soon(kernel)
        before = trio.current_time()
        await watcher.sync()
        assert trio.current_time() - before < 1.0  # no fallback wait
        assert index.texts() == {"memory/d/fresh.md": "fresh"}
        assert watcher.status()["sync_fallbacks"] == 0
        assert not list((tmp_path / "memory").glob(COOKIE_PREFIX + "*"))
        # Cookies are never handed to the consumer.
        assert all(COOKIE_PREFIX not in p for p in index.applied_paths())
        nursery.cancel_scope.cancel()


async def test_sync_waits_out_a_long_first_build_without_scanning_again(
    tmp_path: Path, autojump_clock: object
) -> None:
    # A first build's startup reconcile applies for longer than sync_timeout_s; the
    # cookie's event arrives meanwhile, so sync waits for that apply instead of running
    # a second reconcile of every file after it.
    for i in range(3):
        write(tmp_path / "memory" / "d" / f"n{i}.md", f"note {i}")
    index = FakeIndex(tmp_path)
    src = ScriptedChangeSource()
    applying = trio.Event()

    async def slow_apply(paths: set[str]) -> None:
        applying.set()
        await trio.sleep(30.0)
        await index.apply(paths)

    watcher = Watcher(tmp_path, ROOTS, apply=slow_apply, known=index.known, source=src,
                      config=WatcherConfig(reconcile_interval_s=300.0, sync_timeout_s=2.0,
                                           reconcile_before_ready=False),
                      wall=trio.current_time, run_sync=inline)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        await applying.wait()

        async def kernel() -> None:
            while not src.emit_cookies():
                await trio.sleep(0.001)

        nursery.start_soon(kernel)
        before = trio.current_time()
        await watcher.sync()
        assert trio.current_time() - before >= 25.0  # it did wait for the apply
        assert index.texts() == disk_notes(tmp_path)
        status = watcher.status()
        assert status["sync_fallbacks"] == 0
        assert status["last_reconcile"]["reason"] == "startup"
        assert len(index.batches) == 1
        nursery.cancel_scope.cancel()


async def test_sync_falls_back_to_reconcile_when_events_are_lost(
    tmp_path: Path, autojump_clock: object
) -> None:
    watcher, index, src = make(tmp_path, sync_timeout_s=2.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        src.silent = True
        write(tmp_path / "memory" / "d" / "lost.md", "lost event")
        with trio.fail_after(10):
            await watcher.sync()
        assert index.texts() == {"memory/d/lost.md": "lost event"}
        status = watcher.status()
        assert status["sync_fallbacks"] == 1
        assert status["last_reconcile"]["reason"] == "sync cookie not seen"
        assert not list((tmp_path / "memory").glob(COOKIE_PREFIX + "*"))
        nursery.cancel_scope.cancel()


async def test_watch_error_restarts_with_backoff_and_reconciles(
    tmp_path: Path, autojump_clock: object
) -> None:
    watcher, index, src = make(tmp_path, restart_backoff_initial_s=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        write(tmp_path / "memory" / "d" / "while-down.md", "x")
        failed_at = trio.current_time()
        src.fail(OSError(28, "inotify watch limit reached"))
        await eventually(lambda: watcher.status()["state"] == "failed")
        assert "inotify watch limit" in watcher.status()["why"]
        await eventually(lambda: src.starts == 2 and watcher.status()["state"] == "watching")
        assert trio.current_time() - failed_at >= 1.0  # waited out the backoff
        await eventually(lambda: "memory/d/while-down.md" in index.docs)
        status = watcher.status()
        assert status["errors"] == 1
        assert status["restarts"] == 1
        nursery.cancel_scope.cancel()


async def test_removed_root_is_recreated_and_watched_again(
    tmp_path: Path, autojump_clock: object
) -> None:
    write(tmp_path / "digest" / "wiki" / "a.md", "a")
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        shutil.rmtree(tmp_path / "digest")
        src.emit([(Change.deleted, tmp_path / "digest")])
        await eventually(lambda: src.starts == 2 and (tmp_path / "digest").is_dir())
        await eventually(lambda: not index.docs)
        nursery.cancel_scope.cancel()


async def test_apply_errors_are_retried_by_reconcile(
    tmp_path: Path, autojump_clock: object
) -> None:
    watcher, index, src = make(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        note = write(tmp_path / "memory" / "d" / "n.md", "n")
        index.fail_next = 1
        src.emit([(Change.added, note)])
        await eventually(lambda: "memory/d/n.md" in index.docs)
        status = watcher.status()
        assert status["errors"] == 1
        assert "No space left" in status["last_error"]
        nursery.cancel_scope.cancel()


async def test_cancel_of_a_scripted_watcher_is_immediate(
    tmp_path: Path, autojump_clock: object
) -> None:
    watcher, _, src = make(tmp_path)
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert not src.running.is_set()


# -- the real notifier, real time --------------------------------------------------------------


def real(tmp_path: Path) -> tuple[Watcher, FakeIndex]:
    index = FakeIndex(tmp_path)
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      source=WatchfilesSource(debounce_ms=50, step_ms=10),
                      config=WatcherConfig(sync_timeout_s=5.0))
    return watcher, index


async def test_real_watch_end_to_end(tmp_path: Path) -> None:
    write(tmp_path / "memory" / "2026-07-01" / "old.md", "old")
    outside = tmp_path / "outside"
    for i in range(3):
        write(outside / "2026-07-05" / "deep" / f"m{i}.md", f"m{i}")
    watcher, index = real(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            day = tmp_path / "memory" / "2026-07-23"

            # A brand-new directory and a file in it, then sync.
            note = write(day / "commute.md", "v1")
            await watcher.sync()
            assert index.texts()["memory/2026-07-23/commute.md"] == "v1"

            # Editor save via temp file + rename.
            tmp = write(day / ".commute.md.tmp-9", "v2")
            os.replace(tmp, note)
            await watcher.sync()
            assert index.texts()["memory/2026-07-23/commute.md"] == "v2"

            # vim's sequence.
            swap = write(day / ".commute.md.swp", "swap")
            write(day / "4913", "").unlink()
            os.replace(note, day / "commute.md~")
            write(note, "v3")
            (day / "commute.md~").unlink()
            swap.unlink()
            await watcher.sync()
            assert index.texts()["memory/2026-07-23/commute.md"] == "v3"

            # Rename, delete, directory moves in and out.
            os.replace(note, day / "home.md")
            (tmp_path / "memory" / "2026-07-01" / "old.md").unlink()
            shutil.move(outside / "2026-07-05", tmp_path / "memory" / "2026-07-05")
            await watcher.sync()
            assert index.texts() == disk_notes(tmp_path)
            assert len(index.docs) == 4
            shutil.move(tmp_path / "memory" / "2026-07-05", outside / "back")
            await watcher.sync()
            assert index.texts() == disk_notes(tmp_path) == {"memory/2026-07-23/home.md": "v3"}

            status = watcher.status()
            assert status["state"] == "watching"
            assert status["sync_fallbacks"] == 0
            assert status["last_reconcile"]["reason"] == "startup"
            assert not any(COOKIE_PREFIX in p for p in index.applied_paths())
            nursery.cancel_scope.cancel()


async def test_real_watch_cancels_in_under_a_second(tmp_path: Path) -> None:
    watcher, index = real(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        write(tmp_path / "digest" / "x.md", "x")
        await watcher.sync()
        assert "digest/x.md" in index.docs
        began = time.monotonic()
        nursery.cancel_scope.cancel()
    assert time.monotonic() - began < 1.0


async def test_real_watch_of_a_missing_root_degrades_to_reconcile(tmp_path: Path) -> None:
    index = FakeIndex(tmp_path)
    # A root that cannot exist (a file is in the way): the watch fails, reconcile serves.
    (tmp_path / "digest").write_text("not a directory", encoding="utf-8")
    write(tmp_path / "memory" / "a.md", "a")
    watcher = Watcher(tmp_path, ROOTS, apply=index.apply, known=index.known,
                      config=WatcherConfig(restart_backoff_initial_s=30.0))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            assert watcher.status()["state"] == "failed"
            assert watcher.status()["why"]
            assert index.texts() == {"memory/a.md": "a"}
            write(tmp_path / "memory" / "b.md", "b")
            await watcher.sync()  # no watch: sync reconciles
            assert set(index.docs) == {"memory/a.md", "memory/b.md"}
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("name", ["a.md~", ".a.md.swp", "4913", "#a.md#", "a.md.tmp", ".a.md"])
def test_editor_litter_is_not_a_note(tmp_path: Path, name: str) -> None:
    watcher, _, _ = make(tmp_path)
    assert not watcher.is_note(f"memory/2026-07-01/{name}")
    assert watcher.is_note("memory/2026-07-01/a.md")
    assert not watcher.is_note("memory/mem_metadata/a.md")


async def test_reconcile_scans_wait_for_a_background_token(
    tmp_path: Path, autojump_clock: object
) -> None:
    # The daemon gives work nobody waits for all but one CPU token (services.background):
    # a reconcile's scan takes one of those first, so it never holds a search's token.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    watcher, index, _ = make(tmp_path, background=background, reconcile_before_ready=False)
    async with trio.open_nursery() as nursery:
        async with background:
            await nursery.start(watcher.run)
            await trio.sleep(60)
            assert index.applied_paths() == set()  # the startup scan waits for the token
        await eventually(lambda: index.applied_paths() == {"memory/2026-07-01/n0.md"})
        nursery.cancel_scope.cancel()


async def test_a_reconcile_someone_waits_for_takes_no_background_token(
    tmp_path: Path, autojump_clock: object
) -> None:
    # A sync's fallback, a restore or a rebuild reconciles for a caller that waits: it must
    # not queue behind other workspaces' background work.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    watcher, index, _ = make(tmp_path, background=background, reconcile_before_ready=False)
    async with background:
        with trio.fail_after(60):  # virtual time: fails at once if it waits for the token
            result = await watcher.reconcile("after restore")
    assert result.added == 1
    assert index.applied_paths() == {"memory/2026-07-01/n0.md"}


async def test_an_unattended_reconcile_waits_for_its_token_outside_the_apply_lock(
    tmp_path: Path, autojump_clock: object
) -> None:
    # A periodic reconcile waiting for a background token must not hold the apply lock
    # meanwhile: a reconcile someone waits for (and every edit's flush) goes first.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    watcher, index, _ = make(tmp_path, background=background, reconcile_before_ready=False)
    release = trio.Event()
    periodic: list[ReconcileResult] = []

    async def hold_background(task_status: trio.TaskStatus[None]) -> None:
        async with background:  # other workspaces' background work
            task_status.started()
            await release.wait()

    async def run_periodic() -> None:
        periodic.append(await watcher.reconcile("periodic", unattended=True))

    async with trio.open_nursery() as nursery:
        await nursery.start(hold_background)
        nursery.start_soon(run_periodic)
        await eventually(lambda: background.statistics().tasks_waiting == 1)
        with trio.fail_after(60):  # virtual time: fails at once if it waits for the token
            result = await watcher.reconcile("after restore")
        assert result.added == 1 and not periodic
        release.set()
        await eventually(lambda: len(periodic) == 1)
    assert periodic[0].reason == "periodic" and periodic[0].added == 0
    assert index.applied_paths() == {"memory/2026-07-01/n0.md"}


async def test_a_rescan_owed_under_the_apply_lock_does_not_wait_for_a_token(
    tmp_path: Path, autojump_clock: object
) -> None:
    # An edit's flush waits for the apply lock (held by a reconcile someone waits for);
    # a periodic reconcile takes the one background token and waits for the lock behind
    # it; then the pending set overflows, so the flush, once it has the lock, owes a
    # rescan. Waiting for the token there would wait for the periodic reconcile, which
    # waits for the lock: the rescan scans without one instead, and both end.
    write(tmp_path / "memory" / "2026-07-01" / "n0.md", "note 0")
    background = trio.CapacityLimiter(1)
    index, src = FakeIndex(tmp_path), ScriptedChangeSource()
    applying, release = trio.Event(), trio.Event()

    async def apply(paths: set[str]) -> None:
        if "memory/2026-07-01/held.md" in paths:
            applying.set()
            await release.wait()
        await index.apply(paths)

    config = WatcherConfig(max_pending=2, reconcile_before_ready=False,
                           reconcile_interval_s=1e6)
    watcher = Watcher(tmp_path, ROOTS, apply=apply, known=index.known, source=src,
                      config=config, wall=trio.current_time, background=background,
                      run_sync=inline)
    periodic: list[ReconcileResult] = []

    async def run_periodic() -> None:
        periodic.append(await watcher.reconcile("periodic", unattended=True))

    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        await eventually(lambda: index.applied_paths() == {"memory/2026-07-01/n0.md"})
        write(tmp_path / "memory" / "2026-07-01" / "held.md", "held")
        nursery.start_soon(watcher.reconcile, "after restore")
        with trio.fail_after(60):
            await applying.wait()
        edit = write(tmp_path / "memory" / "2026-07-01" / "e0.md", "edit 0")
        src.emit([(Change.added, edit)])
        await trio.testing.wait_all_tasks_blocked()  # the flush on the apply lock
        nursery.start_soon(run_periodic)
        await eventually(lambda: background.statistics().borrowed_tokens == 1)
        more = [write(tmp_path / "memory" / "2026-07-01" / f"e{i}.md", f"edit {i}")
                for i in range(1, 4)]
        src.emit([(Change.added, p) for p in more])  # over max_pending: a rescan is owed
        release.set()
        with trio.fail_after(60):  # virtual time: a wait for ever fails at once
            await eventually(lambda: len(periodic) == 1)
        assert index.texts() == disk_notes(tmp_path)  # the edits and held.md applied
        nursery.cancel_scope.cancel()
