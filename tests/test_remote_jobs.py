"""Work done once for all hosts of a shared workspace: the dream's catalog on the server."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from conftest import DaemonFactory
from fakes.provider_server import FakeProvider
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_dream import ScriptedModel
from test_remote import config, converged, finished_job, pair, remote_status, root, write
from waits import wait_for


def chat(fake: FakeProvider) -> str:
    return ("dream_cron_enabled = false\n[workspaces.default.chat_model_config]\n"
            f'base_url = "{fake.url}/v1"\napi_key = "k"\nmodel_name = "m"\n')


def dreamed_notes(fake: FakeProvider) -> list[str]:
    """The daily notes the model was asked about, one entry per conversation."""
    asked = []
    for r in fake.requests:
        if r.path.endswith("/chat/completions"):
            user = next(m["content"] for m in r.json["messages"] if m["role"] == "user")
            if user.startswith("Daily note ") and not any(
                    m["role"] == "assistant" for m in r.json["messages"]):
                asked.append(user.split(":", 1)[0].removeprefix("Daily note "))
    return asked


def test_a_note_one_host_dreamed_is_not_dreamed_again_by_another(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        fake: FakeProvider) -> None:
    model = ScriptedModel(fake)
    a, b, _ = pair(daemon_factory, pg_server, settings=chat(fake))
    day = ["memory/2026-11-02/tent.md", "memory/2026-11-03/stove.md"]
    write(a, day[0], "# Camping\nWe bought a blue tent.\n")
    write(b, day[1], "# Camping\nThe stove runs on butane.\n")
    wait_for(lambda: converged(a, b) and all((root(b) / p).exists() for p in day),
             what="both notes on both hosts")
    model.plan[day[0]] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                          "name": "Tent", "content": "- it is blue",
                                          "reason": "gear"})]]

    first: dict[str, Any] = finished_job(a, "auto_dream")
    assert first["state"] == "succeeded" and first["result"]["notes"] == 2, first
    assert sorted(dreamed_notes(fake)) == sorted(day)
    wait_for(lambda: (root(b) / "digest/wiki/tent.md").exists(), what="the node on b")
    # The other host has nothing left to dream: no note goes to the model twice.
    second: dict[str, Any] = finished_job(b, "auto_dream")
    assert second["state"] == "succeeded" and second["result"]["notes"] == 0, second
    assert sorted(dreamed_notes(fake)) == sorted(day)
    # A note changed since is dreamed again, by whichever host runs next.
    write(b, day[1], "# Camping\nThe stove runs on butane; bring two cartridges.\n")
    wait_for(lambda: converged(a, b) and "two cartridges" in (root(a) / day[1]).read_text(),
             what="the edit on a")
    third: dict[str, Any] = finished_job(a, "auto_dream")
    assert third["result"]["notes"] == 1, third
    assert sorted(dreamed_notes(fake)) == sorted([*day, day[1]])


def test_the_notes_of_an_undone_run_are_dreamed_again_by_every_host(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        fake: FakeProvider) -> None:
    # The undo put the notes back in this host's catalog only: the hosts' catalog on the
    # server still had them processed, and it wins when a dream reads its catalog, so no
    # host dreamed them again (dreamed_again said otherwise).
    model = ScriptedModel(fake)
    a, b, _ = pair(daemon_factory, pg_server, settings=chat(fake))
    note, kayak = "memory/2026-11-04/kayak.md", "digest/wiki/kayak.md"
    write(a, note, "# Paddling\nThe kayak is kept in the boathouse, second rack.\n")
    wait_for(lambda: converged(a, b) and (root(b) / note).exists(), what="the note on b")
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                        "name": "Kayak", "content": "- in the boathouse",
                                        "reason": "gear"})]]
    first: dict[str, Any] = finished_job(a, "auto_dream")
    assert first["result"]["notes"] == 1, first
    wait_for(lambda: (root(b) / kayak).exists(), what="the node on b")

    undone = a.call("dream.undo", {"agent_id": "default", "run_id": first["result"]["run_id"]})
    assert undone["dreamed_again"] == [note] and kayak in undone["removed"], undone
    assert not list((root(a) / "mem_metadata/dream/runs").glob("*.undoing"))
    wait_for(lambda: converged(a, b) and not (root(b) / kayak).exists(), what="undone on b")
    again: dict[str, Any] = finished_job(b, "auto_dream")
    assert again["state"] == "succeeded" and again["result"]["notes"] == 1, again
    assert dreamed_notes(fake) == [note, note]
    wait_for(lambda: converged(a, b) and (root(a) / kayak).exists(), what="dreamed on a")
    assert finished_job(a, "auto_dream")["result"]["notes"] == 0  # once


def test_an_undo_made_offline_puts_the_shared_catalog_back_at_the_next_dream(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        fake: FakeProvider, tmp_path: Path) -> None:
    from test_remote_hang import SITECUSTOMIZE, frozen

    model = ScriptedModel(fake)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    a = daemon_factory(config(pg_server.dsn, "t" + uuid.uuid4().hex[:12], "hosta") + chat(fake),
                       PYTHONPATH=str(hooks), CALL_TIMEOUT_S="1")
    wait_for(lambda: remote_status(a)["state"] == "online", what="online")
    note, oar = "memory/2026-11-05/oar.md", "digest/wiki/oar.md"
    write(a, note, "# Paddling\nThe spare oar hangs above the door.\n")
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Oar",
                                        "content": "- above the door", "reason": "gear"})]]
    first: dict[str, Any] = finished_job(a, "auto_dream")
    assert first["result"]["notes"] == 1, first
    runs = root(a) / "mem_metadata/dream/runs"
    with frozen(pg_server):
        write(a, "memory/2026-11-05/rain.md", "# Rain\nIt rained all day.\n")
        wait_for(lambda: remote_status(a)["state"] == "offline", what="offline",
                 deadline_s=30)
        undone = a.call("dream.undo", {"agent_id": "default",
                                       "run_id": first["result"]["run_id"]})
        # Undone here; the server's catalog is put back by this host's next dream.
        assert undone["dreamed_again"] == [note] and not (root(a) / oar).exists(), undone
        assert [p.name for p in runs.glob("*.undoing")] == [
            f"{first['result']['run_id']}.undoing"]
    wait_for(lambda: remote_status(a)["state"] == "online", what="online again")
    model.plan["memory/2026-11-05/rain.md"] = []
    again: dict[str, Any] = finished_job(a, "auto_dream")
    assert again["state"] == "succeeded" and again["result"]["notes"] == 2, again
    assert not list(runs.glob("*.undoing"))
    assert sorted(dreamed_notes(fake)) == sorted([note, note, "memory/2026-11-05/rain.md"])


def test_a_renamed_note_leaves_no_old_name_in_the_shared_catalog(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        fake: FakeProvider) -> None:
    # The run that followed the rename removed the old name from its host's catalog but
    # not from the server's: the next run, on either host, read it back, took the note
    # for deleted since and wrote a run record that changed nothing.
    model = ScriptedModel(fake)
    a, b, _ = pair(daemon_factory, pg_server, settings=chat(fake))
    old, new = "memory/2026-11-06/Überfahrt nach Sylt.md", "memory/2026-11-06/fähre.md"
    write(a, old, "# Fähre\nDie Fähre nach Sylt fährt um 7:40 ab Havneby.\n")
    model.plan[old] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Fähre",
                                       "content": "- 7:40 ab Havneby", "reason": "Reise"})]]
    first: dict[str, Any] = finished_job(a, "auto_dream")
    assert first["result"]["notes"] == 1, first
    (root(a) / old).rename(root(a) / new)
    wait_for(lambda: converged(a, b) and (root(b) / new).exists()
             and not (root(b) / old).exists(), what="the rename on b")
    moved: dict[str, Any] = finished_job(a, "auto_dream")
    assert moved["state"] == "succeeded" and moved["result"]["run_id"], moved
    for host in (b, a):
        after: dict[str, Any] = finished_job(host, "auto_dream")
        assert after["state"] == "succeeded" and after["result"]["run_id"] is None, after
    assert dreamed_notes(fake) == [old]


def test_a_forced_undo_has_every_host_dream_again_what_later_runs_added(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        fake: FakeProvider) -> None:
    # Forced over a node a later run rewrote, the undo takes that run's facts out: its
    # note is read again by the next dream of any host, not only of the undoing one.
    model = ScriptedModel(fake)
    a, b, _ = pair(daemon_factory, pg_server, settings=chat(fake))
    first_note, later_note = "memory/2026-11-07/łódź.md", "memory/2026-11-08/żagiel.md"
    boat = "digest/wiki/łódź.md"
    write(a, first_note, "# Żeglowanie\nŁódź stoi w przystani w Giżycku.\n")
    model.plan[first_note] = [[("integrate", {"action": "CREATE", "bucket": "wiki",
                                              "name": "Łódź", "content": "- w Giżycku",
                                              "reason": "sprzęt"})]]
    first: dict[str, Any] = finished_job(a, "auto_dream")
    assert first["result"]["actions"] == {"CREATE": 1}, first
    write(a, later_note, "# Żeglowanie\nNowy żagiel jest czerwony.\n")
    model.plan[later_note] = [[("integrate", {
        "action": "REFINE", "bucket": "wiki", "node": boat,
        "content": "- w Giżycku\n- żagiel czerwony", "reason": "sprzęt"})]]
    second: dict[str, Any] = finished_job(a, "auto_dream")
    assert second["result"]["actions"] == {"REFINE": 1}, second

    undone = a.call("dream.undo", {"agent_id": "default", "force": True,
                                   "run_id": first["result"]["run_id"]})
    assert undone["dreamed_again"] == [first_note, later_note], undone
    wait_for(lambda: converged(a, b) and not (root(b) / boat).exists(), what="undone on b")
    again: dict[str, Any] = finished_job(b, "auto_dream")
    assert again["state"] == "succeeded" and again["result"]["notes"] == 2, again
    assert "żagiel czerwony" in (root(b) / boat).read_text(encoding="utf-8")
