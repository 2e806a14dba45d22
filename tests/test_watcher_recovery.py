"""The watcher after failures: a watch error restarts with backoff and reconciles, a
removed root is made and watched again, apply errors are retried by reconcile, and a
cancel is immediate.

Under the autojump clock, with a scripted change source.
"""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

import pytest
import trio
from watcher_harness import eventually, make, write
from watchfiles import Change

from recalld.daemon.store.errors import WorkspaceMissing
from recalld.daemon.watchrecords import WatchErrors
from recalld.daemon.watchsource import WatchError


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


async def test_an_apply_finding_the_workspace_folder_gone_logs_no_traceback(
    tmp_path: Path, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    # `rm -rf` of an open workspace: the index's save after the deletions finds the
    # folder gone, which its error says in words; a traceback only hid it in the log.
    watcher, index, src = make(tmp_path)
    index.failure = WorkspaceMissing(tmp_path, errno.ENOENT,
                                     f"the workspace folder {tmp_path} is missing")
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        note = write(tmp_path / "memory" / "d" / "n.md", "n")
        index.fail_next = 1
        with caplog.at_level(logging.WARNING, logger="recalld.daemon.watcher"):
            src.emit([(Change.added, note)])
            await eventually(lambda: "memory/d/n.md" in index.docs)
        nursery.cancel_scope.cancel()
    (said,) = [r for r in caplog.records if "apply failed" in r.getMessage()]
    assert "is missing" in said.getMessage()
    assert said.exc_info is None


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


def test_a_cause_said_before_is_not_said_again_until_the_watch_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A root moved away, then a link left in its place, then the link taken away and put
    # back: each retry's cause was compared with the last one only, so causes taking
    # turns were each said again as news, as a warning, at every turn.
    errors = WatchErrors("/ws")
    gone = WatchError("cannot watch /ws/memory: No such file or directory")
    link = WatchError("cannot watch /ws/memory: it is a symbolic link, which is not followed")
    with caplog.at_level(logging.DEBUG, logger="recalld.daemon.watcher"):
        for exc in (gone, link, gone, link):
            errors.record("watch failed", exc, explained=WatchError)
        errors.recovered("watch failed")  # it watched again: the same cause is news
        errors.record("watch failed", link, explained=WatchError)
    said = [(r.levelname, "symbolic link" in r.getMessage(), r.exc_info)
            for r in caplog.records]
    assert said == [("WARNING", False, None), ("WARNING", True, None), ("DEBUG", False, None),
                    ("DEBUG", True, None), ("WARNING", True, None)]
    assert errors.count == 5 and errors.last is not None and "symbolic" in errors.last
