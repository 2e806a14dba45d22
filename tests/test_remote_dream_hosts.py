"""The dream of a shared workspace handed from host to host: what one host's run (or
undo) changed is what the next run, on another host, works on."""

from __future__ import annotations

from typing import Any

from conftest import DaemonFactory
from fakes.provider_server import FakeProvider
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_dream import ScriptedModel
from test_remote import converged, finished_job, notes, pair, remote_status, root, write
from test_remote_jobs import chat
from waits import wait_for


def test_a_dream_right_after_an_undo_on_another_host_works_on_what_the_undo_left(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        fake: FakeProvider) -> None:
    # The job lock orders the runs, but an undo's removals (and a run's nodes) travel as
    # file changes a moment later: the next host dreamed the note again on the node the
    # undo had removed, found it already said the fact and changed nothing; the undo's
    # deletion then arrived, and the note counted as dreamed with its fact in no node.
    model = ScriptedModel(fake)
    a, b, _ = pair(daemon_factory, pg_server, settings=chat(fake))
    note, tent = "memory/2026-11-07/Zelt am See.md", "digest/wiki/zelt.md"
    write(a, note, "# Zelten\nDas Zelt ist blau und hat zwei Eingänge.\n")
    wait_for(lambda: converged(a, b) and (root(b) / note).exists(), what="the note on b")
    model.plan[note] = [[("integrate", {"action": "CREATE", "bucket": "wiki", "name": "Zelt",
                                        "content": "- es ist blau", "reason": "Ausrüstung"})]]
    first: dict[str, Any] = finished_job(a, "auto_dream")
    assert first["result"]["actions"] == {"CREATE": 1}, first
    wait_for(lambda: converged(a, b) and (root(b) / tent).exists(), what="the node on b")

    undone = a.call("dream.undo", {"agent_id": "default", "run_id": first["result"]["run_id"]})
    assert undone["dreamed_again"] == [note] and tent in undone["removed"], undone
    again: dict[str, Any] = finished_job(b, "auto_dream")  # at once
    assert again["state"] == "succeeded", again
    assert again["result"]["actions"] == {"CREATE": 1}, again
    wait_for(lambda: converged(a, b), what="converged")
    text = (root(a) / tent).read_text(encoding="utf-8")
    assert "corroborations: 0" in text and "es ist blau" in text, text
    assert [p for p in notes(a) if p.startswith("digest/")] == [tent]
    for host in (a, b):
        assert remote_status(host)["conflicts"] == 0, remote_status(host)
    kinds = [i["kind"] for i in a.call("inbox.list", {"agent_id": "default"})["items"]]
    assert "sync_restored" not in kinds, kinds
