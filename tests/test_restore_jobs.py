"""Jobs under way when a workspace is restored."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, open_ws, write
from waits import wait_job

DOG = "memory/2026-11-21/dog.md"


def _held_dream(daemon: DaemonHandle, fake: FakeProvider,
                tmp_path: Path) -> tuple[Path, str, Any]:
    """A workspace whose first dream made a node, backed up; then a note about a dog
    whose dream is under way, its model answer held back. The root, the archive and
    the held dream's job id and gate."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    cat = "memory/2026-11-20/cat.md"
    write(root, cat, "The cat is called Miso.\n")
    open_ws(daemon, root, fake)
    model.plan[cat] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                       "name": "Cat", "content": "- the cat is Miso",
                                       "reason": "fact"})]]
    model.plan[DOG] = [[("integrate", {"action": "CREATE", "bucket": "personal",
                                       "name": "Dog", "content": "- the dog is Rex",
                                       "reason": "fact"})]]
    dream(daemon)
    archive = daemon.call("backup.create", {"agents": [AGENT]})["file"]
    write(root, DOG, "The dog is called Rex.\n")
    gate = fake.gate(lambda body: DOG in str(body.get("messages", "")))
    job_id = daemon.call("jobs.submit", {"agent_id": AGENT, "kind": "auto_dream",
                                         "params": {}})["job_id"]
    assert gate.entered.wait(60)
    return root, archive, (job_id, gate)


def test_a_dream_under_way_runs_again_on_the_restored_files(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Answered after the restore, the dream wrote a node from a note the restore had
    # taken away: the restored memory was not what the backup held.
    root, archive, (job_id, gate) = _held_dream(daemon, fake, tmp_path)
    restored: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: restored.update(daemon.call(
        "backup.restore", {"file": archive, "agents": [AGENT]})))
    thread.start()
    try:
        thread.join(60)
    finally:
        gate.open()
        thread.join()
    assert restored["restored"][0]["agent_id"] == AGENT
    job = wait_job(daemon, job_id, agent=AGENT)
    assert job["state"] == "succeeded", job
    assert not (root / DOG).exists()
    assert not (root / "digest" / "personal" / "dog.md").exists()
    assert (root / "digest" / "personal" / "cat.md").exists()

