"""Conversations handed over in other shapes of the chat message formats.

A real daemon and socket (and a session store on real files); the chat model is a
scripted OpenAI-compatible server on 127.0.0.1 where a job has to run.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from recalld.daemon.memory import sessions
from recalld.daemon.memory.turns import count_user_turns, sanitize_messages, sanitize_turns
from recalld.ipc.errors import INVALID_PARAMS, RecalldError


def config(root: Path, interval: int) -> str:
    return (f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = {interval}\n'
            "auto_memory_idle_s = 0\n")


def anthropic_exchange(question: str, answer: str) -> list[dict[str, Any]]:
    """One user question answered after two tool calls, in Anthropic's message format:
    the tools' results come back as ``user`` messages of ``tool_result`` blocks."""
    return [
        {"role": "user", "content": [{"type": "text", "text": question}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "rain, 4 degrees"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "Bergen"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2",
                                      "content": [{"type": "text", "text": "sun"}]}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "compare"},
                                          {"type": "text", "text": answer}]},
    ]


def test_tool_results_sent_as_user_messages_are_not_user_turns(daemon_factory: Any,
                                                               tmp_path: Path) -> None:
    # Counted as user turns, every tool call of an agent moved the session towards its
    # auto_memory_interval: a run after one question instead of after three.
    d = daemon_factory(config(tmp_path / "ws", interval=3))
    for n, city in enumerate(("Oslo", "Bergen"), start=1):
        r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1",
                                        "messages": anthropic_exchange(
                                            f"Where is it warmer, {city}?", "Bergen.")})
        assert (r["pending_turns"], r["user_turns_total"]) == (n, n), r
        assert "job_id" not in r, r
    dialog = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1"})
    assert dialog["pending_messages"] == 6  # questions and the assistant's texts only
    # A message that mixes its text with a tool result is the user speaking.
    assert count_user_turns([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x"},
        {"type": "text", "text": "and also: I moved to Bergen"}]}]) == 1
    assert count_user_turns([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}}]}]) == 1


def test_texts_and_media_in_the_shapes_of_other_apis(daemon_factory: Any,
                                                    tmp_path: Path) -> None:
    # OpenAI's Assistants API gives a text block's text as {value, annotations}: the
    # whole conversation was dropped as if nothing had been said.
    d = daemon_factory(config(tmp_path / "ws", interval=0))
    thread = [{"role": "user", "content": [
                  {"type": "text", "text": {"value": "I moved to Oslo.", "annotations": []}}]},
              {"role": "assistant", "content": [
                  {"type": "text", "text": {"value": "Noted: Oslo.", "annotations": []}}]}]
    r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "t1", "messages": thread})
    assert (r["added_messages"], r["pending_turns"]) == (2, 1), r
    assert sanitize_messages(thread) == [{"role": "user", "content": "I moved to Oslo."},
                                         {"role": "assistant", "content": "Noted: Oslo."}]
    # Media say what they were ("[input omitted]" before, for audio and images alike).
    assert sanitize_messages([{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "input_image", "image_url": "https://example.org/a.png"},
        {"type": "input_file", "file_id": "file-1"}]}]) == [
        {"role": "user", "content": "[audio omitted]\n[image omitted]\n[file omitted]"}]


async def test_a_long_text_block_is_sanitized_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A long text given as a content block was sized as 1 KiB and sanitized on the event
    # loop: a second of redaction for a long paste, every client of the daemon waiting.
    on_loop: list[bool] = []

    def sanitize(messages: Any, before: str = "") -> Any:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return sanitize_turns(messages, before)

    monkeypatch.setattr(sessions, "sanitize_turns", sanitize)
    store = sessions.SessionStore(tmp_path / "pending.jsonl", "w")
    await store.open()
    long = "The ferry to Vis leaves at nine. " * 1000
    for content in (long, [{"type": "text", "text": long}],
                    [{"type": "input_text", "text": "short"}, {"type": "text", "text": long}],
                    "short", [{"type": "text", "text": "short"}]):
        await store.add("s", [{"role": "user", "content": content}], None)
    store.close()
    assert on_loop == [False, False, False, True, True]


