"""How a dream's end is reported: a cancelled run keeps its summary as its job's result,
a run that processed no note leaves ``interests.yaml`` as it was, and status names the
notes the next run leaves out."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_dream import (
    AGENT,
    HALF_A,
    HALF_B,
    ScriptedModel,
    dream_until_the_second_note,
    open_ws,
    run_job,
    write,
)

STEPS = 12  # DreamConfig.max_steps_per_note


def test_a_cancelled_dream_keeps_what_it_did_as_its_result(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    _model, job_id = dream_until_the_second_note(daemon, fake, tmp_path / "ws")
    daemon.call("jobs.cancel", {"agent_id": AGENT, "job_id": job_id})
    job = daemon.call("jobs.get", {"agent_id": AGENT, "job_id": job_id})
    assert job["state"] == "cancelled", job
    result = job["result"]
    assert result is not None, job
    assert result["actions"]["CREATE"] == 1 and result["changed"] is True, result
    assert "digest/personal/cat.md" in result["files_changed"], result
    assert result["notes"] == 2 and result["run_id"], result
    # Its change log names as read only the note it finished, and the other as left to
    # the next dream (it said "notes read: 2" and listed both).
    text = (tmp_path / "ws" / result["log"]).read_text(encoding="utf-8")
    read, _, rest = text.partition("## Notes read\n\n")[2].partition("\n\n")
    assert read == f"- [[{HALF_A}]]" and "- notes read: 1\n" in text, text
    assert f"## Notes not reached (read by the next dream)\n\n- [[{HALF_B}]]\n" in rest, text


def test_a_dream_whose_every_note_failed_leaves_interests_as_they_were(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    kept = "# Interest topics\nupdated: 2026-01-01\ntopics:\n  - topic: \"tea\"\n" \
        "    weight: 0.80\n"
    write(root, "digest/interests.yaml", kept)
    note = "memory/2026-10-07/loops.md"
    write(root, note, "Tea again, and the garden hose.\n")
    open_ws(daemon, root, fake)
    # The model notes its topics, then searches until its step budget cuts it off.
    model.plan[note] = [[("note_interests", {"topics": ["tea", "garden"]})]] + [
        [("node_search", {"query": f"hose {n}"})] for n in range(STEPS + 2)]
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed", job
    assert (root / "digest/interests.yaml").read_text() == kept
    assert "digest/interests.yaml" not in job["result"]["files_changed"], job["result"]


def test_status_names_a_note_as_soon_as_it_waits(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-08/endless.md"
    write(root, note, "A list of chores with no end: the gutter, the shed.\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [[("node_search", {"query": f"chore {n}"})] for n in range(STEPS + 3)]

    def waiting() -> dict[str, str]:
        ws = next(w for w in daemon.call("daemon.status")["workspaces"]
                  if w["agent_id"] == AGENT)
        named: dict[str, str] = ws["dream"].get("waiting") or {}
        return named

    assert run_job(daemon, "auto_dream")["state"] == "failed"  # try 1: read next run
    assert waiting() == {}
    assert run_job(daemon, "auto_dream")["state"] == "failed"  # try 2: a run left out
    assert "left out of 1 run(s)" in waiting().get(note, ""), waiting()
    assert run_job(daemon, "auto_dream")["state"] == "succeeded"  # the run left out
    assert waiting() == {}, waiting()  # try 3 is next
    assert run_job(daemon, "auto_dream")["state"] == "failed"  # try 3: it waits
    assert "failed on it 3 times" in waiting().get(note, ""), waiting()


def test_the_model_is_told_to_keep_facts_of_different_people_apart(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """Notes of a conversation shared by several people name who said what; the dream's
    model was only told of "the user", so Bob's home town could corroborate or correct
    a node about Alice's."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-06-11/shared.md"
    write(root, note, "- Alice lives in Oslo\n- Bob lives in Bergen\n")
    open_ws(daemon, root, fake)
    model.plan[note] = []
    assert run_job(daemon, "auto_dream")["state"] == "succeeded"
    (request,) = [r.json for r in fake.requests if note in r.body.decode()]
    system = " ".join(str(request["messages"][0]["content"]).split())
    assert "- Alice lives in Oslo\n- Bob lives in Bergen" in request["messages"][1]["content"]
    assert "never corroborates, refines or corrects a node about another person" in system
