"""A note written in parts keeps every part, also one that repeats the one before, and a
part sent again (its answer lost) adds nothing twice: ``memory.add_note`` knows a call by
its ``request_id``. Real daemons, real sockets; the MCP bridge is a real subprocess."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import session_key
from recalld.ipc.answers import NoteAdded
from recalld.ipc.client import Client
from recalld.ipc.request_parts import MAX_NOTE_PART_CHARS, in_note_parts, text_parts

# One chapter of a log pasted twice: the cut between the parts falls between the copies.
CHAPTER = "\n".join(f"- lock {n % 9} of the canal: gate {n % 4} sticks" for n in range(620))
TWICE = f"{CHAPTER}\n{CHAPTER}\n"


def _bodies(root: Path, pattern: str) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(root.rglob(pattern)))


def _note_text(root: Path, pattern: str) -> str:
    """The one note ``pattern`` names, without its frontmatter."""
    [note] = root.rglob(pattern)
    return note.read_text(encoding="utf-8").split("---\n", 2)[2]


def test_parts_that_repeat_each_other_are_all_written(daemon: DaemonHandle) -> None:
    parts = text_parts(TWICE, 1 << 20, MAX_NOTE_PART_CHARS)
    assert len(parts) == 2 and parts[0] == parts[1]  # the case itself

    async def main() -> NoteAdded:
        async with AsyncClient(daemon.socket_path) as c:
            await c.workspace_open("lock-keeper")
            return await in_note_parts(
                TWICE, c.request_limit,
                lambda part, part_id: c.add_note("lock-keeper", part, session_id="canal",
                                                 request_id=part_id))

    last = asyncio.run(main())
    assert last["changed"]
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("lock-keeper")["path"])
    body = _bodies(root / "memory", "agent-notes*.md")
    assert body.count("gate 3 sticks") == 2 * CHAPTER.count("gate 3 sticks"), len(body)


def test_a_part_that_shows_nothing_is_not_sent(daemon: DaemonHandle) -> None:
    # A pasted text with a long run of zero-width spaces between two chapters: the part
    # of only those went to the daemon, which refuses a note that shows nothing, and
    # the write failed after its first part.
    text = f"{CHAPTER}\n" + "\u200b\n" * MAX_NOTE_PART_CHARS + f"{CHAPTER}\n"
    parts = text_parts(text, 1 << 20, MAX_NOTE_PART_CHARS)
    assert any(set(p) <= {"\u200b", "\n"} for p in parts)  # the case itself

    async def main() -> NoteAdded:
        async with AsyncClient(daemon.socket_path) as c:
            await c.workspace_open("lock-keeper")
            return await in_note_parts(
                text, c.request_limit,
                lambda part, part_id: c.add_note("lock-keeper", part, session_id="canal",
                                                 request_id=part_id))

    assert asyncio.run(main())["changed"]
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("lock-keeper")["path"])
    body = _bodies(root / "memory", "agent-notes*.md")
    assert body.count("gate 3 sticks") == 2 * CHAPTER.count("gate 3 sticks"), len(body)


def test_a_call_sent_again_is_known_by_its_request_id(daemon_factory: DaemonFactory) -> None:
    first = daemon_factory()
    params = {"agent_id": "ferry", "content": "The ferry leaves at 7:40.",
              "session_id": "harbour", "request_id": "crossing-1"}
    with Client(first.socket_path) as c:
        c.workspace_open("ferry")
    added = first.call("memory.add_note", params)
    # Sent again after the daemon restarted: the same answer, nothing appended.
    assert first.stop() == 0
    again_daemon = daemon_factory(RECALLD_DATA_DIR=str(first.data_dir),
                                  RECALLD_SOCKET=str(first.socket_path))
    with Client(again_daemon.socket_path) as c:
        c.workspace_open("ferry")
    assert again_daemon.call("memory.add_note", params) == added
    # Another id: the same words are another fact told again, appended.
    other = again_daemon.call("memory.add_note", {**params, "request_id": "crossing-2"})
    # The same id from another session is another call.
    elsewhere = again_daemon.call("memory.add_note", {**params, "session_id": "quay"})
    # Without an id, words the note holds are taken for a call sent again.
    bare = again_daemon.call("memory.add_note", {k: v for k, v in params.items()
                                                 if k != "request_id"})
    assert other["changed"] and not bare["changed"] and elsewhere["path"] != added["path"]
    text = again_daemon.call("memory.read", {"agent_id": "ferry", "path": added["path"]})
    assert text["text"].count("The ferry leaves at 7:40.") == 2


def test_the_mcp_bridge_records_a_note_longer_than_one_call_takes(
        daemon: DaemonHandle) -> None:
    from test_mcp import _text, bridge

    # About 70,000 characters, past the 32,000 one memory.add_note takes, the chapter
    # twice among them.
    content = f"{CHAPTER}\n{CHAPTER}\n" + "\n".join(
        f"- sluice {n}: «ouverte» à {n % 24}h 🚢" for n in range(600))
    assert len(content) > 2 * MAX_NOTE_PART_CHARS

    # Blank lines enough to make a part of their own between two facts.
    spaced = "- The upper gate is green.\n" + " \n" * 40_000 + "- The lower gate is red."

    async def main() -> list[str]:
        async with bridge(daemon, "lock-keeper") as s:
            said = []
            for text in (content, spaced):
                note = await s.call_tool("memory_add_note", {"content": text,
                                                             "session_id": "canal 2"})
                assert not note.is_error, _text(note)
                said.append(_text(note))
            return said

    said = asyncio.run(main())
    assert all(text.startswith("recorded in memory/") for text in said), said
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("lock-keeper")["path"])
    body = _bodies(root / "memory", "agent-notes*.md")
    assert body.count("gate 3 sticks") == 2 * CHAPTER.count("gate 3 sticks")
    assert all(f"- sluice {n}: «ouverte» à {n % 24}h 🚢\n" in body for n in range(600))
    assert "- The upper gate is green.\n" in body and "- The lower gate is red.\n" in body


def test_content_that_redaction_lengthens_is_taken(daemon: DaemonHandle) -> None:
    # Under the 32,000 characters a call takes as sent; longer once each password is
    # masked, which a caller cannot foresee.
    content = "\n".join(f"- replica {n}: postgres://ops:k@db-{n}.lan/orders"
                         for n in range(640))
    assert len(content) < 32_000
    with Client(daemon.socket_path) as c:
        c.workspace_open("dba")
        note = c.add_note("dba", content, session_id="replicas")
        text = c.read("dba", note["path"])["text"]
    assert note["changed"] and len(text) > 32_000
    assert all(f"- replica {n}: postgres://ops:[REDACTED]@db-{n}.lan/orders" in text
               for n in range(640))


def test_part_ids_are_no_callers_own_id_and_a_resend_adds_nothing(
        daemon: DaemonHandle) -> None:
    import orjson

    from recalld.ipc.request_parts import add_turns_in_parts

    # Two parts each: 1,000 messages per memory.add_turns, 30,000 characters per note.
    wharf = "\n".join(f"- wharf {n}: crane {n % 7} lifts ☂ bales" for n in range(900))
    assert len(text_parts(wharf, 1 << 20, MAX_NOTE_PART_CHARS)) == 2
    turns = [{"role": "user", "content": f"bale {n} landed"} for n in range(1_300)]
    # Ids a caller gave its own calls of the same session, shaped as parts' ids were,
    # and two ids alike in their first 195 characters.
    long_a, long_b = "q" * 195 + "-a", "q" * 195 + "-b"
    sizes = {"shift": 1_100, long_a: 1_200, long_b: 1_300}

    async def main() -> list[int]:
        async with AsyncClient(daemon.socket_path) as c:
            await c.workspace_open("stevedore")
            await c.add_note("stevedore", "- The tide table is on the door.",
                             session_id="dock", request_id="shift#1")
            await c.add_turns("stevedore", "dock", [{"role": "user", "content": "hello"}],
                              request_id="shift#1")
            added = []
            for request_id in ("shift", "shift", long_a, long_b):  # "shift" sent again
                await in_note_parts(
                    wharf.replace("wharf", request_id[-7:]), c.request_limit,
                    lambda part, part_id: c.add_note("stevedore", part, session_id="dock",
                                                     request_id=part_id),
                    request_id)
                answer = await add_turns_in_parts(c, "stevedore", "dock",
                                                  turns[:sizes[request_id]], request_id)
                added.append(answer["added_messages"])
            return added

    # The resend gets the first answer again.
    assert asyncio.run(main()) == [1_100, 1_100, 1_200, 1_300]
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("stevedore")["path"])
    body = _bodies(root / "memory", "agent-notes*.md")
    for name in ("shift", long_a[-7:], long_b[-7:]):
        # Every line once: the second part too, and nothing twice for the resend.
        assert all(body.count(f"- {name} {n}: crane {n % 7} lifts ☂ bales\n") == 1
                   for n in range(900)), name
    said = [m["content"] for line in (root / "mem_metadata/sessions/pending.jsonl")
            .read_bytes().splitlines()
            for m in orjson.loads(line.split(b" ", 1)[1]).get("messages") or []]
    assert [said.count(f"bale {n} landed") for n in (1_050, 1_150, 1_250)] == [3, 2, 1]
    assert said.count("hello") == 1
def test_text_json_cannot_carry_is_refused_by_the_request_not_the_cutting(
        daemon: DaemonHandle) -> None:
    import pytest

    from recalld.ipc.errors import InvalidParams
    from recalld.ipc.request_parts import add_turns_in_parts

    # Bytes that were not UTF-8, as Python decodes them (a lone surrogate), in a note
    # of one part and in one of several, and in turns.
    bad = "- the caf\udce9 on the quay\n"

    async def main() -> list[str]:
        refused = []
        async with AsyncClient(daemon.socket_path) as c:
            await c.workspace_open("quay")
            for text in (bad, bad * 2_000):
                with pytest.raises(InvalidParams) as caught:
                    await in_note_parts(text, c.request_limit, lambda part, part_id: c.add_note(
                        "quay", part, request_id=part_id))
                refused.append(caught.value.message)
            with pytest.raises(InvalidParams) as caught:
                await add_turns_in_parts(c, "quay", "s", [{"role": "user", "content": bad}],
                                         None)
            refused.append(caught.value.message)
        return refused

    assert all("text must be valid UTF-8" in message for message in asyncio.run(main()))


def test_recalld_note_takes_a_note_longer_than_one_call_takes(daemon: DaemonHandle) -> None:
    from test_cli import SCRIPT

    # About 90,000 characters piped in: three calls' worth, the chapter twice among them.
    content = f"{TWICE}" + "\n".join(f"- pier {n}: « la marée » monte à {n % 12}h ⚓"
                                     for n in range(900))
    assert len(content) > 2 * MAX_NOTE_PART_CHARS
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("harbour")["path"])
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    done = subprocess.run([*cmd, "note", "-", "--agent", "harbour", "--name", "tides",
                           "--json"], input=content.encode(), capture_output=True,
                          env=daemon.env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    answer = json.loads(done.stdout)
    assert answer["created"] and answer["path"].endswith("/tides.md"), answer
    body = _bodies(root / "memory", "tides*.md")
    assert body.count("gate 3 sticks") == 2 * CHAPTER.count("gate 3 sticks")
    assert all(f"- pier {n}: « la marée » monte à {n % 12}h ⚓\n" in body for n in range(900))


def _note_cli(daemon: DaemonHandle, content: str, *args: str,
              ) -> subprocess.CompletedProcess[bytes]:
    from test_cli import SCRIPT

    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "recalld.ipc"]
    return subprocess.run([*cmd, "note", "-", "--json", *args], input=content.encode(),
                          capture_output=True, env=daemon.env, timeout=60, check=False)


def test_recalld_note_run_again_adds_no_part_twice(daemon: DaemonHandle) -> None:
    """The same long note given twice (a command run again after it failed part-way)
    is in the note once; to another note's name, it is written there too."""
    log = "\n".join(f"- Schleuse {n % 13}: Tor {n % 5} klemmt, Pegel {n % 40} cm"
                    for n in range(3000))
    assert len(log) > 2 * MAX_NOTE_PART_CHARS
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("schleusen")["path"])
    for name in ("pegel", "pegel", "tore"):
        done = _note_cli(daemon, log, "--agent", "schleusen", "--name", name)
        assert done.returncode == 0, done.stderr.decode()
    for name in ("pegel", "tore"):
        body = _bodies(root / "memory", f"{name}*.md")
        assert body.count("- Schleuse 4: Tor 1 klemmt, Pegel 36 cm\n") == log.count(
            "- Schleuse 4: Tor 1 klemmt, Pegel 36 cm\n"), name


