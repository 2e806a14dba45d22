"""auto_memory end to end: a real daemon, a real socket, a scripted chat server on 127.0.0.1.

Covers memory.add_turns (counting, the interval trigger, flush, request-id idempotency,
restart with pending turns), the job (note frontmatter, one note per session, no
overwrite across sessions, the day index, the sanitized dialog file, secrets redacted in
everything written, malformed and failing model answers, no chat model configured); long
conversations and odd ids are in test_auto_memory_long.py."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes.provider_server import FakeProvider, Reply, chat_answer, tool_call
from waits import wait_for, wait_job

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.ipc.errors import InvalidParams

SECRET = "sk-proj-" + "Zq8Lm3Nx7Vb2Kc5Hj1Gf4Dd9Ss6Aa0Pp"
IMAGE = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAA" * 20
TOOL_RESULT = "RECALLED: the user's cat is named Whiskers"


def config(root: Path, fake: FakeProvider | None, interval: int = 2) -> str:
    chat = ""
    if fake is not None:
        chat = (f'chat_model_config = {{base_url = "{fake.url}/v1", api_key = "test-key", '
                f'model_name = "fake-model", timeout_s = 10.0}}\n')
    return f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = {interval}\n{chat}'


def add(d: Any, session: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = d.call("memory.add_turns", {
        "agent_id": "w", "session_id": session, "messages": messages, **extra})
    return result


def turn(user: str, assistant: str = "Noted.") -> list[dict[str, Any]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def write_note(name: str, body: str, description: str = "what matters") -> Reply:
    return Reply(json=chat_answer(None, [tool_call("daily_write", {
        "name": name, "description": description, "content": body})]))


def done(text: str = "saved") -> Reply:
    return Reply(json=chat_answer(text))


def today() -> str:
    return dt.date.today().isoformat()


def all_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_interval_trigger_writes_note_dialog_index_and_inbox(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=2))
    first = add(d, "s1", turn("I commute by bike to the office every day."))
    assert first["pending_turns"] == 1 and first["user_turns_total"] == 1
    assert "job_id" not in first
    fake.script(
        write_note("Commute", f"- Commutes by bike daily\n- API key {SECRET}",
                   description="how the user commutes"),
        done(),
    )
    second = add(d, "s1", [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [
            {"type": "text", "text": f"My key is {SECRET}, and I prefer window seats."},
            {"type": "image_url", "image_url": {"url": IMAGE}},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "memory_search",
                                                          "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": TOOL_RESULT},
        {"role": "assistant", "content": "Window seats, noted. <recalled-memory>old fact: "
                                         "likes trains</recalled-memory>"},
    ])
    assert second["user_turns_total"] == 2 and "job_id" in second
    job = wait_job(d, second["job_id"])
    assert job["state"] == "succeeded", job
    res = job["result"]
    note_rel = f"memory/{today()}/commute.md"
    assert res["note"] == note_rel and res["turns"] > 0
    assert "daily_write" in res["tool_calls"]

    note = (root / note_rel).read_text()
    fields, _ = parse_frontmatter(note)
    assert fields["session_id"] == "s1"
    assert fields["source_conversation"] == "[[mem_session/dialog/s1.jsonl]]"
    assert fields["description"] == "how the user commutes"
    assert "Commutes by bike daily" in note

    dialog = [orjson.loads(line) for line in
              (root / "mem_session/dialog/s1.jsonl").read_text().splitlines()]
    said = "\n".join(m["content"] for m in dialog)
    assert {m["role"] for m in dialog} == {"user", "assistant"}
    assert "I commute by bike" in said and "window seats" in said
    assert TOOL_RESULT not in said and "Whiskers" not in said
    assert "iVBORw0KGgo" not in said and "likes trains" not in said
    assert "You are helpful" not in said

    index = (root / f"memory/{today()}/index.md").read_text()
    assert "[commute](commute.md): how the user commutes" in index

    # The model was never shown the secret, the image or the tool result either (the
    # scripted model itself echoing a key in its tool call is what the redaction of its
    # writes is for).
    sent = fake.requests[0].body
    assert SECRET.encode() not in sent and b"iVBORw0KGgo" not in sent
    assert TOOL_RESULT.encode() not in sent
    # No secret anywhere in the workspace (notes, dialog, pending log, inbox...).
    assert SECRET not in all_text(root)
    assert "[REDACTED]" in note

    items = d.call("inbox.list", {"agent_id": "w"})["items"]
    assert len(items) == 1 and items[0]["kind"] == "auto_memory"
    assert note_rel in items[0]["changes"] and items[0]["job_id"] == second["job_id"]
    # Immediately searchable.
    hits = d.call("memory.search", {"agent_id": "w", "query": "bike"})["results"]
    assert any(h["path"] == note_rel for h in hits)
    after = add(d, "s1", [])
    assert after["pending_turns"] == 0 and after["user_turns_total"] == 2


def test_one_note_per_session_and_no_overwrite_across_sessions(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.script(write_note("trips", "- Plans a trip to Rome"), done())
    a1 = add(d, "alice", turn("I plan a trip to Rome in May."), flush=True)
    assert wait_job(d, a1["job_id"])["state"] == "succeeded"
    # Another session's model picks the same name: it gets a new file.
    fake.script(write_note("trips", "- Goes hiking in Norway"), done())
    b1 = add(d, "bob", turn("I go hiking in Norway."), flush=True)
    assert wait_job(d, b1["job_id"])["result"]["note"] == f"memory/{today()}/trips-2.md"
    # The same session writing under another name updates its own note.
    fake.script(write_note("rome-plans", "- Plans a trip to Rome in May\n- Flies on the 3rd"),
                done())
    a2 = add(d, "alice", turn("I fly on the 3rd."), flush=True)
    assert wait_job(d, a2["job_id"])["result"]["note"] == f"memory/{today()}/trips.md"

    day = root / "memory" / today()
    notes = sorted(p.name for p in day.glob("*.md"))
    assert notes == ["index.md", "trips-2.md", "trips.md"]
    alice = (day / "trips.md").read_text()
    bob = (day / "trips-2.md").read_text()
    assert parse_frontmatter(alice)[0]["session_id"] == "alice"
    assert "Flies on the 3rd" in alice and "Norway" not in alice
    assert parse_frontmatter(bob)[0]["session_id"] == "bob" and "Norway" in bob
    # The existing note was shown to the model so it could merge.
    prompt = fake.requests[-2].json["messages"][1]["content"]
    assert "Plans a trip to Rome" in prompt and "I fly on the 3rd" in prompt
    index = (day / "index.md").read_text()
    assert "(trips.md)" in index and "(trips-2.md)" in index


@pytest.mark.parametrize("lead", ["\n", "\n\n", " \t\n", "\r\n", "\ufeff"])
def test_a_frontmatter_block_after_blank_lines_is_the_notes_frontmatter(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path, lead: str) -> None:
    # Models often open their answer with a blank line. The block after it is the note's
    # frontmatter, never body lines a later rewrite would be refused for leaving out.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.script(write_note("n", f"{lead}---\nname: n\ntags: [garden]\n---\n- Grows quinces"),
                done())
    assert wait_job(d, add(d, "s", turn("I grow quinces."), flush=True)["job_id"])[
        "state"] == "succeeded"
    fake.script(write_note("n", "- Grows quinces\n- Grows pears"), done())
    job = wait_job(d, add(d, "s", turn("And pears."), flush=True)["job_id"])
    assert job["state"] == "succeeded" and job["result"]["refused"] == [], job
    text = (root / "memory" / today() / "n.md").read_text()
    fields, start = parse_frontmatter(text)
    assert fields["tags"] == ["garden"] and fields["session_id"] == "s", text
    assert text.split("\n")[start:] == ["- Grows quinces", "- Grows pears", ""], text


def test_tools_refuse_other_sessions_and_outside_paths(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.script(write_note("bob-note", "- Bob likes tea"), done())
    assert wait_job(d, add(d, "bob", turn("I like tea."), flush=True)["job_id"])[
        "state"] == "succeeded"
    bob_rel = f"memory/{today()}/bob-note.md"
    fake.script(
        Reply(json=chat_answer(None, [
            tool_call("edit", {"path": bob_rel, "old": "tea", "new": "coffee"}, "c1"),
            tool_call("edit", {"path": "../outside.md", "old": "a", "new": "b"}, "c2"),
            tool_call("frontmatter_update", {"path": "mem_metadata/x.md", "changes": {}}, "c3"),
            tool_call("write", {"path": "memory/x.md", "content": "x"}, "c4"),
            tool_call("read", {"path": "mem_session/dialog/bob.jsonl"}, "c5"),
        ])),
        done("nothing to save"),
    )
    job = wait_job(d, add(d, "eve", turn("hello"), flush=True)["job_id"])
    # Every write it asked for was refused: whatever it then answers, its turns are in no
    # note, so they stay pending and the job says why.
    assert job["state"] == "failed" and "could not be written" in job["error"], job
    assert add(d, "eve", [])["pending_turns"] == 1
    assert "coffee" not in (root / bob_rel).read_text()
    assert not (tmp_path / "outside.md").exists() and not (root / "memory/x.md").exists()
    answers = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
    assert len(answers) == 5 and all(a.startswith("error:") for a in answers)
    assert "not this conversation's note" in answers[0]
    # Nothing changed: no inbox item for this job.
    items = d.call("inbox.list", {"agent_id": "w"})["items"]
    assert [i["job_id"] for i in items] != [] and all(
        i["job_id"] != job["job_id"] for i in items)


def test_flush_idempotency_and_nothing_to_save(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=5))
    r1 = add(d, "s", turn("Hi there."), request_id="req-1")
    r1_again = add(d, "s", turn("Hi there."), request_id="req-1")
    assert r1_again == r1
    assert add(d, "s", [])["pending_turns"] == 1  # the retry added nothing
    # The same id with another session is another request: its turns are added.
    other = add(d, "t", turn("Another chat."), request_id="req-1")
    assert other["session_id"] == "t" and other["added_messages"] > 0
    assert add(d, "s", turn("Hi there."), request_id="req-1") == r1
    fake.script(done("nothing to save"))
    f1 = add(d, "s", [], flush=True, request_id="req-2")
    assert "job_id" in f1
    assert add(d, "s", [], flush=True, request_id="req-2") == f1
    job = wait_job(d, f1["job_id"])
    assert job["state"] == "succeeded" and job["result"]["changed"] == []
    assert job["result"]["note"] is None
    # Inbox only on change; the dialog is still saved; nothing pending any more.
    assert d.call("inbox.list", {"agent_id": "w"})["items"] == []
    assert "Hi there." in (root / "mem_session/dialog/s.jsonl").read_text()
    assert not list((root / "memory").rglob("*.md"))
    again = add(d, "s", [], flush=True)
    assert again["pending_turns"] == 0 and "job_id" not in again
    assert len([j for j in d.call("jobs.list", {"agent_id": "w"})["jobs"]
                if j["kind"] == "auto_memory"]) == 1
    with pytest.raises(InvalidParams):
        add(d, "../x", turn("hi"))
    with pytest.raises(InvalidParams):
        add(d, "s", [{"role": "wizard", "content": "hi"}])


def test_malformed_or_rejected_answers_fail_the_job_and_keep_turns(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    add(d, "s", turn("I live in Basel."))
    for reply, error_part in [
        (Reply(json=chat_answer(None, [tool_call("daily_write", "{not json")])),
         "not valid JSON"),
        (Reply(json={"id": "x", "object": "chat.completion", "choices": []}), "no choices"),
        (Reply(raw=b"<html>oops</html>"), "not valid JSON"),
        (Reply(status=400), "HTTP 400"),
        (Reply(json={"choices": [{"message": {"role": "assistant", "content": [
            {"type": "text", "text": None}]}}]}), "content part 0 has no text"),
        (Reply(json={"error": {"message": "model overloaded", "code": 1302}}),
         "model overloaded"),
    ]:
        fake.script(reply)
        job = wait_job(d, add(d, "s", [], flush=True)["job_id"])
        assert job["state"] == "failed" and error_part in job["error"], job
        assert job["error_code"] == -32003
        assert add(d, "s", [])["pending_turns"] == 1  # nothing lost
        assert not (root / "mem_session/dialog/s.jsonl").exists()
    # A thinking model that spent its tokens said no "nothing to save": turns committed.
    # (Cut, it is asked once more for the new facts only: cut again, the job fails.)
    fake.script(*[Reply(json=chat_answer(None, finish_reason="length"))] * 2)
    job = wait_job(d, add(d, "s", [], flush=True)["job_id"])
    assert job["state"] == "failed" and "length limit" in job["error"], job
    assert add(d, "s", [])["pending_turns"] == 1
    # The daemon keeps serving, and the next flush retries the same turns.
    fake.script(write_note("home", "- Lives in Basel"), done())
    retry = wait_job(d, add(d, "s", [], flush=True)["job_id"])
    assert retry["state"] == "succeeded" and "Basel" in (root / retry["result"]["note"]).read_text()
    assert add(d, "s", [])["pending_turns"] == 0


def test_a_write_with_arguments_the_tools_refuse_leaves_the_turns_pending(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The model's daily_write failed (its arguments were wrong) and it answered "saved":
    # the job succeeded and committed the turns, which were then in no note at all.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    add(d, "s", turn("I live in Basel."))
    for args in ({"name": "home", "content": 42}, {"content": "- Lives in Basel"},
                 {"name": "home", "content": ["- Lives in Basel"]}):
        fake.script(Reply(json=chat_answer(None, [tool_call("daily_write", args)])), done())
        job = wait_job(d, add(d, "s", [], flush=True)["job_id"])
        assert job["state"] == "failed" and "must be a string" in job["error"], job
        assert add(d, "s", [])["pending_turns"] == 1
    fake.script(write_note("home", "- Lives in Basel"), done())
    assert wait_job(d, add(d, "s", [], flush=True)["job_id"])["state"] == "succeeded"
    assert "Basel" in "".join(p.read_text() for p in (root / "memory").rglob("home.md"))


def test_server_error_is_retried(daemon_factory: Any, fake: FakeProvider,
                                 tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.script(Reply(status=500), write_note("food", "- Likes ramen"), done())
    job = wait_job(d, add(d, "s", turn("I like ramen."), flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    assert len([r for r in fake.requests if r.path.endswith("/chat/completions")]) == 3


def test_no_chat_model_configured(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory/2026-01-02").mkdir(parents=True)
    (root / "memory/2026-01-02/a.md").write_text("Granola for breakfast.\n")
    d = daemon_factory(config(root, None, interval=1))
    r = add(d, "s", turn("I eat granola."))
    job = wait_job(d, r["job_id"])
    assert job["state"] == "failed" and job["error"] == "no chat model configured"
    assert job["error_code"] == -32003
    # Everything else works: turns are kept, search answers.
    assert add(d, "s", [])["pending_turns"] == 1
    hits = d.call("memory.search", {"agent_id": "w", "query": "granola", "sync": True})
    assert hits["results"][0]["path"] == "memory/2026-01-02/a.md"


def test_pending_turns_survive_a_restart(daemon_factory: Any, fake: FakeProvider,
                                         tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, fake, interval=0)
    d = daemon_factory(cfg)
    add(d, "s", turn("My sister is called Anna."), request_id="r1")
    first = add(d, "s", turn("She lives in Graz."))
    assert first["pending_turns"] == 2
    d.kill()  # a crash: a graceful stop would have written them (tests/test_capture.py)
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert add(d2, "s", turn("My sister is called Anna."), request_id="r1")["pending_turns"] == 1
    fake.script(write_note("family", "- Sister Anna lives in Graz"), done())
    r = add(d2, "s", [], flush=True)
    assert r["pending_turns"] == 2 and r["user_turns_total"] == 2
    assert wait_job(d2, r["job_id"])["state"] == "succeeded"
    prompt = fake.requests[-2].json["messages"][1]["content"]
    assert "Anna" in prompt and "Graz" in prompt


EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "agent_loop.py"


def test_a_retry_after_a_crash_before_the_answer_was_recorded(daemon_factory: Any,
                                                              tmp_path: Path) -> None:
    # The turns are stored (one log record), then the answer (another): a daemon killed
    # between the two still answers a retry of the request in full, adding nothing.
    root = tmp_path / "ws"
    cfg = config(root, None, interval=0)
    d = daemon_factory(cfg)
    add(d, "s", turn("I live in Basel."))
    first = add(d, "s", turn("My bike is green."), request_id="r2")
    assert d.stop() == 0
    log = root / "mem_metadata" / "sessions" / "pending.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    assert b'"op":"answer"' in lines[-1]
    log.write_bytes(b"".join(lines[:-1]))  # the state a kill between the two leaves
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    assert add(d2, "s", turn("My bike is green."), request_id="r2") == first
    assert first == {"session_id": "s", "added_messages": 2, "pending_turns": 2,
                     "pending_messages": 4, "user_turns_total": 2}


def test_a_retry_of_turns_killed_before_their_job_was_queued_queues_it(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # The turns that reach the interval are saved, then their job is queued: a daemon
    # killed in between answered the retry from the saved turns and queued nothing, so
    # the turns waited for the next ones (or the idle flush, 10 minutes later).
    root = tmp_path / "ws"
    cfg = config(root, fake)
    d = daemon_factory(cfg)
    fake.script(Reply(delay_s=60))  # the job stays running till the kill
    add(d, "ride", turn("Mi bici es verde."), request_id="r1")
    second = add(d, "ride", turn("Я езжу по набережной."), request_id="r2")
    d.kill()
    # What a kill after the turns' record and before the job's leaves on disk.
    log = root / "mem_metadata" / "sessions" / "pending.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "набережной".encode() in line)
    log.write_bytes(b"".join(lines[:cut + 1]))
    (journal,) = d.data_dir.rglob("jobs.journal")
    journal.write_bytes(b"".join(line for line in journal.read_bytes().splitlines(True)
                                 if second["job_id"].encode() not in line))
    fake.clear_script()
    fake.script(write_note("ride", "- Bike is green\n- Rides along the embankment"), done())
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    again = add(d2, "ride", turn("Я езжу по набережной."), request_id="r2")
    assert again == {k: v for k, v in second.items() if k != "job_id"}, again
    (job,) = d2.call("jobs.list", {"agent_id": "w"})["jobs"]  # queued by the retry
    assert job["params"]["session_id"] == "ride" and job["params"]["upto"] == 4, job
    assert wait_job(d2, job["job_id"])["state"] == "succeeded"
    assert "embankment" in all_text(root)


def test_example_agent_loop_runs_one_turn(daemon_factory: Any, fake: FakeProvider,
                                          tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory/2026-03-04").mkdir(parents=True)
    (root / "memory/2026-03-04/work.md").write_text("I work at Globex on the billing team.\n")
    d = daemon_factory(config(root, fake, interval=5))
    d.call("index.sync", {"agent_id": "w"})
    fake.script(done("You work at Globex."))
    env = {**d.env, "OPENAI_BASE_URL": f"{fake.url}/v1", "OPENAI_API_KEY": "k",
           "MODEL": "m", "RECALLD_SOCKET": str(d.socket_path)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--agent", "w", "--session", "demo",
         "--once", "Where do I work at Globex?"],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "You work at Globex."
    first = fake.requests[0].json
    assert fake.requests[0].headers["authorization"] == "Bearer k"
    injected = [m["content"] for m in first["messages"] if "<recalled-memory>" in m["content"]]
    assert injected and "billing team" in injected[0]
    # The turn went back to the daemon, and the exit flushed it into an auto_memory job.
    jobs = [j for j in d.call("jobs.list", {"agent_id": "w"})["jobs"]
            if j["kind"] == "auto_memory"]
    assert len(jobs) == 1 and "auto_memory job" in proc.stderr
    job = wait_job(d, jobs[0]["job_id"])
    assert job["state"] == "succeeded" and job["result"]["turns"] == 2
    dialog = (root / "mem_session/dialog/demo.jsonl").read_text()
    assert "Where do I work at Globex?" in dialog and "billing team" not in dialog


def test_cancel_mid_job_leaves_no_partial_files_and_keeps_turns(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.script(write_note("plans", "- Moves to Bern"), Reply(delay_s=30, json=chat_answer("x")))
    r = add(d, "s", turn("I move to Bern."), flush=True)
    # The note is written, the model is thinking again.
    wait_for(lambda: len(fake.requests) >= 2, "the second chat request")
    job = d.call("jobs.cancel", {"agent_id": "w", "job_id": r["job_id"]})
    assert job["state"] == "cancelled"
    assert not [p for p in root.rglob("*") if p.name.startswith(".") and ".tmp-" in p.name]
    # The note written before the cancel is whole; the turns stay pending for a re-run.
    note = root / "memory" / today() / "plans.md"
    assert note.read_text().endswith("- Moves to Bern\n")
    assert add(d, "s", [])["pending_turns"] == 1
    # The note it wrote is told, as cut short (a run again may find nothing to change).
    (item,) = d.call("inbox.list", {"agent_id": "w"})["items"]
    assert item["job_id"] == r["job_id"] and item["details"]["cut_short"] is True
    assert f"memory/{today()}/plans.md" in item["changes"]
    assert d.call("daemon.ping")["pong"] is True


def test_job_interrupted_by_a_crash_is_resumed(daemon_factory: Any, fake: FakeProvider,
                                               tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, fake, interval=0)
    d = daemon_factory(cfg)
    fake.script(Reply(delay_s=30, json=chat_answer("x")))
    r = add(d, "s", turn("I play the cello."), flush=True)
    wait_for(lambda: fake.requests, "the first chat request")
    d.kill()
    fake.script(write_note("music", "- Plays the cello"), done())
    d2 = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    job = wait_job(d2, r["job_id"])
    assert job["state"] == "succeeded" and job["resumed"] is True, job
    assert "cello" in (root / job["result"]["note"]).read_text()
    assert add(d2, "s", [])["pending_turns"] == 0
    assert len(d2.call("inbox.list", {"agent_id": "w"})["items"]) == 1
