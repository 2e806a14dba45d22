"""Before the index has looked at its folder, the vector status says the chunks are not
counted yet, not "0 of 0 embedded, coverage 1.0", and no text of a chunk loaded from the
last commit goes to the provider: its note may have been deleted meanwhile."""

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


async def test_a_note_deleted_while_down_is_not_sent_to_the_provider(
        tmp_path: Path, bridge: ProviderBridge) -> None:
    h = Harness(tmp_path, bridge)
    for rel, text in NOTES.items():
        write(h.root, rel, text)
    # Indexed and committed without vectors (none configured yet), then one note is
    # deleted while no daemon runs.
    plain = Workspace("w", h.root, WorkspaceSettings())
    async with trio.open_nursery() as nursery:
        index = WorkspaceIndex(plain, h.cfg, cpu=trio.CapacityLimiter(2))
        await nursery.start(index.run)
        await wait_for(lambda: len(index.state.chunks) == 3)
        nursery.cancel_scope.cancel()
    gone = "memory/2026-07-20/train.md"
    (h.root / gone).unlink()
    start = trio.Event()
    # The startup reconcile's scan waits for a background token: held here, the
    # backfill starts first, with the chunks loaded from the commit.
    background = trio.CapacityLimiter(1)
    await background.acquire()
    with FakeProvider(dims=8) as fake:
        emb = h.emb(fake)
        ws = Workspace("w", h.root, WorkspaceSettings(embedding_model_config=emb))
        index = WorkspaceIndex(ws, h.cfg, cpu=trio.CapacityLimiter(2), hold=start.wait,
                               background=background)
        worker = VectorWorker(index, h.spaces, emb, backfill=BACKFILL)
        async with trio.open_nursery() as nursery:
            await nursery.start(index.run)
            await nursery.start(worker.run)
            await wait_for(lambda: worker.target.client.health == "ok")
            start.set()
            await wait_for(lambda: worker.state != "health_check")
            background.release()
            await full(worker)
            assert (worker.total, worker.embedded) == (2, 2)
            sent = [t for r in fake.requests for t in r.json["input"]]
            assert not [t for t in sent if "Zurich" in t], sent
            nursery.cancel_scope.cancel()
