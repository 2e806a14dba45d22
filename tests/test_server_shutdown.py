"""A real daemon stopping while a client's call runs: what the client's other requests get.

The call that keeps the daemon draining is a ``memory.select`` whose chat request the fake
provider holds (a real HTTP server on 127.0.0.1), so the stop is under way, with the
connection still open, for as long as the test needs.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle, RawConnection
from fakes.provider_server import FakeProvider, Gate, chat_answer
from waits import wait_value

from recalld.ipc import errors

HELD = "HELD-QUERY"


def _start(daemon_factory: DaemonFactory, root: Path, fake: FakeProvider,
           grace_s: float = 60) -> DaemonHandle:
    """A daemon serving ``root`` as ``w``, with one topic file and ``fake`` as chat model."""
    fake.chat_default = lambda body: chat_answer('{"paths": ["digest/trains.md"]}')
    d = daemon_factory(
        f'[daemon]\ngraceful_timeout_s = {grace_s}\n[workspaces.w]\npath = "{root}"\n'
        f'chat_model_config = {{base_url = "{fake.url}/v1", model_name = "m", api_key = "k"}}\n')
    d.call("memory.topic_write", {"agent_id": "w", "path": "digest/trains.md",
                                  "name": "Trains", "description": "the commute",
                                  "type": "user", "body": "The 7:40 to Zurich."})
    return d


@contextlib.contextmanager
def _held(daemon_factory: DaemonFactory, root: Path,
          grace_s: float = 60) -> Iterator[tuple[DaemonHandle, RawConnection, Gate]]:
    """A daemon whose chat requests with :data:`HELD` wait at ``gate``, and a connection
    to it; at the end the connection is closed and the gate opened (also when an assertion
    failed: no socket left for a later test to collect), and the daemon stops cleanly."""
    with FakeProvider() as fake:
        gate = fake.gate(lambda body: HELD in str(body.get("messages")))
        d = _start(daemon_factory, root, fake, grace_s)
        conn = d.connect(timeout=15)
        try:
            yield d, conn, gate
        finally:
            conn.close()
            gate.open()
        assert d.stop() == 0


def _notes(root: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in root.rglob("*.md"))


def test_requests_sent_while_the_daemon_stops_are_refused_not_dropped(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    with _held(daemon_factory, root) as (d, conn, gate):
        conn.request("memory.select", {"agent_id": "w", "query": f"{HELD} trains"})
        assert gate.entered.wait(30), "the chat request never came"
        d.signal(signal.SIGTERM)
        # The listener goes first: the drain has begun, the connection is still open.
        wait_value(lambda: d.socket_path.exists(), lambda exists: not exists,
                   "the socket removed")
        # Sent now, while the selection runs: a call, a batch (with a notification and an
        # invalid member) and a call the reader would run at once.
        conn.send({"jsonrpc": "2.0", "method": "memory.add_note", "id": "note",
                   "params": {"agent_id": "w", "content": "never written"}})
        conn.send([{"jsonrpc": "2.0", "method": "daemon.status", "id": 7},
                   {"jsonrpc": "2.0", "method": "index.sync", "params": {"agent_id": "w"}},
                   {"jsonrpc": "2.0", "method": 5, "id": 8}])
        conn.send({"jsonrpc": "2.0", "method": "daemon.ping", "id": 9})
        # Three answers, in whatever order the refusals were written.
        answers = [conn.recv() for _ in range(3)]
        (batch,) = [a for a in answers if isinstance(a, list)]
        single = {a["id"]: a for a in answers if isinstance(a, dict)}
        note, ping = single["note"], single[9]
        assert note["error"]["code"] == errors.SHUTTING_DOWN, note
        assert "not run" in note["error"]["message"]
        codes = {m["id"]: m["error"]["code"] for m in batch}
        assert codes == {7: errors.SHUTTING_DOWN, 8: errors.INVALID_REQUEST}, codes
        assert ping["error"]["code"] == errors.SHUTTING_DOWN, ping
        # The running call still answers, then the connection closes.
        gate.open()
        selected = conn.recv()
        assert selected["id"] == 1 and selected["result"]["method"] == "model", selected
        assert conn.at_eof()
    assert "never written" not in _notes(root)


def test_a_batch_under_way_when_the_daemon_stops_answers_without_its_later_members(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Its first member runs; the stop comes; the members after it are not started (a cut
    # at the end of the grace period would lose the answers of those that had run).
    root = tmp_path / "ws"
    with _held(daemon_factory, root) as (d, conn, gate):
        note = {"agent_id": "w", "content": "never written"}
        conn.send([
            {"jsonrpc": "2.0", "method": "memory.select", "id": 1,
             "params": {"agent_id": "w", "query": f"{HELD} trains"}},
            {"jsonrpc": "2.0", "method": "memory.add_note", "id": 2, "params": note},
            {"jsonrpc": "2.0", "method": "memory.add_note", "params": note},
            {"jsonrpc": "2.0", "method": "daemon.ping", "id": 3}])
        assert gate.entered.wait(30), "the chat request never came"
        d.signal(signal.SIGTERM)
        wait_value(lambda: d.socket_path.exists(), lambda exists: not exists,
                   "the socket removed")
        gate.open()
        answers = {a["id"]: a for a in conn.recv()}
        assert answers[1]["result"]["method"] == "model", answers
        assert {i: answers[i]["error"]["code"] for i in (2, 3)} == {
            2: errors.SHUTTING_DOWN, 3: errors.SHUTTING_DOWN}, answers
        assert conn.at_eof()
    assert "never written" not in _notes(root)


def test_a_call_cut_at_the_end_of_the_grace_period_is_answered_with_why(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The call outlasts graceful_timeout_s: the client hears that the stop cut it, not
    # only that the connection closed.
    root = tmp_path / "ws"
    with _held(daemon_factory, root, grace_s=0.5) as (d, conn, gate):
        conn.send([{"jsonrpc": "2.0", "method": "memory.select", "id": "b",
                    "params": {"agent_id": "w", "query": f"{HELD} trains"}},
                   {"jsonrpc": "2.0", "method": "daemon.ping"}])
        conn.request("memory.select", {"agent_id": "w", "query": f"{HELD} again"})
        wait_value(lambda: gate.held, lambda held: held == 2, "both chat requests held")
        d.signal(signal.SIGTERM)
        answers = {}
        for _ in range(2):
            reply = conn.recv()
            answers[str(reply[0]["id"] if isinstance(reply, list) else reply["id"])] = reply
        (batch,) = answers["b"]
        assert batch["error"]["code"] == errors.SHUTTING_DOWN, answers
        assert "stopped before this call finished" in batch["error"]["message"]
        assert answers["1"]["error"] == batch["error"], answers
        assert conn.at_eof()
