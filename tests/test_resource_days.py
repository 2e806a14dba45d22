"""auto_resource over a file's life in days and content: a file moved to another day's
folder, one emptied or made binary after its note was written, records of files gone.
A real daemon, a real resource folder, the scripted chat model."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, write
from test_resource import active_jobs, catalog, fake, note_of, open_ws, wait_state
from waits import wait_for

__all__ = ["fake"]  # the fixture, shared with test_resource


def resource_notes(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "memory").rglob("*.md")
                  if p.name.startswith("resource-"))


def test_a_file_moved_to_another_day_has_its_note_under_that_day(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Into a date folder, that folder renamed to another date, then out to a folder that
    # is no date (the day it was first seen): one note, each time under the file's day,
    # dated so, naming the file; no second model call.
    root = tmp_path / "ws"
    ScriptedModel(fake)
    today = date.today().isoformat()
    write(root, "resource/Devis café.md", "Caterer quote: 4 200 EUR.\n")
    open_ws(daemon, "days", root, fake)
    wait_state(root, "resource/Devis café.md", "processed")
    wait_for(lambda: not active_jobs(daemon, "days", "auto_resource"))
    calls = len(fake.requests)
    steps = [("resource/Devis café.md", "resource/2025-06-30/Devis café.md", "2025-06-30"),
             ("resource/2025-06-30", "resource/2025-07-01", "2025-07-01"),
             ("resource/2025-07-01", "resource/archive", today)]
    for (old, new, day), rel in zip(steps, ("resource/2025-06-30/Devis café.md",
                                            "resource/2025-07-01/Devis café.md",
                                            "resource/archive/Devis café.md"), strict=True):
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        (root / old).rename(root / new)
        wait_state(root, rel, "processed")
        wait_for(lambda rel=rel: list(catalog(root)) == [rel], f"only {rel} cataloged")
        entry = catalog(root)[rel]
        assert entry["date"] == day and entry["note"].startswith(f"memory/{day}/"), entry
        wait_for(lambda entry=entry: resource_notes(root) == [entry["note"]], "one note")
        fields, text = note_of(root, rel)
        assert fields["date"] == day and fields["source_resource"] == f"[[{rel}]]", text
        assert "source_removed" not in fields and text.endswith(f"Source: [[{rel}]]\n")
    wait_for(lambda: not active_jobs(daemon, "days", "auto_resource"))
    assert len(fake.requests) == calls
    hits = daemon.call("memory.search", {"agent_id": "days", "query": "facts", "sync": True})
    assert [h["path"] for h in hits["results"]] == [catalog(root)[rel]["note"]], hits
