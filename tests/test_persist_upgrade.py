"""A generation saved by an older version: rebuilt where needed, never reported as damage."""

from __future__ import annotations

from pathlib import Path

import pytest

from recalld.daemon.index import bm25_saved, persist
from recalld.daemon.index.persist import IndexStore, snapshot
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.state import IndexState
from recalld.daemon.index.tokenizer import tokenize_query

NOTE = "---\nname: zeppelin\n---\n# Airships\n\nThey flew over the lake.\n"
REL = "memory/2026-07-23/a.md"


def saved(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / REL).parent.mkdir(parents=True)
    (root / REL).write_text(NOTE, encoding="utf-8")
    state = IndexState()
    state.apply([prepare_files(root, [REL], max_chars=1600, digests={})])
    meta = tmp_path / "meta"
    IndexStore(meta).save(snapshot(state))
    return meta


def test_current_generation_loads_as_saved(tmp_path: Path) -> None:
    meta = saved(tmp_path)
    state = IndexState()
    report = IndexStore(meta).load(state)
    assert report.rebuilt == [] and report.corrupt == {}
    assert state.files[REL].digest and state.files[REL].mtime_ns


def test_older_keyword_format_and_chunking_are_redone_not_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm25_saved, "VERSION", 1)
    monkeypatch.setattr(persist, "CHUNKING", 1)
    meta = saved(tmp_path)
    monkeypatch.undo()
    state = IndexState()
    report = IndexStore(meta).load(state)
    assert report.corrupt == {} and sorted(report.rebuilt) == ["bm25", "chunks"]
    # The keyword index is rebuilt from the stored chunks and answers at once ...
    hits = state.bm25.search(tokenize_query("zeppelin"), 5)
    assert [state.chunks[k].path for k, _ in hits] == [REL]
    # ... and every file reads as changed, so the reconcile chunks it again.
    info = state.files[REL]
    assert (info.mtime_ns, info.size, info.digest) == (0, 0, "") and list(info.keys)
