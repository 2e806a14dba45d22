"""Inbox items name notes as search and status show them: a note named by what looks like
a credential is masked in an item's changes, summary and details, in ``inbox.list`` and in
the ``inbox.item`` event, and can still be read by the name shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, dream_one_good_one_broken

from recalld.daemon.memory.inbox import INBOX_TOPIC, Inbox
from recalld.daemon.memory.secret_names import mask_path
from recalld.daemon.store.applog import AppendLog

GITHUB = "ghp_Zr4Tq9Lm2Xw7Ks3Vn8Bp1Dh6Fy0Jc5Ga2Ue9"
AWS = "AKIAJ7QX2M4RZ9WL3KTB"


def _leaks(value: object) -> list[str]:
    return [t[:10] for t in (GITHUB, GITHUB[4:20], AWS) if t in str(value)]


async def test_an_item_names_a_note_named_by_a_token_masked(tmp_path: Path) -> None:
    path = tmp_path / "inbox.jsonl"
    events: list[tuple[str, dict[str, Any]]] = []
    inbox = Inbox(path, "a", publish=lambda t, p: events.append((t, p)))
    await inbox.open()
    note, copy = f"memory/{AWS}/deploy-{GITHUB}.md", f"memory/{AWS}/deploy-{GITHUB}.conflict.md"
    item = await inbox.push(
        "sync_conflict", f"{note} was changed on another host first; yours is {copy}",
        [note, copy, "memory/plain.md"],
        details={"path": note, "conflict_copy": copy, "failed": [note], "n": 2,
                 "session_id": GITHUB})
    assert item is not None and not _leaks(item), item
    shown = item["changes"][0]
    assert shown == "memory/[REDACTED]/deploy-[REDACTED].md", item
    assert item["changes"][2] == "memory/plain.md"
    assert item["summary"].startswith(f"{shown} was changed") and item["changes"][1] in (
        item["summary"])
    assert item["details"] == {"path": shown, "conflict_copy": item["changes"][1],
                               "failed": [shown], "n": 2, "session_id": "[REDACTED]"}
    assert events == [(INBOX_TOPIC, {"agent_id": "a", "item": item})]
    assert inbox.list() == [item]
    assert GITHUB.encode() not in path.read_bytes()  # kept masked too
    inbox.close()
    # An item kept unmasked (before such names were masked) is listed masked.
    kept = AppendLog(path)
    kept.open()
    kept.append([{"op": "push", "item": {
        "id": "9" * 13, "time": 1.0, "kind": "auto_dream", "summary": f"wrote {note}",
        "changes": [note], "job_id": None, "details": {"failed_notes": [note]},
        "acked": False}}])
    kept.close()
    again = Inbox(path, "a")
    await again.open()
    assert again.list()[-1]["changes"] == [shown] and not _leaks(again.list()), again.list()
    again.close()


def test_a_dream_names_a_note_named_by_a_token_masked(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A note dropped in by hand, named by a token, that the dream could not process:
    # the run's inbox item listed it unmasked in its details' failed notes.
    bad = f"memory/2026-11-21/deploy-{GITHUB}.md"
    # Its masked name too: as the model is shown it.
    result = dream_one_good_one_broken(daemon, fake, tmp_path / "ws", bad, [mask_path(bad)])
    assert (result["notes"], result["failed_notes"]) == (2, 1), result
    [item] = daemon.call("inbox.list", {"agent_id": AGENT})["items"]
    assert not _leaks(item), item
    assert item["details"]["failed_notes"] == [mask_path(bad)], item
    assert daemon.call("memory.read", {"agent_id": AGENT, "path": mask_path(bad)})
