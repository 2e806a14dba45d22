"""RecalldMem0Middleware in place of AgentScope's Mem0Middleware: real AgentScope agents, a
real daemon, the scripted OpenAI-compatible chat server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import string
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.message import Base64Source, DataBlock, TextBlock
from agentscope.middleware import Mem0Middleware
from conftest import DaemonHandle
from fakes.provider_server import FakeProvider
from test_agentscope import _chat_requests, _non_system, _system, scripted
from test_agentscope import _reply as _agent_reply

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.ipc.agent_ids import stand_in_name
from recalld.ipc.agentscope import RecalldMem0Middleware, RecalldMemoryMiddleware
from recalld.ipc.client import Client


def test_every_mem0_keyword_is_accepted_with_its_default() -> None:
    theirs = inspect.signature(Mem0Middleware.__init__).parameters
    ours = inspect.signature(RecalldMem0Middleware.__init__).parameters
    for name, param in theirs.items():
        assert name in ours, name
        if name not in ("self", "memory_section_header", "memory_section_intro",
                        "tool_instructions"):
            assert ours[name].default == param.default, name
    assert ours["scope_search_by_agent"].default is True
    with pytest.raises(ValueError, match="user_id"):
        RecalldMem0Middleware(user_id=" ")
    with pytest.raises(ValueError, match="mode"):
        RecalldMem0Middleware(user_id="alice", mode="sometimes")  # type: ignore[arg-type]


async def _reply(fake: FakeProvider, mw: Any, name: str, text: str) -> str:
    """The text of agent ``name``'s reply to ``text``, with ``mw`` as its middleware."""
    return (await _agent_reply(fake, mw, name, text))[1]


def _turn(daemon: DaemonHandle, fake: FakeProvider, text: str, **kwargs: Any) -> str:
    async def main() -> str:
        # The one line that differs from a Mem0Middleware agent (plus the test's socket).
        mw = RecalldMem0Middleware(socket_path=daemon.socket_path,
                                   **{"user_id": "alice", **kwargs})
        try:
            return await _reply(fake, mw, str(kwargs.get("agent_id") or "agent"), text)
        finally:
            await mw.close()

    return asyncio.run(main())


def _workspace(daemon: DaemonHandle, user: str) -> Path:
    with Client(daemon.socket_path) as c:
        return Path(c.workspace_open(user)["path"])


def _note_of(daemon: DaemonHandle, user: str, agent: str) -> str:
    """The text of the one note the Mem0 middleware of ``agent`` wrote in ``user``'s
    workspace."""
    (note,) = list((_workspace(daemon, user) / "memory").rglob(f"mem0-{agent}*.md"))
    return note.read_text(encoding="utf-8")


