"""A damaged record in the pending-turns log is set aside, logged and counted, never
dropped silently: a real daemon, its real log file damaged in the middle, a restart."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
from waits import wait_value

from recalld.daemon.store.applog import encode_line, parse


def _ws_status(d: Any) -> dict[str, Any]:
    status = d.call("daemon.status")
    return next(w for w in status["workspaces"] if w["agent_id"] == "w")


def _add(d: Any, n: int) -> dict[str, Any]:
    result: dict[str, Any] = d.call("memory.add_turns", {
        "agent_id": "w", "session_id": "s1",
        "messages": [{"role": "user", "content": f"fact number {n}: the sky is teal"}]})
    return result


def test_a_damaged_record_is_quarantined_logged_and_counted(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    config = f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n'
    d = daemon_factory(config)
    for n in range(1, 4):
        _add(d, n)
    assert _ws_status(d)["sessions"]["quarantined_records"] == 0
    assert d.stop() == 0

    log_path = root / "mem_metadata" / "sessions" / "pending.jsonl"
    lines = log_path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    # Damage the middle record (one byte of its JSON; the CRC no longer matches).
    middle = bytearray(lines[1])
    at = middle.index(b"fact number 2") + 5
    middle[at] ^= 0x20
    damaged_line = bytes(middle)
    log_path.write_bytes(lines[0] + damaged_line + lines[2])

    d2 = daemon_factory(config)
    status = _ws_status(d2)["sessions"]
    assert status["quarantined_records"] == 1
    # The records on both sides of it are kept: sessions s1 has turns 1 and 3 pending.
    info = d2.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": []})
    assert info["pending_turns"] == 2
    quarantine = log_path.with_name("pending.quarantine.jsonl")
    records, report, _ = parse(quarantine.read_bytes())
    assert report.bad_lines == [] and len(records) == 1
    assert records[0]["reason"] == "CRC mismatch"
    assert records[0]["offset"] == len(lines[0])
    assert base64.b64decode(records[0]["raw_b64"]) + b"\n" == damaged_line
    wait_value(d2.log, lambda log: "set aside" in log, "the damaged record set aside")
    assert "pending-turns log" in d2.log()
    # The log was rewritten without it: another restart finds nothing new to set aside.
    assert damaged_line not in log_path.read_bytes()
    assert all(orjson.loads(ln.split(b" ", 1)[1]) for ln in log_path.read_bytes().splitlines())
    assert d2.stop() == 0
    d3 = daemon_factory(config)
    assert _ws_status(d3)["sessions"]["quarantined_records"] == 1
    assert "set aside" not in d3.log()
    _add(d3, 4)
    info = d3.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": []})
    assert info["pending_turns"] == 3


def test_records_of_another_shape_are_quarantined_not_failing_the_workspace(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Records whose checksums match but whose fields do not (a hand edit, another
    # program): "user_turns": "x" failed the workspace's open with "ValueError: invalid
    # literal for int()", its notes unsearchable and its turns refused.
    root = tmp_path / "ws"
    log_path = root / "mem_metadata" / "sessions" / "pending.jsonl"
    log_path.parent.mkdir(parents=True)
    good = {"op": "turns", "session_id": "s1", "user_turns": 1, "user_seqs": [1], "upto": 1,
            "messages": [{"role": "user", "content": "the sky is teal", "seq": 1, "at": 1.0}]}
    bad = [{"session_id": 5}, {"messages": "not a list"}, {"user_turns": "x"},
           {"user_seqs": ["1"]}, {"upto": 1.5}, {"op": "state", "answers": ["r1"]}]
    log_path.write_bytes(encode_line(good) + b"".join(
        encode_line({**good, "session_id": f"s{n + 2}", **fields})
        for n, fields in enumerate(bad)))
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 0\n')
    ws = _ws_status(d)
    assert ws["state"] == "ready" and ws["sessions"]["quarantined_records"] == len(bad), ws
    info = d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "messages": []})
    assert info["pending_turns"] == 1
    records, _, _ = parse(log_path.with_name("pending.quarantine.jsonl").read_bytes())
    assert [r["reason"].split(": ", 1)[0] for r in records] == (
        ["not of this log's shape"] * len(bad))
    assert "user_turns is not an integer" in records[2]["reason"], records
