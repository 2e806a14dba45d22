"""Every turn handed to the daemon becomes memory: idle flush, graceful-stop flush, crash.

A real daemon, a real socket, a scripted OpenAI-compatible chat server on 127.0.0.1.
Idle times are small settings (1-3 s) and every wait is on a condition with a generous cap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Gate, Reply, chat_answer, tool_call
from test_auto_memory import add, done, turn, write_note
from waits import ACTIVE, wait_for, wait_job


def config(root: Path, fake: FakeProvider | None, *, idle_s: float = 600.0,
           interval: int = 5, graceful_s: float = 5.0, breaker_s: float = 5.0) -> str:
    chat = ""
    if fake is not None:
        chat = (f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "test-key", '
                f'model_name = "fake-model", timeout_s = 60.0, '
                f"breaker_open_s = {breaker_s}}}\n")
    return (f"[daemon]\ngraceful_timeout_s = {graceful_s}\n"
            f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = {interval}\n'
            f"auto_memory_idle_s = {idle_s}\n{chat}")


def notes(root: Path) -> list[Path]:
    return sorted(p for p in (root / "memory").rglob("*.md") if p.name != "index.md")


def memory_jobs(d: Any) -> list[dict[str, Any]]:
    jobs = d.call("jobs.list", {"agent_id": "w"})["jobs"]
    return [j for j in jobs if j["kind"] == "auto_memory"]


def chat_requests(fake: FakeProvider) -> int:
    return sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))


def jobs_at_work(d: Any) -> dict[str, int]:
    jobs = d.call("daemon.status")["queues"]["jobs"]
    return {"running": jobs["running"], "queued": jobs["queued"]}


def health(d: Any) -> dict[str, Any]:
    status = d.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")
    result: dict[str, Any] = ws["health"]
    return result


def turn_reasons(d: Any) -> list[str]:
    """The health reasons about conversation turns (a start's first disk scan may still
    be under way beside them on a loaded machine)."""
    return [r for r in health(d)["reasons"] if "conversation message" in r]


def test_idle_session_is_written_without_a_flush(daemon_factory: Any, fake: FakeProvider,
                                                 tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=1.0))
    fake.script(write_note("bike", "- Commutes by bike"), done())
    r = add(d, "s1", turn("I commute by bike."))
    assert "job_id" not in r and r["pending_turns"] == 1
    assert health(d)["state"] == "pending"
    note = wait_for(lambda: notes(root), "the idle flush's note")
    assert "Commutes by bike" in note[0].read_text()
    job = wait_for(lambda: [j for j in memory_jobs(d) if j["state"] == "succeeded"])[0]
    assert job["params"]["session_id"] == "s1"
    assert wait_for(lambda: add(d, "s1", [])["pending_turns"] == 0)
    # Nothing more to do: no second job however long the session stays idle.
    status = d.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")
    assert ws["capture"]["idle_flushes"] == 1 and ws["capture"]["waiting_messages"] == 0
    assert len(memory_jobs(d)) == 1


def test_turns_of_a_failed_job_are_written_by_a_retry(daemon_factory: Any,
                                                      fake: FakeProvider,
                                                      tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=2.0))
    # The idle flush's job meets a broken answer; nobody adds a turn or flushes again.
    fake.script(Reply(raw=b'{"choices": [{"message": '), write_note("fern", "- Has a fern"),
                done())
    add(d, "s1", turn("I keep a fern on the balcony."))

    def failure() -> list[str]:
        return [r for r in health(d).get("reasons", []) if "last auto_memory job" in r]

    (reason,) = wait_for(failure, "health naming the failed job")
    assert "not valid JSON" in reason and "next try in" in reason, reason
    note = wait_for(lambda: notes(root), "the note written by the retry")
    assert "fern" in note[0].read_text()
    wait_for(lambda: all(j["state"] not in ACTIVE for j in memory_jobs(d)))
    jobs = sorted(memory_jobs(d), key=lambda j: j["submitted_at"])
    assert [(j["params"]["trigger"], j["state"]) for j in jobs] == [
        ("idle", "failed"), ("retry", "succeeded")], jobs
    assert "not valid JSON" in jobs[0]["error"]
    assert add(d, "s1", [])["pending_turns"] == 0
    dialog = (root / "mem_session/dialog/s1.jsonl").read_text().splitlines()
    assert sum("fern" in line for line in dialog) == 1


def test_retries_stop_after_failed_runs_until_a_new_turn(daemon_factory: Any,
                                                         fake: FakeProvider,
                                                         tmp_path: Path) -> None:
    # A model that always calls a tool it does not have fails every run: the session was
    # submitted again every hour for ever, the provider paid each time.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0.02))

    def refused(body: Any) -> Reply:
        if any(m.get("role") == "tool" for m in body.get("messages", [])):
            return done("All saved to memory.")
        return Reply(json=chat_answer(None, [tool_call("remember", {"fact": "owls"})]))

    fake.reply_for = refused
    add(d, "s1", turn("I watch owls at dusk."))

    def stopped() -> list[str]:
        return [r for r in health(d).get("reasons", []) if "not tried again" in r]

    (reason,) = wait_for(stopped, "health saying the retries stopped")
    assert "unknown tool 'remember'" in reason and "6 failed runs" in reason, reason
    jobs = sorted(memory_jobs(d), key=lambda j: j["submitted_at"])
    assert [(j["params"]["trigger"], j["state"]) for j in jobs] == [
        ("idle", "failed")] + [("retry", "failed")] * 5, jobs
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "w")
    assert ws["capture"]["retries_stopped"] == 1 and ws["capture"]["waiting_messages"] == 2
    # A new turn (here with a flush) submits them all again, and a model that writes saves.
    fake.reply_for = None
    fake.script(write_note("owls", "- Watches owls at dusk"), done())
    job = wait_job(d, add(d, "s1", turn("A barn owl tonight."), flush=True)["job_id"])
    assert job["state"] == "succeeded" and job["result"]["turns"] == 4, job
    assert "owls at dusk" in notes(root)[0].read_text()
    assert add(d, "s1", [])["pending_turns"] == 0
    wait_for(lambda: health(d)["state"] == "clean", "health clean again")


def test_graceful_stop_writes_pending_turns(daemon_factory: Any, fake: FakeProvider,
                                            tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    fake.script(write_note("tea", "- Drinks green tea"), done())
    assert add(d, "s1", turn("I drink green tea."))["pending_turns"] == 1
    assert d.stop() == 0
    assert "green tea" in notes(root)[0].read_text()


def test_stop_flush_unfinished_in_the_deadline_runs_after_restart(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, fake, idle_s=0, graceful_s=1.0)
    d = daemon_factory(cfg)
    fake.script(Reply(delay_s=20, json=chat_answer("too late")))
    add(d, "s1", turn("My cat is called Pixel."))
    assert d.stop() == 0
    assert notes(root) == []
    # A daemon slow to stop may not have asked before its deadline: the slow reply is
    # not for the restarted one.
    fake.clear_script()
    fake.script(write_note("cat", "- Cat named Pixel"), done())
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    note = wait_for(lambda: notes(root), "the resumed stop flush")
    assert "Pixel" in note[0].read_text()
    job = wait_for(lambda: [j for j in memory_jobs(d2) if j["state"] == "succeeded"])[0]
    assert job["resumed"] is True
    assert add(d2, "s1", [])["pending_turns"] == 0


@pytest.mark.slow
def test_kill_after_acknowledgement_loses_nothing(daemon_factory: Any, fake: FakeProvider,
                                                  tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, fake, idle_s=2.0)
    d = daemon_factory(cfg)
    assert add(d, "s1", turn("I was born in Lisbon."))["pending_turns"] == 1
    d.kill()
    assert chat_requests(fake) == 0 and notes(root) == []
    fake.script(write_note("origin", "- Born in Lisbon"), done())
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    note = wait_for(lambda: notes(root), "the idle flush after the restart")
    assert "Lisbon" in note[0].read_text()
    wait_for(lambda: add(d2, "s1", [])["pending_turns"] == 0)
    # Exactly once: one job, one note, the dialog holds the turn once.
    wait_for(lambda: all(j["state"] not in ACTIVE for j in memory_jobs(d2)))
    assert [j["state"] for j in memory_jobs(d2)] == ["succeeded"]
    assert chat_requests(fake) == 2 and len(notes(root)) == 1
    dialog = (root / "mem_session/dialog/s1.jsonl").read_text().splitlines()
    assert sum("Lisbon" in line for line in dialog) == 1
    assert d2.stop() == 0  # nothing left to flush at the stop either
    assert chat_requests(fake) == 2


def test_without_a_chat_model_turns_wait_and_health_says_why(daemon_factory: Any,
                                                              tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, None, idle_s=0.5)
    d = daemon_factory(cfg)
    add(d, "s1", turn("I like rye bread."))
    add(d, "s2", turn("Remind me of the dentist."))

    def reasons() -> list[str]:
        h = health(d)
        return [r for r in h["reasons"] if "auto_memory" in r] if h["state"] == "pending" else []

    why = wait_for(reasons, "a pending reason")
    assert why == ["4 conversation message(s) of 2 session(s) wait for auto_memory: "
                   "no chat model configured"]
    assert memory_jobs(d) == []  # nothing submitted that can only fail
    assert d.stop() == 0
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert add(d2, "s1", [])["pending_messages"] == 2
    assert add(d2, "s2", [])["pending_messages"] == 2
    assert memory_jobs(d2) == []



def test_a_submitted_upto_past_the_last_turn_swallows_no_later_turn(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A client names any upto in jobs.submit; with nothing pending the job commits it,
    # and a commit past the session's last turn would count every later turn as done.
    d = daemon_factory(config(tmp_path / "ws", None))
    job_id = d.call("jobs.submit", {"agent_id": "w", "kind": "auto_memory",
                                    "params": {"session_id": "s1", "upto": 10**12}})["job_id"]
    assert wait_job(d, job_id, agent="w")["state"] == "succeeded"
    added = add(d, "s1", turn("I like rye bread."))
    assert (added["added_messages"], added["pending_turns"]) == (2, 1), added

def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_many_pending_messages_stay_on_disk_not_in_memory(daemon_factory: Any,
                                                           tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, None, idle_s=600)
    d = daemon_factory(cfg)
    add(d, "warm-up", turn("warming up the code paths"))
    idle = rss_bytes(d.pid)
    total = 100_000
    batch = 1000
    with d.connect(timeout=60) as conn:
        for b in range(total // batch):
            messages = [{"role": "user" if i % 2 == 0 else "assistant",
                         "content": f"message {b}-{i}: the quick brown fox jumps over the "
                                    f"lazy dog near the riverbank, item {i}"}
                        for i in range(batch)]
            conn.call("memory.add_turns", {"agent_id": "w", "session_id": f"s{b % 10}",
                                           "messages": messages})
    grown = rss_bytes(d.pid) - idle
    # Held in memory, 100k messages take some 40 MB (a dict and a string each); on disk,
    # about 4 MB of bookkeeping.
    assert grown < 16 << 20, f"RSS grew by {grown >> 20} MiB for {total} pending messages"
    h = health(d)
    assert h["state"] == "pending"
    assert f"{total + 2} conversation message(s) of 11 session(s) wait for auto_memory" in (
        " ".join(h["reasons"]))
    # After a restart the store is rebuilt from the log, still without the texts.
    assert d.stop() == 0
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert add(d2, "s0", [])["pending_messages"] == total // 10
    # (A new process, compared with the first one's idle size: about 20 MB more.) Read
    # once its start's own work is done (the startup scan and checks, whose transient
    # memory is not the store's), as the first one's idle size was.
    d2.call("index.sync", {"agent_id": "w"})
    wait_for(lambda: health(d2)["reasons"] == h["reasons"], "the start's work done")
    assert rss_bytes(d2.pid) - idle < 32 << 20


def test_a_rewrite_that_drops_facts_is_refused(daemon_factory: Any, fake: FakeProvider,
                                               tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    fake.script(write_note("family", "- Sister Anna lives in Graz\n- Brother Tom is a pilot"),
                done())
    first = add(d, "s1", turn("My sister Anna lives in Graz, my brother Tom flies planes."),
                flush=True)
    assert wait_job(d, first["job_id"])["state"] == "succeeded"
    (note,) = notes(root)
    # The model rewrites the note without the old facts, is refused, then merges.
    fake.script(write_note("family", "- Works as a nurse"),
                write_note("family", "- Sister Anna lives in Graz\n- Brother Tom is a pilot\n"
                                     "- Works as a nurse"),
                done())
    second = add(d, "s1", turn("I work as a nurse."), flush=True)
    job = wait_job(d, second["job_id"])
    assert job["state"] == "succeeded", job
    assert job["result"]["refused"] == [{
        "tool": "daily_write", "path": note.relative_to(root).as_posix(),
        "dropped": ["- Sister Anna lives in Graz", "- Brother Tom is a pilot"]}]
    refusal = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"][-2]
    assert "refused" in refusal["content"] and "Sister Anna" in refusal["content"]
    text = note.read_text()
    assert "Sister Anna" in text and "Tom is a pilot" in text and "nurse" in text
    items = d.call("inbox.list", {"agent_id": "w"})["items"]
    assert items[-1]["details"]["refused"][0]["dropped"][0] == "- Sister Anna lives in Graz"
    # A model that only drops facts changes nothing; the refusal is reported.
    fake.script(write_note("family", "- Brother Tom is a pilot"), done())
    third = add(d, "s1", turn("Tom is still a pilot."), flush=True)
    job = wait_job(d, third["job_id"])
    assert job["state"] == "succeeded" and len(job["result"]["refused"]) == 1
    assert job["result"]["changed"] == [] and note.read_text() == text
    # A model that drops facts while adding one, and stops at the refusal: the turns are
    # committed, so its new fact is written after all, with the dropped ones put back.
    fake.script(write_note("family", "- Drinks green tea every morning\n- Works as a nurse"),
                done())
    fourth = add(d, "s1", turn("I drink green tea every morning."), flush=True)
    job = wait_job(d, fourth["job_id"])
    assert job["state"] == "succeeded", job
    assert job["result"]["refused"][0]["dropped"] == [
        "- Sister Anna lives in Graz", "- Brother Tom is a pilot"]
    assert job["result"]["changed"] == [note.relative_to(root).as_posix()]
    body = note.read_text().split("---\n", 2)[2]
    assert body.splitlines() == ["- Drinks green tea every morning", "- Works as a nurse",
                                 "- Sister Anna lives in Graz", "- Brother Tom is a pilot"]
    assert "description: what matters" in note.read_text()


def test_a_resumed_job_that_fails_is_retried(daemon_factory: Any, fake: FakeProvider,
                                             tmp_path: Path) -> None:
    # Killed while its job waits for the model; after the restart the resumed job covers
    # the turns when the idle flush looks, then fails: the turns must not wait for ever.
    root = tmp_path / "ws"
    cfg = config(root, fake, idle_s=1.0)
    d = daemon_factory(cfg)
    held = fake.gate(lambda body: True)
    add(d, "s1", turn("My dog is called Rex."), flush=True)
    assert held.entered.wait(30)
    d.kill()
    held.open()
    fake.script(Reply(raw=b"not json"), write_note("dog", "- Dog named Rex"), done())
    held = fake.gate(lambda body: True)
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert held.entered.wait(30)  # the resumed job asks the model
    capture = wait_for(lambda: [w["capture"] for w in d2.call("daemon.status")["workspaces"]
                                if w["agent_id"] == "w" and w["capture"]["idle_covered"]],
                       "the idle flush finding the resumed job")
    # It found the job covering the turns and submitted none: no idle flush is counted.
    assert (capture[0]["idle_covered"], capture[0]["idle_flushes"]) == (1, 0), capture
    held.open()
    note = wait_for(lambda: notes(root), "the note written by a retry")
    assert "Rex" in note[0].read_text()
    wait_for(lambda: add(d2, "s1", [])["pending_turns"] == 0)
    # The job commits the turns before its inbox item: it may still run here.
    wait_for(lambda: all(j["state"] not in ACTIVE for j in memory_jobs(d2)))
    jobs = sorted(memory_jobs(d2), key=lambda j: j["submitted_at"])
    assert [(j["params"]["trigger"], j["state"]) for j in jobs] == [
        ("flush", "failed"), ("retry", "succeeded")], jobs
    wait_for(lambda: health(d2)["state"] == "clean", "health clean again")


def test_health_names_a_failed_flush_that_nothing_retries(daemon_factory: Any,
                                                          fake: FakeProvider,
                                                          tmp_path: Path) -> None:
    # Without the idle flush nothing retries; health said the turns were "waiting for a
    # flush" though the flush had been made and its job had failed.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    fake.script(Reply(raw=b"not json"))
    job = wait_job(d, add(d, "s1", turn("My dog is called Rex."), flush=True)["job_id"])
    assert job["state"] == "failed"
    assert health(d)["reasons"] == [
        "2 conversation message(s) of 1 session(s) wait for auto_memory: the last "
        f"auto_memory job left them pending (failed: {job['error']}); waiting for 5 user "
        "turns or a flush"]
    fake.script(write_note("dog", "- Dog named Rex"), done())
    assert wait_job(d, add(d, "s1", [], flush=True)["job_id"])["state"] == "succeeded"
    assert not [r for r in health(d).get("reasons", []) if "auto_memory" in r]


def closed_under_a_held_job(d: Any, fake: FakeProvider) -> tuple[dict[str, Any], Gate]:
    """Workspace w closed while its auto_memory job (a flush of one turn) waits for the
    model at a gate: the close stops the job, which is queued again. The model has two
    notes and a last answer scripted. Returns the flush's answer and the gate."""
    held = fake.gate(lambda body: True)
    fake.script(write_note("dog", "- Dog named Rex"), write_note("dog", "- Dog named Rex"),
                done())
    first = add(d, "s1", turn("My dog is called Rex."), flush=True)
    assert held.entered.wait(30)
    d.call("workspace.close", {"agent_id": "w"})
    assert jobs_at_work(d) == {"running": 0, "queued": 1}  # stopped by the close
    return first, held


