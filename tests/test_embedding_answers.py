"""What an embedding client makes of a provider's answer and of its inputs: vectors put
on their texts by their index (also when the answer leaves a zero index out), a broken
index refused, inputs cut to the token budget."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fakes.provider_server import FakeProvider, Reply, fake_vector
from test_embedding_backends import DIMS, bridge, expected, fake, make  # noqa: F401

from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.embedding_formats import truncate_to_budget
from recalld.daemon.providers.errors import ProviderBadResponse


async def test_vectors_follow_their_index(fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    client = make(fake, bridge)
    texts = ["alpha", "beta", "gamma"]
    vecs = [fake_vector(t, DIMS).tolist() for t in texts]
    # Out of order, with the zero index left out as answers in protobuf style do.
    items: list[dict[str, object]] = [{"index": 2, "embedding": vecs[2]},
                                      {"embedding": vecs[0]},
                                      {"index": 1, "embedding": vecs[1]}]
    fake.script(Reply(raw=json.dumps({"data": items}).encode()))
    np.testing.assert_allclose(await client.embed(texts), expected(texts), rtol=1e-5,
                               atol=1e-6)
    for index in ("1", None, 1.5, True):
        items = [{"index": 0, "embedding": vecs[0]}, {"index": index, "embedding": vecs[1]}]
        fake.script(Reply(raw=json.dumps({"data": items}).encode()))
        with pytest.raises(ProviderBadResponse, match="'index' is not an integer"):
            await client.embed(texts[:2])


def test_truncate_to_budget() -> None:
    assert truncate_to_budget("short", 100) == "short"
    assert truncate_to_budget("a" * 100, 10) == "a" * 30
    assert truncate_to_budget("中文" * 50, 10) == ("中文" * 5)
    mixed = truncate_to_budget("ab中" * 40, 10)
    assert len(mixed) < 30
    assert truncate_to_budget("x" * 20, 0) == "x" * 20
