"""auto_memory's tools keep the fields the daemon owns: a model cannot hand its note to
another session (``session_id``) or point it at another conversation
(``source_conversation``), by ``frontmatter_update`` or by an ``edit`` of those lines."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_auto_memory import add, turn
from test_dream import AGENT, open_ws, run_job

from recalld.daemon.index.frontmatter import parse_frontmatter


def test_the_model_cannot_give_its_note_to_another_session(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    open_ws(daemon, root, fake)
    path = f"memory/{dt.date.today().isoformat()}/bikes.md"
    link = "[[mem_session/dialog/s-own.jsonl]]"
    fake.script(
        Reply(json=chat_answer(None, [tool_call(
            "daily_write", {"name": "bikes", "content": "- rides a Brompton"}, "w")])),
        Reply(json=chat_answer(None, [
            tool_call("frontmatter_update", {"path": path, "changes": {
                "session_id": "s-victim", "topic": "bikes"}}, "f1"),
            tool_call("frontmatter_update", {"path": path, "changes": {
                "source_conversation": None}}, "f2"),
            tool_call("edit", {"path": path, "old": "session_id: s-own",
                               "new": "session_id: s-victim"}, "e1"),
            tool_call("edit", {"path": path, "old": link, "new": "[[elsewhere]]"}, "e2"),
            tool_call("frontmatter_update", {"path": path, "changes": {
                "topic": "bikes"}}, "f3")])),
        Reply(json=chat_answer("saved")))
    add(daemon, "s-own", turn("I ride a Brompton to work."), agent_id=AGENT)
    job = run_job(daemon, "auto_memory", {"session_id": "s-own"})
    assert job["state"] == "succeeded", job
    told = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert all(t.startswith("error:") and "set by the daemon" in t for t in told[1:5]), told
    assert not told[5].startswith("error:")
    fields, _ = parse_frontmatter((root / path).read_text(encoding="utf-8"))
    assert fields["session_id"] == "s-own" and fields["source_conversation"] == link
    assert fields["topic"] == "bikes"
