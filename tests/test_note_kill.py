"""A note sent with a ``request_id`` is written once when the daemon is killed after
writing it but before answering, and the call is sent again to the next daemon. Real
daemons (SIGKILL), real sockets, real files."""

from __future__ import annotations

import signal
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from waits import wait_for

from recalld.ipc.client import Client

AGENT = "ferry"
# Each is sent with its own id; the last tells the first fact again, which is appended
# (another id: another call), so the note holds it twice.
FACTS = ("Η πορθμείο φεύγει στις 7:40 από την προβλήτα Β.",
         "フェリーは雨の日に十分遅れる。🚢",
         "Η πορθμείο φεύγει στις 7:40 από την προβλήτα Β.")


def _restart(daemon_factory: DaemonFactory, first: DaemonHandle) -> DaemonHandle:
    d = daemon_factory(RECALLD_DATA_DIR=str(first.data_dir),
                       RECALLD_SOCKET=str(first.socket_path))
    with Client(d.socket_path) as c:
        c.workspace_open(AGENT)
    return d


def _notes_text(root: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.md"))
                   if p.name != "index.md")


def test_a_note_written_as_the_daemon_is_killed_is_not_written_again_by_its_retry(
        daemon_factory: DaemonFactory) -> None:
    first = daemon_factory()
    with Client(first.socket_path) as c:
        c.workspace_open(AGENT)
    root = first.data_dir / "workspaces" / AGENT
    d = first
    for n, fact in enumerate(FACTS):
        params = {"agent_id": AGENT, "content": fact, "session_id": "harbour",
                  "request_id": f"crossing-{n}"}
        before = _notes_text(root).count(fact)
        with d.connect() as conn:
            conn.request("memory.add_note", params)
            # Killed the moment the note holds the fact: before or after the daemon
            # recorded its answer, whichever it reached.
            wait_for(lambda fact=fact, before=before: _notes_text(root).count(fact) > before,
                     "the fact in the note", poll_s=0.0005)
            d.signal(signal.SIGKILL)
            d.kill()
        d = _restart(daemon_factory, first)
        added = d.call("memory.add_note", params)
        assert d.call("memory.add_note", params) == added
        assert added["changed"] and added["date"]
        text = d.call("memory.read", {"agent_id": AGENT, "path": added["path"]})["text"]
        assert text.count(fact) == before + 1, text
    assert _notes_text(root).count(FACTS[0]) == 2
