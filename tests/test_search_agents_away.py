"""A search of several workspaces when one of them is away (closed by its agent, being
restored): the others are searched and the answer names the one passed by and why; only
a search none of whose workspaces is open fails, and a refusal to read still fails, also
for a workspace that is away."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DaemonFactory
from test_links_daemon import write

from recalld.ipc.errors import InvalidParams, NotAllowed, UnknownWorkspace


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


def test_recalld_search_names_the_agents_it_passed_by(daemon_factory: DaemonFactory,
                                                      tmp_path: Path) -> None:
    import json

    from test_cli import recalld

    config = ""
    for agent in ("dora", "emil", "finn"):
        root = tmp_path / agent
        config += f'[workspaces.{agent}]\npath = "{root}"\nshared_with = ["dora"]\n'
        write(root, f"memory/2026-09-02/{agent}.md", f"# {agent}\nthe heron weir of {agent}\n")
    d = daemon_factory(config)
    for agent in ("dora", "emil", "finn"):
        d.call("index.sync", {"agent_id": agent})
    assert d.call("workspace.close", {"agent_id": "emil"})["closed"]
    shown = recalld("search", "heron weir", "--agent", "dora", "--agents",
                    "finn, emil,dora,finn", env=d.env)
    assert shown.returncode == 0, shown.stderr
    assert "[dora] memory/2026-09-02/dora.md" in shown.stdout
    assert "[finn] memory/2026-09-02/finn.md" in shown.stdout
    assert shown.stdout.endswith("not searched:\n  emil: workspace 'emil' is not open\n"), \
        shown.stdout
    answer = json.loads(recalld("search", "heron weir", "--agent", "dora", "--agents",
                                "emil,finn", "--json", env=d.env).stdout)
    assert {r["agent_id"] for r in answer["results"]} == {"finn"}
    assert list(answer["skipped"]) == ["emil"]
    # Nothing found where it looked: said, and where it did not look.
    nothing = recalld("search", "kingfisher", "--agent", "dora", "--agents", "emil,finn",
                      env=d.env)
    assert nothing.stdout == "no results\nnot searched:\n  emil: workspace 'emil' is not open\n"
    bad = recalld("search", "heron", "--agents", "dora,,finn", env=d.env)
    assert bad.returncode == 2 and "comma-separated list of agents" in bad.stderr, bad.stderr


def test_a_search_names_at_most_64_workspaces(daemon_factory: DaemonFactory,
                                              tmp_path: Path) -> None:
    # A name given twice counts once; 64 names are searched (those not open passed by),
    # 65 are refused with the limit named.
    root = tmp_path / "ann"
    write(root, "memory/2026-09-01/ann.md", "# ann\nthe otter pond\n")
    d = daemon_factory(f'[workspaces.ann]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "ann"})
    answer = d.call("memory.search", {"agent_id": "ann", "query": "otter",
                                      "agents": ["ann"] * 500})
    assert answer["agents"] == ["ann"] and len(answer["results"]) == 1
    others = [f"away{i}" for i in range(63)]
    answer = d.call("memory.search", {"agent_id": "ann", "query": "otter",
                                      "agents": ["ann", *others]})
    assert answer["agents"] == ["ann"] and sorted(answer["skipped"]) == sorted(others)
    with pytest.raises(InvalidParams, match="at most 64 workspaces"):
        d.call("memory.search", {"agent_id": "ann", "query": "otter",
                                 "agents": ["ann", *others, "away63"]})
