"""A run owed before the daemon stopped is queued when the workspace opens, once.

Turns found pending at the opening whose run was already due (their user turns reached
``auto_memory_interval`` but no job was queued for them; or a job was queued and ended
leaving them pending) do not wait for a new turn of the session, nor for the idle flush
(off here, or a day away): a session that ended would get neither. A real daemon killed
(SIGKILL) and started again on the same data, a scripted chat server on 127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply
from test_auto_memory import add, done, turn, write_note
from test_capture import config, health, memory_jobs, notes
from test_capture_many import config as many_config
from test_capture_many import scripted_model, session_notes
from waits import ACTIVE, wait_for, wait_job

DAY_S = 86400.0


def ended_jobs(d: Any) -> list[dict[str, Any]]:
    jobs = wait_for(lambda: (lambda js: js if js and all(j["state"] not in ACTIVE
                                                         for j in js) else None)(
        memory_jobs(d)), "the auto_memory jobs to end")
    return sorted(jobs, key=lambda j: j["submitted_at"])


def test_turns_due_a_run_at_a_kill_are_written_at_the_start(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    # Saved with no run due, then started with a setting that makes one due (as a kill
    # between saving the turns and queueing their job leaves them).
    d = daemon_factory(config(root, fake, idle_s=0, interval=0))
    add(d, "trajet", turn("Mon vélo s'appelle Éclair."))
    add(d, "trajet", turn("Je pars à 7 h 40 chaque matin."))
    add(d, "court", turn("Один вопрос, и всё."))
    d.kill()
    fake.script(write_note("trajet", "- Vélo « Éclair », départ à 7 h 40"), done())
    env = {"XDG_DATA_HOME": d.env["XDG_DATA_HOME"]}
    d = daemon_factory(config(root, fake, idle_s=DAY_S, interval=2), **env)
    note = wait_for(lambda: notes(root), "the run owed at the kill")
    assert "Éclair" in note[0].read_text()
    jobs = ended_jobs(d)
    assert [(j["params"]["session_id"], j["params"]["trigger"], j["state"])
            for j in jobs] == [("trajet", "interval", "succeeded")], jobs
    assert add(d, "trajet", [])["pending_turns"] == 0
    # The one-turn session owed no run: it waits for its triggers, and health says so.
    assert add(d, "court", [])["pending_turns"] == 1
    (reason,) = [r for r in health(d)["reasons"] if "wait for auto_memory" in r]
    assert "1 session(s)" in reason and "waiting for 2 user turns" in reason, reason
    d.kill()
    # Once: the next start (the idle flush off) queues no run for it again.
    d = daemon_factory(config(root, fake, idle_s=0, interval=2), **env)
    fake.script(write_note("court", "- Une seule question"), done())
    wait_job(d, add(d, "court", [], flush=True)["job_id"])
    assert [(j["params"]["session_id"], j["params"]["trigger"], j["state"])
            for j in ended_jobs(d)] == [("trajet", "interval", "succeeded"),
                                        ("court", "flush", "succeeded")]
    assert len(notes(root)) == 2


def test_turns_a_failed_run_left_pending_are_written_at_the_start(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    cfg = config(root, fake, idle_s=DAY_S, interval=1)
    d = daemon_factory(cfg)
    fake.script(Reply(raw=b'{"choices": [{"message": '))
    add(d, "s1", turn("我的猫叫小白。"))
    (failed,) = ended_jobs(d)
    assert failed["state"] == "failed", failed
    d.kill()  # its retry was a day away
    fake.script(write_note("cat", "- 猫叫小白"), done())
    d = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
    note = wait_for(lambda: notes(root), "the run retried at the start")
    assert "小白" in note[0].read_text()
    jobs = ended_jobs(d)
    assert [(j["params"]["trigger"], j["state"]) for j in jobs if j["job_id"]
            != failed["job_id"]] == [("retry", "succeeded")], jobs
    assert add(d, "s1", [])["pending_turns"] == 0


def test_a_message_cut_at_a_kill_is_not_split_by_the_run_owed(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, idle_s=0, interval=0))
    add(d, "long", turn("Γεια σου, μένω στη Θεσσαλονίκη."))
    add(d, "long", turn("Δουλεύω ως νοσηλεύτρια."))
    piece = {"role": "user", "content": "Το σκυλί μου λέγεται", "continued": True}
    add(d, "long", [piece])  # its rest never came before the kill
    d.kill()
    env = {"XDG_DATA_HOME": d.env["XDG_DATA_HOME"]}
    d = daemon_factory(config(root, fake, idle_s=0, interval=2), **env)
    fake.script(write_note("long", "- Ζει στη Θεσσαλονίκη, σκύλος Άργος"), done())
    rest = {"role": "user", "content": "Άργος."}
    job = wait_job(d, add(d, "long", [rest])["job_id"])
    assert job["state"] == "succeeded", job
    assert [(j["params"]["trigger"], j["state"]) for j in ended_jobs(d)] == [
        ("interval", "succeeded")]
    dialog = (root / "mem_session/dialog/long.jsonl").read_text(encoding="utf-8")
    assert sum("σκυλί" in line and "Άργος" in line for line in dialog.splitlines()) == 1


def test_a_note_changed_by_a_run_killed_before_its_end_is_told_after_the_restart(
        daemon_factory: Any, tmp_path: Path) -> None:
    # The model had written the note and was asked for its last answer when the daemon
    # was killed: the job, resumed, wrote the same note again, changed nothing and told
    # nothing, so the inbox never heard of the note.
    with FakeProvider() as fake:
        fake.chat_default = scripted_model
        cfg = many_config(fake).replace("auto_memory_idle_s = 2", "auto_memory_idle_s = 0")
        d = daemon_factory(cfg)
        root = tmp_path / "w"
        d.call("workspace.open", {"agent_id": "w", "path": str(root)})
        last = fake.gate(lambda body: any(m.get("role") == "tool"
                                          for m in body.get("messages", [])))
        said = "Meine Schwester Olga wohnt in Kyjiw."
        d.call("memory.add_turns", {"agent_id": "w", "session_id": "s", "flush": True,
                                    "messages": [{"role": "user", "content": said},
                                                 {"role": "assistant", "content": "gut"}]})
        assert last.entered.wait(60)
        (note,) = session_notes(root, "s")
        d.kill()
        last.open()
        d = daemon_factory(cfg, XDG_DATA_HOME=d.env["XDG_DATA_HOME"])
        (job,) = ended_jobs(d)
        assert job["state"] == "succeeded" and job["resumed"], job
        items = d.call("inbox.list", {"agent_id": "w"})["items"]
        rel = note.relative_to(root).as_posix()
        assert [(i["kind"], rel in i["changes"], i["details"].get("cut_short"))
                for i in items] == [("auto_memory", True, True)], items
        assert note.read_text().count(said) == 1
        assert not list((root / "mem_metadata" / "auto_memory" / "running").iterdir())
        assert d.stop() == 0
