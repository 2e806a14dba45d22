"""The memory jobs next to notes a person saved in another encoding than UTF-8 (GBK,
Latin-1): the model is never shown them as U+FFFD garbage, and they are never written
over; auto_memory puts the session's facts in a note of their own, the dream reads what
reads as written (Windows-1252, GBK) and leaves the rest unread."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, turn
from test_dream import AGENT, ScriptedModel, dream, open_ws, run_job, write


def test_a_sessions_note_saved_as_gbk_is_left_alone(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    day = dt.date.today().isoformat()
    folder = root / "memory" / day
    folder.mkdir(parents=True)
    gbk = "---\nsession_id: s-gbk\ndescription: 茶\n---\n- 喜欢喝乌龙茶\n".encode("gbk")
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
    assert told[0].endswith("- 喜欢喝乌龙茶\n")  # read as written...
    assert told[1].startswith("error:") and "not UTF-8" in told[1]  # ...never changed
    assert (folder / "tea.md").read_bytes() == gbk
    assert "drinks oolong" in (folder / "tea-2.md").read_text(encoding="utf-8")
    index = (folder / "index.md").read_text(encoding="utf-8")
    assert "[tea](tea.md)" in index and "[tea-2](tea-2.md)" in index
    assert "\ufffd" not in index


def test_the_dream_reads_latin1_and_gbk_notes_as_written_and_not_a_cp1251_one(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    latin = root / "memory/2026-09-14/cafe.md"
    latin.parent.mkdir(parents=True)
    latin.write_bytes("- prend un café crème à 8h\n".encode("latin-1"))
    (root / "memory/2026-09-14/cha.md").write_bytes("- 喜欢喝乌龙茶\n".encode("gbk"))
    (root / "memory/2026-09-14/chai.md").write_bytes("- пьёт чай с лимоном\n".encode("cp1251"))
    good = "memory/2026-09-14/tea.md"
    write(root, good, "- drinks genmaicha\n")
    gbk_node = root / "digest/personal/茶.md"
    gbk_node.parent.mkdir(parents=True)
    gbk_node.write_bytes("---\nname: 茶\n---\n- 喜欢乌龙茶\n".encode("gbk"))
    open_ws(daemon, root, fake)
    create = {"action": "CREATE", "bucket": "personal", "name": "Tea",
              "content": "- genmaicha", "reason": "preference"}
    model.plan[good] = [[("node_read", {"path": "digest/personal/茶.md"})],
                        [("integrate", create)]]
    result = dream(daemon)
    assert result["notes"] == 3 and result["actions"] == {"CREATE": 1}, result
    sent = [m["content"] for r in fake.requests for m in r.json["messages"]
            if m["role"] == "user"]
    assert any("café crème" in t for t in sent)  # Windows-1252: read as written
    assert any("喜欢喝乌龙茶" in t for t in sent)  # and GBK
    assert sent and not any("\ufffd" in t or "chai.md" in t for t in sent)
    assert "not UTF-8" in model.tool_results[0] and "\ufffd" not in model.tool_results[0]
    assert gbk_node.read_bytes() == "---\nname: 茶\n---\n- 喜欢乌龙茶\n".encode("gbk")
