"""The persist loop keeps committing after an explicit commit (a compaction, a rebuild)
was made while it waited for changes: edits after one are saved without a stop."""

from __future__ import annotations

from pathlib import Path

import trio
from test_saved_delta import _committed, _index, _note


async def test_edits_after_an_explicit_compaction_are_committed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(12):
        _note(root, i, "first words")
    index = _index(tmp_path, root)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        await index.sync()
        await _committed(index, "the first build's commit", 30)  # the loop waits for changes again
        first = index.last_commit
        await index.compact()  # commits at once, while the loop waits
        assert index.last_commit is not first
        for round_ in range(2):
            _note(root, 100 + round_, "later words")
            await index.sync()
            assert index.status()["uncommitted_changes"] > 0
            await _committed(index, f"the commit of edit {round_} after the compaction", 30)
        nursery.cancel_scope.cancel()
