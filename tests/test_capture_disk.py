"""Storage that fails or stalls under capture: no turn is taken for saved that is not.

Real daemons with start hooks: test_disk_full's (the storage layer's filesystem seam
fails writes while a trigger file exists) and one whose pending-turns log takes seconds
to commit while a trigger file exists; a scripted OpenAI-compatible chat server
on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import CALL_TIMEOUT_S
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from hooks import start_hook
from test_disk_full import LAUNCHER
from waits import wait_for, wait_job

from recalld.ipc.errors import RecalldError

#: Start hook: the daemon's session store gives up on a write after 1 s, and its commits
#: of pending turns take 3 s while the trigger file exists (``<trigger>.in`` marks one
#: under way).
SLOW_COMMITS = (
    "import os, time\n"
    "from pathlib import Path\n"
    "from recalld.daemon.memory import sessions\n"
    "from recalld.daemon.store import applog\n"
    "trigger = Path(os.environ['SLOW_TRIGGER'])\n"
    "sessions.WRITE_TIMEOUT_S = 1.0\n"
    "append = applog.AppendLog.append\n"
    "def slow(self, records):\n"
    "    if trigger.exists() and any(r.get('op') == 'commit' for r in records):\n"
    "        Path(f'{trigger}.in').touch()\n"
    "        time.sleep(3)\n"
    "    return append(self, records)\n"
    "applog.AppendLog.append = slow\n"
)


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
        **start_hook(tmp_path, LAUNCHER), DISK_FULL_TRIGGER=str(trigger), DISK_FULL_AT="1",
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


def test_a_turn_the_log_could_not_take_in_time_is_an_error(daemon_factory: Any,
                                                            fake: FakeProvider,
                                                            tmp_path: Path) -> None:
    # A turn handed over while a job's commit held the log past the write deadline was
    # answered like a saved one, and was in no log, no note and no dialog.
    root = tmp_path / "ws"
    trigger = tmp_path / "slow"
    cfg = (f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
           "auto_memory_idle_s = 0\n"
           f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "m"}}\n')
    d = daemon_factory(cfg, **start_hook(tmp_path, SLOW_COMMITS), SLOW_TRIGGER=str(trigger))
    trigger.touch()
    first = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "flush": True,
                                        "messages": [{"role": "user", "content": "Hi."}]})
    wait_for(lambda: Path(f"{trigger}.in").exists(), "the job's commit under way")
    later = {"agent_id": "w", "session_id": "s1", "request_id": "r2",
             "messages": [{"role": "user", "content": "My dog is called Rex."}]}
    with pytest.raises(RecalldError, match="took no write"):
        d.call("memory.add_turns", later, timeout=CALL_TIMEOUT_S)
    trigger.unlink()
    assert wait_job(d, first["job_id"], agent="w")["state"] == "succeeded"
    assert d.call("memory.add_turns", later)["pending_turns"] == 1  # the retry saves it
    d.kill()
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert d2.call("memory.add_turns", {"agent_id": "w", "session_id": "s1"})[
        "pending_turns"] == 1
