"""A forced undo of a dream run loses nothing it need not: the facts later runs put in
the nodes it restores are dreamed again, and hand edits it drops are named before and
kept after (a real daemon and a scripted model, see test_dream.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import run_recalld
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write
from test_dream_undo import CAT, plan_cat, undo

from recalld.ipc.errors import NotAllowed


def plan_refine(model: ScriptedModel, note: str, content: str) -> None:
    """The model's answer to ``note``: the node Cat, rewritten as ``content``."""
    model.plan[note] = [[("integrate", {"action": "REFINE", "bucket": "personal", "node": CAT,
                                        "content": content, "reason": "more"})]]


def test_a_forced_undo_dreams_again_the_facts_later_runs_put_in_its_nodes(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Run 2 added a fact to the node run 1 made; the forced undo of run 1 took that
    # fact out, and note 2 stayed "processed": its fact was in no node ever again.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    first_note, later_note = "memory/2026-05-02/kot.md", "memory/2026-05-09/kot-wiek.md"
    write(root, first_note, "Nasz kot ma na imię Pestka.\n")
    plan_cat(model, first_note, "- kot: Pestka")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    write(root, later_note, "Pestka skończyła cztery lata.\n")
    plan_refine(model, later_note, "- kot: Pestka\n- Pestka ma cztery lata")
    second = dream(daemon)
    assert second["actions"] == {"REFINE": 1}, second
    assert "cztery lata" in node(root, CAT)[1]

    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": first["run_id"],
                                        "force": True})
    assert not (root / CAT).exists()
    assert undone["dreamed_again"] == [first_note, later_note], undone
    plan_cat(model, first_note, "- kot: Pestka")
    plan_refine(model, later_note, "- kot: Pestka\n- Pestka ma cztery lata")
    again = dream(daemon)
    assert again["notes"] == 2, again
    assert "Pestka ma cztery lata" in node(root, CAT)[1]
    assert dream(daemon)["run_id"] is None  # once


def test_a_forced_undo_names_the_hand_edits_it_would_drop_and_keeps_them(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # A person added a line to the node; the refusal said only "use --force", and the
    # forced undo wrote over the line with nothing left of it anywhere.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, later_note = "memory/2026-05-02/kot.md", "memory/2026-05-09/kot-wiek.md"
    write(root, note, "Nasz kot ma na imię Pestka.\n")
    plan_cat(model, note, "- kot: Pestka")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    write(root, later_note, "Pestka skończyła cztery lata.\n")
    plan_refine(model, later_note, "- kot: Pestka\n- Pestka ma cztery lata")
    second = dream(daemon)
    # Rewritten by a later run only: no hand edit to speak of.
    with pytest.raises(NotAllowed) as refused:
        undo(daemon, first["run_id"])
    assert refused.value.data["hand_edited"] == [], refused.value.data
    assert "by hand" not in str(refused.value)

    edit = "\n- Pestka woli tuńczyka ```nie łososia```\n"
    (root / CAT).write_text((root / CAT).read_text() + edit, encoding="utf-8")
    hand_made = (root / CAT).read_bytes()
    for run in (first, second):
        with pytest.raises(NotAllowed) as refused:
            undo(daemon, run["run_id"])
        assert refused.value.data["hand_edited"] == [CAT], refused.value.data
        assert f"{CAT} (" in str(refused.value) and "edited by hand since" in str(
            refused.value), refused.value
    assert (root / CAT).read_bytes() == hand_made  # a refusal changes nothing

    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": second["run_id"],
                                        "force": True})
    assert undone["forced_over"] == [CAT] and "Pestka woli" not in node(root, CAT)[1]
    assert undone["hand_edits_kept"] == [CAT], undone
    told = (root / undone["log"]).read_bytes()
    kept = told[told.index(b"made by hand"):]
    assert hand_made in kept, told.decode()
    # In a fence the edit's own backticks cannot close.
    fence = kept[kept.index(b"\n`") + 1:kept.index(hand_made)]
    assert fence.strip() == b"````", kept.decode()
    # Kept where search does not serve it as a second copy of a node.
    hits = daemon.call("memory.search", {"agent_id": AGENT, "query": "tuńczyka",
                                         "sync": True})["results"]
    assert [h["path"] for h in hits] == [], hits


def test_a_hand_edit_a_later_run_wrote_on_is_named_as_one(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # Edited by hand between two runs, the node was then rewritten by the later run: the
    # edit is in what that run left, yet no run wrote it, and undoing the earlier run by
    # force drops it (no note brings it back).
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, later_note = "memory/2026-06-01/ねこ.md", "memory/2026-06-03/ねこ-2.md"
    write(root, note, "うちの猫はミソです。\n")
    plan_cat(model, note, "- 猫: ミソ")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    (root / CAT).write_text((root / CAT).read_text(encoding="utf-8").replace(
        "- 猫: ミソ", "- 猫: ミソ\n- ミソは棚の上で寝る"), encoding="utf-8")
    write(root, later_note, "ミソは四歳です。\n")
    plan_refine(model, later_note, "- 猫: ミソ\n- ミソは棚の上で寝る\n- 四歳")
    model.plan[later_note].insert(0, [("node_read", {"path": CAT})])  # the edit is read
    assert dream(daemon)["actions"] == {"REFINE": 1}
    with pytest.raises(NotAllowed) as refused:
        undo(daemon, first["run_id"])
    assert refused.value.data["hand_edited"] == [CAT], refused.value.data
    hand_made = (root / CAT).read_bytes()
    proc = run_recalld(["dream", "--agent", AGENT, "--undo", first["run_id"], "--force"],
                       env=daemon.env)
    log = f"mem_metadata/dream/runs/{first['run_id']}.md"
    assert proc.returncode == 0, proc.stderr
    assert f"the hand edits it wrote over in {CAT} are kept in {log}" in proc.stdout, proc.stdout
    told = (root / log).read_bytes()
    assert hand_made in told[told.index(b"made by hand"):], told.decode()


def test_a_forced_undo_dreams_again_a_note_a_later_run_read_again(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    # The note run 1 made the node from was changed and read again by run 2, which
    # rewrote the node: its catalog record is run 2's, so undoing run 1 left it alone, and
    # the node went with nothing to dream it again.
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-07-04/gato.md"
    write(root, note, "Nuestro gato se llama Miso.\n")
    plan_cat(model, note, "- gato: Miso")
    open_ws(daemon, root, fake)
    first = dream(daemon)
    write(root, note, "Nuestro gato se llama Miso y tiene cuatro años.\n")
    plan_refine(model, note, "- gato: Miso\n- cuatro años")
    assert dream(daemon)["actions"] == {"REFINE": 1}
    undone = daemon.call("dream.undo", {"agent_id": AGENT, "run_id": first["run_id"],
                                        "force": True})
    assert undone["dreamed_again"] == [note] and not (root / CAT).exists(), undone
    plan_cat(model, note, "- gato: Miso\n- cuatro años")
    again = dream(daemon)
    assert again["notes"] == 1 and again["actions"] == {"CREATE": 1}, again
    assert "cuatro años" in node(root, CAT)[1]
