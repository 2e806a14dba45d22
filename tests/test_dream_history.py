"""A node's History stays bounded over many corrections; what it drops is archived beside
it, out of search, and undo restores both files exactly."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import ScriptedModel, dream, node, open_ws, write

from recalld.daemon.memory.digest import MAX_HISTORY_ENTRIES

VPN = "digest/wiki/vpn-gateway.md"
ARCHIVE = "digest/wiki/vpn-gateway.history.txt"


def history_text(text: str) -> str:
    return text.split("## History\n", 1)[1].split("\n## ", 1)[0]


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


def test_an_archive_follows_its_node_renamed_by_hand(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A node whose file a person renamed left its archive behind, named by no node,
    and a second archive was begun beside it at the next archiving."""
    root = tmp_path / "ws"
    model, _ = build_server(daemon, fake, root)
    moved, moved_archive = "digest/wiki/ci-host.md", "digest/wiki/ci-host.history.txt"
    archive_before = (root / BUILD_ARCHIVE).read_bytes()
    (root / BUILD).rename(root / moved)  # by hand: its name stays "Build server"
    node_before = (root / moved).read_bytes()
    second = dream(daemon)
    assert second["notes"] == 0 and second["actions"] == {"RELINK": 1}, second
    assert not (root / BUILD_ARCHIVE).exists()
    entries = (root / moved_archive).read_text(encoding="utf-8")
    assert entries == archive_before.decode().replace(
        f"# Older History of {BUILD},", f"# Older History of {moved},"), entries
    assert f"- 1 older entry is in {moved_archive}\n" in history_text(node(root, moved)[1])
    daemon.call("dream.undo", {"agent_id": "dreamer", "run_id": second["run_id"]})
    assert (root / moved).read_bytes() == node_before
    assert (root / BUILD_ARCHIVE).read_bytes() == archive_before
    assert not (root / moved_archive).exists()

    assert dream(daemon)["actions"] == {"RELINK": 1}  # undone: followed again
    later = "memory/2027-02-01/ci.md"
    write(root, later, "Builds now run on box-99z.\n")
    model.plan[later] = [[("integrate", {
        "action": "CORRECT", "bucket": "wiki", "name": "Build server", "node": moved,
        "content": "- builds run on box-99z", "reason": "moved again"})]]
    assert dream(daemon)["actions"] == {"CORRECT": 1}
    grown = (root / moved_archive).read_text(encoding="utf-8")
    assert grown.startswith(entries) and grown.count("\n- ") == 2, grown
    assert not (root / BUILD_ARCHIVE).exists()
    assert f"- 2 older entries are in {moved_archive}\n" in node(root, moved)[1]


def test_an_archive_named_by_a_hand_edit_outside_its_node_is_left_alone(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A node renamed by hand whose History names an archive that is a link, or one
    outside the buckets, is not followed there: no file outside the digest is read,
    moved or removed, and the run goes on."""
    root = tmp_path / "ws"
    build_server(daemon, fake, root)
    outside = tmp_path / "secret.history.txt"
    outside.write_text("not the node's\n", encoding="utf-8")
    (root / BUILD_ARCHIVE).unlink()
    (root / BUILD_ARCHIVE).symlink_to(outside)
    moved = root / "digest/wiki/ci-host.md"
    (root / BUILD).rename(moved)
    held = moved.read_bytes()
    hand = root / "digest/wiki/hand.md"
    hand.write_bytes(held.replace(BUILD_ARCHIVE.encode(), b"digest/../secret.history.txt"))
    hand_held = hand.read_bytes()
    result = dream(daemon)
    assert result["actions"] == {} and not result["changed"], result
    assert moved.read_bytes() == held and hand.read_bytes() == hand_held
    assert outside.read_text(encoding="utf-8") == "not the node's\n"
    assert (root / BUILD_ARCHIVE).is_symlink()
    assert not (root / "digest/wiki/ci-host.history.txt").exists()


def test_a_node_renamed_and_copied_by_hand_gives_each_copy_its_archive(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Two nodes whose History names one archive left behind (a node renamed, and a copy
    of it made by hand): the archive went to the first, the second's History line was
    pointed at an archive that did not exist."""
    root = tmp_path / "ws"
    build_server(daemon, fake, root)
    archive_before = (root / BUILD_ARCHIVE).read_bytes()
    (root / "digest/procedure").mkdir()
    copies = ["digest/procedure/ci.md", "digest/wiki/ci-copy.md"]
    (root / BUILD).rename(root / copies[0])
    (root / copies[1]).write_bytes((root / copies[0]).read_bytes())
    held = [(root / c).read_bytes() for c in copies]
    result = dream(daemon)
    assert result["actions"] == {"RELINK": 2}, result
    assert not (root / BUILD_ARCHIVE).exists()
    for rel in copies:
        archive = rel.removesuffix(".md") + ".history.txt"
        assert (root / archive).read_bytes() == archive_before.replace(
            BUILD.encode(), rel.encode()), archive
        assert f"- 1 older entry is in {archive}\n" in history_text(node(root, rel)[1])
    daemon.call("dream.undo", {"agent_id": "dreamer", "run_id": result["run_id"]})
    assert [(root / c).read_bytes() for c in copies] == held
    assert (root / BUILD_ARCHIVE).read_bytes() == archive_before
    assert sorted(p.name for p in root.glob("digest/*/*.history.txt")) == [
        "build-server.history.txt"]


def test_a_node_renamed_to_a_credential_not_relinked_is_logged_masked(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A node renamed by hand to a name holding a key, beside which a folder stands
    where its archive would go: it is not relinked, and the warning saying so named the
    node's file unmasked."""
    root = tmp_path / "ws"
    build_server(daemon, fake, root)
    key = "ghp_" + "Q7x9Lm2Pz8Rt4Vb6Nk1Hs3Jd5Fg0Wc7Yq2Ea"
    moved = root / f"digest/wiki/deploy-{key}.md"
    (root / BUILD).rename(moved)
    (root / f"digest/wiki/deploy-{key}.history.txt").mkdir()
    held = moved.read_bytes()
    result = dream(daemon)
    assert result["actions"] == {} and not result["changed"], result
    assert moved.read_bytes() == held and (root / BUILD_ARCHIVE).is_file()
    log = daemon.log_path.read_text(encoding="utf-8")
    assert "deploy-[REDACTED].md not relinked" in log and key not in log, log
