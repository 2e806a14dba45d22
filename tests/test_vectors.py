"""Vectors in one process: backfill, outages, restarts, damage, deletions, model changes.

A real index service over real files under tmp_path, the real provider bridge and a
loopback FakeProvider speaking the OpenAI embeddings wire format, on the real clock with
tiny retry and breaker times (exact retry timing is tested under the fake clock in
test_retry.py and test_breaker.py).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import trio
import zstandard
from fakes.provider_server import FakeProvider, Reply, fake_vector
from waits import until

from recalld.daemon.config import (
    DaemonConfig,
    EmbeddingModelConfig,
    SearchConfig,
    WorkspaceSettings,
)
from recalld.daemon.index.chunker import chunk_markdown
from recalld.daemon.index.embedcache import encode_f16
from recalld.daemon.index.embedder import BackfillConfig, VectorWorker
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.search import search
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.spaces import VectorSpaces
from recalld.daemon.providers.breaker import BreakerConfig
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.retry import RetryPolicy
from recalld.daemon.workspaces import Workspace

DIMS = 8
FAST = RetryPolicy(max_attempts=2, backoff_base_s=0.001, backoff_max_s=0.005,
                   retry_after_cap_s=0.05, deadline_s=5.0, attempt_timeout_s=3.0)
BREAKER = BreakerConfig(failure_threshold=3, open_base_s=0.05, open_max_s=0.2)
BACKFILL = BackfillConfig(backoff_base_s=0.01, backoff_max_s=0.1, permanent_retry_s=60.0,
                          query_timeout_s=2.0)
RENDER = re.compile(r"^========== \S+:\d+-\d+ \[score=\d+\.\d{4} vector=(-|-?\d+\.\d{4}) "
                    r"keyword=(-|\d+\.\d{4})\] ==========\n")

NOTES = {
    "memory/2026-07-20/train.md": "# Commute\n\nI take the 7:40 train to Zurich.\n",
    "memory/2026-07-22/food.md": "# Food\n\nRamen and dumplings for lunch today.\n",
    "digest/wiki/hiking.md": "# Hiking\n\nWe climbed the Rigi last weekend.\n",
}


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def passage_counts(fake: FakeProvider, skip: int = 0) -> Counter[str]:
    """How often each text was sent to /embeddings (after the first ``skip`` requests)."""
    out: Counter[str] = Counter()
    for req in fake.requests[skip:]:
        if req.path.endswith("/embeddings"):
            out.update(req.json["input"])
    return out


class Harness:
    def __init__(self, tmp_path: Path, bridge: ProviderBridge) -> None:
        self.tmp_path = tmp_path
        self.root = tmp_path / "ws"
        self.bridge = bridge
        self.cfg = DaemonConfig(socket_path=tmp_path / "s", data_dir=tmp_path / "data",
                                config_path=tmp_path / "c.toml", persist_delay_s=0.02)
        self.spaces = self.new_spaces()

    def new_spaces(self) -> VectorSpaces:
        return VectorSpaces(self.cfg.state_dir / "embeddings", self.bridge, policy=FAST,
                            breaker_config=BREAKER, environ={})

    @staticmethod
    def emb(fake: FakeProvider, model: str = "m") -> EmbeddingModelConfig:
        return EmbeddingModelConfig(backend="openai", base_url=fake.url + "/v1", api_key="k",
                                    model_name=model, dimensions=DIMS, max_batch_size=4)

    @asynccontextmanager
    async def open(self, emb: EmbeddingModelConfig,
                   wait_start: bool = True) -> AsyncIterator[tuple[WorkspaceIndex, VectorWorker]]:
        ws = Workspace("w", self.root, WorkspaceSettings(embedding_model_config=emb))
        index = WorkspaceIndex(ws, self.cfg, cpu=trio.CapacityLimiter(2))
        worker = VectorWorker(index, self.spaces, emb, backfill=BACKFILL)
        async with trio.open_nursery() as nursery:
            await nursery.start(index.run)
            await nursery.start(worker.run)
            yield index, worker
            nursery.cancel_scope.cancel()


async def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    await until(cond, deadline_s=timeout_s)


async def full(worker: VectorWorker) -> None:
    await wait_for(lambda: worker.total > 0 and worker.embedded == worker.total
                   and worker.state == "idle")


async def ask(index: WorkspaceIndex, query: str, **kw: Any) -> dict[str, Any]:
    config = kw.pop("config", SearchConfig())
    return await search(index, query, max_results=kw.pop("max_results", 5), min_score=None,
                        filters=Filters(), config=config, agent_id="w")


@pytest.fixture
def h(tmp_path: Path, bridge: ProviderBridge) -> Harness:
    harness = Harness(tmp_path, bridge)
    for rel, text in NOTES.items():
        write(harness.root, rel, text)
    return harness


async def test_backfill_end_to_end_and_hybrid_output(h: Harness) -> None:
    with FakeProvider(dims=DIMS) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            st = index.status()["vectors"]
            assert st["coverage"] == 1.0 and st["embedded"] == st["total"] == 3
            assert st["health"] == "ok" and st["provider"]["breaker"]["state"] == "closed"
            # Each chunk text went to the provider exactly once; the ping once.
            counts = passage_counts(fake)
            assert counts.pop("ping") == 1
            assert set(counts.values()) == {1} and len(counts) == 3
            res = await ask(index, "train to Zurich")
            assert res["mode"] == "hybrid" and res["vector_hits"] == 3
            top = res["results"][0]
            assert top["path"] == "memory/2026-07-20/train.md"
            assert RENDER.match(res["rendered"]), res["rendered"]
            assert top["keyword"] is not None and top["vector"] is not None
            # The vector branch's score is the cosine of the fake's vectors.
            q = fake_vector("train to Zurich", DIMS)
            d = fake_vector(index.state.chunks[
                index.state.files["memory/2026-07-20/train.md"].keys[0]].text, DIMS)
            cos = float(q @ d / np.linalg.norm(q) / np.linalg.norm(d))
            assert top["vector"] == pytest.approx(cos, abs=2e-3)
            # A vector-only candidate shows "-" for keyword.
            vec_only = [r for r in res["results"] if r["keyword"] is None]
            assert vec_only and all(
                f"{r['path']}:{r['start_line']}-{r['end_line']} [score={r['score']:.4f} "
                f"vector={r['vector']:.4f} keyword=-] ==========" in res["rendered"]
                for r in vec_only)
            # The query vector is cached: asking again sends nothing.
            before = len(fake.requests)
            await ask(index, "train to Zurich")
            assert len(fake.requests) == before
            # Filters apply to the vector branch too.
            only = await search(index, "train to Zurich", max_results=5, min_score=None,
                                filters=Filters(path_prefixes=("digest",)),
                                config=SearchConfig(), agent_id="w")
            assert only["vector_hits"] == 1
            assert [r["path"] for r in only["results"]] == ["digest/wiki/hiking.md"]


async def test_outage_keyword_keeps_working_then_each_text_once(h: Harness) -> None:
    with FakeProvider(dims=DIMS) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            fake.script(*[Reply(status=503)] * 30)
            failed_from = len(fake.requests)
            write(h.root, "memory/2026-07-23/new.md", "# New\n\nECONNREFUSED while syncing.\n")
            write(h.root, "memory/2026-07-24/more.md", "# More\n\nThe dentist is on Friday.\n")
            await index.sync()
            res = await ask(index, "ECONNREFUSED")
            # Keyword search serves the new note at once; the vector branch reports why not.
            assert res["results"][0]["path"] == "memory/2026-07-23/new.md"
            assert res["mode"] == "keyword" and "vector_error" in res
            await wait_for(lambda: worker.status()["provider"]["breaker"]["state"] != "closed"
                           or fake.pending_script() == 0)
            st = worker.status()
            assert st["embedded"] < st["total"] and st["last_error"]
            await wait_for(lambda: fake.pending_script() == 0)
            await full(worker)
            served = failed_from + 30
            counts = passage_counts(fake, served)
            new_texts = [c.text for c in index.state.chunks.values()
                         if c.path in ("memory/2026-07-23/new.md", "memory/2026-07-24/more.md")]
            assert all(counts[t] == 1 for t in new_texts), counts
            old = [t for t in counts if t not in new_texts and t != "ping"
                   and t != "ECONNREFUSED"]
            assert old == []
            assert (await ask(index, "ECONNREFUSED"))["mode"] == "hybrid"


async def test_restart_resumes_pending_and_reuses_stored_vectors(h: Harness) -> None:
    with FakeProvider(dims=DIMS) as fake:
        # First run: the provider cannot be reached at all; chunks are committed without
        # vectors (pending work is derived from them, there is no queue to lose).
        down = EmbeddingModelConfig(backend="openai", base_url="http://127.0.0.1:9/v1",
                                    api_key="k", model_name="m", dimensions=DIMS)
        async with h.open(down) as (index, worker):
            await wait_for(lambda: index.last_commit is not None
                           and worker.status()["health"] == "fail")
            assert worker.embedded == 0
        # Restart: the chunks were committed without vectors; they are pending again.
        h.spaces = h.new_spaces()
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            await wait_for(lambda: (index.last_commit or {}).get("chunks") == 3
                           and index.status()["uncommitted_changes"] == 0)
        counts = passage_counts(fake)
        counts.pop("ping", None)
        assert set(counts.values()) == {1}
        # Third start: vectors come from the chunk store and the persisted graph.
        before = len(fake.requests)
        h.spaces = h.new_spaces()
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            assert index.load_report is not None and "vectors" not in index.load_report.corrupt
            assert len(index.state.vectors or ()) == 3
            assert worker.provider_texts == 0 and worker.cache_texts == 0
        assert [r for r in fake.requests[before:] if "ping" not in r.json["input"]] == []


async def test_corrupt_graph_is_rebuilt_from_chunk_store(h: Harness) -> None:
    with FakeProvider(dims=DIMS) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            await wait_for(lambda: index.status()["uncommitted_changes"] == 0
                           and index.last_commit is not None)
        files = sorted((h.root / "mem_metadata" / "index").glob("vectors*"))
        assert files
        for path in files:  # every generation's graph, so no older one is a way out
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
        before = len(fake.requests)
        h.spaces = h.new_spaces()
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            assert len(index.state.vectors or ()) == 3 and worker.provider_texts == 0
            res = await ask(index, "ramen lunch")
            assert res["mode"] == "hybrid"
            assert res["results"][0]["path"] == "memory/2026-07-22/food.md"
        passages = [r for r in fake.requests[before:] if r.json["input"] != ["ping"]
                    and r.json["input"] != ["ramen lunch"]]
        assert passages == []


async def test_deleting_a_note_removes_its_vectors(h: Harness) -> None:
    with FakeProvider(dims=DIMS) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            keys = index.state.files["digest/wiki/hiking.md"].keys
            assert all(k in (index.state.vectors or ()) for k in keys)
            (h.root / "digest/wiki/hiking.md").unlink()
            await index.sync()
            assert not any(k in (index.state.vectors or ()) for k in keys)
            res = await ask(index, "climbed the Rigi")
            assert "digest/wiki/hiking.md" not in [r["path"] for r in res["results"]]
            assert res["vector_hits"] == 2


async def test_health_check_logs_ok_and_fail(h: Harness, caplog: pytest.LogCaptureFixture
                                             ) -> None:
    caplog.set_level(logging.INFO)
    with FakeProvider(dims=DIMS) as fake:
        fake.script(Reply(status=401))
        async with h.open(h.emb(fake)) as (_, worker):
            await full(worker)
            assert worker.status()["health"] == "ok"
    lines = [r.getMessage() for r in caplog.records if "EMBEDDING HEALTH CHECK" in r.getMessage()]
    prefix = f"[EMBEDDING HEALTH CHECK] name=w workspace_dir={h.root}"
    assert lines[0].startswith(prefix + " -> FAIL ") and "401" in lines[0]
    assert lines[1] == prefix + " -> OK"


async def test_failed_health_check_is_visible_and_retried(h: Harness) -> None:
    with FakeProvider(dims=DIMS) as fake:
        # The provider fails until told otherwise: the coverage is counted once the
        # index has looked at the disk, which a loaded machine may do after the check.
        fake.script(*[Reply(status=503)] * 10_000)
        async with h.open(h.emb(fake)) as (index, worker):
            await wait_for(lambda: worker.status()["health"] == "fail"
                           and index.status()["vectors"]["counted"])
            st = index.status()["vectors"]
            assert st["enabled"] and st["coverage"] < 1.0 and "503" in st["last_error"]
            # Keyword search meanwhile.
            assert (await ask(index, "dumplings"))["results"][0]["path"] == (
                "memory/2026-07-22/food.md")
            fake.clear_script()
            await full(worker)
            assert worker.status()["health"] == "ok"


def _bury_query(index: WorkspaceIndex, target_key: int, pool: int) -> str:
    """A query for the identifier whose fake vector ranks the target below the pool."""
    keys = list(index.state.chunks)
    docs = np.stack([fake_vector(index.state.chunks[k].text, DIMS) for k in keys])
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    for i in range(200):
        query = "ZQX9ERR" + "?" * i
        q = fake_vector(query, DIMS)
        order = [keys[j] for j in np.argsort(-(docs @ q))]
        if order.index(target_key) >= pool + 5:
            return query
    raise AssertionError("no burying query found")


async def test_exact_identifier_is_never_buried(h: Harness) -> None:
    for i in range(40):
        write(h.root, f"digest/wiki/topic{i}.md", f"# Topic {i}\n\nerrors and failures {i}\n")
    write(h.root, "memory/2026-07-25/bug.md", "# Bug\n\nThe sync failed with ZQX9ERR again.\n")
    with FakeProvider(dims=DIMS) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            target = index.state.files["memory/2026-07-25/bug.md"].keys[0]
            query = _bury_query(index, target, pool=15)
            # Plain weighted RRF would bury it below every vector-only candidate.
            from recalld.daemon.index.fusion import fuse

            found = await index.candidates(query, 15, Filters(), None)
            kw, vec = found.keyword, found.vector
            assert kw == [(target, kw[0][1])]
            qv = await worker.query_vector(query)
            assert qv is not None
            found = await index.candidates(query, 15, Filters(), qv)
            vec, exact = found.vector, found.exact
            plain = [f.key for f in fuse(kw, vec, keyword_weight=0.3, vector_weight=0.7, k=60)]
            assert plain.index(target) >= 5
            assert exact == {target}
            res = await ask(index, query)
            assert res["results"][0]["path"] == "memory/2026-07-25/bug.md"
            assert res["results"][0]["exact"] is True and res["results"][0]["vector"] is None


async def test_model_change_keeps_old_space_serving(h: Harness,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with FakeProvider(dims=DIMS) as old, FakeProvider(dims=DIMS) as new:
        async with h.open(h.emb(old, "m1")) as (index, worker):
            await full(worker)
            old_key = worker.target.key
            await wait_for(lambda: index.status()["uncommitted_changes"] == 0
                           and index.last_commit is not None)
        new.script(*[Reply(status=503)] * 20)
        h.spaces = h.new_spaces()
        async with h.open(h.emb(new, "m2")) as (index, worker):
            assert worker.migrating and worker.fill.serving is not None
            assert worker.fill.serving.key == old_key != worker.target.key
            # The vector service says so, under its own logger.
            said = [r.name for r in caplog.records if "embedding model changed" in r.getMessage()]
            assert said == ["recalld.daemon.index.embedder"]
            res = await ask(index, "ramen lunch")
            # Served by the old space: its provider embedded the query.
            assert res["mode"] == "hybrid" and res["vector_hits"] == 3
            assert any(r.json["input"] == ["ramen lunch"] for r in old.requests)
            await wait_for(lambda: new.pending_script() == 0)
            await wait_for(lambda: not worker.migrating)
            st = worker.status()
            assert st["serving_space"] == st["space"] != old_key and st["coverage"] == 1.0
            assert index.state.vector_space == worker.target.key
            res = await ask(index, "dumplings today")
            assert res["mode"] == "hybrid"
            assert any(r.json["input"] == ["dumplings today"] for r in new.requests)
            assert not any(r.json["input"] == ["dumplings today"] for r in old.requests)


async def test_qwenpaw_vectors_are_reused(h: Harness) -> None:
    records = []
    for rel in NOTES:
        for c in chunk_markdown(rel, (h.root / rel).read_text(), max_chars=h.cfg.chunk_max_chars):
            vec = fake_vector(c.text, DIMS)
            records.append({"id": c.id, "path": rel, "text": c.text,
                            "_embedding_f16_b64": encode_f16(vec / np.linalg.norm(vec))})
    store = h.root / "mem_metadata" / "file_store" / "file_chunks_default_v1.jsonl.zst"
    store.parent.mkdir(parents=True)
    store.write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(orjson.dumps(r) + b"\n" for r in records)))
    with FakeProvider(dims=DIMS) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            assert worker.seeded == 3 and worker.provider_texts == 0
            assert (await ask(index, "train"))["mode"] == "hybrid"
        counts = passage_counts(fake)
        assert not set(counts) & {r["text"] for r in records}


def test_store_rebuilds_a_corrupt_graph_from_chunk_embeddings(tmp_path: Path) -> None:
    from recalld.daemon.index.persist import IndexStore, snapshot
    from recalld.daemon.index.state import IndexState, prepare_files
    from recalld.daemon.index.vectors import VectorIndex

    root = tmp_path / "ws"
    for rel, text in NOTES.items():
        write(root, rel, text)
    state = IndexState()
    state.apply([prepare_files(root, list(NOTES), max_chars=1600, digests={})])
    state.vectors = VectorIndex(DIMS)
    state.vector_space = "openai-m-8-x"
    for key, text in list(state.chunks.texts()):
        vec = fake_vector(text, DIMS)
        state.chunks.set_embedding(key, encode_f16(vec / np.linalg.norm(vec)))
        state.vectors.add([key], vec[None, :])
    store = IndexStore(root / "mem_metadata")
    store.save(snapshot(state))
    query = fake_vector("query", DIMS)
    expected = state.vector_search(query, 3)

    fresh = IndexState()
    assert IndexStore(root / "mem_metadata").load(fresh).corrupt == {}
    assert fresh.vector_space == "openai-m-8-x"
    assert [k for k, _ in fresh.vector_search(query, 3)] == [k for k, _ in expected]

    path = next((root / "mem_metadata" / "index").glob("vectors*"))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    rebuilt = IndexState()
    report = IndexStore(root / "mem_metadata").load(rebuilt)
    assert "vectors" in report.corrupt and "vectors" in report.rebuilt
    got = rebuilt.vector_search(query, 3)
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=2e-3)


async def test_rebuild_keeps_vectors_and_pays_nothing(h: Harness) -> None:
    with FakeProvider(dims=DIMS) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            before = len(fake.requests)
            old_state = index.state
            result = await index.rebuild(lambda done, total, msg: None)
            assert result["chunks"] == 3 and index.state is not old_state
            # Hybrid at once after the swap: the vectors moved with their texts.
            assert len(index.state.vectors or ()) == 3
            res = await ask(index, "ramen lunch")
            assert res["mode"] == "hybrid" and res["vector_hits"] == 3
            await wait_for(lambda: worker.fill.adopted(index.state) and worker.state == "idle")
            assert worker.embedded == worker.total == 3
            sent = [r.json["input"] for r in fake.requests[before:]]
            assert sent == [["ramen lunch"]]
