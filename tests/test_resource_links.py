"""auto_resource and what a note's links stand on: folder links inside resource/, file
names redaction would mask, the note's own fields. A real daemon, a real resource
folder, the scripted chat model."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, write
from test_resource import active_jobs, catalog, fake, open_ws, wait_state
from waits import wait_for

__all__ = ["fake"]  # the fixture, shared with test_resource


def test_a_folder_link_into_the_notes_is_not_read_as_resources(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # resource/notes -> ../memory: each daily note (the resource notes among them) would
    # be summarised into a note of its own, read once when the link appears and never
    # again (the watcher's scans do not descend folder links).
    root = tmp_path / "ws"
    ScriptedModel(fake)
    write(root, "memory/2026-11-03/meeting.md", "# Meeting\nThe venue is Porto.\n")
    write(root, "resource/first.txt", "Budget: 10k.\n")
    open_ws(daemon, "res", root, fake)
    wait_state(root, "resource/first.txt", "processed")
    wait_for(lambda: not active_jobs(daemon, "res", "auto_resource"))
    os.symlink("../memory", root / "resource/notes")
    write(root, "resource/later.txt", "Venue: Porto.\n")  # after the link's event
    wait_state(root, "resource/later.txt", "processed")
    cat = catalog(root)
    assert not [p for p in cat if p.startswith("resource/notes/")], sorted(cat)
    assert not any(b"resource/notes/" in r.body for r in fake.requests)
    assert sorted(p.name for p in (root / "memory").rglob("resource-*.md")) == [
        "resource-first-txt.md", "resource-later-txt.md"]