def test_tools_behave_as_mem0_documents_and_user_id_is_shared_across_agents(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    fake.chat_default = scripted(("add_memory", {
        "thinking": "SECRET-RATIONALE a lasting preference",
        "content": ["Alice's cat is called Pixelwhisker.", "Alice drinks oolong tea."]}))
    text = _turn(daemon, fake, "remember my cat and my tea", agent_id="planner",
                 mode="agent_control")
    assert text.startswith("final: Successfully recorded to memory (rationale: SECRET")
    first = _chat_requests(fake)[0]
    assert {t["function"]["name"] for t in first["tools"]} == {"search_memory", "add_memory"}
    assert "`search_memory` and `add_memory`" in _system(first)
    # One workspace per user; the note records its writing agent; thinking is not stored.
    body = _note_of(daemon, "alice", "planner")
    assert parse_frontmatter(body)[0]["author"] == "planner"
    assert "Pixelwhisker" in body and "SECRET-RATIONALE" not in body

    # search_memory: every keyword searched, results merged and de-duplicated.
    fake.requests.clear()
    fake.chat_default = scripted(("search_memory", {
        "keywords": ["Pixelwhisker", "oolong", "cat Pixelwhisker"], "limit": 3}))
    found = _turn(daemon, fake, "what do you know about me?", agent_id="planner",
                  mode="agent_control")
    lines = [ln for ln in found.removeprefix("final: ").splitlines() if ln.startswith("- ")]
    assert any("Pixelwhisker" in ln for ln in lines) and any("oolong" in ln for ln in lines)
    assert len(lines) == len(set(lines)) >= 1
    assert all(ln.startswith("- [memory/") for ln in lines)

    # Another agent of the same user: scoped by default, so it sees none of planner's.
    fake.requests.clear()
    fake.chat_default = scripted(("search_memory", {"keywords": ["Pixelwhisker"]}))
    other = _turn(daemon, fake, "my cat?", agent_id="writer", mode="agent_control")
    assert other == "final: (no relevant memories found)"
    # Unscoped, the user's memory serves every agent.
    fake.requests.clear()
    fake.chat_default = scripted(("search_memory", {"keywords": ["Pixelwhisker"]}))
    shared = _turn(daemon, fake, "my cat?", agent_id="writer", mode="agent_control",
                   scope_search_by_agent=False)
    assert "Pixelwhisker" in shared
    # No keywords, no content: Mem0's answers.
    fake.requests.clear()
    fake.chat_default = scripted(("search_memory", {"keywords": []}))
    assert "nothing to search" in _turn(daemon, fake, "?", agent_id="writer",
                                        mode="agent_control")
    fake.chat_default = scripted(("add_memory", {"thinking": "t", "content": []}))
    assert "nothing to record" in _turn(daemon, fake, "?", agent_id="writer",
                                        mode="agent_control")


@pytest.mark.parametrize("await_write", [True, False])
def test_static_control_injects_at_reply_start_and_writes_back(
        daemon: DaemonHandle, fake: FakeProvider, await_write: bool) -> None:
    with Client(daemon.socket_path) as c:
        c.workspace_open("alice")
        c.add_note("alice", "Alice's bicycle is a green Brompton.", session_id="mem0-planner",
                   name="mem0-planner", author="planner")
    fake.chat_default = scripted()
    answer = _turn(daemon, fake, "which bicycle do I ride? Brompton", agent_id="planner",
                   mode="static_control", await_write=await_write, threshold=0.0)
    assert answer == "plain answer"
    (req,) = _chat_requests(fake)
    assert not req.get("tools") and "search_memory" not in _system(req)
    injected = _non_system(req)
    assert "## Relevant memories from past conversations" in injected
    assert "green Brompton" in injected
    # The exchange is stored (close() waits for a background write) and searchable.
    with Client(daemon.socket_path) as c:
        hits = c.search("alice", "which bicycle do I ride", filters={"author": "planner"},
                        max_results=10)
    assert any("Assistant: plain answer" in h.text for h in hits)


def test_long_user_ids_alike_up_to_the_64th_character_are_kept_apart(
        daemon: DaemonHandle) -> None:
    prefix = "tenant-northwind-traders-emea-region-customer-support-department-"
    assert len(prefix) > 64

    async def main() -> tuple[list[str], list[str], str, str]:
        alice, bob = (RecalldMem0Middleware(user_id=prefix + user, scope_search_by_agent=False,
                                            socket_path=daemon.socket_path)
                      for user in ("alice", "bob"))
        try:
            await alice.add_memory_text("The locker code of the gym is 4711.")
            found = await alice.search_memories("locker code")
            leaked = await bob.search_memories("locker code")
            return found, leaked, alice.workspace, bob.workspace
        finally:
            await alice.close()
            await bob.close()

    found, leaked, alice_ws, bob_ws = asyncio.run(main())
    hit = next(hit for hit in found if "4711" in hit)
    # A memory is what the note says: its frontmatter (name, session_id...) is left out
    # and the line range starts at the body.
    assert "---" not in hit and "session_id" not in hit and "source_conversation" not in hit
    path, lines = hit[1:hit.index("]")].rsplit(":", 1)
    with Client(daemon.socket_path) as c:
        body = c.read(alice_ws, path, start_line=int(lines.split("-")[0]))["text"]
    assert body.lstrip().startswith("The locker code of the gym is 4711."), body
    assert leaked == []
    assert alice_ws != bob_ws and len(alice_ws) <= 64 and len(bob_ws) <= 64


def test_a_workspace_closed_by_another_client_is_opened_again(daemon: DaemonHandle) -> None:
    async def main() -> tuple[list[str], str, list[str]]:
        mem0 = RecalldMem0Middleware(user_id="alice", agent_id="planner",
                                     socket_path=daemon.socket_path)
        memory = RecalldMemoryMiddleware(agent_id="bob", socket_path=daemon.socket_path)
        try:
            await mem0.add_memory_text("The spare key hides under the blue flowerpot.")
            await memory.add("bob", "Bob's locker is number 88 of the north wing.", None)
            with Client(daemon.socket_path) as c:  # e.g. to hand it other models
                for user in ("alice", "bob"):
                    assert c.call("workspace.close", {"agent_id": user})["closed"]
            found = await mem0.search_memories("spare key flowerpot")
            added = await mem0.add_memory_text("The doormat is red.")
            return found, str(added["path"]), await memory.recall_block("bob", "locker")
        finally:
            await mem0.close()
            await memory.close()

    found, added, recalled = asyncio.run(main())
    assert any("blue flowerpot" in m for m in found)
    assert added.startswith("memory/")
    assert any("north wing" in block for block in recalled)


def test_a_note_sent_again_adds_nothing_it_already_holds(daemon: DaemonHandle) -> None:
    """The daemon's half of a write sent again after its answer was lost: content the
    session's note already holds as whole paragraphs is not appended twice."""
    block = "- Ravi's locker code opens with a 7.\n- The spare helmet is orange."
    with Client(daemon.socket_path) as c:
        c.workspace_open("carol")
        first = c.add_note("carol", block, session_id="mem0-x", name="mem0-x")
        again = c.add_note("carol", f"\n{block}  \n", session_id="mem0-x", name="mem0-x")
        part = c.add_note("carol", "- The spare helmet is orange.", session_id="mem0-x",
                          name="mem0-x")  # one line of a paragraph: a fact of its own
        other = c.add_note("carol", block, session_id="mem0-y", name="mem0-x")
        text = c.read("carol", first["path"])["text"]
    assert first["created"] and first["changed"]
    assert (again["path"], again["created"], again["changed"]) == (first["path"], False, False)
    assert part["changed"] and other["path"] != first["path"]
    body = text.split("---\n", 2)[2]
    assert body.count("locker code") == 1 and body.count("spare helmet") == 2, body


def test_an_exchange_the_daemon_missed_is_stored_with_the_next(
        daemon_factory: Any, fake: FakeProvider) -> None:
    first = daemon_factory()
    sock = first.socket_path
    fake.chat_default = scripted()

    async def main() -> None:
        mw = RecalldMem0Middleware(user_id="dana", agent_id="tutor", mode="static_control",
                                   socket_path=sock)
        try:
            await _reply(fake, mw, "tutor", "my cello teacher is named Ottoline")
            assert first.stop() == 0  # the daemon restarts (an upgrade, say)
            await _reply(fake, mw, "tutor", "my violin bow is made of pernambuco")
            daemon_factory(RECALLD_DATA_DIR=str(first.data_dir), RECALLD_SOCKET=str(sock))
            await _reply(fake, mw, "tutor", "my recital is in the Wigmore hall")
        finally:
            await mw.close()

    asyncio.run(main())
    with Client(sock) as c:
        c.workspace_open("dana")
        notes = [c.read("dana", f["path"])["text"] for f in c.memory_list("dana")
                 if "mem0-tutor" in f["path"]]
    (note,) = notes
    for fact in ("Ottoline", "pernambuco", "Wigmore"):
        assert note.count(fact) == 1, (fact, note)
    assert note.index("Ottoline") < note.index("pernambuco") < note.index("Wigmore")


def test_an_agent_id_that_looks_like_a_credential_writes_under_a_stand_in(
        daemon: DaemonHandle, caplog: pytest.LogCaptureFixture) -> None:
    """The daemon refuses to write an ``author`` (and a session) redaction would mask: an
    API key given as ``agent_id`` made every write fail. Its notes record a stand-in, the
    key is written nowhere, and scoped searches find them, in a later run too."""
    rng = random.Random(4242)
    key = "ghp_" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(36))

    async def main() -> tuple[str, list[str], list[str]]:
        first = RecalldMem0Middleware(user_id="erin", agent_id=key, socket_path=daemon.socket_path)
        try:
            added = await first.add_memory_text("Erin's bike lock code starts with a nine.")
            await first.add_memory_text("Erin's bike is a green Gazelle.")
        finally:
            await first.close()
        later = RecalldMem0Middleware(user_id="erin", agent_id=key,
                                      socket_path=daemon.socket_path)
        other = RecalldMem0Middleware(user_id="erin", agent_id="planner",
                                      socket_path=daemon.socket_path)
        try:
            return (str(added["path"]), await later.search_memories("Erin bike Gazelle"),
                    await other.search_memories("Erin bike Gazelle"))
        finally:
            await later.close()
            await other.close()

    with caplog.at_level(logging.WARNING, logger="recalld.ipc.agentscope"):
        path, found, not_theirs = asyncio.run(main())
    note = _workspace(daemon, "erin") / path
    fields = parse_frontmatter(note.read_text(encoding="utf-8"))[0]
    assert fields["author"] == stand_in_name(key), fields
    assert any("green Gazelle" in m for m in found) and not not_theirs, (found, not_theirs)
    on_disk = [p for p in daemon.data_dir.rglob("*") if p.is_file()
               and (key in p.name or key.encode() in p.read_bytes())]
    assert not on_disk, on_disk
    warnings = [r.getMessage() for r in caplog.records if "looks like a credential" in
                r.getMessage()]
    assert len(warnings) == 1 and key not in warnings[0], warnings


