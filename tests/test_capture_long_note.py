"""A day-long conversation whose note grows past what the chat model may write in one
answer: capture goes on, every fact in the note once.

A real daemon, a real socket, a chat server on 127.0.0.1 that answers as a model does:
it writes the note whole with ``daily_write`` when it is offered (the note it was shown
with the new facts), or only the new facts with ``daily_append``, ten an answer; and, as
a real server,
cuts an answer longer than the request's ``max_tokens`` (4 characters a token) at that
length, with finish reason ``length``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, config, today, turn
from waits import wait_job

from recalld.daemon.index.frontmatter import body_of

MAX_TOKENS = 256
_FACT = re.compile(r"fact-\d+ [a-z0-9 ]+")


def _cut_model(calls: list[str]) -> Any:
    """The chat model: ``calls`` gets the name of each tool it calls."""

    def model(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        shown, _, said = prompt.partition("New turns of the conversation:")
        held = [ln for ln in shown.splitlines() if ln.startswith("- ")]
        sent = "".join(c["function"]["arguments"] for m in messages
                       for c in m.get("tool_calls") or [])
        new = [f"- {f.strip()}" for f in _FACT.findall(said)
               if not any(f.strip() in ln for ln in held) and f.strip() not in sent]
        offered = {t["function"]["name"] for t in body["tools"]}
        system = next(m["content"] for m in messages if m["role"] == "system")
        calls.extend(f"named, not offered: {n}"
                     for n in set(re.findall(r"\bdaily_\w+", system)) - offered)
        if not new or (messages[-1]["role"] == "tool" and "daily_write" in offered):
            return chat_answer("saved")
        if "daily_write" in offered:
            name, args = "daily_write", {"name": "day", "description": "the day",
                                         "content": "\n".join(held + new)}
        else:  # ten new facts at most, and one the note holds (a model repeats itself)
            name, args = "daily_append", {"content": "\n".join(held[-1:] + new[:10])}
        calls.append(name)
        text = orjson.dumps(args).decode()
        limit = 4 * int(body["max_tokens"])
        answer = chat_answer(None, [tool_call(name, text[:limit])])
        if len(text) > limit:
            answer["choices"][0]["finish_reason"] = "length"
        return answer

    return model


def _config(root: Path, fake: FakeProvider) -> str:
    return config(root, fake, interval=0).replace(
        'timeout_s = 10.0}', f'timeout_s = 10.0, max_tokens = {MAX_TOKENS}}}')


def _note(root: Path) -> str:
    notes = [p for p in (root / "memory" / today()).glob("*.md") if p.name != "index.md"]
    assert len(notes) == 1, notes
    return body_of(notes[0].read_text())[0]


def test_a_note_many_times_max_tokens_keeps_being_captured(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    calls: list[str] = []
    fake.chat_default = _cut_model(calls)
    facts = [f"fact-{n} the crate in bay {n} holds spare valves of size {n}"
             for n in range(80)]
    for start in range(0, len(facts), 4):
        for fact in facts[start:start + 4]:
            add(d, "day", turn(f"Remember: {fact}."))
        job = wait_job(d, add(d, "day", [], flush=True)["job_id"])
        assert job["state"] == "succeeded", job
    body = _note(root)
    assert len(body) > 4 * 4 * MAX_TOKENS  # several times what one answer may hold
    for fact in facts:
        assert body.count(fact) == 1, fact
    assert "daily_write" in calls and "daily_append" in calls
    # The system prompt names only the note tools offered with it.
    assert not [c for c in calls if c.startswith("named")], sorted(set(calls))
    assert add(d, "day", [])["pending_turns"] == 0


def test_a_rewrite_cut_at_the_length_limit_is_asked_again_for_the_new_facts(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The note is short; the turns bring more facts than a rewrite of it can hold in
    # one answer, though the new facts alone fit.
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    calls: list[str] = []
    fake.chat_default = _cut_model(calls)
    old = [f"fact-{n} the shed key is under pot {n}" for n in range(6)]
    add(d, "cut", turn(" ".join(f"Remember: {f}." for f in old)))
    assert wait_job(d, add(d, "cut", [], flush=True)["job_id"])["state"] == "succeeded"
    new = [f"fact-{n} the garden hose in row {n} leaks near its tap" for n in range(6, 22)]
    add(d, "cut", turn(" ".join(f"Remember: {f}." for f in new)))
    job = wait_job(d, add(d, "cut", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    assert calls == ["daily_write", "daily_write", "daily_append", "daily_append"]
    body = _note(root)
    for fact in old + new:
        assert body.count(fact) == 1, fact
    assert add(d, "cut", [])["pending_turns"] == 0


def test_a_first_note_of_more_facts_than_one_answer_holds_is_written_in_steps(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    calls: list[str] = []
    fake.chat_default = _cut_model(calls)
    facts = [f"fact-{n} the ferry to island {n} leaves at pier {n} on mondays"
             for n in range(28)]
    for fact in facts:
        add(d, "first", turn(f"Remember: {fact}."))
    job = wait_job(d, add(d, "first", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    assert calls == ["daily_write"] + ["daily_append"] * 3
    body = _note(root)
    for fact in facts:
        assert body.count(fact) == 1, fact
    assert add(d, "first", [])["pending_turns"] == 0


def test_more_new_facts_than_the_steps_of_one_loop_are_all_added(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Ten facts an answer: 95 of them take more answers than one tool loop's steps.
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    calls: list[str] = []
    fake.chat_default = _cut_model(calls)
    facts = [f"fact-{n} the locker {n} code is on card {n}" for n in range(95)]
    add(d, "many", turn(" ".join(f"Remember: {f}." for f in facts)))
    job = wait_job(d, add(d, "many", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    body = _note(root)
    for fact in facts:
        assert body.count(fact) == 1, fact
    assert add(d, "many", [])["pending_turns"] == 0


def test_a_text_answer_cut_at_max_tokens_is_asked_again(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Servers modelled on other APIs name the cut "max_tokens", not "length".
    root = tmp_path / "ws"
    d = daemon_factory(_config(root, fake))
    fake.chat_default = _cut_model([])
    add(d, "mt", turn("Remember: fact-1 the boat is blue."))
    assert wait_job(d, add(d, "mt", [], flush=True)["job_id"])["state"] == "succeeded"
    fake.script(Reply(json=chat_answer(None, finish_reason="max_tokens")))
    add(d, "mt", turn("Remember: fact-2 the oars are in the loft."))
    job = wait_job(d, add(d, "mt", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    body = _note(root)
    assert body.count("fact-1 the boat is blue") == body.count("fact-2 the oars are in") == 1
