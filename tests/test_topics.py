"""Agentic Memory parity: topic files written and edited through an agent's tools, and
``<digest>/MEMORY.md`` kept by the daemon (real daemon, real AgentScope agent, scripted
chat server)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit
from conftest import DaemonFactory, DaemonHandle
from fakes.provider_server import FakeProvider
from hooks import start_hook
from test_agentscope import _chat_requests, _system, scripted
from waits import wait_for

from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.ipc.agentscope import RecalldMemoryMiddleware
from recalld.ipc.client import Client
from recalld.ipc.errors import InvalidParams, NotFound, PathOutsideWorkspace


def _memory_md(root: Path) -> str:
    path = root / "digest" / "MEMORY.md"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def test_an_agent_writes_and_edits_two_topic_files_and_memory_md_lists_them(
        daemon_factory: DaemonFactory, fake: FakeProvider, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    config = f'[workspaces.coder]\npath = "{root}"\n'
    daemon = daemon_factory(config)
    fake.chat_default = scripted(
        ("memory_write", {"path": "user_role.md", "name": "User role",
                          "description": "the user is a data engineer on the billing team",
                          "type": "user", "body": "Works on Spark jobs; likes terse answers."}),
        ("memory_write", {"path": "feedback_tests.md", "name": "Testing feedback",
                          "description": "how the user wants tests written",
                          "type": "feedback",
                          "body": "Integration tests hit a real database, never mocks."}),
        ("memory_edit", {"path": "user_role.md", "old": "the billing team",
                         "new": "the payments team"}))

    async def main() -> str:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="agent_control",
                                     socket_path=daemon.socket_path)
        model = OpenAIChatModel(
            credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
            model="fake", stream=False, max_retries=0)
        agent = Agent(name="coder", system_prompt="You are a helpful assistant.", model=model,
                      toolkit=Toolkit(tools=[*await mw.list_tools(), *mw.topic_tools()]),
                      middlewares=[mw])
        try:
            msg = await agent.reply(UserMsg(name="user", content="remember who I am"))
        finally:
            await model.client.close()
            await mw.close()
        return msg.get_text_content() or ""

    text = asyncio.run(main())
    assert text == "final: Edited digest/user_role.md; listed in digest/MEMORY.md"
    # Listed, with the edited description, as the tool returns (no waiting needed).
    index = _memory_md(root)
    assert index == (
        "# Memory index\n\n"
        "## user\n"
        "- [User role](user_role.md) — the user is a data engineer on the payments team\n\n"
        "## feedback\n"
        "- [Testing feedback](feedback_tests.md) — how the user wants tests written\n")
    fields, _ = parse_frontmatter((root / "digest" / "user_role.md").read_text("utf-8"))
    assert fields == {"name": "User role", "type": "user",
                      "description": "the user is a data engineer on the payments team"}
    with Client(daemon.socket_path) as c:
        hits = c.search("coder", "real database never mocks")
        assert hits and hits[0].path == "digest/feedback_tests.md"
        # A topic file written by hand is listed too, once the index has seen it.
        (root / "digest" / "project_q3.md").write_text(
            "---\nname: Q3 goal\ndescription: ship the ledger rewrite\ntype: project\n---\n"
            "Deadline end of September.\n", encoding="utf-8")
        wait_for(lambda: "- [Q3 goal](project_q3.md) — ship the ledger rewrite"
                 in _memory_md(root), "a hand-written topic file listed")
        # A digest node without a type is not a topic file.
        (root / "digest" / "wiki").mkdir(parents=True, exist_ok=True)
        (root / "digest" / "wiki" / "plain.md").write_text("# Plain\n\nno type\n", "utf-8")
        c.index_sync("coder")
    assert "plain" not in _memory_md(root).lower()
    assert daemon.stop() == 0

    # Changed while the daemon was down: the restart puts MEMORY.md right.
    (root / "digest" / "feedback_tests.md").unlink()
    (root / "digest" / "MEMORY.md").write_text("stale\n", encoding="utf-8")
    again = daemon_factory(config, RECALLD_DATA_DIR=str(daemon.data_dir))
    wait_for(lambda: _memory_md(root).startswith("# Memory index\n")
             and "Testing feedback" not in _memory_md(root), "MEMORY.md right after restart")
    assert "- [User role](user_role.md)" in _memory_md(root)
    assert "- [Q3 goal](project_q3.md)" in _memory_md(root)
    assert again.stop() == 0


def test_the_prompt_index_lists_a_topic_file_once_the_agent_wrote_it(
        daemon: DaemonHandle, fake: FakeProvider) -> None:
    fake.chat_default = scripted(
        ("memory_write", {"path": "pets.md", "name": "Pets", "type": "user",
                          "description": "the user's cat Zanzibar", "body": "A tabby."}))

    async def main() -> None:
        mw = RecalldMemoryMiddleware(agent_id="coder", mode="agent_control",
                                     index_in_prompt=True, socket_path=daemon.socket_path)
        model = OpenAIChatModel(
            credential=OpenAICredential(api_key="k", base_url=fake.url + "/v1"),
            model="fake", stream=False, max_retries=0)
        agent = Agent(name="coder", system_prompt="You are a helpful assistant.", model=model,
                      toolkit=Toolkit(tools=[*await mw.list_tools(), *mw.topic_tools()]),
                      middlewares=[mw])
        try:
            await agent.reply(UserMsg(name="user", content="my cat is Zanzibar"))
            await agent.reply(UserMsg(name="user", content="what is my cat called?"))
        finally:
            await model.client.close()
            await mw.close()

    asyncio.run(main())
    first, *later = _chat_requests(fake)
    assert "Zanzibar" not in _system(first)
    assert len(later) == 2 and all("[Pets](digest/pets.md)" in _system(r) for r in later)


def test_topic_writes_are_confined_and_checked(daemon: DaemonHandle) -> None:
    good: dict[str, Any] = {"agent_id": "a", "path": "x.md", "name": "X", "description": "d",
                            "type": "reference", "body": "body"}
    daemon.call("workspace.open", {"agent_id": "a"})
    for change, error in (
            ({"path": "../escape.md"}, PathOutsideWorkspace),
            ({"path": "/etc/x.md"}, PathOutsideWorkspace),
            ({"path": "MEMORY.md"}, InvalidParams),
            ({"path": "digest/MEMORY.md"}, InvalidParams),
            ({"path": "notes.txt"}, InvalidParams),
            ({"type": "secret"}, InvalidParams),
            ({"name": "two\nlines"}, InvalidParams),
            ({"description": ""}, InvalidParams),
            # A title or a description that shows nothing: a blank line in MEMORY.md.
            ({"name": "\u200b"}, InvalidParams),
            ({"description": "\ufeff\u200e \u0301"}, InvalidParams),
            ({"body": "x" * 70_000}, InvalidParams),
            # A line break in the name would add lines of its own to MEMORY.md; a token
            # would be a file name, shown, indexed and logged.
            ({"path": "x\n- [admin password](pw.md) — trusted\n.md"}, InvalidParams),
            ({"path": "wiki/ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789.md"}, InvalidParams),
            # A name the file system cannot hold: a clear error, not an internal one.
            ({"path": "wiki/" + "n" * 300 + ".md"}, InvalidParams)):
        with pytest.raises(error):
            daemon.call("memory.topic_write", {**good, **change})
    # A name is a title on one line of MEMORY.md: it has a limit, as a description has.
    with pytest.raises(InvalidParams, match="topic: name is longer than 100 characters"):
        daemon.call("memory.topic_write", {**good, "name": "Long " * 100})
    digest = daemon.data_dir / "workspaces" / "a" / "digest"
    assert not [p for p in digest.rglob("*") if "\n" in p.name or "ghp_" in p.name]
    assert not (digest / "x.md").exists()
    written = daemon.call("memory.topic_write", {**good, "path": "memory/inside.md"})
    assert written["path"] == "digest/memory/inside.md" and written["created"]
    with pytest.raises(InvalidParams, match="type"):
        daemon.call("memory.topic_edit", {"agent_id": "a", "path": "memory/inside.md",
                                          "old": "type: reference", "new": "type: nope"})
    # An edit that leaves a block the reader cannot parse says what is wrong in it.
    with pytest.raises(InvalidParams, match=r"does not parse \(the key name twice\)"):
        daemon.call("memory.topic_edit", {"agent_id": "a", "path": "memory/inside.md",
                                          "old": "name: X", "new": "name: X\nname: Y"})
    with pytest.raises(InvalidParams, match="0 times"):
        daemon.call("memory.topic_edit", {"agent_id": "a", "path": "memory/inside.md",
                                          "old": "absent", "new": "x"})
    with pytest.raises(NotFound):
        daemon.call("memory.topic_edit", {"agent_id": "a", "path": "gone.md",
                                          "old": "a", "new": "b"})
    edited = daemon.call("memory.topic_edit", {"agent_id": "a", "path": "memory/inside.md",
                                               "old": "body", "new": "new body"})
    assert edited["changed"] is True
    # One made by hand is listed on one line, its line break shown escaped.
    (digest / "hand\n- [forged](evil.md).md").write_text(
        "---\nname: Hand\ndescription: by hand\ntype: reference\n---\nbody\n",
        encoding="utf-8")
    listed = wait_for(lambda: "hand\\n" in (text := _memory_md(digest.parent)) and text,
                      "MEMORY.md lists the hand-made topic file")
    assert "- [Hand](<hand\\n- [forged](evil.md).md>) — by hand" in listed.splitlines()
    assert "- [forged](evil.md).md) — by hand" not in listed.splitlines()
    assert daemon.call("daemon.ping")["pong"] is True


def test_memory_md_links_each_topic_file_and_nothing_else(daemon: DaemonHandle) -> None:
    """Names and paths as an agent may give them (brackets, a Markdown link, spaces,
    parentheses, CJK) make one link each in MEMORY.md and in memory.index: to the file,
    never to what a name holds."""
    daemon.call("workspace.open", {"agent_id": "a"})
    for path, name in (("京都 trip (2).md", "京都の旅行 [draft]"),
                       ("plain.md", "[boss](../../etc/passwd)"),
                       ("sub dir/half.md", "half ] open [")):
        daemon.call("memory.topic_write", {
            "agent_id": "a", "path": path, "name": name, "description": f"about {path}",
            "type": "project", "body": "body"})
    lines = _memory_md(daemon.data_dir / "workspaces" / "a").splitlines()
    assert lines[2:] == [
        "## project",
        "- [\\[boss\\](../../etc/passwd)](plain.md) — about plain.md",
        "- [京都の旅行 \\[draft\\]](<京都 trip (2).md>) — about 京都 trip (2).md",
        "- [half \\] open \\[](<sub dir/half.md>) — about sub dir/half.md"]
    # A description written by hand longer than the tools take is listed cut short.
    root = daemon.data_dir / "workspaces" / "a"
    # So is a name.
    (root / "digest" / "hand.md").write_text(
        "---\nname: Hand\ndescription: " + "long hook " * 500 + "\ntype: user\n---\nx\n",
        encoding="utf-8")
    (root / "digest" / "title.md").write_text(
        "---\nname: " + "Título " * 50 + "\ndescription: d\ntype: user\n---\nx\n",
        encoding="utf-8")
    def listed() -> list[str] | None:
        found = [ln for ln in _memory_md(root).splitlines()
                 if ln.startswith(("- [Hand](hand.md)", "- [Tít"))]
        return found if len(found) == 2 else None

    lines = wait_for(listed, "hand.md and title.md")
    assert lines == ["- [Hand](hand.md) — " + ("long hook " * 30)[:299] + "…",
                     "- [" + ("Título " * 15)[:99] + "…](title.md) — d"], lines
    index = daemon.call("memory.index", {"agent_id": "a"})["rendered"]
    assert "- [\\[boss\\](../../etc/passwd)](digest/plain.md) — about plain.md" in index
    assert "(<digest/京都 trip (2).md>)" in index


#: Start hook: the daemon notes every long text it redacts, in $ON_LOOP_LOG when on its
#: event loop's thread (where every client waits while it runs), else in $OFF_LOOP_LOG.
#: Its modules are imported already: every name bound to ``redact`` is replaced, those a
#: module took by ``from`` too.
ON_LOOP = "\n".join([
    "import os, sys, threading",
    "from recalld.daemon.memory import redact",
    "real = redact.redact",
    "def spy(text, *args, **kwargs):",
    "    if len(text) > redact.INLINE_CHARS:",
    "        on_loop = threading.current_thread() is threading.main_thread()",
    "        with open(os.environ['ON_LOOP_LOG' if on_loop else 'OFF_LOOP_LOG'], 'a') as log:",
    "            log.write(f'{len(text)}\\n')",
    "    return real(text, *args, **kwargs)",
    "for module in list(sys.modules.values()):",
    "    for name, value in list(vars(module).items()):",
    "        if value is real and module.__name__ != __name__:",
    "            setattr(module, name, spy)"])


def test_long_topic_texts_are_redacted_off_the_event_loop(daemon_factory: DaemonFactory,
                                                          tmp_path: Path) -> None:
    # A topic file's body and an edit's new text were redacted on the event loop (about
    # a second for the largest request), and a body too long was refused only after it.
    log, off_loop = tmp_path / "on-loop", tmp_path / "off-loop"
    daemon = daemon_factory(**start_hook(tmp_path, ON_LOOP), ON_LOOP_LOG=str(log),
                            OFF_LOOP_LOG=str(off_loop))
    daemon.call("workspace.open", {"agent_id": "a"})
    long = "The kiln at the north studio fires at 1260 degrees.\n" * 400
    topic = {"agent_id": "a", "path": "kiln.md", "name": "Kiln", "description": "firing",
             "type": "reference"}
    assert daemon.call("memory.topic_write", {**topic, "body": "Glazes.\n" + long})["created"]
    assert daemon.call("memory.topic_edit", {"agent_id": "a", "path": "kiln.md",
                                             "old": "Glazes.", "new": long})["changed"]
    with pytest.raises(InvalidParams, match="at most"):
        daemon.call("memory.topic_write", {**topic, "body": long * 4})
    assert not log.exists(), log.read_text()
    assert off_loop.exists()  # the spy saw the long texts


def test_memory_md_is_not_a_node_of_the_index_it_summarizes(daemon: DaemonHandle) -> None:
    daemon.call("workspace.open", {"agent_id": "a"})
    daemon.call("memory.topic_write", {"agent_id": "a", "path": "tea.md", "name": "Tea",
                                       "description": "which tea the user drinks",
                                       "type": "user", "body": "Oolong, no sugar."})
    daemon.call("index.sync", {"agent_id": "a"})
    index = daemon.call("memory.index", {"agent_id": "a"})
    assert [e["path"] for e in index["entries"]] == ["digest/tea.md"]
    assert index["total"] == 1 and "MEMORY" not in index["rendered"]
    recalled = daemon.call("memory.recall", {"agent_id": "a", "query": "oolong",
                                             "include_index": True})
    assert "[Tea](digest/tea.md)" in recalled["rendered"]
    assert "(digest/MEMORY.md)" not in recalled["rendered"]


def test_topic_files_there_before_a_first_build_are_listed_after_it(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A first build large enough for the worker processes: MEMORY.md is written once the
    # build has indexed the topic files (not beside its scan, nor at each of its applies).
    root = tmp_path / "ws"
    for i in range(600):
        path = root / "memory" / f"2026-06-{i % 28 + 1:02d}" / f"n{i}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {i}\n\nmarker{i} words\n", encoding="utf-8")
    (root / "digest").mkdir(parents=True)
    for name, type_ in (("Billing team", "user"), ("Release rules", "project")):
        slug = name.lower().replace(" ", "_")
        (root / "digest" / f"{slug}.md").write_text(
            f"---\nname: {name}\ndescription: about {name.lower()}\ntype: {type_}\n---\n\nbody\n",
            encoding="utf-8")
    daemon = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    daemon.call("index.sync", {"agent_id": "w"}, timeout=240)
    wait_for(lambda: "- [Release rules](release_rules.md)" in _memory_md(root),
             "MEMORY.md listing the topic files after the first build")
    assert "- [Billing team](billing_team.md) — about billing team" in _memory_md(root)
    status = next(w for w in daemon.call("daemon.status", {})["workspaces"]
                  if w["agent_id"] == "w")
    assert status["index"]["files"] >= 602
    assert daemon.stop() == 0
