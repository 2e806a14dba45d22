"""The resource catalog on disk: saves land in the order of the states they write.

The watcher (a file cataloged) and the job (a file skipped or interpreted) each save the
catalog; a save of an older state that finished after a newer one left the file stale
(an empty file ``skipped`` in memory stayed ``queued`` on disk, to be handed to the job
again after a restart).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from recalld.daemon.memory import resource
from recalld.daemon.memory.catalog import load_catalog
from recalld.daemon.memory.resource import ResourceCatalog
from recalld.daemon.workspaces import Workspace, WorkspaceSettings


async def test_a_save_of_an_older_state_never_lands_after_a_newer_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_save = resource.save_catalog
    real_run_sync = trio.to_thread.run_sync
    gate = trio.Event()
    saves: list[str] = []
    calls = 0

    def save(path: Path, records: Mapping[str, Mapping[str, object]]) -> None:
        saves.append(str(records["resource/a.md"]["state"]))
        real_save(path, records)

    async def run_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # The first save's write is slow (a busy disk): it waits for the gate; the
        # saves run in the trio thread, so the test knows where each one is.
        nonlocal calls
        if fn is save:
            calls += 1
            if calls == 1:
                await gate.wait()
            return fn(*args)
        return await real_run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(resource, "save_catalog", save)
    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)
    cat = ResourceCatalog(Workspace("w", tmp_path, WorkspaceSettings()))
    cat.records = {"resource/a.md": {"path": "resource/a.md", "digest": "", "state": "queued"}}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cat._save)  # the watcher's, of the file queued
        await trio.testing.wait_all_tasks_blocked()
        cat.records["resource/a.md"]["state"] = "skipped"
        nursery.start_soon(cat._save)  # the job's, of the file skipped
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert load_catalog(cat.path)["resource/a.md"]["state"] == "skipped", saves
