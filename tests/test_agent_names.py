"""Agent names that make one agent id ("Sales Bot", "Sales_Bot", "Sales #Bot" ...): the
first to open the workspace owns it, the daemon refuses the others by name (also after
a restart and for a workspace recorded before names were); names that make no id at
all are refused by the client libraries instead of being taken for ``default``."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import unicodedata
from typing import Any

import pytest

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import owner_name, session_key, workspace_id, workspace_name
from recalld.ipc.cli_args import agent_name
from recalld.ipc.client import Client
from recalld.ipc.errors import InvalidParams
from recalld.ipc.known_ids import provisional_id
from recalld.ipc.mcp_bridge import Bridge


def test_a_second_name_with_the_same_id_is_refused_naming_both(daemon_factory: Any) -> None:
    d = daemon_factory("")
    with Client(d.socket_path) as c:
        c.workspace_open(workspace_id("Sales Bot"), name="Sales Bot")
        c.workspace_open("Sales_Bot", name="Sales Bot")  # the same agent again
        c.add_note("Sales_Bot", "Quarterly target: 40 new accounts.")
        for other in ("Sales_Bot", "Sales  Bot", "Sales #Bot"):
            with pytest.raises(InvalidParams) as refused:
                c.workspace_open(workspace_id(other), name=other)
            assert repr(other) in refused.value.message
            assert "'Sales Bot'" in refused.value.message
            assert "'Sales_Bot'" in refused.value.message
        c.workspace_open("Sales_Bot")  # the id alone (an operator) claims no name
    env = d.env
    assert d.stop() == 0
    d2 = daemon_factory("", XDG_DATA_HOME=env["XDG_DATA_HOME"])
    with Client(d2.socket_path) as c:
        with pytest.raises(InvalidParams, match="'Sales Bot'"):
            c.workspace_open("Sales_Bot", name="Sales_Bot")
        c.workspace_close("Sales_Bot", forget=True)  # handed over on purpose
        c.workspace_open("Sales_Bot", name="Sales_Bot")
        with pytest.raises(InvalidParams, match="'Sales_Bot'"):
            c.workspace_open("Sales_Bot", name="Sales Bot")
        for bad in ("", " ", "a\nb", "x" * 257):
            with pytest.raises(InvalidParams, match="'name'"):
                c.workspace_open("Sales_Bot", name=bad)


def test_a_workspace_recorded_without_a_name_goes_to_the_first_name(
        daemon_factory: Any) -> None:
    # Opened by id alone (before names were sent, or at a start), then by the MCP
    # bridges of two agents whose names make its id: the second is refused.
    d = daemon_factory("")
    with Client(d.socket_path) as c:
        c.workspace_open("alice_smith")

    async def bridges() -> str:
        async with AsyncClient(d.socket_path) as one, AsyncClient(d.socket_path) as two:
            first = Bridge(one, workspace_id("alice smith"), "alice smith")
            second = Bridge(two, workspace_id("alice_smith"), "alice_smith")
            opened = await first.call_tool("memory_search", {"query": "anything"})
            assert not opened.is_error
            result = await second.call_tool("memory_search", {"query": "anything"})
        assert result.is_error
        return str(result.content[0].text)  # type: ignore[union-attr]

    said = asyncio.run(bridges())
    assert "'alice smith'" in said and "'alice_smith'" in said, said


@pytest.mark.parametrize("name", ["", ".", "..", "..."])
def test_names_that_make_no_id_are_not_taken_for_default(name: str) -> None:
    with pytest.raises(ValueError, match="makes no workspace name"):
        workspace_name(name)
    if name != "...":  # itself a valid agent id
        with pytest.raises(ValueError, match="makes no workspace name"):
            workspace_id(name)


def _bridge_notes(socket_path: Any, names: list[str], note: str = "") -> dict[str, tuple[
        str, bool, str]]:
    """Each name's MCP bridge adds a note (``note`` or one naming it) then searches for
    what every bridge added: its agent id, whether it was refused, what it found."""
    out: dict[str, tuple[str, bool, str]] = {}

    async def main() -> None:
        async with AsyncClient(socket_path) as client:
            bridges = {name: Bridge(client, provisional_id(name), name) for name in names}
            for name, bridge in bridges.items():
                added = await bridge.call_tool(
                    "memory_add_note", {"content": note or f"The kiln of {name!r} is hot."})
                out[name] = (bridge.agent, bool(added.is_error),
                             str(added.content[0].text))  # type: ignore[union-attr]
            for name, bridge in bridges.items():
                if not out[name][1]:
                    found = await bridge.call_tool("memory_search", {"query": "kiln hot"})
                    out[name] = (bridge.agent, False,
                                 str(found.content[0].text))  # type: ignore[union-attr]

    asyncio.run(main())
    return out


def test_names_the_daemon_took_for_no_name_get_memory(daemon: Any) -> None:
    # A tab, a no-break space (pasted), an ideographic space, 300 characters, only
    # spaces: each agent gets memory of its own instead of every call refused.
    names = ["Sales\tBot", "Sales\u00a0Bot", "研究\u3000助手", "z" * 300, "   "]
    seen = _bridge_notes(daemon.socket_path, names)
    for name, (_, refused, found) in seen.items():
        assert not refused, (name, found)
        assert f"The kiln of {name!r} is hot." in found, (name, found)
        assert sum(f"The kiln of {other!r}" in found for other in names) == 1, (name, found)
    # "Sales Bot" makes the id of "Sales\tBot": it is that one's, and stays so.
    later = _bridge_notes(daemon.socket_path, ["Sales Bot", "Sales\tBot"])
    said, owner = later["Sales Bot"][2], owner_name("Sales\tBot")
    assert later["Sales Bot"][1] and f"agent {owner!r}" in said, later
    assert not later["Sales\tBot"][1]
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    assert {seen[n][0] for n in names} <= set(listed)


def test_names_alike_but_for_unicode_normalisation_are_one_agent(daemon: Any) -> None:
    composed, decomposed = "Café Noir", unicodedata.normalize("NFD", "Café Noir")
    assert composed != decomposed
    assert workspace_id(composed) == workspace_id(decomposed) == workspace_name(decomposed)
    assert session_key("会话 " + composed) == session_key("会话 " + decomposed)
    seen = _bridge_notes(daemon.socket_path, [composed, decomposed])
    assert seen[composed][0] == seen[decomposed][0]
    assert not seen[decomposed][1], seen  # not refused as another agent's
    for _, _, found in seen.values():
        assert found.count("The kiln of") == 2, found


def _earlier_digest_id(name: str) -> str:
    """The id a name not in NFC form had before: the digest of its form as given."""
    base = workspace_name(name).rsplit("-", 1)[0]
    return f"{base}-{hashlib.blake2s(name.encode(), digest_size=4).hexdigest()}"


def test_a_workspace_under_an_id_a_name_had_before_keeps_serving_it(daemon: Any) -> None:
    # Opened under the ids earlier versions gave these names (by id, as a bridge did),
    # each with a note: the bridges of those names keep finding them there.
    decomposed = unicodedata.normalize("NFD", "Zoë")
    earlier = {".alice": ".alice", "bob.": "bob.", "...": "...",
               decomposed: _earlier_digest_id(decomposed)}
    with Client(daemon.socket_path) as c:
        for name, agent_id in earlier.items():
            assert workspace_id(name) != agent_id if name != "..." else True
            c.workspace_open(agent_id, name=name)
            c.add_note(agent_id, f"The kiln of {name!r} is hot.")
    seen = _bridge_notes(daemon.socket_path, list(earlier), note="The kiln is cold.")
    for name, agent_id in earlier.items():
        assert seen[name][:2] == (agent_id, False), (name, seen[name])
        assert f"The kiln of {name!r} is hot." in seen[name][2]
    # A daemon that never had them: the ids every integration gives these names now.
    with Client(daemon.socket_path) as c:
        for agent_id in earlier.values():
            c.workspace_close(agent_id, forget=True)
    fresh = _bridge_notes(daemon.socket_path, [".carol", "dave."])
    assert [fresh[n][0] for n in (".carol", "dave.")] == ["carol", "dave"]
    assert workspace_id(".carol") == workspace_name(".carol") == "carol"
    refused = _bridge_notes(daemon.socket_path, ["...."])
    assert refused["...."][1] and "makes no workspace name" in refused["...."][2]
    assert "default" not in {w["agent_id"] for w in daemon.call("workspace.list")[
        "workspaces"] if w.get("name")}


def test_workspace_list_names_each_workspaces_owner(daemon: Any) -> None:
    # Which agent a workspace is for shows in the list, open or closed, so that an
    # operator told "Sales_Bot is 'Sales Bot''s" can see it before handing it over.
    with Client(daemon.socket_path) as c:
        c.workspace_open(workspace_id("Sales Bot"), name="Sales Bot")
        c.workspace_open(workspace_id("研究助手"), name="研究助手")
        c.workspace_open("by_id_only")
        c.workspace_close(workspace_id("研究助手"))
        listed = {w["agent_id"]: w for w in c.workspace_list()}
    assert listed["Sales_Bot"]["name"] == "Sales Bot"
    assert listed[workspace_id("研究助手")]["state"] == "closed"
    assert listed[workspace_id("研究助手")]["name"] == "研究助手"
    assert "name" not in listed["by_id_only"]


@pytest.mark.parametrize(("name", "taken"), [("!!!", True), ("a b", True), ("..", False),
                                             ("", False)])
def test_cli_agent_argument_refuses_what_the_middleware_refuses(name: str, taken: bool) -> None:
    # `recalld mcp --agent` checks a name as the middleware maps it: refused exactly when
    # workspace_id refuses it ("!!!" makes "_", as an AgentScope agent of that name).
    if taken:
        assert agent_name(name) == name and workspace_id(name)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            agent_name(name)


def _said(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


def test_an_empty_session_id_is_one_session_and_an_empty_query_is_refused(
        daemon: Any) -> None:
    # A host that gives "" as its conversation id: its turns and its notes are one
    # session (as the AgentScope middleware maps ""), not the turns in session-<digest>
    # and the notes in the default one; a search for nothing is refused as memory_recall
    # and `recalld search ""` refuse it, not answered "(no results)".
    async def main() -> list[Any]:
        async with AsyncClient(daemon.socket_path) as client:
            b = Bridge(client, "host", "host")
            return [await b.call_tool("memory_add_turns", {
                        "session_id": "", "messages": [{"role": "user", "content": "hi"}]}),
                    await b.call_tool("memory_add_note", {"content": "kiln at 1200C",
                                                          "session_id": ""}),
                    await b.call_tool("memory_search", {"query": ""}),
                    await b.call_tool("memory_search", {"query": " \t"})]

    turns, note, *searches = asyncio.run(main())
    assert not turns.is_error and not note.is_error, (_said(turns), _said(note))
    assert note.structured_content["session_id"] == session_key("")
    assert turns.structured_content["session_id"] == session_key("")
    for found in searches:
        assert found.is_error and "the query is empty" in _said(found), _said(found)
