"""The day index of a shared workspace: each host derives ``memory/<date>/index.md`` from
the notes of that day it holds, its own and those that came from the other hosts; the
index is never replicated, so hosts capturing different conversations on one day make no
conflict copies of it. A conflict copy of a note is no daily note of its own."""

from __future__ import annotations

import uuid
from typing import Any

from conftest import DaemonFactory
from fakes.provider_server import FakeProvider
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_auto_memory import done, today, turn, write_note
from test_remote import config, converged, notes, pair, remote_status, root, write
from waits import wait_for, wait_job


def chat(fake: FakeProvider) -> str:
    return ("dream_cron_enabled = false\nauto_memory_interval = 50\n"
            f'[workspaces.default.chat_model_config]\nbase_url = "{fake.url}/v1"\n'
            'api_key = "k"\nmodel_name = "m"\n')


def capture(d: Any, session: str, said: str, name: str, description: str,
            fake: FakeProvider) -> str:
    """Start a capture of one conversation by ``d``'s auto_memory; its job id."""
    fake.script(write_note(name, f"- {said}", description=description), done())
    added = d.call("memory.add_turns", {"agent_id": "default", "session_id": session,
                                        "messages": turn(said), "flush": True})
    job_id: str = added["job_id"]
    return job_id


def note_of(d: Any, job_id: str) -> str:
    job = wait_job(d, job_id, agent="default")
    assert job["state"] == "succeeded", job
    note: str = job["result"]["note"]
    return note


def index_of(d: Any, day: str) -> str:
    path = root(d) / "memory" / day / "index.md"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def test_hosts_capturing_one_day_each_list_both_notes_without_conflicts(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        fake: FakeProvider) -> None:
    # Each host captures a conversation of its own, each with its own model, while the
    # server is away: both write their day's index before the other's note has come.
    name = "t" + uuid.uuid4().hex[:12]
    with FakeProvider() as fake_b:
        a = daemon_factory(config(pg_server.dsn, name, "hosta") + chat(fake))
        b = daemon_factory(config(pg_server.dsn, name, "hostb") + chat(fake_b))
        for d in (a, b):
            wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
        day = today()
        pg_server.stop()
        try:
            for d in (a, b):
                wait_for(lambda d=d: remote_status(d)["state"] == "offline", what="offline")
            job_a = capture(a, "laptop-1", "Ела поръчва кафе без захар.", "Кафе",
                            "как Ела пие кафе", fake)
            job_b = capture(b, "desk-7", "The build server reboots on Sundays.",
                            "Build server", "when the build server reboots", fake_b)
            on_a, on_b = note_of(a, job_a), note_of(b, job_b)
        finally:
            pg_server.start()
    wait_for(lambda: converged(a, b) and (root(a) / on_b).exists()
             and (root(b) / on_a).exists(), what="both notes on both hosts")
    # Each host lists the other's note once it came, without running auto_memory again.
    for host in (a, b):
        wait_for(lambda h=host: all(f"({n.rsplit('/', 1)[1]})" in index_of(h, day)
                                    for n in (on_a, on_b)), what="both notes in the index")
        assert remote_status(host)["conflicts"] == 0, remote_status(host)
        kinds = [i["kind"] for i in host.call("inbox.list", {"agent_id": "default"})["items"]]
        assert "sync_conflict" not in kinds, kinds
        assert not [p for p in notes(host) if "sync-conflict" in p], notes(host)
    assert "when the build server reboots" in index_of(a, day)
    assert "как Ела пие кафе" in index_of(b, day)


def test_a_day_index_stays_on_its_host_and_takes_in_the_notes_that_arrive(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, _ = pair(daemon_factory, pg_server)
    write(a, "memory/2026-03-09/index.md", "# my own index on a\n")
    write(a, "memory/2026-03-09/ferry.md", "---\ndescription: ferry times\n---\n- 7:40\n")
    wait_for(lambda: (root(b) / "memory/2026-03-09/ferry.md").exists(), what="note on b")
    wait_for(lambda: remote_status(a)["outbox"] == 0 == remote_status(b)["outbox"],
             what="outboxes empty")
    # b captured nothing that day: a's index does not come, nor does b make one.
    write(b, "memory/2026-03-09/bus.md", "---\ndescription: bus times\n---\n- 8:05\n")
    wait_for(lambda: (root(a) / "memory/2026-03-09/bus.md").exists(), what="note on a")
    # a's index is made again from both notes when b's arrives.
    wait_for(lambda: "bus times" in index_of(a, "2026-03-09"), what="a's index made again")
    assert "ferry times" in index_of(a, "2026-03-09")
    assert index_of(b, "2026-03-09") == ""
    for host in (a, b):
        assert remote_status(host)["conflicts"] == 0, remote_status(host)
        assert not [p for p in notes(host) if "sync-conflict" in p], notes(host)


def test_a_day_whose_notes_are_all_deleted_elsewhere_loses_its_index_and_folder(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    a, b, _ = pair(daemon_factory, pg_server)
    day = root(a) / "memory/2026-11-02"
    write(a, "memory/2026-11-02/index.md", "# 2026-11-02\n\n- [Ölfass](Ölfass.md)\n")
    for name in ("Ölfass", "渡し舟"):
        write(a, f"memory/2026-11-02/{name}.md", f"---\ndescription: {name}\n---\n- x\n")
    for name in ("Ölfass", "渡し舟"):
        wait_for(lambda n=name: (root(b) / f"memory/2026-11-02/{n}.md").exists(),
                 what="the notes on b")
    # b deletes one: a's index is made again without it; then the other: nothing is left
    # of the day on a, neither the index listing deleted notes nor the folder it kept.
    (root(b) / "memory/2026-11-02/Ölfass.md").unlink()
    wait_for(lambda: not (day / "Ölfass.md").exists(), what="the first deletion on a")
    wait_for(lambda: "(Ölfass.md)" not in index_of(a, "2026-11-02"), what="a's index again")
    assert "(渡し舟.md)" in index_of(a, "2026-11-02")
    (root(b) / "memory/2026-11-02/渡し舟.md").unlink()
    wait_for(lambda: not day.exists(), what="the day folder gone on a")
