"""A runaway or unwilling chat model against the memory jobs, end to end: tool calls past
the limit of one answer are not run (the model is told, each call answered), and the
job's result and inbox item count them; a refusal, or tool calls the server left as
text, is no "nothing to save"."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, turn
from test_dream import AGENT, ScriptedModel, dream, inbox_items, open_ws, run_job, write

from recalld.daemon.memory.llm import MAX_CALLS_PER_ANSWER

EXTRA = 9  # calls past the limit of one answer


def test_a_dream_answer_with_too_many_calls_runs_only_the_first(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-03/hobbies.md"
    write(root, note, "- plays the oud on Sundays\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [[("note_interests", {"topics": [f"topic {n}"]})
                         for n in range(MAX_CALLS_PER_ANSWER + EXTRA)]]
    result = dream(daemon)
    assert result["tool_calls_refused"] == EXTRA, result
    told = model.tool_results
    assert len(told) == MAX_CALLS_PER_ANSWER + EXTRA
    assert sum(t.startswith("error: refused: this answer asked for") for t in told) == EXTRA
    interests = (root / "digest/interests.yaml").read_text(encoding="utf-8")
    assert f"topic {MAX_CALLS_PER_ANSWER - 1}" in interests
    assert f"topic {MAX_CALLS_PER_ANSWER}" not in interests
    items = inbox_items(daemon)
    assert items is not None and len(items) == 1
    assert items[0]["details"]["tool_calls_refused"] == EXTRA
    assert f"{EXTRA} tool call(s)" in items[0]["summary"]
    log = (root / str(result["log"])).read_text(encoding="utf-8")
    assert f"not run (past its limits): {EXTRA}" in log


def test_an_auto_memory_answer_with_too_many_calls_says_so(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    reads = [tool_call("read", {"path": "memory/none.md"}, f"r{n}")
             for n in range(MAX_CALLS_PER_ANSWER + EXTRA - 1)]
    write_call = tool_call("daily_write", {"name": "garden",
                                           "content": "- grows tomatoes"}, "w")
    fake.script(Reply(json=chat_answer(None, [write_call, *reads])),
                Reply(json=chat_answer("saved")))
    add(daemon, "s-flood", turn("I grow tomatoes on the balcony."), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s-flood"})
    assert job["state"] == "succeeded", job
    res = job["result"]
    assert res["tool_calls_refused"] == EXTRA and res["note"], res
    assert res["tool_calls"] == ["daily_write"] + ["read"] * (MAX_CALLS_PER_ANSWER - 1)
    sent = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert len(sent) == MAX_CALLS_PER_ANSWER + EXTRA
    item = next(i for i in daemon.call("inbox.list", {"agent_id": AGENT})["items"]
                if i["kind"] == "auto_memory")
    assert item["details"]["tool_calls_refused"] == EXTRA
    assert f"{EXTRA} tool call(s)" in item["summary"]


def test_a_refusal_leaves_the_turns_and_the_note_to_the_next_run(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-04/trip.md"
    write(root, note, "- flies to Reykjavík on the 12th\n")
    open_ws(daemon, root, fake)
    refusal = chat_answer(None)
    refusal["choices"][0]["message"]["refusal"] = "I can't help with that request."
    fake.script(Reply(json=refusal))
    add(daemon, "s-no", turn("Remember that my flight leaves at 7."), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s-no"})
    assert job["state"] == "failed", job
    assert "refused to answer: I can't help with that request." in job["error"]
    assert add(daemon, "s-no", [], agent_id=AGENT)["pending_messages"] == 2
    # A server without its tool-call parser hands the calls back as text: no write.
    fake.script(Reply(json=chat_answer('<tool_call>\n{"name": "daily_write", "arguments": '
                                       '{"name": "flight", "content": "- 7:00"}}\n'
                                       '</tool_call>')))
    job = run_job(daemon, "auto_memory", {"session_id": "s-no"})
    assert job["state"] == "failed" and "tool calls as text" in job["error"], job
    assert add(daemon, "s-no", [], agent_id=AGENT)["pending_messages"] == 2
    fake.script(Reply(json=refusal))
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "refused to answer" in job["error"], job
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                        "name": "Trip", "content": "- Reykjavík on the 12th",
                                        "reason": "plan"})]]
    assert dream(daemon)["notes"] == 1  # read again, as it was never read
    assert (root / "digest/wiki/trip.md").exists()
