"""auto_memory at its edges, end to end: conversations longer than one prompt (sent in
parts, nothing cut, a failed part keeping the ones before it) and ids that would name
other files and workspaces."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer
from test_auto_memory import add, config, done, turn
from waits import wait_job

from recalld.ipc.errors import InvalidParams


def test_a_long_conversation_reaches_the_model_whole(daemon_factory: Any, fake: FakeProvider,
                                                    tmp_path: Path) -> None:
    # More than one prompt holds: an early fact, a pasted log of 150k characters with a
    # fact in its middle, and a late fact. Every one of them is shown to the model.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    middle = "lorem ipsum " * 6000
    paste = middle + "the build server is called quokkabox " + middle
    prompts: list[str] = []

    def model(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return chat_answer("saved")
        prompts.append(messages[-1]["content"])
        return chat_answer("nothing to save")

    fake.chat_default = model
    add(d, "long", turn("My sister Anna lives in Graz.", "Noted, Graz."))
    add(d, "long", turn(paste))
    add(d, "long", turn("I moved to Tallinn in May."))
    job = wait_job(d, add(d, "long", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    assert len(prompts) > 1 and all(len(p) < 70_000 for p in prompts)
    shown = "".join(prompts)
    for fact in ("Anna lives in Graz", "quokkabox", "Tallinn in May"):
        assert fact in shown, fact
    assert shown.count("lorem") == shown.count("ipsum") == 12000  # all of it, words whole
    assert add(d, "long", [])["pending_turns"] == 0
    said = [orjson.loads(line)["content"] for line in
            (root / "mem_session" / "dialog" / "long.jsonl").read_text().splitlines()]
    assert len(said) == 6 and said[2] == paste.strip()


def test_a_failed_part_keeps_the_parts_before_it(daemon_factory: Any, fake: FakeProvider,
                                                 tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.chat_default = lambda body: chat_answer("nothing to save")
    add(d, "two", turn("first " * 9950))  # ~60k characters: the next turn needs a part
    add(d, "two", turn("I moved to Tallinn in May. " + "It is cold there. " * 60))
    fake.script(done("nothing to save"), Reply(raw=b"garbage"))
    job = wait_job(d, add(d, "two", [], flush=True)["job_id"])
    assert job["state"] == "failed" and "not valid JSON" in job["error"], job
    # The first part's turns are memory; the second's still wait, and are sent once more.
    assert add(d, "two", [])["pending_messages"] == 2
    said = [orjson.loads(line)["content"] for line in
            (root / "mem_session" / "dialog" / "two.jsonl").read_text().splitlines()]
    assert said == ["first " * 9949 + "first", "Noted."]
    job = wait_job(d, add(d, "two", [], flush=True)["job_id"])
    assert job["state"] == "succeeded" and job["result"]["turns"] == 2, job


def test_ids_with_a_trailing_newline_are_refused(daemon_factory: Any, tmp_path: Path) -> None:
    # They would become other workspaces, files and frontmatter values than the ids
    # without it ("default\n" beside "default", mem_session/dialog/"s\n".jsonl).
    root = tmp_path / "ws"
    d = daemon_factory(config(root, None))
    for agent_id in ("default\n", "x\n", "w\n"):
        with pytest.raises(InvalidParams):
            d.call("workspace.open", {"agent_id": agent_id})
    for session_id in ("s\n", "s\r\n", "s\n\n"):
        with pytest.raises(InvalidParams):
            add(d, session_id, turn("My cat is called Pixel."))
    with d.connect() as conn, pytest.raises(InvalidParams):
        conn.call("events.subscribe", {"topics": ["inbox.item\n"]})
    assert [w["agent_id"] for w in d.call("workspace.list")["workspaces"]] == ["default", "w"]
    assert add(d, "s", [])["pending_messages"] == 0
    assert [p for p in tmp_path.rglob("*") if "\n" in p.name] == []


def test_turns_after_the_pending_log_was_removed_reach_the_dialog(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Without its pending-turns log (mem_metadata removed while the daemon was down) a
    # workspace numbers turns from 1 again: the dialog file, which skipped every turn
    # numbered below its last one, lost the new turns of its conversation.
    root = tmp_path / "ws"
    cfg = config(root, fake, interval=0)
    d = daemon_factory(cfg)
    fake.chat_default = lambda body: chat_answer("nothing to save")
    for text in ("I live in Basel.", "I work at the zoo."):
        assert wait_job(d, add(d, "s", turn(text), flush=True)["job_id"])["state"] == "succeeded"
    assert d.stop() == 0
    shutil.rmtree(root / "mem_metadata")
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    job = wait_job(d2, add(d2, "s", turn("I moved to Tallinn."), flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    said = [orjson.loads(line)["content"] for line in
            (root / "mem_session" / "dialog" / "s.jsonl").read_text().splitlines()]
    assert said == ["I live in Basel.", "Noted.", "I work at the zoo.", "Noted.",
                    "I moved to Tallinn.", "Noted."]
