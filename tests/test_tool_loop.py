"""The chat model's tool loop (``memory.llm.run_tools``) on its own, against the loopback
fake chat server: errors go back to the model, and the step and time limits hold."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call

from recalld.daemon.config import ChatModelConfig
from recalld.daemon.memory.llm import LoopFailed, run_tools
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat import ChatClient
from recalld.daemon.providers.retry import RetryPolicy


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


@pytest.fixture
async def bridge(nursery: trio.Nursery) -> ProviderBridge:
    b = ProviderBridge()
    await nursery.start(b.run)
    return b


def loop_client(fake: FakeProvider, bridge: ProviderBridge) -> ChatClient:
    return ChatClient(ChatModelConfig(base_url=fake.url + "/v1", model_name="m"), bridge,
                      policy=RetryPolicy(max_attempts=2, backoff_base_s=0.001,
                                         backoff_max_s=0.002, deadline_s=10.0,
                                         attempt_timeout_s=5.0), environ={})


async def test_run_tools_loop_errors_to_model_and_step_limit(fake: FakeProvider,
                                                             bridge: ProviderBridge) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    async def dispatch(name: str, arguments: Any) -> str:
        calls.append((name, dict(arguments)))
        if name == "boom":
            raise RuntimeError("kaput")
        return "ok " * 10_000  # long results are cut for the model

    chat = loop_client(fake, bridge)
    fake.script(Reply(json=chat_answer(None, [tool_call("boom", {"a": 1}, "c1"),
                                              tool_call("fine", {}, "c2")])),
                Reply(json=chat_answer("all done")))
    steps: list[int] = []
    res = await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch,
                          on_step=lambda n, _msg: steps.append(n))
    assert res.finished and res.final_text == "all done" and res.steps == 2
    assert res.tool_calls_made == ["boom", "fine"] and calls[0] == ("boom", {"a": 1})
    tool_msgs = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert tool_msgs[0] == {"role": "tool", "tool_call_id": "c1",
                            "content": "error: RuntimeError: kaput"}
    assert tool_msgs[1]["content"].endswith("[truncated]") and len(tool_msgs[1]["content"]) < 20_100
    assert steps == [1, 2]

    forever = Reply(json=chat_answer(None, [tool_call("fine", {})]))
    fake.script(forever, forever, forever)
    capped = await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch,
                             max_steps=3)
    assert not capped.finished and capped.steps == 3 and capped.tool_calls_made == ["fine"] * 3

    fake.script(Reply(delay_s=5, json=chat_answer("late")))
    with pytest.raises(LoopFailed, match=r"did not finish within 0\.2 s"):
        await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch,
                        deadline_s=0.2)
