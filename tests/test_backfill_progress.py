"""The backfill's figures while a large pass adds notes: the notes not indexed yet have
chunks nobody has counted, so the total (and the ETA) is unknown until the pass ends,
never a coverage or an ETA of the notes indexed so far."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider
from test_vectors_daemon import covered_daemon, write
from waits import wait_for

NOTES = 3_000  # a large pass (worker processes) of several seconds


@pytest.mark.slow
def test_the_backfill_total_is_unknown_while_a_large_pass_adds_notes(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-03-01/первый.md", "# Первый\n\nthe harbour pilot\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        # A folder of notes moved in at once: one large pass.
        outside = tmp_path / "2026-03-02"
        for i in range(NOTES):
            write(outside, f"note {i}.md", f"# Tide {i}\n\nthe pilot boat 引航 {i}\n")
        outside.rename(root / "memory" / "2026-03-02")
        readings: list[tuple[int, dict[str, Any]]] = []

        def indexed() -> bool:
            ws = next(w for w in d.call("daemon.status")["workspaces"]
                      if w["agent_id"] == "w")
            idx = ws["index"]
            readings.append((idx["adding"], idx["vectors"]))
            return bool(idx["files"] == NOTES + 1 and not idx["adding"])

        wait_for(indexed, "the notes moved in indexed", poll_s=0.02)
        during = [v for adding, v in readings if adding]
        assert during, readings[:3]
        assert all(v["total"] is None and v["coverage"] is None and v["eta_s"] is None
                   for v in during), [v for v in during if v["total"] is not None][:3]
