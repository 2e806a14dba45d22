"""Shared workspaces searched in the server, with a note slow to chunk: the uploader
makes each note's chunk rows before the upload's transaction (which holds the lock every
other host's upload waits on, under the call limit), and a note whose rows take longer
than their limit waits alone in the outbox, named in status, while the notes after it go
up. Two daemons ("two hosts") share one workspace on the server of ``pg_server``, as in
tests/test_remote.py; the uploading one has its limits cut (the launcher hook of
tests/test_remote_hang.py): half a second to chunk a note, three for a call (far less
than the slow note takes to chunk, far more than any other call takes under load).
"""

from __future__ import annotations

import secrets
import signal
import uuid
from pathlib import Path

from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, converged, notes, remote_status, write
from test_remote_hang import SITECUSTOMIZE
from waits import wait_for

from recalld.ipc.health import assess

# Lines of token-like words: masking them takes seconds (about 2 s a megabyte on an
# idle machine, 1.1 MB here), over three times a half-second limit, whatever the load.
SLOW = "# Keys\n\n" + "".join(f"key {i}: sk-{secrets.token_hex(20)}\n"
                              for i in range(20000))
PREPARE_LIMIT = "0.5"


def test_a_note_slow_to_chunk_waits_alone_and_holds_no_upload_back(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    name = "s" + uuid.uuid4().hex[:12]
    a = daemon_factory(config(pg_server.dsn, name, "hosta", ', search_mode = "server"'))
    b = daemon_factory(config(pg_server.dsn, name, "hostb"), PYTHONPATH=str(hooks),
                       CALL_TIMEOUT_S="3", PREPARE_TIMEOUT_S=PREPARE_LIMIT)
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    wait_for(lambda: remote_status(a)["search"]["chunks_ready"], what="chunked")

    slow, small = "memory/2026-12-09/keys.md", "memory/2026-12-09/after.md"
    b.signal(signal.SIGSTOP)  # queued in one run, the slow note first
    try:
        write(b, slow, SLOW)
        write(b, small, "# After\nthe otter naps on the jetty\n")
    finally:
        b.signal(signal.SIGCONT)
    wait_for(lambda: small in notes(a), what="the note after the slow one on a")
    # (b marks the small note done once its answer is recorded: a may have it before.)
    status = wait_for(lambda: (lambda s: s if s["refused"] and s["outbox"] == 1 else None)(
        remote_status(b)), what="the slow note named in status, alone in the outbox")
    assert list(status["refused"]) == [slow], status
    assert "takes longer than 0.5 s to prepare" in status["refused"][slow], status
    assert status["state"] != "offline", status
    # Doctor and status say what to do about it: a smaller note, not another name.
    ws = next(w for w in b.call("daemon.status")["workspaces"] if w["agent_id"] == "default")
    fixes = [p.fix for p in assess(ws).problems if "remote" in p.what]
    assert any("split the note" in fix for fix in fixes), fixes
    assert not any("rename the note" in fix for fix in fixes), fixes
    res = a.call("memory.search", {"agent_id": "default", "query": "otter jetty",
                                   "sync": True, "max_results": 5})
    assert res["search_mode"] == "server"
    assert [r["path"] for r in res["results"]] == [small], res
    # Later notes go up too.
    write(b, "memory/2026-12-09/later.md", "# Later\nthe heron stands still\n")
    wait_for(lambda: "memory/2026-12-09/later.md" in notes(a), what="a later note on a")
    # An edit that is quick to chunk takes the slow change's place.
    write(b, slow, "# Keys\nnone kept here now\n")
    wait_for(lambda: converged(a, b) and slow in notes(a), what="converged")
    assert remote_status(b)["refused"] == {}


def test_a_note_slow_to_chunk_holds_back_no_chunk_backfill(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        tmp_path: Path) -> None:
    # Uploaded before any host searched in the server: the searching host chunks them.
    name = "s" + uuid.uuid4().hex[:12]
    b = daemon_factory(config(pg_server.dsn, name, "hostb"))
    wait_for(lambda: remote_status(b)["state"] == "online", what="online")
    slow, small = "memory/2026-12-09/keys.md", "memory/2026-12-09/otter.md"
    write(b, slow, SLOW)
    write(b, small, "# Otter\nthe otter naps on the jetty\n")
    wait_for(lambda: remote_status(b)["outbox"] == 0, what="both up")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    a = daemon_factory(config(pg_server.dsn, name, "hosta", ', search_mode = "server"'),
                       PYTHONPATH=str(hooks), CALL_TIMEOUT_S="3", PREPARE_TIMEOUT_S=PREPARE_LIMIT)
    status = wait_for(lambda: (lambda s: s if s["search"]["chunks_ready"] else None)(
        remote_status(a)), what="the files before chunked")
    assert status["state"] == "online", status
    assert "keys.md takes longer than 0.5 s to prepare" in str(status["search"]), status
    res = a.call("memory.search", {"agent_id": "default", "query": "otter jetty",
                                   "sync": True, "max_results": 5})
    assert res["search_mode"] == "server"
    assert [r["path"] for r in res["results"]] == [small], res
