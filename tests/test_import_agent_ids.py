"""``recalld import-qwenpaw`` and agent ids: agents named in other scripts, one recorded at
another folder, ids given by earlier versions, the imported workspace owned by its agent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import DaemonHandle
from test_import_qwenpaw import cli

from recalld.ipc.aclient import AsyncClient
from recalld.ipc.agent_ids import workspace_id
from recalld.ipc.errors import InvalidParams
from recalld.ipc.mcp_bridge import Bridge


def test_import_of_agents_named_in_other_scripts(daemon: DaemonHandle, tmp_path: Path) -> None:
    # QwenPaw agents named 研究助手 and 写作助手 (in agent.json, or only as the folder):
    # each its own workspace, the same one at every import, never `default`.
    seen: dict[str, str] = {}
    for name, agent in (("研究助手", None), ("写作助手", None), ("paw3", "研究助手2"),
                        ("paw4", "写作助手2")):
        ws = tmp_path / name
        (ws / "memory" / "2026-01-02").mkdir(parents=True)
        (ws / "memory" / "2026-01-02" / "n.md").write_text(f"- the fern of {name}\n")
        if agent is not None:
            (ws / "agent.json").write_text(json.dumps({"id": agent, "running": {}}), "utf-8")
        proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        seen[name] = json.loads(proc.stdout)["agent_id"]
    assert len(set(seen.values())) == 4 and "default" not in seen.values(), seen
    again = cli(daemon, "--json", "import-qwenpaw", str(tmp_path / "研究助手"))
    assert again.returncode == 0 and json.loads(again.stdout)["agent_id"] == seen["研究助手"]
    for name, agent_id in seen.items():
        hits = daemon.call("memory.search", {"agent_id": agent_id, "query": "fern"})
        assert [h["text"].strip() for h in hits["results"]] == [f"- the fern of {name}"]


def test_an_agent_recorded_at_another_folder_keeps_its_id(daemon: DaemonHandle,
                                                          tmp_path: Path) -> None:
    # Three QwenPaw homes (three machines), each with an agent `coder`: each folder gets
    # an id of its own, also while the first is closed (recorded, reopened at start).
    folders = [tmp_path / f"home{i}" / "coder" for i in range(3)]
    for folder in folders:
        (folder / "memory" / "2026-01-02").mkdir(parents=True)
        (folder / "memory" / "2026-01-02" / "n.md").write_text(f"- the fern of {folder}\n")
        (folder / "agent.json").write_text(json.dumps({"id": "coder", "running": {}}))
    ids = []
    for folder in folders:
        proc = cli(daemon, "--json", "import-qwenpaw", str(folder))
        assert proc.returncode == 0, proc.stderr
        ids.append(json.loads(proc.stdout)["agent_id"])
        if len(ids) == 1:
            daemon.call("workspace.close", {"agent_id": "coder"})
    assert ids == ["coder", "qwenpaw-coder", "qwenpaw-coder-2"]
    listed = {w["agent_id"]: w for w in daemon.call("workspace.list")["workspaces"]}
    assert listed["coder"]["path"] == str(folders[0]) and listed["coder"]["registered"]
    again = cli(daemon, "--json", "import-qwenpaw", str(folders[0]))
    assert again.returncode == 0 and json.loads(again.stdout)["agent_id"] == "coder"


def test_an_agent_finds_what_was_imported_for_it_also_after_an_earlier_import(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # QwenPaw agents "Sales Bot" and "Back.Office!": the import gives each the id its
    # MCP bridge (and AgentScope middleware) uses. A folder imported before under the id
    # earlier versions gave ("Sales-Bot") moves to it: one workspace, each note once.
    folders = {}
    for name in ("Sales Bot", "Back.Office!"):
        ws = tmp_path / name.replace(" ", "_")
        (ws / "memory" / "2026-01-02").mkdir(parents=True)
        (ws / "memory" / "2026-01-02" / "n.md").write_text(f"- the ledger of {name}\n")
        (ws / "agent.json").write_text(json.dumps({"id": name, "running": {}}), "utf-8")
        folders[name] = ws
    daemon.call("workspace.open", {"agent_id": "Sales-Bot", "path": str(folders["Sales Bot"])})
    for name, ws in folders.items():
        proc = cli(daemon, "import-qwenpaw", str(ws))
        assert proc.returncode == 0, proc.stderr
        assert f"as agent {workspace_id(name)}" in proc.stdout
        assert ("imported before as agent Sales-Bot" in proc.stdout) == (name == "Sales Bot")

    async def searched(name: str) -> str:
        async with AsyncClient(daemon.socket_path) as client:
            found = await Bridge(client, workspace_id(name), name).call_tool(
                "memory_search", {"query": "ledger"})
        assert not found.is_error
        return str(found.content[0].text)  # type: ignore[union-attr]

    for name in folders:
        text = asyncio.run(searched(name))
        assert text.count("- the ledger of") == 1 and f"the ledger of {name}" in text, text
    at = [w["agent_id"] for w in daemon.call("workspace.list")["workspaces"]
          if w["path"] == str(folders["Sales Bot"])]
    assert at == ["Sales_Bot"]
    again = cli(daemon, "--json", "import-qwenpaw", str(folders["Sales Bot"]))
    assert again.returncode == 0 and json.loads(again.stdout)["agent_id"] == "Sales_Bot"
    assert "moved_from" not in json.loads(again.stdout)


def test_the_imported_workspace_is_the_qwenpaw_agents(daemon: DaemonHandle,
                                                       tmp_path: Path) -> None:
    # The import names the workspace after agent.json's id and records that name as its
    # owner: another agent whose name makes the same id ("Sales_Bot") is refused rather
    # than taking over the memory imported for "Sales Bot", who finds it.
    ws = tmp_path / "sales"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "n.md").write_text("- the ledger\n", "utf-8")
    (ws / "agent.json").write_text(json.dumps({"id": "Sales Bot", "running": {}}), "utf-8")
    proc = cli(daemon, "--json", "import-qwenpaw", str(ws))
    assert proc.returncode == 0, proc.stderr
    agent = json.loads(proc.stdout)["agent_id"]
    assert agent == workspace_id("Sales Bot")
    with pytest.raises(InvalidParams, match="both have the agent id"):
        daemon.call("workspace.open", {"agent_id": agent, "name": "Sales_Bot"})
    opened = daemon.call("workspace.open", {"agent_id": agent, "name": "Sales Bot"})
    assert opened["path"] == str(ws)
    # Given --agent, the id is the user's choice, not the agent's name: nothing recorded.
    other = tmp_path / "other"
    (other / "memory").mkdir(parents=True)
    (other / "agent.json").write_text(json.dumps({"id": "Ops Bot", "running": {}}), "utf-8")
    proc = cli(daemon, "--json", "import-qwenpaw", "--agent", "ops", str(other))
    assert proc.returncode == 0, proc.stderr
    assert daemon.call("workspace.open", {"agent_id": "ops", "name": "ops"})["path"] == str(other)
