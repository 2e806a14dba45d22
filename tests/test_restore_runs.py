"""What a restore does to the records the memory jobs keep: those made after the
backup go with the files they describe, and a rollback brings them back (a real daemon
and a scripted model, see test_dream.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider
from test_backup_resume import note_reply
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write
from waits import wait_job

TRAM = "digest/wiki/tram-line-7.md"
FIRST, LATER, AFTER = ("memory/2026-09-01/tram.md", "memory/2026-09-04/tram.md",
                       "memory/2026-09-08/tram.md")


def runs(daemon: DaemonHandle) -> dict[str, Any]:
    listed: list[dict[str, Any]] = daemon.call("dream.runs", {"agent_id": AGENT})["runs"]
    return {r["run_id"]: r["undone"] for r in listed}


def test_runs_made_after_a_backup_go_with_the_restore_and_come_back_with_a_rollback(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The restore put the node back as the first run left it, but the later run's record
    # stayed, listed as not undone and taken by the next dream for what a dream last
    # left in the node: a rewrite of it without reading it was refused as a hand edit.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    made = {"action": "CREATE", "bucket": "wiki", "name": "Tram line 7",
            "content": "- runs every 12 minutes\n- Łódź Kaliska to Widzew", "reason": "fact"}
    write(root, FIRST, "Tram 7 (Łódź Kaliska–Widzew) runs every 12 minutes.\n")
    model.plan[FIRST] = [[("integrate", made)]]
    open_ws(daemon, root, fake)
    first = dream(daemon)["run_id"]
    archive = daemon.call("backup.create", {"agents": [AGENT]})["file"]
    before = (root / TRAM).read_bytes()

    write(root, LATER, "Tram 7 now runs every 10 minutes at rush hour.\n")
    model.plan[LATER] = [[("integrate", {
        **made, "action": "REFINE", "node": TRAM, "reason": "detail",
        "content": "- runs every 12 minutes, 10 at rush hour\n- Łódź Kaliska to Widzew"})]]
    later = dream(daemon)["run_id"]
    assert set(runs(daemon)) == {first, later}
    changed = (root / TRAM).read_bytes()

    daemon.call("backup.restore", {"file": archive, "agents": [AGENT]})
    assert (root / TRAM).read_bytes() == before and not (root / LATER).exists()
    assert runs(daemon) == {first: None}  # the later run is not the workspace's any more
    assert dream(daemon)["run_id"] is None  # nothing the restore brought back is undreamed

    write(root, AFTER, "Tram 7 stops at Piotrkowska too.\n")
    model.plan[AFTER] = [[("integrate", {
        **made, "action": "REFINE", "node": TRAM, "reason": "detail",
        "content": "- runs every 12 minutes\n- Łódź Kaliska to Widzew\n- stops at Piotrkowska"})]]
    assert dream(daemon)["actions"] == {"REFINE": 1}  # no hand edit to read first
    assert "Piotrkowska" in node(root, TRAM)[1]

    daemon.call("backup.rollback")
    assert (root / TRAM).read_bytes() == changed and not (root / AFTER).exists()
    assert runs(daemon) == {first: None, later: None}



def test_a_note_the_backup_had_not_dreamed_is_dreamed_again_after_its_restore(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Written before the backup, dreamed after it: the restore takes back what that run
    # wrote, so the note is dreamed again, and its rewrite of the node, made as the first
    # time without reading it, is not refused as one of a hand-edited node.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    made = {"action": "CREATE", "bucket": "wiki", "name": "Tram line 7",
            "content": "- runs every 12 minutes", "reason": "fact"}
    write(root, FIRST, "Tram 7 runs every 12 minutes.\n")
    model.plan[FIRST] = [[("integrate", made)]]
    open_ws(daemon, root, fake)
    first = dream(daemon)["run_id"]
    write(root, LATER, "Tram 7 runs every 10 minutes at rush hour.\n")
    refine = {**made, "action": "REFINE", "node": TRAM, "reason": "detail",
              "content": "- runs every 12 minutes, 10 at rush hour"}
    model.plan[LATER] = [[("integrate", refine)]]
    archive = daemon.call("backup.create", {"agents": [AGENT]})["file"]
    assert dream(daemon)["actions"] == {"REFINE": 1}

    daemon.call("backup.restore", {"file": archive, "agents": [AGENT]})
    assert "rush hour" not in node(root, TRAM)[1] and (root / LATER).exists()
    assert runs(daemon) == {first: None}
    again = dream(daemon)
    assert again["notes"] == 1 and again["actions"] == {"REFINE": 1}, again
    assert "rush hour" in node(root, TRAM)[1]
    assert dream(daemon)["run_id"] is None

def test_turns_captured_after_a_backup_are_captured_again_once_after_its_restore(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    # Pending when the backup was made, captured since: the restore takes the note away
    # and makes them pending again; the change log must not keep the capture's record.
    d = daemon_factory("[workspace_defaults]\nauto_memory_idle_s = 0\n"
                       "[workspace_defaults.chat_model_config]\n"
                       f'base_url = "{fake.url}/v1"\napi_key = "k"\nmodel_name = "m"\n')
    root = tmp_path / "ws"
    d.call("workspace.open", {"agent_id": "w", "path": str(root),
                              "config": {"auto_memory_interval": 50}})
    said = [{"role": "user", "content": "Η θυρίδα μου είναι η 314, στον δεύτερο όροφο."},
            {"role": "assistant", "content": "Το κράτησα."}]
    assert d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1",
                                       "messages": said})["pending_messages"] == 2
    archive = d.call("backup.create", {"agents": ["w"]})["file"]

    fake.script(*note_reply("locker", "- Θυρίδα 314, δεύτερος όροφος"))
    job = wait_job(d, d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1",
                                                  "flush": True})["job_id"])
    assert job["state"] == "succeeded", job
    captured = job["result"]["note"]
    assert len(_captures(d)) == 1

    d.call("backup.restore", {"file": archive, "agents": ["w"]})
    assert not (root / captured).exists()
    assert _captures(d) == []
    fake.script(*note_reply("locker", "- Θυρίδα 314, δεύτερος όροφος"))
    again = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "flush": True})
    assert again["pending_messages"] == 2
    job = wait_job(d, again["job_id"])
    assert job["state"] == "succeeded", job
    assert "314" in (root / job["result"]["note"]).read_text(encoding="utf-8")
    assert len(_captures(d)) == 1
    assert d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1"})[
        "pending_messages"] == 0


def _captures(d: DaemonHandle) -> list[dict[str, Any]]:
    changes: list[dict[str, Any]] = d.call("memory.changes", {"agent_id": "w"})["changes"]
    return [c for c in changes if c.get("kind") == "auto_memory"]


def test_a_restore_leaves_remes_own_records_it_has_no_copy_of(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # ReMe (QwenPaw) writes file_catalog/, not recalld's jobs, and backups made before
    # they held it have none of it: the restore writes back what it has and removes none.
    root = tmp_path / "ws"
    write(root, FIRST, "Tram 7 runs every 12 minutes.\n")
    open_ws(daemon, root, None)
    archive = daemon.call("backup.create", {"agents": [AGENT]})["file"]
    remes = write(root, "mem_metadata/file_catalog/notes.jsonl", '{"path": "x"}\n')
    ours = write(root, "mem_metadata/inbox/stray.jsonl", "{}\n")
    daemon.call("backup.restore", {"file": archive, "agents": [AGENT]})
    assert remes.read_text() == '{"path": "x"}\n' and not ours.exists()
