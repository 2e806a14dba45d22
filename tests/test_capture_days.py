"""A conversation is filed under the day it was held, however late it is captured: turns
said before midnight and written after it (the daemon was down, the idle flush came
late) go to that day's folder. A real daemon, its real pending-turns log, a scripted
chat server on 127.0.0.1."""

from __future__ import annotations

import datetime as dt
import zlib
from pathlib import Path
from typing import Any

import orjson
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_capture import add, config, done, notes, turn, write_note
from waits import wait_job

PENDING = "mem_metadata/sessions/pending.jsonl"
DAY_S = 86_400


def _rewrite_log(path: Path, change: dict[str, float | None]) -> None:
    """Move each session's turns back by ``change[session]`` seconds (None: as a log
    kept before turns had their time), each line's checksum made again."""
    lines = []
    for line in path.read_bytes().splitlines():
        rec = orjson.loads(line.split(b" ", 1)[1])
        shift = change.get(rec.get("session_id"), 0.0)
        for msg in rec.get("messages") or []:
            if shift is None:
                msg.pop("at")
            else:
                msg["at"] -= shift
        body = orjson.dumps(rec)
        lines.append(b"%08x %s\n" % (zlib.crc32(body), body))
    path.write_bytes(b"".join(lines))


def test_turns_are_filed_under_the_day_they_were_said(daemon_factory: Any,
                                                      fake: FakeProvider,
                                                      tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, fake, idle_s=0)
    d = daemon_factory(cfg)
    add(d, "late", turn("I planted the quince tree tonight."))
    add(d, "old", turn("The shed key is on the blue hook."))
    d.kill()  # nothing flushed: the turns wait in the log
    _rewrite_log(root / PENDING, {"late": 2 * DAY_S, "old": None})
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    today = dt.date.today()
    said = (dt.datetime.now() - dt.timedelta(seconds=2 * DAY_S)).date()
    # The shed note's description has lines of its own: the day's index.md took them
    # as lines of its body (a rule, a stray "session_id:" line), not one line per note.
    shed = Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "shed", "description": "where keys are\n---\nsession_id: x",
        "content": "- about the shed"})]))
    for session, name in (("late", "quince"), ("old", "shed")):
        fake.script(shed if name == "shed" else write_note(name, f"- about the {name}"),
                    done())
        job = add(d2, session, [], flush=True)["job_id"]
        assert wait_job(d2, job, agent="w")["state"] == "succeeded"
    by_name = {p.stem: p.parent.name for p in notes(root)}
    assert by_name == {"quince": said.isoformat(), "shed": today.isoformat()}, by_name
    prompts = [r.json["messages"][1]["content"] for r in fake.requests
               if r.path.endswith("/chat/completions") and len(r.json["messages"]) == 2]
    assert any(f"Date: {said.isoformat()}" in p and "quince" in p for p in prompts)
    index = (root / f"memory/{today.isoformat()}/index.md").read_text().splitlines()
    assert index[-2:] == ["", "- [shed](shed.md): where keys are --- session_id: x"], index


def _shift_said(path: Path, words: str, seconds: float) -> None:
    """Move the turns holding ``words`` back by ``seconds`` (each line's checksum made
    again): said then, as if the daemon had been down since."""
    lines = []
    for line in path.read_bytes().splitlines():
        rec = orjson.loads(line.split(b" ", 1)[1])
        for msg in rec.get("messages") or []:
            if words in msg["content"]:
                msg["at"] -= seconds
        body = orjson.dumps(rec)
        lines.append(b"%08x %s\n" % (zlib.crc32(body), body))
    path.write_bytes(b"".join(lines))


def test_turns_said_on_several_days_go_to_each_days_note(daemon_factory: Any,
                                                        fake: FakeProvider,
                                                        tmp_path: Path) -> None:
    # One conversation's turns wait over a night (the daemon was down, the chat model
    # failed until the morning): those said yesterday are yesterday's memory, not today's.
    root = tmp_path / "ws"
    cfg = config(root, fake, idle_s=0)
    d = daemon_factory(cfg)
    add(d, "s", turn("I planted the quince tree."))
    d.kill()
    _shift_said(root / PENDING, "quince", DAY_S)
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    add(d2, "s", turn("I pruned the pear tree."))
    today = dt.date.today().isoformat()
    said = (dt.datetime.now() - dt.timedelta(seconds=DAY_S)).date().isoformat()
    fake.script(write_note("quince", "- Planted a quince tree"), done(),
                write_note("pear", "- Pruned the pear tree"), done())
    job = wait_job(d2, add(d2, "s", [], flush=True)["job_id"], agent="w")
    assert job["state"] == "succeeded", job
    by_day = {p.parent.name: p.read_text() for p in notes(root)}
    assert sorted(by_day) == [said, today], by_day
    assert "quince" in by_day[said] and "pear" not in by_day[said]
    assert "pear" in by_day[today] and "quince" not in by_day[today]
    prompts = [r.json["messages"][1]["content"] for r in fake.requests
               if r.path.endswith("/chat/completions") and len(r.json["messages"]) == 2]
    assert [(f"Date: {said}" in p, "quince" in p, "pear" in p) for p in prompts] == [
        (True, True, False), (False, False, True)], prompts
    result = job["result"]
    assert result["dates"] == [said, today] and result["date"] == today, result
    assert result["turns"] == 4 and add(d2, "s", [])["pending_messages"] == 0, result
    dialog = (root / "mem_session/dialog/s.jsonl").read_text().splitlines()
    assert [orjson.loads(line)["content"] for line in dialog] == [
        "I planted the quince tree.", "Noted.", "I pruned the pear tree.", "Noted."]
