"""The dialog log (``mem_session/dialog/<session>.jsonl``) end to end: each auto_memory run
appends to it, whatever its size; what a kill left at its end (a torn line, turns written
but not committed) is repaired by the next run, with no turn lost or written twice."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
from fakes.provider_server import FakeProvider, chat_answer
from test_auto_memory import add, config, turn
from waits import wait_job


def _dialog(root: Path, session: str) -> Path:
    return root / "mem_session" / "dialog" / f"{session}.jsonl"


def _said(root: Path, session: str) -> list[tuple[int, str]]:
    """(seq, content) of every line of the log; a line that is no record fails."""
    return [(rec["seq"], rec["content"]) for rec in
            map(orjson.loads, _dialog(root, session).read_bytes().splitlines())]


def _capture(d: Any, session: str, text: str) -> None:
    job = wait_job(d, add(d, session, turn(text), flush=True)["job_id"])
    assert job["state"] == "succeeded", (job.get("error"), job)


def test_a_torn_last_line_is_cut_and_its_turns_come_whole(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # A kill in the middle of an append leaves part of a line at the end, its turns not
    # committed. The next run writes them whole after the last whole line; nothing of the
    # torn piece stays, and the lines before it are not written again.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.chat_default = lambda body: chat_answer("nothing to save")
    _capture(d, "chat-7", "My bike is a green Brompton.")
    log = _dialog(root, "chat-7")
    inode = log.stat().st_ino
    add(d, "chat-7", turn("I ride it to the office in Zürich."))
    with log.open("ab") as f:
        f.write(b'{"role":"user","content":"I ride it to the off')
    job = wait_job(d, add(d, "chat-7", [], flush=True)["job_id"])
    assert job["state"] == "succeeded", job
    assert _said(root, "chat-7") == [
        (1, "My bike is a green Brompton."), (2, "Noted."),
        (3, "I ride it to the office in Zürich."), (4, "Noted.")]
    assert log.stat().st_ino == inode  # appended to, not written anew
    # A piece that starts no line of these turns is another writer's (ReMe's), maybe
    # still writing it: kept as it is, the turns on lines of their own after it.
    theirs = '{"role":"user","content":"Zürich has good bike lanes, and I r'.encode()
    with log.open("ab") as f:
        f.write(theirs)
    _capture(d, "chat-7", "Once I rode it to Basel.")
    lines = log.read_bytes().splitlines()
    assert lines[4] == theirs
    assert [(r["seq"], r["content"]) for r in map(orjson.loads, lines[5:])] == [
        (5, "Once I rode it to Basel."), (6, "Noted.")]


def test_turns_written_before_a_kill_are_not_written_twice(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # Killed after its append and before its commit, a run leaves its turns in the log
    # and pending: the run again adds only those after them. A hand-edited last line
    # without its newline is kept.
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.chat_default = lambda body: chat_answer("nothing to save")
    _capture(d, "s", "I keep bees.")
    add(d, "s", turn("The hives are on the roof."))
    add(d, "s", turn("I sell the honey at the market."))
    with _dialog(root, "s").open("ab") as f:
        f.write(b'{"role":"user","content":"The hives are on the roof.","seq":3}\n'
                b'{"role":"assistant","content":"Noted.","seq":4}')
    job = wait_job(d, add(d, "s", [], flush=True)["job_id"])
    assert job["state"] == "succeeded" and job["result"]["turns"] == 4, job
    assert _said(root, "s") == [
        (1, "I keep bees."), (2, "Noted."), (3, "The hives are on the roof."),
        (4, "Noted."), (5, "I sell the honey at the market."), (6, "Noted.")]


def test_a_log_past_256_mib_still_takes_turns(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # A long conversation's log was read whole and written anew by every run, and a run
    # refused once it passed 256 MiB: the turns stayed pending for good. (The log is
    # sparse here, to spare the disk: 300 MiB of NULs stand for the earlier lines, and
    # its first record starts 300 MiB in.)
    root = tmp_path / "ws"
    d = daemon_factory(config(root, fake, interval=0))
    fake.chat_default = lambda body: chat_answer("nothing to save")
    _capture(d, "long", "I was born in Oslo.")
    log = _dialog(root, "long")
    first = log.read_bytes()
    with log.open("r+b") as f:
        f.truncate(0)
        f.seek((300 << 20) - 1)
        f.write(b"\n" + first)
    _capture(d, "long", "I moved to Bergen.")
    with log.open("rb") as f:
        f.seek(300 << 20)
        tail = [orjson.loads(line)["content"] for line in f.read().splitlines()]
    assert tail == ["I was born in Oslo.", "Noted.", "I moved to Bergen.", "Noted."]
    assert add(d, "long", [])["pending_messages"] == 0
    assert os.stat(log).st_blocks * 512 < 16 << 20  # still sparse: not written anew