def test_an_agent_id_of_no_letter_or_digit_writes_under_a_stand_in(
        daemon: DaemonHandle, caplog: pytest.LogCaptureFixture) -> None:
    """No note's ``author`` may lack a letter or digit: ``agent_id="~"`` was taken, then
    every ``add_memory`` failed. Its notes record a stand-in, and its scoped searches find
    them, not another agent's."""
    async def main(agent_id: str) -> tuple[str, list[str]]:
        middleware = RecalldMem0Middleware(user_id="fern", agent_id=agent_id,
                                           socket_path=daemon.socket_path)
        try:
            added = await middleware.add_memory_text(f"Fern waters the ficus ({agent_id}).")
            return str(added["path"]), await middleware.search_memories("Fern ficus")
        finally:
            await middleware.close()

    with caplog.at_level(logging.WARNING, logger="recalld.ipc.agentscope"):
        for agent_id in ("~", "\U0001f916", " -.md"):
            path, found = asyncio.run(main(agent_id))
            fields = parse_frontmatter((_workspace(daemon, "fern") / path).read_text(
                encoding="utf-8"))[0]
            assert fields["author"] == stand_in_name(agent_id), fields
            assert [m.split("] ", 1)[1] for m in found] == [
                f"Fern waters the ficus ({agent_id})."], found
    warnings = [r.getMessage() for r in caplog.records if "no letter or digit" in
                r.getMessage()]
    assert len(warnings) == 3, warnings


