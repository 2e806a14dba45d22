"""auto_dream and a note the model cannot finish as it is: a few tries, a run apart,
then the note waits for a change or a person, and status says which and why. A failure
that says nothing of the note (the provider answering what is no chat answer) is not
counted; a tool call of the model's that cannot be read is."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

from clirun import run_recalld
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider, Reply
from test_dream import AGENT, ScriptedModel, dream, open_ws, run_job, write
from waits import workspace_status

from recalld.daemon.store.fsio import REAL
from recalld.daemon.store.records import write_records

STEPS = 12  # DreamConfig.max_steps_per_note


def _asked(fake: FakeProvider, note: str) -> int:
    """Chat completions sent about ``note`` so far."""
    return sum(1 for r in fake.requests if r.path.endswith("/chat/completions")
               and r.json["messages"][1]["content"].startswith(f"Daily note {note}:"))


def test_a_note_the_model_cannot_finish_waits_after_a_few_tries(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-02/endless.md"
    write(root, note, "Lots to look up: the router, the NAS, the printer.\n")
    open_ws(daemon, root, fake)
    # The model searches and searches: every conversation is cut off by its step budget.
    model.plan[note] = [[("node_search", {"query": f"thing {n}"})] for n in range(STEPS + 5)]

    def run(retry: bool = False) -> tuple[dict[str, object], int]:
        before = _asked(fake, note)
        job = run_job(daemon, "auto_dream", {"retry_failed": True} if retry else None)
        return job, _asked(fake, note) - before

    job, asked = run()  # try 1
    assert job["state"] == "failed" and f"within {STEPS} steps" in job["error"], job
    assert asked == STEPS
    job, asked = run()  # try 2, the next run
    assert job["state"] == "failed" and asked == STEPS, job
    job, asked = run()  # a run left out before try 3
    assert job["state"] == "succeeded" and asked == 0, job
    assert job["result"]["waiting_notes"] == 1, job
    assert "left out of 1 run(s)" in job["result"]["waiting"][note], job
    job, asked = run()  # try 3
    assert job["state"] == "failed" and asked == STEPS, job
    for _ in range(2):  # then it waits, run after run
        job, asked = run()
        assert job["state"] == "succeeded" and asked == 0, job
        why = job["result"]["waiting"][note]
        assert "failed on it 3 times" in why and f"within {STEPS} steps" in why, why
        assert "--retry-failed" in why, why
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "status"], env=daemon.env,
                          capture_output=True, text=True, timeout=60, check=False)
    shown = " ".join(proc.stdout.split())
    assert f"1 daily note(s) wait after the model failed on them as they are ({note}:" \
        in shown, proc.stdout
    assert f"recalld dream --retry-failed --agent {AGENT}" in shown, proc.stdout
    # Asked for, it is tried once more; failing again, it waits again.
    job, asked = run(retry=True)
    assert job["state"] == "failed" and asked == STEPS, job
    job, asked = run()
    assert job["state"] == "succeeded" and asked == 0, job
    # Its text changed: tried at once, and what it says now is integrated.
    write(root, note, "The router is called hal.\n")
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                        "name": "Router", "content": "- it is hal",
                                        "reason": "fact"})]]
    result = dream(daemon)
    assert (result["notes"], result["failed_notes"], result.get("waiting_notes")) == (
        1, 0, None), result
    assert (root / "digest/wiki/router.md").exists()


def test_a_provider_answering_garbage_does_not_count_as_a_try(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-03/d.md"
    write(root, note, "The build server is called deep-thought.\n")
    open_ws(daemon, root, fake)
    for _ in range(4):
        fake.script(Reply(raw=b"{this is not json"))
        job = run_job(daemon, "auto_dream")
        assert job["state"] == "failed" and "no note could be processed" in job["error"], job
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                        "name": "Build server", "content": "- deep-thought",
                                        "reason": "fact"})]]
    result = dream(daemon)
    assert (result["notes"], result["failed_notes"]) == (1, 0), result


def test_a_note_held_by_a_node_it_cannot_write_waits_and_says_how_to_go_on(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The note is unchanged; the node is what a person fixes: the note's waiting reason
    says so, not that the next dream reads it."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, broken = "memory/2026-10-05/a.md", "digest/wiki/kettle.md"
    write(root, note, "The kettle boils in 90 s, again.\n")
    write(root, broken, "---\nname: Kettle\nname: again\n---\n# Kettle\n\n- boils\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [[("integrate", {"action": "CORROBORATE", "bucket": "wiki",
                                        "node": broken, "reason": "again"})]]
    states = [run_job(daemon, "auto_dream")["state"] for _ in range(4)]
    assert states == ["failed", "failed", "succeeded", "failed"], states
    job = run_job(daemon, "auto_dream")
    why = job["result"]["waiting"][note]
    assert f"{broken} cannot be read as written" in why, why
    assert "read again by the next dream" not in why, why
    assert "by the next dream once the node is changed" in why, why
    # A run that then fails (the one note it reads gets no chat answer) still has status
    # say which note waits, and why.
    write(root, "memory/2026-10-05/b.md", "The mugs are in the left cupboard.\n")
    fake.script(Reply(raw=b"{not json"))
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "no note could be processed" in job["error"], job
    proc = subprocess.run([sys.executable, "-m", "recalld.ipc", "status"], env=daemon.env,
                          capture_output=True, text=True, timeout=60, check=False)
    shown = " ".join(proc.stdout.split())
    assert f"1 daily note(s) wait after the model failed on them as they are ({note}: " \
        f"the model failed on it 3 times" in shown, proc.stdout
    before = _asked(fake, note)
    # A person mends the node (not the note): the next dream reads the note, unasked.
    write(root, broken, "---\nname: Kettle\n---\n# Kettle\n\n- boils\n")
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "succeeded" and job["result"]["actions"] == {"CORROBORATE": 1}, job
    assert "waiting" not in job["result"] and _asked(fake, note) > before, job


def test_a_note_whose_tool_calls_come_garbled_counts_its_tries(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The server answers in good order, but the model's tool call for this one note is
    not JSON each time (while another note is read): that is the note's try, as a step
    budget spent on it is, not a server failing."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note, other = "memory/2026-10-06/garbled.md", "memory/2026-10-06/fine.md"
    write(root, note, "Quotes \"everywhere\" {and braces}.\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [[("integrate", '{"action": "CREATE", "name": "Quotes "every')]]

    def run() -> tuple[dict[str, object], int]:
        before = _asked(fake, note)
        job = run_job(daemon, "auto_dream")
        return job, _asked(fake, note) - before

    job, asked = run()
    assert job["state"] == "failed" and "not valid JSON" in job["error"] and asked == 1, job
    write(root, other, "Nothing to keep.\n")
    job, asked = run()  # try 2, beside a note read fine
    assert job["state"] == "succeeded" and job["result"]["failed_notes"] == 1, job
    assert asked == 1
    job, asked = run()  # left out once: its tries are counted
    assert asked == 0 and "left out of 1 run(s)" in job["result"]["waiting"][note], job
    assert "not valid JSON" in job["result"]["waiting"][note], job


def test_one_unreadable_call_does_not_lose_the_others_of_its_answer(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """An answer with a readable call, one whose arguments are not JSON and one without a
    function name: the readable one is carried out, the garbled one is answered with an
    error naming it (sent back with empty arguments, which servers can parse again), the
    nameless one is not sent back; the model calls it again and the note succeeds."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-07/mixed.md"
    write(root, note, "The printer is on floor 3; the NAS is named vault.\n")
    open_ws(daemon, root, fake)
    nas = {"action": "CREATE", "bucket": "wiki", "name": "NAS", "content": "- named vault",
           "reason": "fact"}
    model.plan[note] = [
        [("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Printer",
                        "content": "- on floor 3", "reason": "fact"}),
         ("integrate", '{"action": "CREATE", "name": "NAS", content: vault}'),
         ("", {"query": "x"})],
        [("integrate", nas)]]
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "succeeded" and job["result"]["actions"] == {"CREATE": 2}, job
    assert (root / "digest/wiki/printer.md").exists() and (root / "digest/wiki/nas.md").exists()
    garbled = next(r for r in model.tool_results if r.startswith("error:"))
    assert "tool call 1 (integrate) are not valid JSON" in garbled, model.tool_results
    assert "call integrate again" in garbled and len(model.tool_results) == 3
    second = [r.json for r in fake.requests if r.path.endswith("/chat/completions")
              and r.json["messages"][1]["content"].startswith(f"Daily note {note}:")][1]
    echoed = second["messages"][2]["tool_calls"]
    assert [c["function"]["arguments"] for c in echoed][1:] == ["{}"] and len(echoed) == 2


