"""auto_memory next to notes a person saved in another encoding than UTF-8 (GBK,
Latin-1): the model is never shown them as U+FFFD garbage, and they are never written
over; the session's facts go to a note of their own."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, turn
from test_dream import AGENT, fake, open_ws, run_job

__all__ = ["fake"]  # the fixture, used by name


def test_a_sessions_note_saved_as_gbk_is_left_alone(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    day = dt.date.today().isoformat()
    folder = root / "memory" / day
    folder.mkdir(parents=True)
    gbk = "---\nsession_id: s-gbk\n---\n- 喜欢喝乌龙茶\n".encode("gbk")
    (folder / "tea.md").write_bytes(gbk)
    open_ws(daemon, root, fake)
    fake.script(
        Reply(json=chat_answer(None, [
            tool_call("read", {"path": f"memory/{day}/tea.md"}, "r"),
            tool_call("edit", {"path": f"memory/{day}/tea.md", "old": "-", "new": "*"}, "e"),
            tool_call("daily_write", {"name": "tea", "content": "- drinks oolong"}, "w")])),
        Reply(json=chat_answer("saved")))
    add(daemon, "s-gbk", turn("我每天喝乌龙茶。"), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s-gbk"})
    assert job["state"] == "succeeded", job
    assert job["result"]["note"] == f"memory/{day}/tea-2.md", job["result"]
    prompt = fake.requests[0].json["messages"][1]["content"]
    assert "\ufffd" not in prompt and "has no note" in prompt
    told = [m["content"] for m in fake.requests[1].json["messages"] if m["role"] == "tool"]
    assert "not UTF-8" in told[0] and "\ufffd" not in told[0]
    assert told[1].startswith("error:")
    assert (folder / "tea.md").read_bytes() == gbk
    assert "drinks oolong" in (folder / "tea-2.md").read_text(encoding="utf-8")
