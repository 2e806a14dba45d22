"""The chat model's tool loop (``memory.llm.run_tools``) on its own, against the loopback
fake chat server: errors go back to the model, and the step and time limits hold."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call

from recalld.daemon.config import ChatModelConfig
from recalld.daemon.memory.llm import MAX_CALLS_PER_ANSWER, LoopFailed, ToolBudget, run_tools
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.chat import ChatClient, function_tool
from recalld.daemon.providers.retry import RetryPolicy


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


async def test_tool_calls_past_an_answers_limit_or_the_jobs_budget_are_not_run(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    ran: list[int] = []

    async def dispatch(name: str, arguments: Any) -> str:
        ran.append(arguments["n"])
        return "made"

    chat = loop_client(fake, bridge)
    many = 3 * MAX_CALLS_PER_ANSWER + 5
    flood = Reply(json=chat_answer(None, [tool_call("create", {"n": n}, f"c{n}")
                                          for n in range(many)]))
    fake.script(flood, Reply(json=chat_answer("done")))
    budget = ToolBudget(limit=5 * MAX_CALLS_PER_ANSWER - 7)
    res = await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch,
                          budget=budget)
    # One answer runs its first calls only; every call still gets its answer.
    assert ran == list(range(MAX_CALLS_PER_ANSWER)) and res.finished
    tool_msgs = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [f"c{n}" for n in range(many)]
    assert tool_msgs[MAX_CALLS_PER_ANSWER]["content"].startswith("error: refused:")
    assert budget.used == MAX_CALLS_PER_ANSWER and budget.refused == many - len(ran)

    # The job's budget is shared by its loops: spent, the loop ends unfinished, saying why.
    fake.script(*[flood] * 10)
    cut = await run_tools(chat, [{"role": "user", "content": "again"}], [], dispatch,
                          budget=budget, max_steps=10)
    assert len(ran) == budget.limit and budget.spent() and not cut.finished
    assert cut.steps == 4 and "more than 153 tool calls" in cut.unfinished(10)
    told = [str(m["content"]) for m in cut.messages if m["role"] == "tool"]
    assert sum("used all of its 153 tool calls" in t for t in told) == 7
    sent = len(fake.requests)
    with pytest.raises(LoopFailed, match="more than 153 tool calls"):
        await run_tools(chat, [{"role": "user", "content": "more"}], [], dispatch,
                        budget=budget)
    assert len(fake.requests) == sent  # nothing sent once the budget is spent


async def test_a_refusal_is_no_last_word(fake: FakeProvider, bridge: ProviderBridge) -> None:
    async def dispatch(name: str, arguments: Any) -> str:
        return "ok"

    chat = loop_client(fake, bridge)
    refusal = chat_answer(None)
    refusal["choices"][0]["message"]["refusal"] = "I cannot process this conversation."
    fake.script(Reply(json=refusal))
    res = await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch)
    assert not res.finished and res.cut == "refusal" and res.steps == 1
    assert res.unfinished(8) == ("the chat model refused to answer: I cannot process this "
                                 "conversation.")


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "daily_write", "arguments": {"name": "tea"}}\n</tool_call>',
    '```json\n{"name": "daily_write", "arguments": {"name": "tea"}}\n```',
    '[TOOL_CALLS][{"name": "daily_write", "arguments": {}}]',
    "<function=daily_write><parameter=name>tea</parameter></function>",
])
async def test_tool_calls_written_as_text_are_no_last_word(
        text: str, fake: FakeProvider, bridge: ProviderBridge) -> None:
    async def dispatch(name: str, arguments: Any) -> str:
        return "ok"

    chat = loop_client(fake, bridge)
    tools = [function_tool("daily_write", "write", {"type": "object"})]
    fake.script(Reply(json=chat_answer(text)))
    res = await run_tools(chat, [{"role": "user", "content": "go"}], tools, dispatch)
    assert not res.finished and "wrote its tool calls as text" in res.unfinished(8)
    fake.script(Reply(json=chat_answer("", finish_reason="tool_calls")))
    res = await run_tools(chat, [{"role": "user", "content": "go"}], tools, dispatch)
    assert not res.finished and "did not send" in res.unfinished(8)
    # Without tools offered, or in plain words, text is the answer.
    fake.script(Reply(json=chat_answer(text)),
                Reply(json=chat_answer("Nothing to save: <function> names were discussed.")))
    assert (await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch)).finished
    assert (await run_tools(chat, [{"role": "user", "content": "go"}], tools, dispatch)).finished


async def test_a_call_in_the_shape_of_the_functions_api_is_run(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    # A server answering with the functions API's "function_call" (which tools replaced)
    # had its call overlooked: the answer passed for the model's last word ("nothing to
    # save"), and the turns it was asked about were committed without their note.
    ran: list[tuple[str, Any]] = []

    async def dispatch(name: str, arguments: Any) -> str:
        ran.append((name, arguments))
        return "ok"

    chat = loop_client(fake, bridge)
    tools = [function_tool("daily_write", "write", {"type": "object"})]
    legacy = chat_answer(None, finish_reason="function_call")
    legacy["choices"][0]["message"]["function_call"] = {
        "name": "daily_write", "arguments": '{"name": "Wohnort", "content": "- Oslo"}'}
    fake.script(Reply(json=legacy), Reply(json=chat_answer("gespeichert")))
    res = await run_tools(chat, [{"role": "user", "content": "go"}], tools, dispatch)
    assert res.finished and res.tool_calls_made == ["daily_write"], res
    assert ran == [("daily_write", {"name": "Wohnort", "content": "- Oslo"})]
    sent = fake.requests[-1].json["messages"]
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "daily_write"
    assert sent[-1]["role"] == "tool" and sent[-1]["tool_call_id"] == (
        sent[-2]["tool_calls"][0]["id"])
    # An answer ended for a function call it does not hold is no last word either.
    fake.script(Reply(json=chat_answer("", finish_reason="function_call")))
    res = await run_tools(chat, [{"role": "user", "content": "go"}], tools, dispatch)
    assert not res.finished and "did not send" in res.unfinished(8)


async def test_calls_dropped_for_having_no_name_are_told_to_the_model(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    """Beside a call that runs, a call without a function name (an empty one, none, or a
    call that is no object) was only logged: the model never heard of it. The tool
    result of its answer now names each, and the calls with a name still run."""
    ran: list[str] = []

    async def dispatch(name: str, arguments: Any) -> str:
        ran.append(name)
        return "done"

    chat = loop_client(fake, bridge)
    fake.script(Reply(json=chat_answer(None, [
        {"id": "x1", "type": "function", "function": {"name": "", "arguments": "{}"}},
        tool_call("store", {"k": "v"}, "c2"),
        ["store", {"k": "w"}],
        {"id": "x3", "type": "function", "function": {"arguments": '{"k": "u"}'}}])),
        Reply(json=chat_answer("finished")))
    res = await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch)
    assert res.finished and ran == ["store"]
    sent = fake.requests[-1].json["messages"]
    assert [c["id"] for c in sent[-2]["tool_calls"]] == ["c2"]
    told = sent[-1]
    assert told["role"] == "tool" and told["tool_call_id"] == "c2", sent
    assert told["content"].startswith("done\n\nerror: 3 other call(s)"), told
    for what in ("tool call 0 has no function name", "tool call 2 is not an object",
                 "tool call 3 has no function name"):
        assert what in told["content"], told


async def test_an_answer_of_thousands_of_calls_costs_one_bounded_follow_up(
        fake: FakeProvider, bridge: ProviderBridge, caplog: pytest.LogCaptureFixture) -> None:
    """3,000 calls in one answer were each answered with a tool result of their own (a
    follow-up request of 1 MB), and each nameless one logged a line of its own and was
    quoted in a note of unbounded length. Past the first calls of an answer, those left
    are told in one short note; one log line counts them."""
    ran: list[int] = []

    async def dispatch(name: str, arguments: Any) -> str:
        ran.append(arguments["n"])
        return "made"

    chat = loop_client(fake, bridge)
    named, nameless = 2_000, 1_000
    calls: list[Any] = [tool_call("create", {"n": n}, f"c{n}") for n in range(named)]
    calls += [{"id": f"x{n}", "type": "function", "function": {"arguments": "{}"}}
              for n in range(nameless)]
    fake.script(Reply(json=chat_answer(None, calls)), Reply(json=chat_answer("done")))
    budget = ToolBudget(limit=10 * MAX_CALLS_PER_ANSWER)
    res = await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch,
                          budget=budget)
    assert res.finished and ran == list(range(MAX_CALLS_PER_ANSWER))
    assert budget.refused == named - MAX_CALLS_PER_ANSWER
    follow_up = fake.requests[-1]
    assert len(follow_up.body) < 64_000, len(follow_up.body)
    sent = follow_up.json["messages"]
    echoed = sent[1]["tool_calls"]
    tool_msgs = [m for m in sent if m["role"] == "tool"]
    # What is sent back is whole: each call echoed has its one result.
    assert [c["id"] for c in echoed] == [m["tool_call_id"] for m in tool_msgs]
    assert tool_msgs[0]["content"] == "made"
    assert tool_msgs[MAX_CALLS_PER_ANSWER]["content"].startswith("error: refused:")
    note = tool_msgs[-1]["content"]
    assert f"error: {nameless} other call(s)" in note and "and 997 more" in note
    assert f"refused: {named - len(tool_msgs)} more call(s)" in note and len(note) < 1_500
    lines = [r for r in caplog.records if r.name == "recalld.daemon.memory.llm"]
    assert len(lines) == 1 and f"{nameless + named - len(tool_msgs)} tool call(s)" in (
        lines[0].getMessage())