def test_recalld_note_takes_the_session_ids_the_mcp_bridge_maps(
        daemon: DaemonHandle) -> None:
    """``--session "chat 42/b"`` (a space and a slash the daemon does not take) is the
    session the MCP bridge gives that id, and the same one each time; an empty one is
    refused as a usage error."""
    with Client(daemon.socket_path) as c:
        c.workspace_open("helpdesk")
    answers = []
    for text in ("Printer on floor 3 jams on A3.", "Toner ordered for floor 3."):
        done = _note_cli(daemon, text, "--agent", "helpdesk", "--session", "chat 42/b")
        assert done.returncode == 0, done.stderr.decode()
        answers.append(json.loads(done.stdout))
    assert answers[0]["session_id"] == session_key("chat 42/b") != "chat 42/b"
    assert answers[1]["path"] == answers[0]["path"] and not answers[1]["created"]
    bare = _note_cli(daemon, "Floor 3 is fine again.", "--agent", "helpdesk",
                     "--session", "")
    assert bare.returncode == 2 and b"--session: must not be empty" in bare.stderr


def test_a_long_paragraph_is_cut_between_words_and_clauses(daemon: DaemonHandle) -> None:
    # One paragraph with no line break, longer than two calls take: the parts were cut
    # at whatever character fell in the middle, so the note kept words split in two
    # ("harb" / "our") that no search for them finds.
    words = " ".join(f"harbour{n}lantern" for n in range(5000))
    clauses = "".join(f"第{n}号码头的灯塔在夜里亮着，潮水涨到{n % 12}点。" for n in range(3000))
    assert min(len(words), len(clauses)) > 2 * MAX_NOTE_PART_CHARS
    with Client(daemon.socket_path) as c:
        root = Path(c.workspace_open("harbour")["path"])
    for name, content in (("words", words), ("clauses", clauses)):
        done = _note_cli(daemon, content, "--agent", "harbour", "--name", name)
        assert done.returncode == 0, done.stderr.decode()
    said = _note_text(root / "memory", "words*.md").split()
    assert said == words.split()
    body = _note_text(root / "memory", "clauses*.md")
    pieces = [p.strip() for p in body.split("\n") if p.strip()]
    assert len(pieces) > 2
    assert all(p.endswith(("，", "。")) for p in pieces), [p[-12:] for p in pieces]
    assert "".join(pieces) == clauses
