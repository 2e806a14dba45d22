"""A search while the provider may not be asked: an open circuit says so, not a
Retry-After the provider never sent."""

from __future__ import annotations

from pathlib import Path

from fakes.provider_server import FakeProvider, Reply
from test_vectors import FAST, NOTES, Harness, ask, full, write

from recalld.daemon.index.spaces import VectorSpaces
from recalld.daemon.providers.breaker import BreakerConfig
from recalld.daemon.providers.bridge import ProviderBridge


async def test_an_open_circuit_is_named_as_such(tmp_path: Path,
                                                bridge: ProviderBridge) -> None:
    h = Harness(tmp_path, bridge)
    # Opens after two failures and stays open for the test.
    h.spaces = VectorSpaces(h.cfg.state_dir / "embeddings", bridge, policy=FAST,
                            breaker_config=BreakerConfig(failure_threshold=2,
                                                         open_base_s=600.0),
                            environ={})
    for rel, text in NOTES.items():
        write(h.root, rel, text)
    with FakeProvider(dims=8) as fake:
        async with h.open(h.emb(fake)) as (index, worker):
            await full(worker)
            fake.script(*[Reply(status=503)] * FAST.max_attempts)
            res = await ask(index, "a train to Zurich")
            assert "HTTP 503" in res["vector_error"], res
            assert worker.target.client.breaker.state == "open"
            sent = len(fake.requests)
            for query in ("ramen", "hiking the Rigi"):
                res = await ask(index, query)
                assert res["mode"] == "keyword"
                assert "circuit open" in res["vector_error"], res["vector_error"]
                assert "Retry-After" not in res["vector_error"]
            assert len(fake.requests) == sent
