"""A tool loop's requests stay within the model's context: a model that reads many long
files in one conversation sees the latest of them whole and the older ones as one line
each, and a provider that refuses a conversation as too long fails the job saying so.
The fake chat server refuses, as a real one does, a request longer than its context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, config, done, turn, write_note
from test_dream import ScriptedModel, dream, node, open_ws, run_job, write
from test_tool_loop import loop_client
from waits import wait_job

from recalld.daemon.memory.llm import (
    MAX_RESULTS_CHARS,
    MAX_TOOL_RESULT_CHARS,
    LoopFailed,
    context_exceeded,
    run_tools,
)
from recalld.daemon.providers.bridge import ProviderBridge
from recalld.daemon.providers.errors import ProviderRejected

#: The request size (characters of JSON) past which the fake refuses, as a server whose
#: model's context holds a prompt, its answers and :data:`MAX_RESULTS_CHARS` of results
#: (a number of its own: the fake's context does not grow with the budget).
CONTEXT_CHARS = 100_000


def chars(body: bytes) -> int:
    return len(body.decode())


def refuse_past(fake: FakeProvider, limit: int) -> None:
    """Make the fake answer a request longer than ``limit`` characters as vLLM does."""

    def reply(body: Any) -> Reply | None:
        if chars(orjson.dumps(body)) <= limit:
            return None
        return Reply(status=400, json={"error": {
            "message": "This model's maximum context length is 32768 tokens. However, you "
                       "requested 41234 tokens in the messages. Please reduce the length.",
            "type": "BadRequestError", "code": 400}})

    fake.reply_for = reply


async def test_a_loop_reading_many_long_files_stays_within_its_context(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    async def dispatch(name: str, arguments: Any) -> str:
        return f"{arguments['path']}: " + "Ωmega line of a long note.\n" * 600

    reads = 9  # each result of 16,000 characters: far past the budget in all
    answers = [Reply(json=chat_answer(None, [tool_call("read", {"path": f"n{i}.md"},
                                                       f"r{i}")])) for i in range(reads)]
    fake.script(*answers)
    refuse_past(fake, CONTEXT_CHARS)
    chat = loop_client(fake, bridge)
    fake.chat_default = lambda body: chat_answer("read them all")
    res = await run_tools(chat, [{"role": "user", "content": "read"}], [], dispatch,
                          max_steps=reads + 1)
    assert res.finished and res.final_text == "read them all" and res.steps == reads + 1
    assert max(chars(r.body) for r in fake.requests) <= CONTEXT_CHARS
    last = fake.requests[-1].json["messages"]
    # Every call still has its result, in its place; the latest are whole.
    calls = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    results = [m for m in last if m["role"] == "tool"]
    assert calls == [m["tool_call_id"] for m in results] == [f"r{i}" for i in range(reads)]
    whole = [m for m in results if m["content"].startswith("n")]
    assert [m["tool_call_id"] for m in whole] == [f"r{i}" for i in range(reads - 3, reads)]
    assert sum(len(m["content"]) for m in whole) <= MAX_RESULTS_CHARS
    for m in results[:reads - 3]:
        assert m["content"].startswith("[left out: this result of read (")
        assert "Call read again" in m["content"] and len(m["content"]) < 300
    # The conversation the loop returns is whole.
    assert all(len(str(m["content"])) > MAX_TOOL_RESULT_CHARS * 3 // 4
               for m in res.messages if m["role"] == "tool")


async def test_one_answer_reading_many_long_files_stays_within_its_context(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    async def dispatch(name: str, arguments: Any) -> str:
        return "한국어 문장입니다. " * 3_000  # cut to MAX_TOOL_RESULT_CHARS

    reads = 12
    fake.script(Reply(json=chat_answer(None, [tool_call("read", {"path": f"n{i}.md"}, f"r{i}")
                                              for i in range(reads)])))
    refuse_past(fake, CONTEXT_CHARS)
    fake.chat_default = lambda body: chat_answer("done")
    chat = loop_client(fake, bridge)
    res = await run_tools(chat, [{"role": "user", "content": "read"}], [], dispatch)
    assert res.finished and res.steps == 2
    sent = fake.requests[-1]
    assert chars(sent.body) <= CONTEXT_CHARS
    results = [m for m in sent.json["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [f"r{i}" for i in range(reads)]
    assert [m["content"].startswith("[left out") for m in results] == [True] * 10 + [False] * 2


async def test_a_conversation_too_long_for_the_model_fails_saying_so(
        fake: FakeProvider, bridge: ProviderBridge) -> None:
    async def dispatch(name: str, arguments: Any) -> str:
        return "ok"

    refuse_past(fake, 10_000)
    chat = loop_client(fake, bridge)
    with pytest.raises(LoopFailed, match=r"too long for the chat model's context window "
                                         r"\(step 1, \d+ characters.*maximum context length"):
        await run_tools(chat, [{"role": "user", "content": "ஒரு நீண்ட உரை " * 2_000}], [],
                        dispatch)
    assert len(fake.requests) == 1  # not retried: it would be refused again
    fake.reply_for = None
    fake.script(Reply(status=413, raw=b"<html>413 Request Entity Too Large</html>"))
    with pytest.raises(LoopFailed, match="too long for the chat model's context window"):
        await run_tools(chat, [{"role": "user", "content": "go"}], [], dispatch)


@pytest.mark.parametrize(("status", "said", "exceeded"), [
    (400, "This model's maximum context length is 8192 tokens. However, your messages "
          "resulted in 9001 tokens.", True),  # OpenAI, vLLM
    (400, "the request exceeds the available context size, try increasing it", True),
    (400, "prompt is too long: 210000 tokens > 200000 maximum", True),
    (400, "The input token count (1234567) exceeds the maximum number of tokens allowed "
          "(1048576).", True),  # Gemini
    (400, "Range of input length should be [1, 30720]", True),  # DashScope
    (400, '{"code": "context_length_exceeded"}', True),
    (413, "Request Entity Too Large", True),
    (400, "max_tokens is too large: 50000. This model supports at most 16384 completion "
          "tokens", False),
    (400, "Invalid value for 'tool_choice'", False),
    (401, "maximum context length", False),
])
def test_a_refusal_for_the_context_is_told_from_others(status: int, said: str,
                                                       exceeded: bool) -> None:
    exc = ProviderRejected(f"chat m: HTTP {status}: {said}", status=status)
    assert context_exceeded(exc) is exceeded


def test_a_dream_whose_model_reads_many_long_nodes_completes(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-12-01/teams.md"
    write(root, note, "The platform team now owns the build farm.\n")
    nodes = [f"digest/wiki/team-{n}.md" for n in range(8)]
    for n, rel in enumerate(nodes):
        write(root, rel, f"---\nname: Team {n}\nsources: []\n---\n# Team {n}\n\n"
              + "".join(f"- team {n} fact {k}: Größe und Maß\n" for k in range(700)))
    open_ws(daemon, root, fake)
    refuse_past(fake, CONTEXT_CHARS)
    model.plan[note] = [[("node_read", {"path": rel})] for rel in nodes] + [[(
        "integrate", {"action": "CREATE", "bucket": "wiki", "name": "Build farm",
                      "content": "- the platform team owns it", "reason": "fact"})]]
    result = dream(daemon)
    assert result["actions"] == {"CREATE": 1}, result
    assert node(root, "digest/wiki/build-farm.md")[0]["sources"] == [note]
    chats = [r for r in fake.requests if r.path.endswith("/chat/completions")]
    assert len(chats) == len(nodes) + 2
    assert max(chars(r.body) for r in chats) <= CONTEXT_CHARS
    # Refused, the run fails naming the cause; the model's context, not the note, is at
    # fault: the note is read again by every run, never left to wait.
    refuse_past(fake, 2_000)
    more = "memory/2026-12-02/more.md"
    write(root, more, "The build farm moved to rack 4.\n")
    for _ in range(4):
        job = run_job(daemon, "auto_dream")
        assert job["state"] == "failed", job
        assert "too long for the chat model's context window" in job["error"], job
        assert not job["result"].get("waiting_notes"), job
    asked = [r for r in fake.requests if r.path.endswith("/chat/completions")
             and f"Daily note {more}:" in r.json["messages"][1]["content"]]
    assert len(asked) == 4
    fake.reply_for = None
    model.plan[more] = [[("integrate", {
        "action": "CREATE", "bucket": "wiki", "name": "Rack 4", "reason": "fact",
        "content": "- it holds the build farm"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}


def test_auto_memory_whose_model_reads_many_long_notes_completes(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    old = [f"memory/2026-11-{n + 10}/trip.md" for n in range(6)]
    for n, rel in enumerate(old):
        write(root, rel, f"---\nname: trip {n}\ndescription: a trip\n---\n"
              + "".join(f"- 旅行 {n} の記録 {k}: train, hotel, museum\n" for k in range(600)))
    d = daemon_factory(config(root, fake, interval=0))
    refuse_past(fake, CONTEXT_CHARS)
    fake.script(*[Reply(json=chat_answer(None, [tool_call("read", {"path": rel}, f"r{n}")]))
                  for n, rel in enumerate(old)],
                write_note("trips", "- Plans a ninth trip, to Kyoto"), done())
    add(d, "s", turn("Plan my ninth trip: Kyoto, like the others."))
    job = wait_job(d, add(d, "s", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", (job["error"], [r.body[-300:] for r in fake.requests])
    assert "Kyoto" in (root / job["result"]["note"]).read_text()
    chats = [r for r in fake.requests if r.path.endswith("/chat/completions")]
    assert len(chats) == len(old) + 2 and max(chars(r.body) for r in chats) <= CONTEXT_CHARS
    # A conversation the model's context cannot hold fails the job saying so, its turns
    # kept for the next run.
    refuse_past(fake, 1_000)
    add(d, "s", turn("And a tenth, to Lyon."))
    job = wait_job(d, add(d, "s", [], flush=True)["job_id"])
    assert job["state"] == "failed" and "chat model's context window" in job["error"], job
    assert add(d, "s", [])["pending_turns"] == 1


def test_a_dream_among_nodes_with_long_descriptions_stays_within_its_context(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Nodes a person or ReMe wrote may hold a page of description, over several lines:
    each node the prompt lists is one line of bounded length."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-12-03/garden.md"
    write(root, note, "Die Tomaten brauchen mehr Wasser.\n")
    for n in range(80):
        about = " ".join(f"Beet {n} Zeile {k}: Tomaten, Bohnen, Kürbis." for k in range(120))
        write(root, f"digest/wiki/beet-{n}.md", f"---\nname: Beet {n} {'Ä' * 400}\n"
              f"description: |\n  {about}\n  second line\n---\n# Beet {n}\n\n- Beet {n}\n")
    open_ws(daemon, root, fake)
    refuse_past(fake, CONTEXT_CHARS)
    model.plan[note] = [[("integrate", {
        "action": "CREATE", "bucket": "wiki", "name": "Tomaten", "reason": "fact",
        "content": "- brauchen mehr Wasser"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}
    sent = next(r.json for r in fake.requests if r.path.endswith("/chat/completions"))
    listing = sent["messages"][1]["content"].split("Existing nodes (newest first):\n")[1]
    lines = listing.splitlines()
    assert len(lines) == 80 and all(line.startswith("- digest/wiki/beet-") for line in lines)
    assert max(len(line) for line in lines) < 600
