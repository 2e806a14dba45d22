"""Agent names that make one agent id ("Sales Bot", "Sales_Bot", "Sales #Bot" ...): the
first to open the workspace owns it, the daemon refuses the others by name (also after
a restart and for a workspace recorded before names were); names that make no id at
all are refused by the client libraries instead of being taken for ``default``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import workspace_id, workspace_name
from recalld.ipc.client import Client
from recalld.ipc.errors import InvalidParams
from recalld.ipc.mcp import Bridge


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
            await first._open()
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