def test_images_and_files_are_named_in_the_stored_exchange(daemon: DaemonHandle,
                                                           fake: FakeProvider) -> None:
    # Only a message's text was stored: a photo sent with a caption lost what it showed,
    # and a photo alone stored no exchange at all, where the memory middleware names it.
    photo = DataBlock(name="receipt.png",
                      source=Base64Source(data="iVBORw0KGgo=", media_type="image/png"))
    sheet = DataBlock(name="budget [Q3].xlsx", source=Base64Source(
        data="UEsDBA==", media_type="application/vnd.ms-excel"))
    fake.chat_default = scripted()

    async def main() -> None:
        mw = RecalldMem0Middleware(user_id="bob", agent_id="clerk", mode="static_control",
                                   socket_path=daemon.socket_path)
        try:
            await _agent_reply(fake, mw, "clerk", [photo, TextBlock(text="For the warranty.")])
            await _agent_reply(fake, mw, "clerk", [sheet])
        finally:
            await mw.close()

    asyncio.run(main())
    body = _note_of(daemon, "bob", "clerk")
    assert "User: [image omitted: receipt.png]\nFor the warranty.\nAssistant:" in body, body
    assert "User: [file omitted: budget (Q3).xlsx]\nAssistant: plain answer" in body, body
    assert "iVBORw0KGgo" not in body and "UEsDBA" not in body


def test_notes_link_no_dialog_log_none_is_written_for(daemon: DaemonHandle,
                                                      fake: FakeProvider) -> None:
    # Each note linked source_conversation: [[mem_session/dialog/mem0-<agent>.jsonl]], a
    # file never written: the exchange is the note. A link written so before goes too.
    with Client(daemon.socket_path) as c:
        c.workspace_open("carol")
        c.add_note("carol", "Carol rows at dawn.", session_id="mem0-rower",
                   name="mem0-rower", author="rower")
    fake.chat_default = scripted()
    assert _turn(daemon, fake, "I row on Tuesdays", user_id="carol", agent_id="rower",
                 mode="static_control") == "plain answer"
    root = _workspace(daemon, "carol")
    text = _note_of(daemon, "carol", "rower")
    fields, _ = parse_frontmatter(text)
    assert "source_conversation" not in fields, fields
    assert fields["session_id"] == "mem0-rower" and fields["author"] == "rower"
    assert "Carol rows at dawn." in text
    assert not (root / "mem_session").exists() or not any((root / "mem_session").rglob("*"))


def test_the_stored_exchange_names_the_user_who_spoke(daemon: DaemonHandle,
                                                       fake: FakeProvider) -> None:
    # Every exchange was stored as "User: ...": two people sharing one agent left two
    # contradictory claims of one user ("I live in Oslo", "I live in Bergen").
    fake.chat_default = scripted()

    async def main() -> None:
        mw = RecalldMem0Middleware(user_id="household", agent_id="concierge",
                                   mode="static_control", socket_path=daemon.socket_path)
        try:
            for speaker, text in (("Ingrid Solberg", "I live in Oslo."),
                                  ("Bjørn\n  Haugen", "I live in Bergen."),
                                  ("user", "We share a cabin in Geilo."),
                                  ("\u200b\ufeff", "Our dog is called Fenrir.")):
                await _agent_reply(fake, mw, "concierge", text, speaker=speaker)
        finally:
            await mw.close()

    asyncio.run(main())
    body = _note_of(daemon, "household", "concierge")
    assert "User (Ingrid Solberg): I live in Oslo.\nAssistant: plain answer" in body, body
    assert "User (Bjørn Haugen): I live in Bergen.\nAssistant: plain answer" in body, body
    assert "User: We share a cabin in Geilo.\nAssistant: plain answer" in body, body
    assert "User: Our dog is called Fenrir.\nAssistant: plain answer" in body, body
