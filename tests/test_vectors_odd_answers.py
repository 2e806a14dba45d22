"""Answers a provider should not send: a number no float holds (``1e400``) or JSON has no
number for (``NaN``, ``-Infinity``) is named as such, in every backend's format."""

from __future__ import annotations

import pytest
from fakes.provider_server import FakeProvider, Reply
from test_embedding_backends import REMOTE, fake, make  # noqa: F401

from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.errors import ProviderBadResponse

#: One vector of 8 values in each backend's answer, its first value ``@`` (replaced).
ANSWERS = {
    "openai": '{"data": [{"index": 0, "embedding": [@, 1, 0, 0, 0, 0, 0, 0]}]}',
    "dashscope": '{"output": {"embeddings": [{"text_index": 0, '
                 '"embedding": [@, 1, 0, 0, 0, 0, 0, 0]}]}}',
    "dashscope_multimodal": '{"output": {"embeddings": [{"index": 0, '
                            '"embedding": [@, 1, 0, 0, 0, 0, 0, 0]}]}}',
    "gemini": '{"embeddings": [{"values": [@, 1, 0, 0, 0, 0, 0, 0]}]}',
    "ollama": '{"embeddings": [[@, 1, 0, 0, 0, 0, 0, 0]]}',
}


@pytest.mark.parametrize("backend", REMOTE)
async def test_a_number_out_of_range_or_not_finite_is_named(
        backend: str, fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    client = make(fake, bridge, backend)
    column = ANSWERS[backend].index("@") + 1
    for number, said in (("1e400", "the number 1e400"), ("-1.5E+999", "the number -1.5E+999"),
                         ("NaN", "NaN"), ("-Infinity", "-Infinity")):
        fake.script(Reply(raw=ANSWERS[backend].replace("@", number).encode()))
        with pytest.raises(ProviderBadResponse) as caught:
            await client.embed(["a"])
        message = str(caught.value)
        assert f"holds {said} (line 1, column {column})" in message, message
        assert "not valid JSON" not in message
    fake.script(Reply(raw=b"<html><body>502 Bad Gateway</body></html>"))
    with pytest.raises(ProviderBadResponse, match=r"not valid JSON \(.*column 1\) at: "
                                                  r"<html><body>502 Bad Gateway"):
        await client.embed(["a"])
    # A number in range, however large, is a vector all the same.
    fake.script(Reply(raw=ANSWERS[backend].replace("@", "1e300").encode()))
    assert (await client.embed(["a"])).shape == (1, 8)

