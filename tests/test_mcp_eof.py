"""The end of the MCP bridge's stdin: every request read before it is answered before the
bridge stops, as a script that writes its requests and closes its end expects."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

pytest.importorskip("mcp", reason="needs mcp, which '.[test]' installs")

import anyio
import mcp.types as types
from conftest import DaemonHandle
from test_mcp_lines import INIT, _call

from recalld.ipc.mcp_lines import CheckedLines, InFlight, LongLine


def test_requests_written_all_at_once_before_eof_are_all_answered(
        daemon: DaemonHandle) -> None:
    facts = [f"The lighthouse keeper number {n} is called Ysolde-{n}" for n in range(6)]
    script = (json.dumps(INIT).encode() + b"\n"
              + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
              + b"".join(_call(f"note{n}", "memory_add_note", {"content": fact})
                         for n, fact in enumerate(facts))
              + b"".join(_call(n, "memory_search", {"query": f"lighthouse keeper {n}"})
                         for n in range(1, 20))
              + b'{"jsonrpc":"2.0","id":"res","method":"resources/list"}\n'
              # The last line without its newline.
              + b'{"jsonrpc":"2.0","id":"tools","method":"tools/list"}')
    done = subprocess.run(
        [sys.executable, "-m", "recalld.ipc.mcp", "--agent", "coder",
         "--socket", str(daemon.socket_path)],
        input=script, capture_output=True, env=daemon.env, timeout=100, check=True)

    answers = [json.loads(line) for line in done.stdout.splitlines()]
    by_id = {m["id"]: m for m in answers}
    expected = {0, *(f"note{n}" for n in range(6)), *range(1, 20), "res", "tools"}
    assert set(by_id) == expected and len(answers) == len(expected), answers
    assert all("result" in m for m in answers), [m for m in answers if "result" not in m]
    assert not any(by_id[f"note{n}"]["result"]["isError"] for n in range(6))
    assert done.stderr.decode() == "", done.stderr.decode()
    # What the bridge said it recorded is in memory.
    with daemon.connect() as conn:
        found = conn.call("memory.search", {"agent_id": "coder", "query": "Ysolde-5",
                                            "max_results": 10})
    assert any("Ysolde-5" in hit["text"] for hit in found["results"]), found


def _request(request_id: int | str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "ping"}) + "\n"


def test_a_request_the_client_cancels_or_sends_twice_is_counted_as_such() -> None:
    in_flight = InFlight()
    for line in (_request(1), _request(1), _request("1"),
                 '{"jsonrpc":"2.0","method":"notifications/cancelled",'
                 '"params":{"requestId":1}}'):
        in_flight.read(types.jsonrpc_message_adapter.validate_json(line))
    assert len(in_flight) == 2  # one 1 (sent twice, cancelled once) and "1"
    in_flight.answered(1)
    in_flight.answered("1")
    assert len(in_flight) == 0


async def test_the_end_of_the_lines_waits_for_answers_then_at_most_the_grace(
        autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]) -> None:
    async def given() -> AsyncIterator[str | LongLine]:
        for line in (_request(1), _request(2)):
            yield line

    send, receive = anyio.create_memory_object_stream[types.JSONRPCError](1)
    lines = CheckedLines(given(), send, grace_s=30.0)
    ended = trio.Event()
    read: list[str] = []

    async def reader() -> None:
        async for line in lines:
            read.append(line)
        ended.set()

    async with receive, trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert len(read) == 2 and not ended.is_set()  # both read, neither answered
        lines.in_flight.answered(1)
        await trio.testing.wait_all_tasks_blocked()
        assert not ended.is_set()
        await ended.wait()  # 2 never answered: the grace ends the lines
    assert "1 request(s) still unanswered after 30 s" in capsys.readouterr().err


def test_a_client_gone_from_stdout_has_what_it_sent_finished_quietly(
        daemon: DaemonHandle) -> None:
    with subprocess.Popen(
            [sys.executable, "-m", "recalld.ipc.mcp", "--agent", "coder",
             "--socket", str(daemon.socket_path)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=daemon.env) as bridge:
        assert bridge.stdin and bridge.stdout and bridge.stderr
        bridge.stdin.write(json.dumps(INIT).encode() + b"\n")
        bridge.stdin.flush()
        assert json.loads(bridge.stdout.readline())["id"] == 0
        bridge.stdout.close()  # the client stops reading: its answers cannot be written
        bridge.stdin.write(
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n' + b"".join(
                _call(f"note{n}", "memory_add_note", {"content": f"Pier {n} has a red crane"})
                for n in range(8)))
        bridge.stdin.close()
        said = bridge.stderr.read().decode()  # to its end, when the bridge exits
        assert bridge.wait(timeout=100) == 0, said
    assert "closed its end of stdout" in said and "Traceback" not in said, said
    assert "InvalidStateError" not in said, said
    with daemon.connect() as conn:
        found = conn.call("memory.search", {"agent_id": "coder", "query": "red crane pier",
                                            "max_results": 20})
    text = "\n".join(hit["text"] for hit in found["results"])
    assert all(f"Pier {n} has a red crane" in text for n in range(8)), text


def test_a_bridge_started_with_stdin_closed_reads_an_empty_input(tmp_path: Path) -> None:
    # Python gives a process started with fd 0 closed no sys.stdin: the bridge failed
    # with a traceback. (fd 0 is then the next file opened, not the bridge's to read.)
    done = subprocess.run(
        ["sh", "-c", 'exec "$@" <&-', "sh", sys.executable, "-m", "recalld.ipc.mcp",
         "--socket", str(tmp_path / "none.sock")], capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, b""), done
    assert "Traceback" not in done.stderr.decode(), done.stderr.decode()


def test_initialize_is_answered_while_a_silent_daemon_is_still_being_asked(
        tmp_path: Path) -> None:
    """A daemon that accepts and does not answer (stopped, or busy with a long write):
    the bridge's check at start waits its full deadline for it, and MCP hosts give
    ``initialize`` only a few seconds. The answer comes first; a client gone before the
    check ends is told nothing (not that the daemon closed the connection)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        path = Path(short) / "silent.sock"
        err_path = tmp_path / "mcp-silent.log"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent, \
                open(err_path, "wb") as err:
            silent.bind(str(path))
            silent.listen(8)
            with subprocess.Popen(
                    [sys.executable, "-m", "recalld.ipc.mcp", "--agent", "coder",
                     "--socket", str(path)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err) as bridge:
                assert bridge.stdin is not None and bridge.stdout is not None
                try:
                    bridge.stdin.write(json.dumps(INIT).encode() + b"\n")
                    bridge.stdin.flush()
                    answer = json.loads(bridge.stdout.readline())
                    said = err_path.read_text(encoding="utf-8")
                    bridge.stdin.close()
                    assert bridge.wait(timeout=100) == 0
                finally:
                    if bridge.poll() is None:
                        bridge.kill()
    assert answer["id"] == 0 and "result" in answer, answer
    assert "warning" not in said, said
    assert err_path.read_text(encoding="utf-8") == ""
