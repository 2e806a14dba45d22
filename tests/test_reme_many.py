"""A ReMe workspace of many notes, a part of them chunked by ReMe, is indexed in one pass."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from recalld.daemon.index import reme_import
from recalld.daemon.index.passes import POOL_BATCH, POOL_MIN_FILES


def many_notes(root: Path, n: int) -> int:
    """``n`` notes below ``root``, every other one in a ReMe chunk store; how many are."""
    records = []
    for i in range(n):
        rel = f"memory/2026-{i % 12 + 1:02d}-{i % 28 + 1:02d}/note {i}.md"
        body = f"# Note {i}\n\nFact {i}: the widget wg{i * 7} ships on day {i % 28}."
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body + "\n", "utf-8")
        if i % 2 == 0:
            records.append({"id": hashlib.sha256(rel.encode()).hexdigest(), "text": body,
                            "metadata": {}, "path": rel, "start_line": 1, "end_line": 3,
                            "scores": {}})
    store = root / "mem_metadata" / reme_import.CHUNK_STORE
    store.parent.mkdir(parents=True)
    store.write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(orjson.dumps(r) + b"\n" for r in records)))
    return len(records)


@pytest.mark.timeout(300)
def test_many_notes_half_chunked_by_reme_are_indexed_in_one_pass(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Each batch first looks up ReMe's chunks of its notes (and, for the notes ReMe has
    # none of, those of notes gone since) in a thread, so batches get there in any
    # order; the worker processes must still count their words batch after batch.
    n = 12 * POOL_BATCH
    assert n >= POOL_MIN_FILES
    ws = tmp_path / "ws"
    chunked = many_notes(ws, n)
    d = daemon_factory("")
    rep = d.call("workspace.open", {"agent_id": "w", "path": str(ws), "import_report": True},
                 timeout=240)["import"]
    assert rep["complete"] and rep["notes"] == n, rep
    assert rep["chunks"] == {"total": n, "reme_boundaries": chunked}, rep
    assert "apply failed" not in d.log()
    hits = d.call("memory.search", {"agent_id": "w", "query": f"wg{(n - 1) * 7}"})["results"]
    assert hits and hits[0]["path"].endswith(f"note {n - 1}.md"), hits
