"""An error nobody foresaw in a provider call (in the bridge, or reading an answer) is
that call's provider error, logged once with its traceback and shown in status: a health
check fails as a ping, a chat call fails as a call; nothing raises past them (an
OverflowError out of a Retry-After once took a whole workspace down). The faults are
made in process: no answer of the loopback fake makes them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NoReturn

import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer
from test_embedding_backends import KEY, fake, make  # noqa: F401

from recalld.daemon.config import ChatModelConfig, EmbeddingModelConfig
from recalld.daemon.providers import chat as chat_module
from recalld.daemon.providers import embedding as embedding_module
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat import ChatClient
from recalld.daemon.providers.embedding import EmbeddingClient
from recalld.daemon.providers.errors import ProviderPermanent
from recalld.daemon.providers.retry import RetryPolicy


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "Traceback (most recent call last)" in r.getMessage()]


async def test_a_fault_reading_an_answer_fails_the_ping_not_the_caller(
        fake: FakeProvider, bridge: ProviderBridge, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_args: object) -> NoReturn:
        raise IndexError("tuple index out of range")

    client = make(fake, bridge)
    monkeypatch.setattr(embedding_module, "to_unit_rows", broken)
    assert not await client.health_check(tmp_path, name="notes")
    status = client.status()
    assert status["health"] == "fail" and status["fails_for_good"]
    assert "unexpected error: IndexError: tuple index out of range" in str(status["last_error"])
    assert len(_tracebacks(caplog)) == 1
    monkeypatch.undo()
    assert await client.health_check(tmp_path, name="notes") and client.health == "ok"


async def test_a_fault_in_the_bridge_is_that_requests_error(
        fake: FakeProvider, bridge: ProviderBridge,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def broken(*_args: object) -> NoReturn:
        raise LookupError("no such codec")

    chat = ChatClient(ChatModelConfig(base_url=fake.url + "/v1", model_name="m", api_key=KEY),
                      bridge,
                      policy=RetryPolicy(max_attempts=3), environ={})
    monkeypatch.setattr(bridge, "_read", broken)  # on the bridge's own asyncio thread
    fake.script(Reply(json=chat_answer("hi")))
    with pytest.raises(ProviderPermanent, match="unexpected error: LookupError: no such codec"):
        await chat.complete([{"role": "user", "content": "hello"}])
    assert len(fake.requests) == 1  # failed for good: not sent again
    assert "LookupError" in str(chat.status()["last_error"])
    assert len(_tracebacks(caplog)) == 1
    monkeypatch.undo()
    fake.script(Reply(json=chat_answer("hi")))
    assert (await chat.complete([{"role": "user", "content": "hello"}])).content == "hi"


async def test_a_fault_parsing_a_chat_answer_is_that_calls_error(
        fake: FakeProvider, bridge: ProviderBridge,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_args: object) -> NoReturn:
        raise OverflowError(f"Python int too large to convert to C long near {KEY}")

    chat = ChatClient(ChatModelConfig(base_url=fake.url + "/v1", model_name="m",
                                      api_key=KEY), bridge, environ={})
    monkeypatch.setattr(chat_module, "parse_chat_response", broken)
    fake.script(Reply(json=chat_answer("hi")))
    with pytest.raises(ProviderPermanent, match="chat m: unexpected error: OverflowError"):
        await chat.complete([{"role": "user", "content": "hello"}])
    assert chat.breaker.snapshot().state == "closed"  # it answered: no outage
    assert len(_tracebacks(caplog)) == 1
    assert KEY not in caplog.text


async def test_a_fault_of_the_local_model_fails_the_ping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken(*_args: object, **_kwargs: object) -> NoReturn:
        raise KeyError("token_type_ids")

    client = EmbeddingClient(EmbeddingModelConfig(backend="local", model_name="e5-small"),
                             None, environ={})
    assert client.local is not None
    monkeypatch.setattr(client.local, "embed", broken)
    assert not await client.health_check(tmp_path, name="notes")
    assert "unexpected error: KeyError: 'token_type_ids'" in str(client.status()["last_error"])
    assert len(_tracebacks(caplog)) == 1
