"""auto_dream over the notes auto_resource writes: a note that follows its file (moved to
another day, renamed, marked removed) says what it said, and is one source of it. A real
daemon, a real resource folder, the scripted chat model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, node, run_job, write
from test_resource import active_jobs, catalog, open_ws, wait_state
from waits import wait_for

AGENT = "papers"
NODE = "digest/wiki/ferry-timetable.md"


def dream(daemon: DaemonHandle) -> dict[str, Any]:
    job = run_job(daemon, "auto_dream", agent=AGENT)
    assert job["state"] == "succeeded", job
    result: dict[str, Any] = job["result"]
    return result


def settled(daemon: DaemonHandle, root: Path, rel: str) -> str:
    """The note of ``rel`` once the resource job has nothing left to do."""
    wait_state(root, rel, "processed")
    wait_for(lambda: not active_jobs(daemon, AGENT, "auto_resource"))
    note: str = catalog(root)[rel]["note"]
    return note


def test_a_resource_note_that_follows_its_file_stays_one_source(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The note of a file moved into a day's folder is written anew there (another path,
    # another date, another name), that of a file renamed is rewritten where it is (its
    # name): what it says is the same, and the dream follows it as a renamed note, not a
    # second note saying it again (the model, asked, would corroborate the node with it:
    # two sources of one fact), nor reads it again.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    model.resource_answer = "Ferry timetable: the 07:40 boat to Vis runs daily in June."
    write(root, "resource/Fähre [Juni] #2.txt", "Split – Vis 07:40, täglich im Juni.\n")
    open_ws(daemon, AGENT, root, fake)
    note = settled(daemon, root, "resource/Fähre [Juni] #2.txt")
    model.plan[note] = [[("integrate", {
        "action": "CREATE", "bucket": "wiki", "name": "Ferry timetable",
        "content": "- the 07:40 boat to Vis runs daily in June", "reason": "timetable"})]]
    assert dream(daemon)["actions"] == {"CREATE": 1}
    assert node(root, NODE)[0]["sources"] == [note]
    steps = [("resource/Fähre [Juni] #2.txt", "resource/2026-06-01/Fähre [Juni] #2.txt"),
             ("resource/2026-06-01/Fähre [Juni] #2.txt", "resource/2026-06-01/ferry.txt"),
             ("resource/2026-06-01", "resource/2026-06-02")]
    for old, new in steps:
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        (root / old).rename(root / new)
        rel = new if new.endswith(".txt") else f"{new}/ferry.txt"
        wait_for(lambda rel=rel: list(catalog(root)) == [rel], f"only {rel} cataloged")
        moved = settled(daemon, root, rel)
        for n in (note, moved):
            model.plan[n] = [[("integrate", {
                "action": "CORROBORATE", "bucket": "wiki", "node": NODE,
                "name": "Ferry timetable", "content": "", "reason": "said again"})]]
        asked = len(fake.requests)
        result = dream(daemon)
        # A file renamed in its day keeps its note, rewritten where it is: nothing to do.
        relinked = {"RELINK": 1} if moved != note else {}
        assert result["notes"] == 0 and result["actions"] == relinked, (old, result)
        assert len(fake.requests) == asked  # no model asked
        fields, text = node(root, NODE)
        assert fields["sources"] == [moved] and fields["confidence"] == 0.5, text
        assert not fields.get("deleted_sources") and f"[[{moved}]]" in text, text
        assert dream(daemon)["run_id"] is None  # followed: nothing left to do
        note = moved
    # Deleted, its note is kept and marked: it says what it said, and the source the
    # node has stays one source, linked.
    (root / "resource/2026-06-02/ferry.txt").unlink()
    wait_for(lambda: catalog(root)["resource/2026-06-02/ferry.txt"].get("marked"), "marked")
    wait_for(lambda: not active_jobs(daemon, AGENT, "auto_resource"))
    asked = len(fake.requests)
    assert dream(daemon)["run_id"] is None
    assert len(fake.requests) == asked
    assert node(root, NODE)[0]["sources"] == [note]
