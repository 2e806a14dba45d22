"""A note renamed or moved since ReMe indexed it keeps ReMe's chunks and vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reme_fixture_util import fixture_provider, passage_texts
from test_reme_import import wait_full
from test_reme_start import reme_workspace, report

from recalld.daemon.index import reme_import


def test_notes_renamed_or_moved_since_reme_indexed_them_cost_nothing(
        daemon_factory: Any, tmp_path: Path) -> None:
    ws, config = reme_workspace(tmp_path)
    reme_files = {p: p.read_bytes() for p in (ws / "mem_metadata").rglob("*") if p.is_file()}
    found = reme_import.read_store(ws / "mem_metadata")
    assert found is not None
    two = next(p for p, cs in found.chunks.items() if len(cs) == 2 and p.startswith("memory/"))
    one = next(p for p, cs in found.chunks.items() if len(cs) == 1 and p.startswith("memory/"))
    renamed, moved = "memory/2026-06-12/renamed after the fact.md", "memory/archive/old.md"
    (ws / two).rename(ws / renamed)
    (ws / "memory" / "archive").mkdir()
    (ws / one).rename(ws / moved)
    with fixture_provider() as fake:
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        st = wait_full(d)
        rep = report(d, ws)
        paid = passage_texts(fake)
        hits = {h["path"] for h in d.call("memory.list", {"agent_id": "w"})["files"]}
        assert d.stop() == 0
    assert {renamed, moved} <= hits and not {two, one} & hits
    assert paid == []
    assert rep["chunks"] == {"total": len(found), "reme_boundaries": len(found)}, rep
    assert st["reused_vectors"] == st["total"] == len(found), st
    assert {p: p.read_bytes() for p in reme_files} == reme_files  # ReMe's files as they were
