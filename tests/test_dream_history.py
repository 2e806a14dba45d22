"""A node's History stays bounded over many corrections; what it drops is archived beside
it, out of search, and undo restores both files exactly."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, dream, fake, node, open_ws, write

from recalld.daemon.memory.digest import MAX_HISTORY_ENTRIES

__all__ = ["fake"]  # the fixture, imported for the tests here

VPN = "digest/wiki/vpn-gateway.md"
ARCHIVE = "digest/wiki/vpn-gateway.history.txt"


def history(text: str) -> list[str]:
    section = text.split("## History\n", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.strip()]


def test_history_is_bounded_and_older_entries_are_archived(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    notes = [f"memory/2026-10-{day:02d}/net.md" for day in range(1, MAX_HISTORY_ENTRIES + 5)]

    def plan(i: int) -> None:
        write(root, notes[i], f"The VPN gateway is now host{i}q.\n")
        args = {"bucket": "wiki", "name": "VPN gateway", "content": f"- the gateway is host{i}q",
                "reason": f"moved to host{i}q"}
        model.plan[notes[i]] = [[("integrate", {**args, "action": "CREATE"} if i == 0 else
                                  {**args, "action": "CORRECT", "node": VPN})]]

    for i in range(MAX_HISTORY_ENTRIES + 1):  # one CREATE, then as many corrections
        plan(i)
    open_ws(daemon, root, fake)
    first = dream(daemon)
    assert first["actions"] == {"CREATE": 1, "CORRECT": MAX_HISTORY_ENTRIES}, first
    after_first = (root / VPN).read_bytes()
    assert len(history(after_first.decode())) == MAX_HISTORY_ENTRIES
    assert not (root / ARCHIVE).exists()

    for i in range(MAX_HISTORY_ENTRIES + 1, len(notes)):
        plan(i)
    second = dream(daemon)
    assert second["actions"] == {"CORRECT": len(notes) - MAX_HISTORY_ENTRIES - 1}, second
    _, text = node(root, VPN)
    kept = history(text)
    moved = len(notes) - 1 - MAX_HISTORY_ENTRIES
    assert kept[0] == f"- {moved} older entries are in {ARCHIVE}", kept[0]
    assert len(kept) == MAX_HISTORY_ENTRIES + 1
    assert f"host{moved}q" in kept[1], kept
    archived = (root / ARCHIVE).read_text(encoding="utf-8").splitlines()
    entries = [ln for ln in archived if ln.startswith("- ")]
    # The oldest claims, oldest first, each once, and no longer in the node.
    assert [f"host{i}q" in e for i, e in enumerate(entries)] == [True] * moved, archived
    assert all(f'"the gateway is host{i}q"' not in text for i in range(moved))
    assert "- the gateway is host23q" in text.split("## ")[0]
    # The archive is no note: search does not find what only it holds.
    hits = daemon.call("memory.search", {"agent_id": "dreamer", "query": "host0q",
                                         "sync": True})["results"]
    assert [h["path"] for h in hits if h["path"] != notes[0]] == [], hits
    # Parsed and written again, the node keeps its count line once.
    third_note = "memory/2026-11-30/again.md"
    write(root, third_note, "The gateway is still host23q.\n")
    model.plan[third_note] = [[("integrate", {
        "action": "CORROBORATE", "bucket": "wiki", "name": "VPN gateway", "node": VPN,
        "reason": "said again"})]]
    third = dream(daemon)
    assert third["actions"] == {"CORROBORATE": 1}, third
    assert history(node(root, VPN)[1]) == kept

    daemon.call("dream.undo", {"agent_id": "dreamer", "run_id": third["run_id"]})
    daemon.call("dream.undo", {"agent_id": "dreamer", "run_id": second["run_id"]})
    assert (root / VPN).read_bytes() == after_first
    assert not (root / ARCHIVE).exists()


BUILD = "digest/wiki/build-server.md"
BUILD_ARCHIVE = "digest/wiki/build-server.history.txt"


def build_server(daemon: DaemonHandle, fake: FakeProvider, root: Path
                 ) -> tuple[ScriptedModel, list[str]]:
    """A node corrected once more than its History keeps: its oldest entry archived."""
    model = ScriptedModel(fake)
    notes = [f"memory/2027-01-{day:02d}/ci.md" for day in range(1, MAX_HISTORY_ENTRIES + 3)]
    for i, note in enumerate(notes):
        write(root, note, f"Builds now run on box-{i}z.\n")
        args = {"bucket": "wiki", "name": "Build server", "reason": f"box-{i}z",
                "content": f"- builds run on box-{i}z"}
        model.plan[note] = [[("integrate", {**args, "action": "CREATE"} if i == 0 else
                              {**args, "action": "CORRECT", "node": BUILD})]]
    open_ws(daemon, root, fake)
    assert dream(daemon)["actions"] == {"CREATE": 1, "CORRECT": MAX_HISTORY_ENTRIES + 1}
    assert f"(source: [[{notes[1]}]]" in (root / BUILD_ARCHIVE).read_text(encoding="utf-8")
    return model, notes


def test_archived_history_follows_a_renamed_note(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A daily note renamed had its links updated in the node's History, not in the
    entries archived beside it."""
    root = tmp_path / "ws"
    _, notes = build_server(daemon, fake, root)
    renamed = "memory/2027-01-02/ci (monday).md"  # the source of the archived entry
    (root / notes[1]).rename(root / renamed)
    node_before = (root / BUILD).read_bytes()
    archive_before = (root / BUILD_ARCHIVE).read_bytes()
    second = dream(daemon)
    assert second["actions"] == {"RELINK": 1}, second
    kept = (root / BUILD_ARCHIVE).read_text(encoding="utf-8")
    assert f"[[{notes[1]}]]" not in kept and f"(source: [[{renamed}]]" in kept, kept
    assert kept == archive_before.decode().replace(notes[1], renamed)
    daemon.call("dream.undo", {"agent_id": "dreamer", "run_id": second["run_id"]})
    assert (root / BUILD).read_bytes() == node_before
    assert (root / BUILD_ARCHIVE).read_bytes() == archive_before

