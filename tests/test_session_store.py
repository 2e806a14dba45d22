"""The session store and the sanitizer of conversation turns, without a daemon: what is
kept of what was said, how commits are counted and compacted, and how finished sessions
are let go."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_auto_memory import IMAGE, SECRET, TOOL_RESULT, turn

from recalld.daemon.memory import sessions
from recalld.daemon.memory.turns import sanitize_messages


def test_sanitize_messages_keeps_only_what_was_said() -> None:
    out = sanitize_messages([
        {"role": "system", "content": "system prompt"},
        {"role": "developer", "content": "dev prompt"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": IMAGE}},
                                     {"type": "tool_result", "content": TOOL_RESULT}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": TOOL_RESULT},
        {"role": "function", "content": TOOL_RESULT},
        {"role": "assistant", "content": f"inline {IMAGE} and <recalled-memory a=1>old"
                                         f"</recalled-memory> kept, token={SECRET}"},
    ])
    assert out == [
        {"role": "user", "content": "look\n[image omitted]"},
        {"role": "assistant", "content": "inline [data omitted] and  kept, token=[REDACTED]"},
    ]


async def test_session_store_counts_commits_and_compacts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The store's sizes cut by ten (its rules unchanged): compaction past 200 lines of slack,
    # 100 request ids remembered.
    monkeypatch.setattr(sessions, "COMPACT_SLACK_LINES", 200)
    monkeypatch.setattr(sessions, "MAX_REQUEST_IDS", 100)
    path = tmp_path / "pending.jsonl"
    store = sessions.SessionStore(path, "w")
    await store.open()
    for i in range(110):
        added = await store.add("s", turn(f"fact {i}"), f"r{i}", {"n": i})
        await store.commit("s", added.upto)
    a = await store.add("s", [{"role": "user", "content": [{"type": "image_url"}]}], None)
    assert a.pending_turns == 1 and a.pending_messages == 1  # "[image omitted]" is kept
    assert a.user_turns_total == 111
    store.close()
    assert len(path.read_bytes().splitlines()) < 220  # compacted along the way
    again = sessions.SessionStore(path, "w")
    await again.open()
    info = again.info("s")
    assert (info.pending_turns, info.user_turns_total) == (1, 111)
    assert again.answer_for("r109") == {"n": 109} and again.answer_for("r0") is None
    assert [m["content"] for m in await again.pending("s", info.upto)] == ["[image omitted]"]
    again.close()


async def test_finished_sessions_do_not_pile_up(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A new conversation id for every chat (AgentScope's default) left one record per
    finished conversation in memory and in the log forever; past MAX_DONE_SESSIONS the
    oldest finished ones are forgotten, unfinished ones never."""
    monkeypatch.setattr(sessions, "MAX_DONE_SESSIONS", 100, raising=False)
    monkeypatch.setattr(sessions, "COMPACT_SLACK_LINES", 200)
    path = tmp_path / "pending.jsonl"
    store = sessions.SessionStore(path, "w")
    await store.open()
    await store.add("open-chat", turn("I keep bees."), None)
    for i in range(700):
        added = await store.add(f"chat-{i}", turn(f"fact {i}"), None)
        await store.commit(f"chat-{i}", added.upto)
    assert store.status()["sessions"] < 400, store.status()  # was 701
    assert len(path.read_bytes().splitlines()) < 900
    last = store.info("chat-699").upto
    store.close()
    again = sessions.SessionStore(path, "w")
    await again.open()
    assert again.status()["sessions"] < 400 and again.sessions_pending() == ["open-chat"]
    assert again.info("chat-699").user_turns_total == 1  # recent ones are remembered
    info = again.info("open-chat")
    assert [m["content"] for m in await again.pending("open-chat", info.upto)] == [
        "I keep bees.", "Noted."]
    # A forgotten id used again starts afresh, after every turn ever numbered.
    reused = await again.add("chat-0", turn("fact again"), None)
    assert reused.upto > last and reused.pending_turns == 1
    again.close()


