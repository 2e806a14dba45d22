"""What the recalld tools of an AgentScope agent answer the model when the daemon refuses a
call or the model's arguments are empty or carry names the tool does not take (a real
daemon; the tools called as the agent's toolkit calls them: keywords only)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs agentscope, which '.[test]' installs")

from agentscope.tool import ToolBase, ToolChunk
from conftest import DaemonFactory, DaemonHandle

from recalld.ipc.agentscope import RecalldMemoryMiddleware
from recalld.ipc.agentscope_mem0 import RecalldMem0Middleware
from recalld.ipc.client import Client


def _answer(chunk: object) -> tuple[str, bool]:
    """The text of a tool's answer, and whether it is marked as an error."""
    assert isinstance(chunk, ToolChunk), chunk
    text = "".join(getattr(block, "text", "") for block in chunk.content)
    return text, chunk.state.value == "error"


def test_each_tool_answers_a_refusal_or_an_empty_argument_as_text(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    daemon = daemon_factory(f'[workspaces.potter]\npath = "{root}"\n')

    async def main() -> dict[str, tuple[str, bool]]:
        mw = RecalldMemoryMiddleware(agent_id="potter", mode="agent_control",
                                     socket_path=daemon.socket_path)
        tools: dict[str, ToolBase] = {
            t.name: t for t in [*await mw.list_tools(), *mw.topic_tools()]}
        calls: dict[str, tuple[str, dict[str, Any]]] = {
            "no query": ("memory_search", {"query": "  "}),
            "no facts": ("add_memory", {"thinking": "why", "content": ["", " "]}),
            # Facts that show nothing (a zero-width space, a byte order mark and a bidi
            # mark, a mark with no letter) are none: they were written as "- " lines.
            "invisible facts": ("add_memory", {"thinking": "why",
                                               "content": ["\u200b", "\ufeff\u200e", "\u0301"]}),
            "one seen fact": ("add_memory", {"thinking": "why",
                                             "content": ["\u200b", "The kiln fires at cone 6."]}),
            "bad type": ("memory_write", {"path": "kiln.md", "name": "Kiln",
                                          "description": "firing", "type": "diary",
                                          "body": "Cone 6."}),
            "no file": ("memory_edit", {"path": "glaze.md", "old": "a", "new": "b"}),
            # Names the tools do not take, among them those of their own parameters.
            "stray": ("memory_write", {"path": "kiln.md", "name": "Kiln",
                                       "description": "firing", "type": "project",
                                       "body": "Cone 6.", "workspace": "other",
                                       "state": None}),
            "edit": ("memory_edit", {"path": "kiln.md", "old": "Cone 6.", "new": "Cone 10.",
                                     "workspace": "other"}),
        }
        try:
            return {what: _answer(await tools[name].call(_agent_state=None, **args))
                    for what, (name, args) in calls.items()}
        finally:
            await mw.close()

    answers = asyncio.run(main())
    assert answers["no query"] == ("(no query given: nothing to search)", False)
    assert answers["no facts"] == ("`content` is empty: nothing to record", True)
    assert answers["invisible facts"] == answers["no facts"]
    text, error = answers["one seen fact"]
    assert not error and text.startswith("Recorded 1 fact(s) in "), text
    note = (root / text.split(" in ", 1)[1].split(" (", 1)[0]).read_text(encoding="utf-8")
    assert "- The kiln fires at cone 6.\n" in note and "\u200b" not in note, note
    text, error = answers["bad type"]
    assert error and text.startswith("memory_write failed: ") and "'type'" in text, text
    text, error = answers["no file"]
    assert error and text.startswith("memory_edit failed: ") and "glaze.md" in text, text
    assert answers["stray"] == ("Created digest/kiln.md; listed in digest/MEMORY.md", False)
    assert answers["edit"] == ("Edited digest/kiln.md; listed in digest/MEMORY.md", False)
    assert "Cone 10." in (root / "digest" / "kiln.md").read_text(encoding="utf-8")


TOKEN = "ghp_" + "Rk2Vn8Qw5Lx1Tz7Mb4Hc9Jd3Fs6Pg0Ya5Ue"


def test_an_argument_of_the_wrong_shape_is_named_never_quoted(daemon: DaemonHandle) -> None:
    # A key a model wrote into the wrong argument came back in Python's own words
    # ("invalid literal for int() with base 10: 'ghp_...'") or as a traceback's text.
    async def main() -> list[tuple[str, tuple[str, bool]]]:
        mw = RecalldMemoryMiddleware(agent_id="potter", mode="agent_control",
                                     socket_path=daemon.socket_path)
        mem0 = RecalldMem0Middleware(user_id="potter", socket_path=daemon.socket_path)
        tools = {t.name: t for t in await mw.list_tools()}
        mem0_tools = {t.name: t for t in await mem0.list_tools()}
        calls: list[tuple[ToolBase, dict[str, Any]]] = [
            (tools["memory_search"], {"_agent_state": None, "query": "kiln", "limit": TOKEN}),
            (tools["memory_search"], {"_agent_state": None, "query": [TOKEN]}),
            (tools["add_memory"], {"_agent_state": None, "thinking": "t",
                                   "content": {TOKEN: "fact"}}),
            (mem0_tools["search_memory"], {"keywords": ["kiln"], "limit": TOKEN}),
            (mem0_tools["search_memory"], {"keywords": [{"k": TOKEN}]}),
            (mem0_tools["add_memory"], {"thinking": "t", "content": 7}),
            # As models write them: a number as a string, one keyword for a list.
            (tools["memory_search"], {"_agent_state": None, "query": "kiln", "limit": "3"}),
            (mem0_tools["search_memory"], {"keywords": "kiln", "limit": 2.0}),
        ]
        try:
            return [(tool.name, _answer(await tool.call(**args))) for tool, args in calls]
        finally:
            await mw.close()
            await mem0.close()

    answers = asyncio.run(main())
    for name, (text, error) in answers[:6]:
        assert error and TOKEN[6:18] not in text, (name, text)
    said = [text for _, (text, _) in answers]
    assert said[0] == ("memory search failed: limit: must be a whole number, not a string "
                       f"of {len(TOKEN)} characters"), said
    assert said[1] == "memory search failed: query: must be a string, not an array of 1 item"
    assert said[2] == ("recording memory failed: content: must be an array of strings, "
                       "not an object"), said
    assert said[3].startswith("Error retrieving memory: limit: must be a whole number"), said
    assert said[4] == ("Error retrieving memory: keywords: each item must be a string, "
                       "not an object"), said
    assert said[5].startswith("Error recording memory: content: must be an array"), said
    assert [error for _, (_, error) in answers[6:]] == [False, False], answers[6:]
    with Client(daemon.socket_path) as c:  # nothing of them reached the workspace
        assert all(TOKEN not in f["path"] for f in c.memory_list("potter"))


def test_a_count_of_hits_out_of_range_is_told_by_the_tools_own_name(
        daemon: DaemonHandle) -> None:
    # limit=-5 came back as the daemon's "param 'max_results' must be at least 1", a name
    # the model never saw; a count past 64 bits could not even be sent.
    with Client(daemon.socket_path) as c:
        c.workspace_open("potter")
        for title in ("glaze one", "glaze two"):
            c.add_note("potter", f"The kiln {title} fires at cone 6.", name=title)

    async def main() -> list[tuple[str, bool]]:
        mw = RecalldMemoryMiddleware(agent_id="potter", mode="agent_control",
                                     socket_path=daemon.socket_path)
        mem0 = RecalldMem0Middleware(user_id="potter", socket_path=daemon.socket_path)
        search = {t.name: t for t in await mw.list_tools()}["memory_search"]
        mem0_search = {t.name: t for t in await mem0.list_tools()}["search_memory"]
        try:
            return [*[_answer(await search.call(_agent_state=None, query="kiln", limit=n))
                      for n in (-5, 0, "-1", 10**30)],
                    _answer(await mem0_search.call(keywords=["kiln"], limit=10**30)),
                    *[_answer(await mem0_search.call(keywords=["kiln"], limit=n))
                      for n in (-5, 0)]]
        finally:
            await mw.close()
            await mem0.close()

    answers = asyncio.run(main())
    assert answers[:2] == [("memory search failed: limit: must be at least 1", True)] * 2
    assert answers[2][1] and "max_results" not in answers[2][0], answers[2]
    # search_memory's as memory_search's: not one hit as if 1 had been asked.
    assert answers[5:] == [("Error retrieving memory: limit: must be at least 1", True)] * 2
    for text, error in answers[3:5]:  # as many as there are
        assert not error and "glaze one" in text and "glaze two" in text, text


def test_counts_and_waits_out_of_range_are_refused_at_construction_by_their_names(
        daemon: DaemonHandle) -> None:
    # index_max_entries=0 was taken, and each system prompt then lost its index to the
    # daemon's "param 'max_entries' must be at least 1" in a log warning: a name the
    # caller never set. top_k=2.5 or True was taken too; a negative index_ttl_s as well.
    sock = daemon.socket_path
    for kwargs, name in (({"index_max_entries": 0}, "index_max_entries"),
                         ({"index_max_entries": -3}, "index_max_entries"),
                         ({"index_max_entries": 2.5}, "index_max_entries"),
                         ({"top_k": 2.5}, "top_k"), ({"top_k": True}, "top_k"),
                         ({"index_ttl_s": -1}, "index_ttl_s"),
                         ({"index_ttl_s": float("nan")}, "index_ttl_s")):
        with pytest.raises(ValueError, match=rf"^{name} must be a") as raised:
            RecalldMemoryMiddleware(agent_id="potter", socket_path=sock, **kwargs)
        assert "max_entries'" not in str(raised.value), raised.value
    with pytest.raises(ValueError, match=r"^top_k must be a whole number, 1 or more"):
        RecalldMem0Middleware(user_id="potter", socket_path=sock, top_k=1.5)
    # A threshold of NaN or text failed each search naming the daemon's min_score.
    for threshold in (float("nan"), float("inf"), "0.5", True):
        with pytest.raises(ValueError, match=r"^threshold must be a finite number or None"):
            RecalldMem0Middleware(user_id="potter", socket_path=sock, threshold=threshold)
    # The edges themselves are taken.
    mw = RecalldMemoryMiddleware(agent_id="potter", socket_path=sock, top_k=1,
                                 index_max_entries=1, index_ttl_s=0)
    assert (mw.top_k, mw.index_max_entries, mw.index_ttl_s) == (1, 1, 0)
    asyncio.run(mw.close())
    mem0 = RecalldMem0Middleware(user_id="potter", socket_path=sock, threshold=-1)
    assert mem0.threshold == -1
    asyncio.run(mem0.close())


def test_an_empty_agent_id_is_refused_not_taken_as_none(daemon: DaemonHandle) -> None:
    # agent_id="" (a variable left unset) was taken: replies then used each agent's own
    # workspace while the topic tools wrote to the workspace "".
    with pytest.raises(ValueError, match=r"^agent_id: the agent name '' makes no workspace"):
        RecalldMemoryMiddleware(agent_id="", socket_path=daemon.socket_path)
    for agent_id, pinned in ((None, None), ("potter", "potter")):
        mw = RecalldMemoryMiddleware(agent_id=agent_id, socket_path=daemon.socket_path)
        assert mw.agent_id == pinned and mw.workspace_for_session("s") == pinned
        asyncio.run(mw.close())
