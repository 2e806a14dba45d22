"""The watcher on the real inotify source when a root itself goes wrong: replaced by a
link, removed again while the watch restarts, replaced while a sync waits."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trio
from watcher_harness import ROOTS, FakeIndex, disk_notes, eventually, write

from recalld.daemon import inotify
from recalld.daemon.inotify import InotifySource
from recalld.daemon.store import confine
from recalld.daemon.watcher import Watcher
from recalld.daemon.watchpaths import WatchedRoots
from recalld.daemon.watchrecords import WatcherConfig

pytestmark = pytest.mark.skipif(not inotify.available(), reason="inotify is Linux-only")


def make(tmp_path: Path, **cfg: float) -> tuple[Watcher, FakeIndex]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    index = FakeIndex(ws)
    watcher = Watcher(ws, ROOTS, apply=index.apply, known=index.known,
                      source=InotifySource(), config=WatcherConfig(**cfg))
    return watcher, index


async def test_a_root_replaced_by_a_link_is_failed_then_watched_again(tmp_path: Path) -> None:
    watcher, index = make(tmp_path, restart_backoff_initial_s=0.2)
    ws = index.workspace
    write(ws / "notes" / "n.md", "n")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            shutil.rmtree(ws / "memory")
            os.symlink("notes", ws / "memory")
            # inotify does not follow the link: the watcher says the root is unwatched.
            await eventually(lambda: watcher.status()["state"] == "failed")
            # It says the root is a link, not "Not a directory" (which it seems to be).
            assert str(watcher.status()["why"]).endswith(
                f"cannot watch {ws / 'memory'}: it is a symbolic link, which is not "
                "followed: put the folder itself there"), watcher.status()
            os.unlink(ws / "memory")
            (ws / "memory").mkdir()
            await eventually(lambda: watcher.status()["state"] == "watching")
            # Watched again: a new note arrives by its event, with no sync.
            write(ws / "memory" / "2026-12-01" / "x.md", "x")
            await eventually(lambda: "memory/2026-12-01/x.md" in index.docs)
            nursery.cancel_scope.cancel()


async def test_a_root_removed_again_while_the_watch_restarts_is_watched_again(
        tmp_path: Path) -> None:
    # Another process's `rm -rf digest; mkdir digest` wins the race once: the root is
    # gone when the restarted watch is set up, and back a moment later.
    watcher, index = make(tmp_path, restart_backoff_initial_s=0.2)
    ws = index.workspace
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            paths = watcher._paths
            make_roots = paths.make_roots

            def make_then_lose(leave: frozenset[str] = frozenset()) -> None:
                make_roots(leave)
                shutil.rmtree(ws / "digest")
                paths.make_roots = make_roots  # type: ignore[method-assign]

            paths.make_roots = make_then_lose  # type: ignore[method-assign]
            shutil.rmtree(ws / "digest")
            await eventually(lambda: paths.make_roots == make_roots
                             and watcher.status()["state"] == "watching")
            write(ws / "digest" / "later.md", "later")
            await watcher.sync()
            assert index.texts() == disk_notes(ws), watcher.status()
            nursery.cancel_scope.cancel()


async def test_a_sync_right_after_a_root_was_replaced_needs_no_fallback(tmp_path: Path) -> None:
    # The sync's cookie goes into the new memory/ before the watch has restarted on it:
    # written again once it has, it is seen, with no wait for the fallback's timeout.
    watcher, index = make(tmp_path, sync_timeout_s=5.0)
    ws = index.workspace
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            shutil.rmtree(ws / "memory")
            write(ws / "memory" / "2026-12-01" / "a.md", "a")
            await watcher.sync()
            assert index.texts() == disk_notes(ws)
            assert watcher.status()["sync_fallbacks"] == 0
            assert watcher.status()["restarts"] >= 1
            assert not [p.name for p in (ws / "memory").iterdir() if p.name.startswith(".")]
            nursery.cancel_scope.cancel()


async def test_a_workspace_moved_away_and_back_keeps_its_notes(tmp_path: Path) -> None:
    # While the roots cannot be listed, what they hold is unknown, not gone: nothing is
    # dropped, the watcher says why, and once they are back it lists them again.
    watcher, index = make(tmp_path, restart_backoff_initial_s=0.2)
    ws = index.workspace
    write(ws / "memory" / "2026-12-01" / "a.md", "a")
    write(ws / "digest" / "b.md", "b")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            away = tmp_path / "away"
            os.rename(ws, away)
            await watcher.sync()
            status = watcher.status()
            assert status["state"] == "failed"
            assert "cannot list memory" in str(status["why"])
            assert index.texts() == disk_notes(away)
            os.rename(away, ws)
            write(ws / "memory" / "2026-12-01" / "c.md", "c")
            # No event says the workspace is back: the watcher's retry finds it.
            await eventually(lambda: watcher.status()["state"] == "watching")
            assert index.texts() == disk_notes(ws)
            nursery.cancel_scope.cancel()


def _reads_everything() -> bool:
    # Root with CAP_DAC_READ_SEARCH or CAP_DAC_OVERRIDE lists a folder of mode 000.
    try:
        with open("/proc/self/status") as fh:
            caps = int(next(line for line in fh if line.startswith("CapEff")).split()[1], 16)
    except OSError:  # no /proc: only Linux runs these tests anyway
        return os.geteuid() == 0
    return bool(caps & 0b110)


@pytest.mark.skipif(_reads_everything(), reason="this process lists folders of mode 000")
async def test_an_unreadable_root_keeps_its_notes_until_readable_again(tmp_path: Path) -> None:
    watcher, index = make(tmp_path)
    ws = index.workspace
    write(ws / "memory" / "2026-12-01" / "a.md", "a")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            os.chmod(ws / "memory", 0)
            try:
                # The chmod's event makes the watcher look again.
                await eventually(lambda: watcher.status()["state"] == "failed")
                assert "cannot list memory: Permission denied" in str(watcher.status()["why"])
                assert "memory/2026-12-01/a.md" in index.docs
            finally:
                os.chmod(ws / "memory", 0o755)
            write(ws / "memory" / "2026-12-01" / "b.md", "b")
            await eventually(lambda: watcher.status()["state"] == "watching"
                             and index.texts() == disk_notes(ws))
            nursery.cancel_scope.cancel()


@pytest.mark.skipif(_reads_everything(), reason="this process lists folders of mode 000")
async def test_an_unreadable_day_folder_keeps_its_notes_until_readable_again(
        tmp_path: Path) -> None:
    # A folder below a root that cannot be listed is as unknown as a root that cannot:
    # its notes stay, and the status says why, whether its event or a scan finds it.
    watcher, index = make(tmp_path)
    ws = index.workspace
    write(ws / "memory" / "2026-12-01" / "a.md", "a")
    write(ws / "memory" / "2026-12-02" / "deep" / "b.md", "b")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            for folder in ("2026-12-01", "2026-12-02/deep"):
                os.chmod(ws / "memory" / folder, 0)
            try:
                await eventually(lambda: watcher.status()["state"] == "failed")
                await watcher.reconcile("a look from the start")
                why = str(watcher.status()["why"])
                assert "cannot list memory/2026-12-01: Permission denied" in why, why
                assert "cannot list memory/2026-12-02/deep: Permission denied" in why, why
                assert index.texts() == {"memory/2026-12-01/a.md": "a",
                                         "memory/2026-12-02/deep/b.md": "b"}
            finally:
                for folder in ("2026-12-01", "2026-12-02/deep"):
                    os.chmod(ws / "memory" / folder, 0o755)
            write(ws / "memory" / "2026-12-01" / "c.md", "c")
            await eventually(lambda: watcher.status()["state"] == "watching"
                             and index.texts() == disk_notes(ws))
            nursery.cancel_scope.cancel()


async def test_a_root_moved_away_and_back_by_hand_keeps_its_layout(tmp_path: Path) -> None:
    # A root moved away is not recreated at once: `mv memory x; mv x memory` typed by
    # hand puts the folder back where it was, not inside a new memory/.
    watcher, index = make(tmp_path, restart_backoff_initial_s=0.2)
    ws = index.workspace
    write(ws / "memory" / "2026-12-01" / "a.md", "a")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            os.rename(ws / "memory", tmp_path / "mem.bak")
            await eventually(lambda: watcher.status()["state"] == "failed")
            await watcher.sync()  # its notes are elsewhere, not gone
            assert not (ws / "memory").exists()
            assert index.texts() == {"memory/2026-12-01/a.md": "a"}
            os.rename(tmp_path / "mem.bak", ws / "memory")
            await eventually(lambda: watcher.status()["state"] == "watching")
            write(ws / "memory" / "2026-12-01" / "b.md", "b")
            await watcher.sync()
            assert index.texts() == disk_notes(ws)
            assert sorted(p.name for p in (ws / "memory").iterdir()) == ["2026-12-01"]
            nursery.cancel_scope.cancel()


async def test_a_root_removed_is_recreated_and_its_notes_dropped(tmp_path: Path) -> None:
    watcher, index = make(tmp_path)
    ws = index.workspace
    write(ws / "memory" / "2026-12-01" / "a.md", "a")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            shutil.rmtree(ws / "memory")
            await eventually(lambda: (ws / "memory").is_dir() and not index.docs)
            write(ws / "memory" / "2026-12-02" / "b.md", "b")
            await watcher.sync()
            assert index.texts() == {"memory/2026-12-02/b.md": "b"}
            assert watcher.status()["state"] == "watching"
            nursery.cancel_scope.cancel()


def test_the_roots_are_never_made_through_a_link_in_place_of_the_workspace(
        tmp_path: Path) -> None:
    # The watcher made its missing roots with mkdir by path: with a link to alice's
    # folder in the workspace's place, bob's watch (restarted after the loss) made
    # alice's memory/ and digest/ folders, before any use of bob saw the link.
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    bob.mkdir()
    alice.mkdir()
    paths = WatchedRoots(bob, ROOTS, suffixes=(".md",), ignore_dirs=())
    confine.guard(bob)  # as the open workspace has it
    try:
        bob.rename(tmp_path / "bob.old")
        bob.symlink_to(alice)
        with pytest.raises(OSError, match="now leads to"):
            paths.make_roots()
        paths.make_removed_roots(frozenset())  # logged, not made
    finally:
        confine.release(bob)
    assert list(alice.iterdir()) == []
