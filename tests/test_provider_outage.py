"""What an embedding provider that asks to be left alone (Retry-After) leaves in status
while the outage lasts: the provider's own error, the same size however long it goes on.
In process, against the loopback fake."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fakes.provider_server import FakeProvider, Reply
from test_embedding_backends import DIMS, FAST, KEY, fake  # noqa: F401

from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.embedding import EmbeddingClient

#: Fast retries, the provider's Retry-After honoured up to a minute (the default cap).
PATIENT = dataclasses.replace(FAST, retry_after_cap_s=60.0)


async def test_pings_during_a_retry_after_do_not_pile_up_the_last_error(
        fake: FakeProvider, bridge: ProviderBridge, tmp_path: Path) -> None:  # noqa: F811
    # Each ping refused while the Retry-After ran kept, as the last error, its refusal
    # quoting the last error, which was the refusal before: the message (and status, and
    # the daemon's memory) grew by one quote per ping for as long as the outage lasted.
    cfg = EmbeddingModelConfig(backend="openai", api_key=KEY, base_url=fake.url + "/v1",
                               model_name="m", dimensions=DIMS)
    client = EmbeddingClient(cfg, bridge, policy=PATIENT, environ={}, health_timeout_s=1.0)
    fake.script(Reply(status=429, headers={"Retry-After": "45"}))
    assert not await client.health_check(tmp_path, name="notes")
    first = client.status()["last_error"]
    assert isinstance(first, str) and "HTTP 429" in first, first
    for _ in range(20):
        assert not await client.health_check(tmp_path, name="notes")
    assert len(fake.requests) == 1  # the provider was left alone meanwhile
    last = client.status()["last_error"]
    assert isinstance(last, str) and "HTTP 429" in last, last
    assert last.count("Retry-After") <= 1 and len(last) <= len(first) + 100, last
