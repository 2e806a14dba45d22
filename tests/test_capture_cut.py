"""A message too large for one request, sent by the client library in pieces, is one user
turn and one line of the dialog log.

A real daemon with a small ``max_request_bytes``, the client library reading it from the
daemon's configuration, a scripted chat server on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from fakes.provider_server import FakeProvider
from test_auto_memory import add, done, turn, write_note
from test_capture import config
from test_capture_shapes import pending_said
from waits import wait_job

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.request_parts import add_turns_in_parts, part_id, turn_parts

LIMIT = 65536
#: About three requests of LIMIT: lines of text to escape, CJK, an indented last line.
PASTED = "".join(f'line {i}: "kestrel" 服务器 ✓\n' for i in range(5000)) + "    done."


def test_a_message_sent_in_pieces_is_one_turn_and_one_dialog_line(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=2).replace(
        "[daemon]\n", f"[daemon]\nmax_request_bytes = {LIMIT}\n"))
    for key in ("XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "HOME"):
        monkeypatch.setenv(key, d.env[key])  # the client takes the daemon's limit
    assert add(d, "s1", turn("I keep bees."))["user_turns_total"] == 1
    messages = [{"role": "user", "content": PASTED},
                {"role": "assistant", "content": "Logs read."}]
    assert len(turn_parts(messages, LIMIT)) >= 3
    fake.script(write_note("bees", "- Keeps bees"), done())

    async def send(only: int | None = None) -> dict[str, Any]:
        async with AsyncClient(d.socket_path) as client:
            if only is not None:  # a sender stopped after ``only`` parts
                for n, part in enumerate(turn_parts(messages, client.request_limit)[:only]):
                    await client.add_turns("w", "s1", part, request_id=part_id("r1", n))
                return {}
            return dict(await add_turns_in_parts(client, "w", "s1", messages, "r1"))

    trio.run(send, 2)
    # Half said: neither a turn nor a run yet, though the interval is 2.
    assert add(d, "s1", [])["user_turns_total"] == 1
    answer = trio.run(send)  # sent again whole, with the same request id
    assert answer["user_turns_total"] == 2 and answer["pending_turns"] == 2, answer
    assert wait_job(d, answer["job_id"])["state"] == "succeeded"
    dialog = [orjson.loads(line) for line in
              (root / "mem_session/dialog/s1.jsonl").read_text().splitlines()]
    assert [m["role"] for m in dialog] == ["user", "assistant", "user", "assistant"]
    assert dialog[2]["content"] == PASTED.strip()
    assert "continued" not in dialog[2]
    # The model is shown one turn too (longer than a prompt, it goes in labelled parts).
    assert any(b"user (part 1 of" in r.body for r in fake.requests)
    # The same again adds nothing: each part is known by its id, its answer given again.
    assert trio.run(send) == answer
    assert add(d, "s1", [])["user_turns_total"] == 2


def test_what_the_daemon_drops_makes_no_request_too_large(
        daemon_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A photo, a recording, a long tool result or tool-call arguments, or Gemini parts
    # larger than one request: the whole call was refused as too large, so the user's
    # words beside them were never captured, though the daemon keeps none of those bytes.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, None, interval=0).replace(
        "[daemon]\n", f"[daemon]\nmax_request_bytes = {LIMIT}\n"))
    for key in ("XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "HOME"):
        monkeypatch.setenv(key, d.env[key])
    data = "iVBORw0KGgo" * (3 * LIMIT // 11)
    png = f"data:image/png;base64,{data}"
    conversations: dict[str, list[dict[str, Any]]] = {
        "photo": [{"role": "user", "content": [
            {"type": "text", "text": "Die Wohnung in Graz:"},
            {"type": "image_url", "image_url": {"url": png, "detail": "high"}}],
            "id": "m1", "metadata": {"thumbnail": data}}],  # an AgentScope Msg's fields
        "voice": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
            {"type": "text", "text": "שלום, זה אני"}]}],
        "scan": [{"role": "user", "content": [
            {"type": "document", "title": "Mietvertrag",
             "source": {"type": "base64", "media_type": "application/pdf", "data": data}},
            {"type": "text", "text": "Ist die Kaution zu hoch?"}]}],
        "gemini": [{"role": "user", "parts": [
            {"inline_data": {"mime_type": "image/jpeg", "data": data}},
            {"text": "Mein Fahrrad ist grün."}]}],
        "tools": [{"role": "user", "content": "Lies das Log."},
                  {"role": "assistant", "content": None, "tool_calls": [{
                      "id": "c1", "type": "function",
                      "function": {"name": "save", "arguments": orjson.dumps(
                          {"text": data}).decode()}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": data},
                  {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": "t", "content": data},
                      {"type": "text", "text": "Und jetzt?"}]},
                  {"type": "function_call_output", "call_id": "c2", "output": data},
                  {"role": "assistant", "content": "Fertig."}],
    }

    async def send() -> None:
        async with AsyncClient(d.socket_path) as client:
            for session, messages in conversations.items():
                await add_turns_in_parts(client, "w", session, messages, f"r-{session}")

    trio.run(send)
    assert {s: pending_said(root, s) for s in conversations} == {
        "photo": [("user", "Die Wohnung in Graz:\n[image omitted]")],
        "voice": [("user", "[audio omitted]\nשלום, זה אני")],
        "scan": [("user", "[document omitted: Mietvertrag]\nIst die Kaution zu hoch?")],
        "gemini": [("user", "[image omitted]\nMein Fahrrad ist grün.")],
        "tools": [("user", "Lies das Log."), ("user", "Und jetzt?"),
                  ("assistant", "Fertig.")]}
    assert add(d, "tools", [])["user_turns_total"] == 2
