"""Answers a provider should not send: a number no float holds (``1e400``) or JSON has no
number for (``NaN``, ``-Infinity``) is named as such, in every backend's format, and so
are vectors of mixed dimensions; and an answer to a search's query that cannot be used
(other dimensions, such a number) is kept as the provider's last error without judging
its health, which the backfill's own calls and pings decide: a good answer to a query
does not end a failure for good they met either."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply, fake_vector
from test_embedding_backends import REMOTE, fake, make  # noqa: F401
from test_vectors import Harness, ask
from test_vectors_daemon import fake_config, vectors_status, wait_covered, write
from waits import until, wait_value

from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.errors import DimensionMismatch, ProviderBadResponse

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


def test_an_odd_answer_to_a_query_leaves_the_health_to_the_backfill(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-03-01/kiln.md", "# Kiln\n\nThe kiln fires cone 6 glazes.\n")
    odd = {"glaze chemistry": Reply(dims=5),
           "kiln wash": Reply(raw=ANSWERS["openai"].replace("@", "1e400").encode())}
    with FakeProvider(dims=8, api_key="k") as provider:
        provider.reply_for = lambda body: odd.get((body.get("input") or [""])[0])
        d = daemon_factory(fake_config(root, provider))
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        for query, said in (("glaze chemistry", "5-dimensional vectors"),
                            ("kiln wash", "the number 1e400")):
            res = d.call("memory.search", {"agent_id": "w", "query": query})
            assert res["mode"] == "keyword" and said in res["vector_error"], res
            st = vectors_status(d)
            # One answer to one query: said, but no verdict on the provider.
            assert said in st["provider"]["last_error"], st
            assert st["health"] == "ok" and not st["provider"]["fails_for_good"], st
            assert st["last_error"] is None, st
        # The backfill goes on embedding at once (no health-check pings first).
        pings = sum(1 for r in provider.requests if r.json.get("input") == ["ping"])
        write(root, "memory/2026-03-02/clay.md", "# Clay\n\nWedge the clay well.\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["embedded"] == st["total"] == 2, "the new note embedded")
        assert st["health"] == "ok"
        assert sum(1 for r in provider.requests if r.json.get("input") == ["ping"]) == pings
        # The backfill's own answer of other dimensions still fails for good (and so
        # do its pings from then on).
        provider.reply_for = lambda body: Reply(dims=5) if any(
            "bisque" in t or t == "ping" for t in body.get("input") or []) else None
        write(root, "memory/2026-03-03/glaze.md", "# Glaze\n\nGlazes crawl on dusty bisque.\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda st: st["provider"]["fails_for_good"],
                        "the backfill's verdict")
        assert st["health"] == "fail" and "5-dimensional" in st["last_error"], st
        # A good answer to a search's query is no verdict either: the provider still
        # fails for good for what the backfill sends, until its pings say otherwise.
        res = d.call("memory.search", {"agent_id": "w", "query": "cone 6 glazes"})
        assert res["mode"] == "hybrid" and res.get("vector_error") is None, res
        st = vectors_status(d)
        assert st["health"] == "fail" and st["provider"]["fails_for_good"], st
        assert "5-dimensional" in st["last_error"], st
        assert d.stop() == 0


async def test_vectors_of_mixed_dimensions_are_named_so(
        fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    client = make(fake, bridge)  # 8 dimensions configured
    # The configured dimensions among them or not: the answer is broken for some texts,
    # which says nothing against ``dimensions``.
    for lengths in ((3, 5), (3, 3, 9), (8, 5, 8), (8, 0)):
        items = [{"index": i, "embedding": [1.0] * n} for i, n in enumerate(lengths)]
        fake.script(Reply(raw=json.dumps({"data": items}).encode()))
        with pytest.raises(ProviderBadResponse) as caught:
            await client.embed([f"t{i}" for i in range(len(lengths))])
        assert not isinstance(caught.value, DimensionMismatch)
        assert (f"vectors of mixed dimensions {sorted(set(lengths))}, configured 8"
                in str(caught.value)), caught.value
    items = [{"index": 0, "embedding": [1.0] * 8}, {"index": 1, "embedding": [1.0, "x"]}]
    fake.script(Reply(raw=json.dumps({"data": items}).encode()))
    with pytest.raises(ProviderBadResponse, match="not lists of numbers"):
        await client.embed(["a", "b"])



async def test_a_text_answered_in_other_dimensions_is_parked_alone(
        tmp_path: Path, bridge: ProviderBridge) -> None:
    # Every answer holding one text has that text's vector short (the others of the
    # configured length): the configuration is right, the answer broken for that text.
    # It held back every text of its batch for good, the status telling the user to fix
    # ``dimensions``; now it is singled out and parked, the others embedded. Being the
    # oldest note, it is the last one sent alone: that failed call, the text's own, does
    # not leave the provider shown failing for good (fix the config) while it embeds.
    h = Harness(tmp_path, bridge)
    for i in range(3):
        write(h.root, f"memory/2026-05-0{i + 1}/n.md", f"# N{i}\n\ntuff {i}\n")
    write(h.root, "memory/2026-04-30/odd.md", "# Odd\n\nignimbrite\n")

    def short_for_the_odd_text(body: Any) -> Reply | None:
        texts = body["input"]
        if not any("ignimbrite" in t for t in texts):
            return None
        return Reply(json={"data": [
            {"index": i, "embedding": fake_vector(t, 8).tolist()[:5 if "ignimbrite" in t else 8]}
            for i, t in enumerate(texts)]})

    with FakeProvider(dims=8) as provider:
        provider.reply_for = short_for_the_odd_text
        async with h.open(h.emb(provider)) as (index, worker):
            # The odd text parked and the others embedded: in either order (their own
            # calls and its last lone one may end in any order on a busy machine).
            await until(lambda: (lambda st: st["parked"] == 1 and st["embedded"] == 3)(
                worker.status()))
            st = worker.status()
            assert st["total"] == 4, st
            assert st["parked_paths"][0].startswith("memory/2026-04-30/odd.md"), st
            assert "5-dimensional" in st["parked_error"] and "failed" in st["parked_error"]
            assert st["health"] == "ok" and not st["provider"]["fails_for_good"], st
            res = await ask(index, "tuff 1")
            assert res["mode"] == "hybrid" and res["vector_hits"] == 3, res
