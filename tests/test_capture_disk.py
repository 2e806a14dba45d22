"""A note that cannot be written keeps its turns pending.

A real daemon started through test_disk_full's launcher (the storage layer's filesystem
seam fails writes while a trigger file exists) and a scripted OpenAI-compatible chat
server on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from test_disk_full import LAUNCHER
from waits import wait_job


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


def test_a_note_the_disk_refused_leaves_the_turns_pending(daemon_factory: Any,
                                                          fake: FakeProvider,
                                                          tmp_path: Path) -> None:
    # The model is told its daily_write failed and answers "saved" all the same: the
    # job succeeded and committed the turns, which were then in no note at all.
    root = tmp_path / "ws"
    trigger = tmp_path / "disk-is-full"
    d = daemon_factory(
        f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
        "auto_memory_idle_s = 0\n"
        f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "m"}}\n',
        launcher=LAUNCHER, DISK_FULL_TRIGGER=str(trigger), DISK_FULL_AT="1",
        DISK_FULL_ERRNO="ENOSPC")
    first = fake.gate(lambda body: not any(m["role"] == "tool" for m in body["messages"]))
    second = fake.gate(lambda body: any(m["role"] == "tool" for m in body["messages"]))
    fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": "dog", "description": "pets", "content": "- Dog named Rex"})])),
        Reply(json=chat_answer("saved")))
    job_id = d.call("memory.add_turns", {
        "agent_id": "w", "session_id": "s1", "flush": True,
        "messages": [{"role": "user", "content": "My dog is called Rex."}]})["job_id"]
    assert first.entered.wait(30)
    trigger.touch()  # the disk fills while the model thinks
    first.open()
    assert second.entered.wait(30)
    trigger.unlink()  # and has room again when it answers
    second.open()
    job = wait_job(d, job_id, agent="w")
    assert job["state"] == "failed" and "disk" in job["error"].lower(), job
    tool_answer = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert tool_answer[0]["content"].startswith("error:"), tool_answer
    pending = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1"})
    assert pending["pending_turns"] == 1, pending
    assert not list((root / "memory").rglob("dog.md"))
