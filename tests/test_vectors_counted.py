"""Before the index has looked at its folder, the vector status says the chunks are not
counted yet, not "0 of 0 embedded, coverage 1.0"."""

from __future__ import annotations

from pathlib import Path

import trio
from fakes.provider_server import FakeProvider
from test_vectors import BACKFILL, NOTES, Harness, full, wait_for, write

from recalld.daemon.config import WorkspaceSettings
from recalld.daemon.index.embedder import VectorWorker
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.maintenance import Health
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.workspaces import Workspace


async def test_coverage_is_not_counted_before_the_first_scan(tmp_path: Path,
                                                             bridge: ProviderBridge) -> None:
    h = Harness(tmp_path, bridge)
    for rel, text in NOTES.items():
        write(h.root, rel, text)
    start = trio.Event()  # the daemon's start: the folder's first scan waits for it
    with FakeProvider(dims=8) as fake:
        emb = h.emb(fake)
        ws = Workspace("w", h.root, WorkspaceSettings(embedding_model_config=emb))
        index = WorkspaceIndex(ws, h.cfg, cpu=trio.CapacityLimiter(2), hold=start.wait)
        worker = VectorWorker(index, h.spaces, emb, backfill=BACKFILL)
        health = Health(ws, index, trio.CapacityLimiter(1), vectors=worker)
        async with trio.open_nursery() as nursery:
            await nursery.start(index.run)
            await nursery.start(worker.run)
            # The health check passed; the folder is not read yet.
            await wait_for(lambda: worker.target.client.health == "ok")
            st = worker.status()
            assert st["counted"] is False, st
            assert (st["total"], st["coverage"], st["pending"], st["eta_s"]) == (
                None, None, None, None), st
            report = health.status()
            assert report["state"] == "pending"
            assert "vectors: chunks not counted yet" in report["reasons"], report
            start.set()
            await full(worker)
            st = worker.status()
            assert st["counted"] is True
            assert (st["total"], st["coverage"], st["pending"]) == (3, 1.0, 0), st
            nursery.cancel_scope.cancel()