def test_a_job_across_a_close_and_reopen_commits_its_turns(daemon_factory: Any,
                                                           fake: FakeProvider,
                                                           tmp_path: Path) -> None:
    # The workspace is closed and opened again while the model answers: the job wrote
    # the note, then failed on the closed session store, and its turns were sent to the
    # model once more by a retry. Now the close stops the job (its answer never comes:
    # nothing of it is written) and the reopen runs it again, once.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=600))
    # The first answer goes to the job the close stopped; the run after the reopen gets
    # the other two.
    first, held = closed_under_a_held_job(d, fake)
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    held.open()
    job = wait_job(d, first["job_id"])
    assert job["state"] == "succeeded", job
    assert add(d, "s1", [])["pending_turns"] == 0
    assert chat_requests(fake) == 3 and "Rex" in notes(root)[0].read_text()
    assert len(notes(root)) == 1
    assert [i["job_id"] for i in d.call("inbox.list", {"agent_id": "w"})["items"]] == [
        first["job_id"]]


def test_a_job_of_a_closed_workspace_waits_for_it_and_runs_once_after_a_restart(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # A close let the workspace's running job go on: answered, it wrote to a folder no
    # longer served, its turns committed to a store that had closed. The close stops it;
    # it waits, queued, through the daemon's stop, and runs when the workspace opens.
    root = tmp_path / "ws"
    text = config(root, fake, idle_s=600)
    d = daemon_factory(text)
    first, held = closed_under_a_held_job(d, fake)
    held.open()
    assert d.stop() == 0
    assert not notes(root)  # the stopped job wrote nothing to the closed folder
    assert fake.pending_script() == 2  # and asked nothing more
    d2 = daemon_factory(text, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    job = wait_job(d2, first["job_id"])
    # Held, not cut short by the restart: it runs as a held job does, not "resumed".
    assert job["state"] == "succeeded" and not job["resumed"], job
    assert add(d2, "s1", [])["pending_turns"] == 0
    assert len(notes(root)) == 1 and "Rex" in notes(root)[0].read_text()
    assert chat_requests(fake) == 3
    assert [i["job_id"] for i in d2.call("inbox.list", {"agent_id": "w"})["items"]] == [
        first["job_id"]]


def test_health_tells_turns_a_running_job_covers_from_those_after_it(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Turns added while a flush's job waited for the model were reported as all "waiting
    # for a flush", the running job unmentioned; and with one session covered, another
    # session's turns were all said to be in a running job.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0))
    held = fake.gate(lambda body: True)
    fake.script(write_note("dog", "- Dog named Rex"), done())
    first = add(d, "s1", turn("My dog is called Rex."), flush=True)
    assert held.entered.wait(30)
    said = "wait for auto_memory: "
    assert turn_reasons(d) == [
        f"2 conversation message(s) of 1 session(s) {said}auto_memory job queued or running"]
    add(d, "s1", turn("Rex is a beagle."))
    add(d, "s2", turn("I drink rooibos."))
    assert turn_reasons(d) == [
        f"6 conversation message(s) of 2 session(s) {said}auto_memory job queued or "
        "running; turns of 2 session(s) no job covers: waiting for 5 user turns or a flush"]
    held.open()
    assert wait_job(d, first["job_id"])["state"] == "succeeded"
    assert turn_reasons(d) == [
        f"4 conversation message(s) of 2 session(s) {said}waiting for 5 user turns or a flush"]


def test_health_names_the_latest_failure_of_several_sessions(daemon_factory: Any,
                                                            fake: FakeProvider,
                                                            tmp_path: Path) -> None:
    # Two conversations' jobs fail, each its own way: health speaks of the latest one,
    # not of whichever session it happens to look at first.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0, interval=0))
    for session, reply in (("old", Reply(raw=b"<html>bad gateway</html>")),
                           ("new", Reply(json={"choices": [{"message": None}]}))):
        fake.script(reply)
        job = wait_job(d, add(d, session, turn(f"A fact of {session}."), flush=True)["job_id"])
        assert job["state"] == "failed", job
    (reason,) = [r for r in health(d)["reasons"] if "wait for auto_memory" in r]
    assert "2 session(s)" in reason and "has no message" in reason, reason
    assert "not valid JSON" not in reason, reason
