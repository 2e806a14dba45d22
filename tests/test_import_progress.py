"""The progress of ``recalld import-qwenpaw`` on a workspace of thousands of notes: a
listing whose total is unknown says so, and the indexing's total is every note to index
from its first count, so no figure shows the end before the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DaemonHandle
from test_cli import recalld
from test_cli_progress import _records

NOTES = 3_000  # several passes' batches: many readings, whatever the machine's speed


def _workspace(root: Path) -> None:
    for i in range(NOTES):
        note = root / "memory" / f"2025-{i % 12 + 1:02d}-{i % 28 + 1:02d}" / f"заметка {i}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"# Запись {i}\nthe tide table of Kerrowan, 潮汐 {i}\n" * 12,
                        encoding="utf-8")


@pytest.mark.slow
def test_an_import_shows_its_end_only_at_the_end(daemon: DaemonHandle,
                                                 tmp_path: Path) -> None:
    ws = tmp_path / "qw-большой"
    _workspace(ws)
    proc = recalld("import-qwenpaw", str(ws), "--agent", "tides", "--json", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    records = _records(proc.stderr)
    # While the notes are listed their number is unknown: a count, no total, no ETA.
    for r in records:
        if r["phase"] == "listing notes":
            assert r["total"] is None and r["eta_s"] is None, r
    indexing = [r for r in records if r["phase"] == "indexing"]
    assert len(indexing) >= 2, records
    *before, end = indexing
    assert end["done"] == end["total"] == NOTES, records
    # Every earlier reading counts all the notes still to come.
    assert all(r["total"] == NOTES and r["done"] < NOTES for r in before), records
    fractions = [r["done"] / r["total"] for r in indexing]
    assert fractions == sorted(fractions), records