def pending_said(root: Path, session: str) -> list[tuple[str, str]]:
    """(role, text) of every turn of ``session`` the session store holds, from its log."""
    log = root / "mem_metadata" / "sessions" / "pending.jsonl"
    ops = [json.loads(line.split(" ", 1)[1]) for line in log.read_text("utf-8").splitlines()]
    return [(m["role"], m["content"]) for op in ops
            if op["op"] == "turns" and op["session_id"] == session for m in op["messages"]]


def test_every_clients_shapes_keep_what_was_said(daemon_factory: Any, tmp_path: Path) -> None:
    # Gemini's parts (blocks without "type") were dropped as if nothing had been said, an
    # Anthropic document vanished, leaving "is it refundable?" about nothing, a refusal
    # was lost, and a Responses API transcript (items without a role) was refused whole.
    d = daemon_factory(config(tmp_path / "ws", interval=0))
    transcript = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": [{"text": "Mein Fahrrad ist grün."}]},
        {"role": "user", "content": [
            {"type": "document", "title": "Lease [v2]\nsigned",
             "source": {"type": "text", "media_type": "text/plain", "data": "Deposit 900"}},
            {"type": "text", "text": "Is the deposit refundable?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "deposit: 900 EUR"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "ok"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "Das prüfe ich nicht."}]},
        {"role": "user", "content": [
            {"inline_data": {"mime_type": "image/jpeg", "data": "/9j/4AAQ"}},
            {"type": "file", "file": {"filename": "kaution.pdf", "file_id": "file-1"}}]},
    ]
    r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "mixed",
                                    "messages": transcript})
    assert (r["added_messages"], r["pending_turns"]) == (4, 3), r
    assert pending_said(tmp_path / "ws", "mixed") == [
        ("user", "Mein Fahrrad ist grün."),
        ("user", "[document omitted: Lease (v2) signed]\nIs the deposit refundable?"),
        ("assistant", "Das prüfe ich nicht."),
        ("user", "[image omitted]\n[file omitted: kaution.pdf]")]
    # Gemini's own shape: "model" is the assistant, "parts" the content.
    gemini = [{"role": "user", "parts": [{"text": "Ich heiße Jo."}]},
              {"role": "model", "parts": [{"text": "Hallo Jo."}]}]
    r = d.call("memory.add_turns", {"agent_id": "w", "session_id": "gemini",
                                    "messages": gemini})
    assert (r["added_messages"], r["pending_turns"]) == (2, 1), r
    assert pending_said(tmp_path / "ws", "gemini") == [("user", "Ich heiße Jo."),
                                                       ("assistant", "Hallo Jo.")]
    # The same transcript asks recall what the user said in it.
    answer = d.call("memory.recall", {"agent_id": "w", "messages": transcript})
    assert "Mein Fahrrad ist grün." in answer["query"], answer["query"]
    # A message with a role nobody knows is still refused, and so is one without either.
    for wrong in ({"role": "robot", "content": "hi"}, {"content": "hi"},
                  {"type": "message", "content": "hi"}):
        with pytest.raises(RecalldError) as refused:
            d.call("memory.add_turns", {"agent_id": "w", "session_id": "mixed",
                                        "messages": [wrong]})
        assert refused.value.code == INVALID_PARAMS and "messages[0]" in str(refused.value)


