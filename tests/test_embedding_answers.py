"""What an embedding client makes of a provider's answer and of its inputs: vectors put
on their texts by their index (also when the answer leaves a zero index out), a broken
index refused, an error sent as an answer or a redirect named, a Retry-After past a
deadline waited for all the same, inputs cut to the token budget."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import trio
from fakes.provider_server import FakeProvider, Reply, fake_vector
from test_embedding_backends import DIMS, KEY, expected, fake, make  # noqa: F401
from trio.testing import MockClock

from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.embedding_formats import truncate_to_budget
from recalld.daemon.providers.errors import ProviderBadResponse, ProviderRejected
from recalld.daemon.providers.retry import RetryPolicy


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


@pytest.mark.parametrize("backend", ["openai", "gemini"])
async def test_an_answer_after_a_byte_order_mark_is_read(
        backend: str, fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    # A UTF-8 BOM before the JSON (a .NET gateway's encoder) failed every batch as "not
    # valid JSON"; RFC 8259 lets a reader ignore it.
    client = make(fake, bridge, backend)
    texts = ["ebb", "flood"]
    vecs = [fake_vector(t, DIMS).tolist() for t in texts]
    answer = ({"data": [{"index": i, "embedding": v} for i, v in enumerate(vecs)]}
              if backend == "openai" else {"embeddings": [{"values": v} for v in vecs]})
    fake.script(Reply(raw=b"\xef\xbb\xbf" + json.dumps(answer).encode()))
    np.testing.assert_allclose(await client.embed(texts), expected(texts), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize(("backend", "other"), [("dashscope", "index"),
                                              ("dashscope_multimodal", "text_index")])
async def test_a_dashscope_answer_naming_its_index_the_other_way_keeps_the_order(
        backend: str, other: str, fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    # DashScope's text API says ``text_index``, its multimodal API ``index``; a gateway
    # answering one API with the other's name still orders its vectors by it (taken for
    # an answer without indices, reversed vectors went each on another text).
    client = make(fake, bridge, backend)
    texts = ["ebb", "flood", "slack"]
    vecs = [fake_vector(t, DIMS).tolist() for t in texts]
    items = [{other: i, "embedding": vecs[i]} for i in reversed(range(len(texts)))]
    fake.script(Reply(raw=json.dumps({"output": {"embeddings": items}}).encode()))
    np.testing.assert_allclose(await client.embed(texts), expected(texts), rtol=1e-5,
                               atol=1e-6)
    items = [{other: 1, "embedding": vecs[0]}, {other: 1, "embedding": vecs[1]}]
    fake.script(Reply(raw=json.dumps({"output": {"embeddings": items}}).encode()))
    with pytest.raises(ProviderBadResponse, match="values are not 0 to 1"):
        await client.embed(texts[:2])


async def test_an_index_that_is_not_each_position_once_is_refused(
        fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    # Two vectors claiming one place (or a place past the end) cannot be put on their
    # texts: taking them in sorted order would give a text another text's vector.
    client = make(fake, bridge)
    texts = ["north", "south", "east"]
    vecs = [fake_vector(t, DIMS).tolist() for t in texts]
    for indices in ([1, 1, 0], [0, 2, 2], [0, 1, 5], [-1, 0, 1], [1, 2, 3]):
        items = [{"index": i, "embedding": v} for i, v in zip(indices, vecs, strict=True)]
        fake.script(Reply(raw=json.dumps({"data": items}).encode()))
        with pytest.raises(ProviderBadResponse, match="'index'"):
            await client.embed(texts)


async def test_vectors_of_any_finite_size_are_normalised(
        fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    # Values near float32's limit (or tiny ones) are a direction like any other: the
    # unit vector comes back, never a row of zeros or an "all-zero" refusal.
    client = make(fake, bridge)
    texts = ["big", "small", "wide"]
    rows = [[3e38, -3e38, 0, 0, 0, 0, 0, 1e38], [1e-30, 0, 0, 0, 0, 0, 0, -1e-30],
            [1e300, 1e300, 0, 0, 0, 0, 0, 0]]
    fake.script(Reply(raw=json.dumps({"data": [{"index": i, "embedding": r}
                                               for i, r in enumerate(rows)]}).encode()))
    got = await client.embed(texts)
    want = np.asarray(rows, dtype=np.float64)
    want /= np.abs(want).max(axis=1, keepdims=True)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


async def test_vectors_answered_in_base64_are_read(
        fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    # An OpenAI-compatible server may answer base64 (little-endian float32, what
    # ``encoding_format: base64`` asks for) though floats were asked: the same vectors.
    client = make(fake, bridge)
    texts = ["raven", "\u6e21\u9e26", "crow"]
    encoded = [base64.b64encode(fake_vector(t, DIMS).astype("<f4").tobytes()).decode()
               for t in texts]
    items = [{"index": 1, "embedding": encoded[1]}, {"index": 0, "embedding": encoded[0]},
             {"index": 2, "embedding": fake_vector(texts[2], DIMS).tolist()}]
    fake.script(Reply(raw=json.dumps({"data": items}).encode()))
    np.testing.assert_allclose(await client.embed(texts), expected(texts), rtol=1e-5,
                               atol=1e-6)
    # A string that is no base64 of float32 values, or that holds NaN, is refused.
    nan = base64.b64encode(np.full(DIMS, np.nan, "<f4").tobytes()).decode()
    for bad, said in (("not base64!", "not base64 of float32"),
                      (base64.b64encode(b"\0" * (4 * DIMS - 1)).decode(),
                       "not base64 of float32"),
                      (nan, "NaN or infinity")):
        fake.script(Reply(raw=json.dumps({"data": [{"index": 0, "embedding": bad}]}).encode()))
        with pytest.raises(ProviderBadResponse, match=said):
            await client.embed(["one"])


async def test_vectors_of_strings_or_booleans_are_refused(
        fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    client = make(fake, bridge)
    # A boolean among numbers (or a row of them beside rows of numbers) would be read as
    # 1.0 or 0.0 by numpy: refused all the same.
    for rows in ([["0.5"] + [0.25] * (DIMS - 1)], [[True] * DIMS],
                 [[None] + [0.25] * (DIMS - 1)], [[True] + [0.25] * (DIMS - 1)],
                 [[0.5] * (DIMS - 1) + [False]], [[1] * (DIMS - 1) + [False]],
                 [[0.5] * DIMS, [True] * DIMS]):
        fake.script(Reply(raw=json.dumps({"data": [{"index": i, "embedding": row}
                                                   for i, row in enumerate(rows)]}).encode()))
        with pytest.raises(ProviderBadResponse, match="not lists of numbers"):
            await client.embed(["one", "two"][:len(rows)])


@pytest.mark.parametrize(("backend", "answer", "said"), [
    ("openai", {"error": {"message": "You exceeded your current quota, key KEY",
                          "type": "insufficient_quota"}},
     "You exceeded your current quota, key ***"),
    ("openai", {"data": None, "error": "upstream overloaded"}, "upstream overloaded"),
    ("openai", {"object": "list", "data": [], "error": {"message": "upstream overloaded"}},
     "upstream overloaded"),
    ("ollama", {"embeddings": [], "error": "model requires more system memory"},
     "model requires more system memory"),
    ("dashscope", {"code": "Throttling", "message": "Requests throttled",
                   "request_id": "r"}, "Throttling: Requests throttled"),
    ("gemini", {"error": {"code": 429, "message": "Resource has been exhausted",
                          "status": "RESOURCE_EXHAUSTED"}}, "Resource has been exhausted"),
    ("ollama", {"error": {"type": "busy"}}, '{"type":"busy"}'),
])
async def test_an_error_answered_with_http_200_is_quoted(
        backend: str, answer: dict[str, object], said: str, fake: FakeProvider,  # noqa: F811
        bridge: ProviderBridge) -> None:
    # Some gateways send their errors with HTTP 200: the error says what the provider
    # said, not that the answer lacks its vectors.
    client = make(fake, bridge, backend)
    fake.script(Reply(raw=json.dumps(answer).replace("KEY", KEY).encode()))
    with pytest.raises(ProviderBadResponse) as info:
        await client.embed(["alpha"])
    assert str(info.value).endswith(f": the provider answered an error, not vectors: {said}")


async def test_a_redirect_elsewhere_is_an_error_naming_it(
        fake: FakeProvider, bridge: ProviderBridge) -> None:  # noqa: F811
    # Gemini's key travels in its own header, which an HTTP library following a redirect
    # to another server keeps: such a redirect is not followed, and says where it leads.
    client = make(fake, bridge, "gemini", max_batch_size=4)
    with FakeProvider(dims=DIMS) as other:
        target = f"{other.url}/v1beta/models/{client.config.model_name}:batchEmbedContents"
        fake.script(Reply(status=307, headers={"Location": target}))
        with pytest.raises(ProviderRejected) as info:
            await client.embed(["alpha"])
        assert other.requests == []
    message = str(info.value)
    assert f"HTTP 307: the provider redirects to {target}; set base_url" in message
    assert client.config.api_key not in message and not info.value.transient


@pytest.fixture
def idle_clock() -> MockClock:
    """Fake time that jumps only once the run has been idle for a real second: an
    answer on its way over loopback is not taken for a long wait."""
    return MockClock(autojump_threshold=1.0)


async def test_a_health_check_told_to_wait_asks_again_only_then(
        fake: FakeProvider, bridge: ProviderBridge, idle_clock: MockClock,  # noqa: F811
        tmp_path: Path) -> None:
    # The Retry-After is past the health check's deadline, so the check fails at once;
    # the next ping waits for it, not for the short backoff of a failed check.
    client = make(fake, bridge, policy=RetryPolicy(max_attempts=1))
    fake.script(Reply(status=429, headers={"Retry-After": "45"}))
    started = trio.current_time()
    await client.wait_healthy(tmp_path, name="notes", backoff_base_s=1.0, backoff_max_s=2.0)
    assert len(fake.requests) == 2 and client.health == "ok"
    assert trio.current_time() - started >= 45
    assert client.hold_s() == 0


async def test_a_health_check_answered_a_retry_after_of_no_date_fails_as_a_ping(
        fake: FakeProvider, bridge: ProviderBridge, tmp_path: Path) -> None:  # noqa: F811
    # A year no datetime holds in the Retry-After of a 503: a failed ping like any other
    # (it raised OverflowError out of the health check, and the workspace failed with it).
    client = make(fake, bridge, policy=RetryPolicy(max_attempts=1))
    fake.script(Reply(status=503, headers={
        "Retry-After": "Wed, 21 Oct 99999999999999999999 07:28:00 GMT"}))
    assert not await client.health_check(tmp_path, name="notes")
    assert client.health == "fail" and "HTTP 503" in (client.last_error or "")
    assert client.hold_s() == 0
    assert await client.health_check(tmp_path, name="notes") and client.health == "ok"


def test_truncate_to_budget() -> None:
    assert truncate_to_budget("short", 100) == "short"
    assert truncate_to_budget("a" * 100, 10) == "a" * 30
    mixed = truncate_to_budget("ab中" * 40, 10)
    assert len(mixed) < 30
    assert truncate_to_budget("x" * 20, 0) == "x" * 20


@pytest.mark.parametrize("text", [
    "中文" * 50, "한국어 문장 " * 30, "नमस्ते दुनिया " * 30, "สวัสดีชาวโลก " * 30,
    "Привет, мир! " * 30, "Γειά σου κόσμε " * 30, "مرحبا بالعالم " * 30,
    "🙂🚀👩‍👩‍👧" * 40, "𠀀𠀁𠀂" * 40, "naïve café " * 40,
])
@pytest.mark.parametrize("budget", [7, 64, 300])
def test_the_budget_holds_for_every_script(text: str, budget: int) -> None:
    # A byte-level tokenizer makes at most one token per UTF-8 byte: what is kept stays
    # within the budget by that count (ASCII by its own third), so no provider refuses
    # it for length, whatever the script.
    kept = truncate_to_budget(text, budget)
    assert text.startswith(kept) and kept
    def thirds(part: str) -> int:  # the worst count, in thirds of a token
        return sum(1 if ch.isascii() else 3 * len(ch.encode("utf-8")) for ch in part)

    assert thirds(kept) <= 3 * budget, kept
    # Cut no shorter than that: the next character would pass the budget.
    if kept != text:
        assert thirds(text[:len(kept) + 1]) > 3 * budget
