"""A search of several workspaces when one of them is away (closed by its agent, being
restored): the others are searched and the answer names the one passed by and why; only
a search none of whose workspaces is open fails, and a refusal to read still fails, also
for a workspace that is away."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DaemonFactory
from test_links_daemon import write

from recalld.ipc.errors import NotAllowed, UnknownWorkspace


def test_a_closed_workspace_is_passed_by_and_named(daemon_factory: DaemonFactory,
                                                   tmp_path: Path) -> None:
    config = ""
    for agent in ("ann", "ben", "cat"):
        root = tmp_path / agent
        shared = '["ann"]' if agent != "cat" else "[]"
        config += f'[workspaces.{agent}]\npath = "{root}"\nshared_with = {shared}\n'
        write(root, f"memory/2026-09-01/{agent}.md", f"# {agent}\nthe otter pond of {agent}\n")
    d = daemon_factory(config)
    for agent in ("ann", "ben"):
        d.call("index.sync", {"agent_id": agent})
    both = d.call("memory.search", {"agent_id": "ann", "query": "otter pond",
                                    "agents": ["ann", "ben"]})
    assert {r["agent_id"] for r in both["results"]} == {"ann", "ben"} and "skipped" not in both
    assert d.call("workspace.close", {"agent_id": "ben"})["closed"]
    answer = d.call("memory.search", {"agent_id": "ann", "query": "otter pond",
                                      "agents": ["ben", "ann", "nobody-here"]})
    assert {r["agent_id"] for r in answer["results"]} == {"ann"}
    assert answer["agents"] == ["ann"]
    assert sorted(answer["skipped"]) == ["ben", "nobody-here"]
    assert "not open" in answer["skipped"]["ben"], answer["skipped"]
    with pytest.raises(UnknownWorkspace, match="ben"):  # none of them is open
        d.call("memory.search", {"agent_id": "ann", "query": "otter", "agents": ["ben"]})
    with pytest.raises(NotAllowed):  # a refusal is never passed by
        d.call("memory.search", {"agent_id": "ann", "query": "otter",
                                 "agents": ["ann", "ben", "cat"]})
    # Nor does it pass for being away: a workspace ann may not read is refused while it
    # is closed too, not named as one that is merely not open.
    assert d.call("workspace.close", {"agent_id": "cat"})["closed"]
    with pytest.raises(NotAllowed, match="cat"):
        d.call("memory.search", {"agent_id": "ann", "query": "otter",
                                 "agents": ["ann", "cat"]})
    with pytest.raises(NotAllowed, match="cat"):
        d.call("memory.read", {"agent_id": "cat", "path": "memory/2026-09-01/cat.md",
                               "as_agent": "ann"})
    with pytest.raises(UnknownWorkspace, match="cat"):  # its owner is told it is closed
        d.call("memory.read", {"agent_id": "cat", "path": "memory/2026-09-01/cat.md"})
