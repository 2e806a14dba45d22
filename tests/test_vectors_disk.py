"""A disk that fills while the backfill writes the embedding cache: the cache is only
worth keeping, so the workspace goes on serving (its new vectors too) and the cache is
written again once there is room."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from hooks import start_hook
from test_disk_full import LAUNCHER
from test_vectors_daemon import fake_config, vectors_status, wait_covered, write
from waits import wait_value


def test_a_full_disk_under_the_embedding_cache_keeps_the_workspace(daemon_factory: Any,
                                                                   tmp_path: Path) -> None:
    root = tmp_path / "ws"
    trigger = tmp_path / "disk-is-full"
    write(root, "memory/2026-02-01/a.md", "# A\n\nmarble\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(fake_config(root, fake), **start_hook(tmp_path, LAUNCHER),
                           DISK_FULL_TRIGGER=str(trigger), DISK_FULL_AT="1",
                           DISK_FULL_ERRNO="ENOSPC")
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        trigger.touch()
        write(root, "memory/2026-02-02/b.md", "# B\n\nbasalt\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["embedded"] == st["total"] == 2, "the new vector")
        assert st["cache"]["write_errors"] >= 1
        res = d.call("memory.search", {"agent_id": "w", "query": "basalt"})
        assert res["mode"] == "hybrid" and res["results"][0]["path"].endswith("b.md")
        assert "disk full" in d.log() and "Traceback" not in d.log()
        trigger.unlink()
        write(root, "memory/2026-02-03/c.md", "# C\n\nchalk\n")
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d)["cache"]["stored"], lambda n: n >= 2,
                   "the cache written again")
        assert d.stop() == 0