def test_a_restarted_daemon_names_the_notes_that_wait_before_it_dreams(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    """The notes waiting after failed tries were named by the status only from the last
    dream of the daemon that ran it: a daemon started since named none until it dreamed.
    Now the workspace's open reads them from the dream catalog."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-09/garbled.md"
    write(root, note, "Braces {everywhere} and \"quotes\".\n")
    d = daemon_factory()
    open_ws(d, root, fake)
    model.plan[note] = [[("integrate", '{"action": "CREATE", "name": "Braces {')]]
    states = [run_job(d, "auto_dream")["state"] for _ in range(4)]  # try, try, wait, try
    assert states == ["failed", "failed", "succeeded", "failed"], states
    assert d.stop() == 0
    d2 = daemon_factory(XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    open_ws(d2, root, fake)
    dream_status = (workspace_status(d2, AGENT) or {})["dream"]
    assert dream_status["waiting_notes"] == 1, dream_status
    why = dream_status["waiting"][note]
    assert "failed on it 3 times" in why and "not valid JSON" in why, why


def test_a_failed_dream_keeps_what_it_did_as_its_result(daemon: DaemonHandle,
                                                         fake: FakeProvider,
                                                         tmp_path: Path) -> None:
    """A dream whose every note failed kept only its error (the first note's reason)
    and ``result: null``, though it had written a node: its run summary is the failed
    job's result now, in ``jobs.get`` and in ``recalld jobs get``."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    a, b = "memory/2026-09-03/dog.md", "memory/2026-09-04/fish.md"
    write(root, a, "The dog is called Rex.\n")
    write(root, b, "The fish is called Nemo.\n")
    open_ws(daemon, root, fake)
    model.plan[a] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Dog",
                                     "content": "- the dog is Rex", "reason": "fact"})]]
    model.plan[b] = [[("integrate", {"action": "CREATE", "bucket": "personal", "name": "Fish",
                                     "content": "- the fish is Nemo", "reason": "fact"})]]
    # Each note's node is written, then its conversation breaks.
    fake.script(Reply(), Reply(raw=b"[1, 2"), Reply(), Reply(raw=b"<html>"))
    job = run_job(daemon, "auto_dream")
    assert job["state"] == "failed" and "no note could be processed" in job["error"], job
    result = job["result"]
    assert result["failed_notes"] == 2 and result["notes"] == 2, result
    assert result["actions"] == {"CREATE": 2}, result
    assert {"digest/personal/dog.md", "digest/personal/fish.md"} <= set(
        result["files_changed"]), result
    assert daemon.call("jobs.get", {"agent_id": AGENT, "job_id": job["job_id"]}) == job
    proc = run_recalld(["jobs", "get", job["job_id"]], env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert "error: no note could be processed" in proc.stdout, proc.stdout
    assert result["run_id"] in proc.stdout and "digest/personal/fish.md" in proc.stdout


def test_a_catalog_kept_where_recalld_kept_it_before_names_the_waiting_notes(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """A workspace whose dream catalog an older recalld kept in ReMe's ``file_catalog/``
    named no waiting note when it opened (only the catalog's place now was looked at),
    until its next dream. Its open reads that catalog too; nothing is dreamed for it."""
    root = tmp_path / "ws"
    note = "memory/2026-08-14/knots.md"
    text = "Knots: bowline, clove hitch.\n"
    write(root, note, text)
    legacy = root / "mem_metadata/file_catalog/dream.jsonl.zst"
    legacy.parent.mkdir(parents=True)
    write_records(REAL, legacy, [{
        "path": note, "digest": hashlib.sha256(text.encode()).hexdigest(), "state": "failed",
        "reason": "the answer stopped at its length limit", "run_id": "r1", "tries": 3}])
    open_ws(daemon, root, fake)
    dream_status = (workspace_status(daemon, AGENT) or {})["dream"]
    assert dream_status["waiting_notes"] == 1, dream_status
    why = dream_status["waiting"][note]
    assert "failed on it 3 times" in why and "length limit" in why, why
    assert not any(r.path.endswith("/chat/completions") for r in fake.requests)


def test_a_forgotten_workspace_leaves_no_waiting_notes_to_the_next_one_of_its_agent(
        daemon: DaemonHandle, fake: FakeProvider, tmp_path: Path) -> None:
    """The notes waiting after failed tries were kept per agent id for the daemon's life:
    a workspace closed with forget and one opened anew under the same id, at another
    folder with no dream catalog, showed the old folder's waiting notes."""
    root = tmp_path / "ws"
    model = ScriptedModel(fake)
    note = "memory/2026-10-11/gadget.md"
    write(root, note, "Δεν ξέρω τι είναι αυτό: {gadget}.\n")
    open_ws(daemon, root, fake)
    model.plan[note] = [[("integrate", '{"action": "CREATE", "name": "Gadget {')]]
    states = [run_job(daemon, "auto_dream")["state"] for _ in range(4)]
    assert states == ["failed", "failed", "succeeded", "failed"], states
    assert (workspace_status(daemon, AGENT) or {})["dream"]["waiting_notes"] == 1
    daemon.call("workspace.close", {"agent_id": AGENT, "forget": True})
    open_ws(daemon, tmp_path / "fresh", fake)
    dream_status = (workspace_status(daemon, AGENT) or {})["dream"]
    assert "waiting_notes" not in dream_status, dream_status
