"""The resource catalog at scale: a batch of changes walks the catalog once, not once per
changed path (20,000 files took minutes to catalog and to delete)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.resource import ResourceCatalog
from recalld.daemon.workspaces import Workspace, WorkspaceSettings


class CountingRecords(dict[str, JsonObject]):
    """Catalog records that count the walks over them."""

    walks = 0

    def __iter__(self) -> Iterator[str]:
        self.walks += 1
        return super().__iter__()


async def test_a_batch_walks_the_catalog_once(tmp_path: Path) -> None:
    bulk = tmp_path / "resource" / "bulk"
    bulk.mkdir(parents=True)
    paths = set()
    for i in range(300):
        (bulk / f"r{i:03d}.txt").write_text(f"resource {i}\n")
        paths.add(f"resource/bulk/r{i:03d}.txt")
    cat = ResourceCatalog(Workspace("w", tmp_path, WorkspaceSettings()))
    records = cat.records = CountingRecords()

    await cat.apply_paths(paths)
    assert cat.counts() == {"queued": 300}
    assert records.walks <= 1

    # The folder goes: its one event stands for every file cataloged below it.
    shutil.rmtree(bulk)
    records.walks = 0
    await cat.apply_paths({"resource/bulk"})
    assert cat.counts() == {"removed": 300}
    assert records.walks <= 1
