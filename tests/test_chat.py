"""The OpenAI-compatible chat client against the loopback fake, on the real clock."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
import trio
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from trio.testing import MockClock

from recalld.daemon.config import ChatModelConfig
from recalld.daemon.errors import wire_error
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat import (
    NO_CHAT_MODEL,
    ChatClient,
    ChatMessage,
    ChatResult,
    ToolCall,
    parse_chat_response,
    resolve_chat_api_key,
)
from recalld.daemon.providers.errors import (
    ProviderBadResponse,
    ProviderConfigError,
    ProviderRejected,
    ProviderRetryableStatus,
)
from recalld.daemon.providers.retry import RetryPolicy
from recalld.ipc.errors import PROVIDER_UNAVAILABLE, ProviderUnavailable

KEY = "sk-chat-SECRET-abcdefghijklmnop"
FAST = RetryPolicy(max_attempts=3, backoff_base_s=0.001, backoff_max_s=0.005,
                   retry_after_cap_s=0.05, deadline_s=10.0, attempt_timeout_s=5.0)
TOOLS = [{"type": "function", "function": {
    "name": "write", "description": "write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(api_key=KEY) as server:
        yield server


def client(fake: FakeProvider, bridge: ProviderBridge, **fields: object) -> ChatClient:
    cfg = ChatModelConfig(**{"base_url": fake.url + "/v1", "api_key": KEY,  # type: ignore[arg-type]
                             "model_name": "qwen-test", **fields})
    return ChatClient(cfg, bridge, policy=FAST, environ={})


async def test_plain_completion(fake: FakeProvider, bridge: ProviderBridge) -> None:
    fake.script(Reply(json=chat_answer("Hello there")))
    c = client(fake, bridge, temperature=0.5, max_tokens=77)
    msgs = [{"role": "user", "content": "hi"}]
    result = await c.complete(msgs)
    assert result == ChatResult("Hello there", [], "stop",
                                {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    (req,) = fake.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.json == {"model": "qwen-test", "messages": msgs, "temperature": 0.5,
                        "max_tokens": 77}


async def test_tool_calls(fake: FakeProvider, bridge: ProviderBridge) -> None:
    fake.script(Reply(json=chat_answer(None, [
        tool_call("write", {"path": "memory/a.md", "content": "x"}, "call_a"),
        tool_call("read", "", "call_b"),
    ])))
    c = client(fake, bridge)
    result = await c.complete([{"role": "user", "content": "save"}], TOOLS)
    assert result.content is None
    assert result.finish_reason == "tool_calls"
    assert result.tool_calls == [
        ToolCall("call_a", "write", {"path": "memory/a.md", "content": "x"}),
        ToolCall("call_b", "read", {}),
    ]
    body = fake.requests[0].json
    assert body["tools"] == TOOLS
    assert body["tool_choice"] == "auto"
    msg = result.assistant_message()
    assert msg["tool_calls"][0]["function"]["name"] == "write"
    assert msg["tool_calls"][0]["id"] == "call_a"


async def test_tool_choice_passed_through(fake: FakeProvider, bridge: ProviderBridge) -> None:
    c = client(fake, bridge)
    choice = {"type": "function", "function": {"name": "write"}}
    await c.complete([{"role": "user", "content": "x"}], TOOLS, tool_choice=choice,
                     temperature=0.0, max_tokens=5)
    body = fake.requests[0].json
    assert body["tool_choice"] == choice
    assert body["temperature"] == 0.0
    assert body["max_tokens"] == 5


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(raw=b"{not json"), r"not valid JSON \(.*\) at: not json"),
        # A number no float holds, or none JSON has, is named, not "not valid JSON".
        (Reply(raw=b'{"choices": [{"message": {"content": "hi"}}], '
                   b'"usage": {"total_tokens": 1e400}}'),
         r"holds the number 1e400 \(line 1, column 73\), beyond the range"),
        (Reply(raw=b'{"choices": [{"message": {"content": "hi"}, "logprob": -Infinity}]}'),
         r"holds -Infinity \(line 1, column 56\), which is no JSON number"),
        (Reply(json={"id": "x", "choices": []}), "no choices"),
        (Reply(json={"id": "x"}), "no choices"),
        (Reply(json={"choices": [{"finish_reason": "stop"}]}), "no message"),
        (Reply(json=chat_answer(None, [tool_call("write", "{'path': bad}")])),
         r"arguments of tool call 0 \(write\) are not valid JSON"),
        (Reply(json=chat_answer(None, [tool_call("write", "[1, 2]")])),
         "not a JSON object"),
        (Reply(json=chat_answer(None, [{"id": "c", "type": "function", "function": {}}])),
         "no function name"),
        (Reply(json=[1, 2, 3]), "not a JSON object"),
    ],
)
async def test_malformed_answers_are_typed(reply: Reply, message: str, fake: FakeProvider,
                                           bridge: ProviderBridge) -> None:
    fake.script(reply)
    c = client(fake, bridge)
    with pytest.raises(ProviderBadResponse, match=message) as info:
        await c.complete([{"role": "user", "content": "x"}], TOOLS)
    assert not info.value.transient
    assert len(fake.requests) == 1  # a malformed answer is not retried
    assert c.status()["last_error"] is not None


async def test_transient_failures_are_retried(fake: FakeProvider,
                                              bridge: ProviderBridge) -> None:
    fake.script(Reply(status=500), Reply(drop=True), Reply(json=chat_answer("finally")))
    c = client(fake, bridge)
    result = await c.complete([{"role": "user", "content": "x"}])
    assert result.content == "finally"
    assert len(fake.requests) == 3


async def test_rejection_is_not_retried(fake: FakeProvider, bridge: ProviderBridge) -> None:
    fake.script(Reply(status=400, raw=b'{"error": {"message": "context too long"}}'))
    c = client(fake, bridge)
    with pytest.raises(ProviderRejected, match="context too long"):
        await c.complete([{"role": "user", "content": "x"}])
    assert len(fake.requests) == 1


async def test_no_chat_model_configured(bridge: ProviderBridge) -> None:
    for cfg in (None, ChatModelConfig()):
        c = ChatClient(cfg, bridge, environ={"OPENAI_API_KEY": "k"})
        assert not c.enabled
        with pytest.raises(ProviderConfigError, match=NO_CHAT_MODEL) as info:
            await c.complete([{"role": "user", "content": "x"}])
        wire = wire_error(info.value)
        assert isinstance(wire, ProviderUnavailable)
        assert wire.code == PROVIDER_UNAVAILABLE
        assert wire.message == NO_CHAT_MODEL


async def test_cancellation_mid_completion(fake: FakeProvider, bridge: ProviderBridge) -> None:
    fake.script(Reply(delay_s=5.0))
    c = client(fake, bridge)
    with trio.move_on_after(0.2) as scope:
        await c.complete([{"role": "user", "content": "x"}])
    assert scope.cancelled_caught
    assert bridge.statistics().in_flight == 0
    assert (await c.complete([{"role": "user", "content": "y"}])).content == "ok"


def test_key_precedence_and_redaction() -> None:
    cfg = ChatModelConfig(model_name="m")
    assert resolve_chat_api_key(cfg, {"RECALLD_CHAT_API_KEY": "r", "OPENAI_API_KEY": "o"}) == "r"
    assert resolve_chat_api_key(cfg, {"OPENAI_API_KEY": "o"}) == "o"
    assert resolve_chat_api_key(ChatModelConfig(api_key="c"), {"OPENAI_API_KEY": "o"}) == "c"
    c = ChatClient(ChatModelConfig(model_name="m", api_key=KEY), None, environ={})
    assert KEY not in repr(c)
    assert c.endpoint == "https://api.openai.com/v1/chat/completions"


async def test_key_never_in_status_or_errors(fake: FakeProvider, bridge: ProviderBridge) -> None:
    fake.script(Reply(status=401, raw=f"bad key {KEY}".encode()))
    c = client(fake, bridge)
    with pytest.raises(ProviderRejected) as info:
        await c.complete([{"role": "user", "content": "x"}])
    assert KEY not in str(info.value)
    assert KEY not in str(c.status())


@pytest.mark.parametrize("key", ["k", "none", "EMPTY"])
async def test_a_short_key_is_masked_as_a_word_not_inside_every_word(
        fake: FakeProvider, bridge: ProviderBridge, key: str) -> None:
    # A placeholder key ("none", "k") quoted back by the provider is masked where it
    # stands alone; the words that merely hold it ("asked", "nonexistent") stay readable.
    body = f"key {key} refused: asked for model nonexistent-{key}x with {key}; EMPTYING".encode()
    fake.script(Reply(status=401, raw=body))
    c = client(fake, bridge, api_key=key)
    with pytest.raises(ProviderRejected) as info:
        await c.complete([{"role": "user", "content": "x"}])
    message = str(info.value)
    assert "key *** refused" in message and "with ***;" in message
    assert "asked for model" in message and f"nonexistent-{key}x" in message
    assert "EMPTYING" in message


def test_parse_content_parts_and_object_arguments() -> None:
    body = (b'{"choices": [{"message": {"content": [{"type": "text", "text": "a"},'
            b' {"type": "text", "text": "b"}], "tool_calls": [{"id": "t", "function":'
            b' {"name": "f", "arguments": {"k": 1}}}]}, "finish_reason": "tool_calls"}]}')
    result = parse_chat_response(body)
    assert result.content == "ab"
    assert result.tool_calls == [ToolCall("t", "f", {"k": 1})]



def test_parse_a_refusal() -> None:
    def answer(message: dict[str, object]) -> bytes:
        return orjson.dumps({"choices": [{"message": message, "finish_reason": "stop"}]})

    refused = parse_chat_response(answer({"content": None, "refusal": " Je ne peux pas. "}))
    assert refused.refusal == "Je ne peux pas." and refused.tool_calls == []
    assert parse_chat_response(answer({"content": "fine", "refusal": None})).refusal is None


def test_parse_repeated_ids_null_arguments_and_streams() -> None:
    calls = [{"id": "same", "function": {"name": "f", "arguments": None}},
             {"id": "same", "function": {"name": "g", "arguments": '{"x": "日本"}'}},
             {"function": {"name": "h"}}, {"id": "same_1", "function": {"name": "k"}}]
    body = orjson.dumps({"choices": [{"message": {"content": None, "tool_calls": calls},
                                      "finish_reason": "tool_calls"}]})
    got = parse_chat_response(body).tool_calls
    assert [c.arguments for c in got] == [{}, {"x": "日本"}, {}, {}]
    assert len({c.id for c in got}) == 4 and got[0].id == "same"
    stream = (b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
              b"data: [DONE]\n\n")
    with pytest.raises(ProviderBadResponse, match="event stream"):
        parse_chat_response(stream)


def test_a_tool_call_cut_by_the_length_limit_names_the_limit() -> None:
    call = {"id": "c", "function": {"name": "daily_write",
                                    "arguments": '{"name": "trip", "content": "- flies to Os'}}
    body = {"choices": [{"message": {"content": None, "tool_calls": [call]},
                         "finish_reason": "length"}]}
    with pytest.raises(ProviderBadResponse, match=r"length limit inside a tool call \(raise "
                                                  r"max_tokens.*not valid JSON"):
        parse_chat_response(orjson.dumps(body))
    body["choices"][0]["finish_reason"] = "tool_calls"
    with pytest.raises(ProviderBadResponse, match=r"^chat completion: arguments of tool call"):
        parse_chat_response(orjson.dumps(body))


def test_arguments_encoded_twice_are_read() -> None:
    inner = orjson.dumps({"path": "memory/日記.md"}).decode()
    calls = [{"id": "a", "function": {"name": "read", "arguments": orjson.dumps(inner).decode()}},
             {"id": "b", "function": {"name": "read", "arguments": '"just words"'}}]
    body = {"choices": [{"message": {"content": None, "tool_calls": calls[:1]},
                         "finish_reason": "tool_calls"}]}
    got = parse_chat_response(orjson.dumps(body)).tool_calls
    assert got[0].arguments == {"path": "memory/日記.md"}
    body["choices"][0]["message"]["tool_calls"] = calls[1:]
    with pytest.raises(ProviderBadResponse, match="not a JSON object"):
        parse_chat_response(orjson.dumps(body))


def test_a_refusal_given_as_a_content_part_is_a_refusal() -> None:
    parts = [{"type": "refusal", "refusal": "No puedo ayudar con eso."}]
    body = {"choices": [{"message": {"content": parts}, "finish_reason": "stop"}]}
    got = parse_chat_response(orjson.dumps(body))
    assert got.refusal == "No puedo ayudar con eso." and got.content == ""
    body["choices"][0]["message"]["content"] = [{"type": "text", "text": "ok"}]
    assert parse_chat_response(orjson.dumps(body)).refusal is None


@pytest.fixture
def still_clock() -> MockClock:
    """Fake time that moves only when the test jumps it: no wait of the loopback
    answers is taken for a timeout."""
    return MockClock()


async def test_a_retry_after_holds_the_next_calls_until_it_ends(
        fake: FakeProvider, bridge: ProviderBridge, still_clock: MockClock) -> None:
    """After a 429 with Retry-After: 3600 the next call (the next auto_memory run, a
    dream, a summary) was sent at once; now calls are held, unsent, for the Retry-After
    (capped by the policy, as embeddings are), and the status says for how long."""
    chat = ChatClient(ChatModelConfig(base_url=fake.url + "/v1", model_name="m",
                                      api_key=KEY), bridge,
                      policy=RetryPolicy(max_attempts=1, retry_after_cap_s=60.0), environ={})
    hello: list[ChatMessage] = [{"role": "user", "content": "hello"}]
    fake.script(Reply(status=429, headers={"Retry-After": "3600"}),
                Reply(json=chat_answer("later")))
    with pytest.raises(ProviderRetryableStatus, match="HTTP 429"):
        await chat.complete(hello)
    assert chat.status()["wait_s"] == 60.0
    still_clock.jump(20)
    with pytest.raises(ProviderRetryableStatus,
                       match=r"asked to wait 40s more \(Retry-After\) after: chat m: HTTP 429"
                       ) as info:
        await chat.complete(hello)
    assert info.value.transient and info.value.retry_after_s == 40.0
    assert len(fake.requests) == 1  # held: nothing sent
    assert "HTTP 429" in str(chat.status()["last_error"]) and chat.status()["wait_s"] == 40.0
    still_clock.jump(40)
    assert chat.status()["wait_s"] is None
    assert (await chat.complete(hello)).content == "later"
    assert len(fake.requests) == 2 and chat.status()["wait_s"] is None


async def test_an_answer_after_a_byte_order_mark_is_read(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    # A UTF-8 BOM before the JSON (a .NET gateway's encoder) failed the whole answer as
    # "not valid JSON"; RFC 8259 lets a reader ignore it.
    chat = ChatClient(ChatModelConfig(base_url=fake.url + "/v1", model_name="m",
                                      api_key=KEY), bridge, policy=FAST, environ={})
    fake.script(Reply(raw=b"\xef\xbb\xbf" + orjson.dumps(chat_answer("café"))))
    assert (await chat.complete([{"role": "user", "content": "hi"}])).content == "café"
    fake.script(Reply(raw=b"\xef\xbb\xbf\xef\xbb\xbf{}"))  # one mark, not any number
    with pytest.raises(ProviderBadResponse, match="not valid JSON"):
        await chat.complete([{"role": "user", "content": "hi"}])