def test_messages_that_say_nothing_are_no_user_turns(daemon_factory: Any,
                                                     tmp_path: Path) -> None:
    # Gemini hands a function's answer back as a "user" message of functionResponse
    # parts, and an empty user message (null, [], an empty text block) says nothing:
    # each counted as a user turn and started the periodic auto_memory run early.
    d = daemon_factory(config(tmp_path / "ws", interval=2))
    gemini = [{"role": "user", "parts": [{"text": "Wie wird das Wetter in Bergen?"}]},
              {"role": "model", "parts": [{"functionCall": {"name": "weather",
                                                            "args": {"city": "Bergen"}}}]},
              {"role": "user", "parts": [{"functionResponse": {
                  "name": "weather", "response": {"sky": "rain"}}}]},
              {"role": "user", "parts": [{"function_response": {
                  "name": "weather", "response": {"sky": "rain"}}}]},
              {"role": "model", "parts": [{"text": "Regen."}]}]
    empty = [{"role": "user", "content": content}
             for content in (None, [], "", " \n", [{"type": "text", "text": ""}],
                             [{"type": "thinking", "thinking": "hm"}],
                             # Text that shows nothing: a zero-width space, a byte order
                             # mark, bidi marks, a combining mark with no letter.
                             "\u200b", [{"type": "text", "text": "\ufeff\n\u2060"}],
                             "\u200e\u200f", " \u0301 ")]
    for session, messages in (("gemini", gemini), ("empty", [gemini[0], *empty])):
        r = d.call("memory.add_turns", {"agent_id": "w", "session_id": session,
                                        "messages": messages})
        assert (r["pending_turns"], r["user_turns_total"]) == (1, 1), r
        assert "job_id" not in r, r
    assert pending_said(tmp_path / "ws", "empty") == [("user", gemini[0]["parts"][0]["text"])]
    # A message cut in pieces whose last piece holds only a tool result is still the
    # one turn its text made it.
    cut = [{"role": "user", "content": "Ich ziehe nach Bergen.", "continued": True},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                         "content": "ok"}]}]
    assert count_user_turns(cut) == 1
    assert count_user_turns([{**cut[0], "continued": True}, *empty[:1]]) == 1


def test_a_secret_before_a_media_block_leaves_the_placeholder_whole(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A text block ending in a secret was read glued to the placeholder of the image or
    # file after it ("...789[image"), so the mask ate the placeholder's first word:
    # "[REDACTED] omitted]", and the turn no longer said what the user had shared.
    d = daemon_factory(config(tmp_path / "ws", interval=0))
    token = "ghp_" + "Qw7eRt9yUi3oPa5sDf1gHj2kLz8xCv4bNm6M"
    media = [{"type": "image_url", "image_url": {"url": "https://example.org/x.png"}},
             {"type": "file", "file": {"filename": "plan.pdf"}},
             {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]
    for n, kind in enumerate(("token", "password:", "Schlüssel")):
        d.call("memory.add_turns", {"agent_id": "w", "session_id": f"s{n}", "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"עכשיו {kind} {token}"},
                                         *media, {"type": "text", "text": token}]}]})
        said = pending_said(tmp_path / "ws", f"s{n}")
        assert said == [("user", f"עכשיו {kind} [REDACTED]\n[image omitted]\n"
                                 "[file omitted: plan.pdf]\n[audio omitted]\n[REDACTED]")], said
    # A key cut across two text blocks is still masked in both.
    assert sanitize_messages([{"role": "user", "content": [
        {"type": "text", "text": "deploy with " + token[:12]},
        {"type": "text", "text": token[12:] + " tonight"}]}]) == [
        {"role": "user", "content": "deploy with [REDACTED]\n[REDACTED] tonight"}]


def test_a_reasoning_models_thinking_in_its_text_is_not_kept(daemon_factory: Any,
                                                             tmp_path: Path) -> None:
    # Qwen3 or DeepSeek-R1 served without a reasoning parser hand their thinking back in
    # the content, "<think>...</think>" before the answer: it was kept as said by the
    # assistant, so its guesses ("maybe they live in Paris") could become facts.
    d = daemon_factory(config(tmp_path / "ws", interval=0))
    thinking = "<think>\nMaybe they live in Paris? 也许是巴黎。\n</think>\n\n"
    d.call("memory.add_turns", {"agent_id": "w", "session_id": "r1", "messages": [
        {"role": "user", "content": "Where do I live?"},
        {"role": "assistant", "content": thinking + "You live in Oslo."},
        {"role": "assistant", "content": [{"type": "text", "text": thinking + "Oslo."}]},
        {"role": "model", "parts": [{"text": "  <think>cut off by the length limit"}]},
        {"role": "user", "content": thinking + "I typed that myself."}]})
    assert pending_said(tmp_path / "ws", "r1") == [
        ("user", "Where do I live?"), ("assistant", "You live in Oslo."),
        ("assistant", "Oslo."), ("user", thinking.strip() + "\n\nI typed that myself.")]
