"""``recalld import-qwenpaw`` of a folder that is not an agent's workspace but holds them,
or lies inside one: refused with the command to give, and nothing is made there."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from conftest import DaemonHandle
from test_import_qwenpaw import cli

from recalld.ipc.errors import InvalidParams


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_folder_of_the_agents_workspaces_or_one_inside_a_workspace_is_refused(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # ~/.qwenpaw/workspaces holds every agent's folder: one with its agent.json, one
    # that only has ReMe's store. Served as one workspace it would get folders of its
    # own among the agents' and keep each agent from being imported.
    spaces = tmp_path / "qwenpaw" / "workspaces"
    for agent in ("coder", "my writer"):
        (spaces / agent / "memory" / "2026-01-02").mkdir(parents=True)
        (spaces / agent / "memory" / "2026-01-02" / "n.md").write_text("- the fern\n")
    (spaces / "coder" / "agent.json").write_text(json.dumps({"id": "coder"}))
    (spaces / "my writer" / "mem_metadata" / "file_store").mkdir(parents=True)
    (spaces / "notes").mkdir()  # not an agent's
    before = tree(spaces)
    proc = cli(daemon, "import-qwenpaw", str(spaces))
    assert proc.returncode == 2, proc.stdout
    assert f"{spaces} holds the workspaces of QwenPaw agents; import each" in proc.stderr
    assert f"recalld import-qwenpaw {spaces / 'coder'}" in proc.stderr
    assert f"recalld import-qwenpaw {shlex.quote(str(spaces / 'my writer'))}" in proc.stderr
    assert "notes" not in proc.stderr.replace(str(spaces), "")
    # A folder of an agent's workspace (its memory folder, a day of it) is not one either.
    for inside in ("coder/memory", "my writer/memory/2026-01-02"):
        proc = cli(daemon, "import-qwenpaw", str(spaces / inside))
        assert proc.returncode == 2, proc.stdout
        agent = spaces / inside.split("/")[0]
        assert (f"{spaces / inside} lies inside the QwenPaw workspace {agent}; import it: "
                f"recalld import-qwenpaw {shlex.quote(str(agent))}") in proc.stderr
    assert tree(spaces) == before
    listed = daemon.call("workspace.list")["workspaces"]
    assert [w["agent_id"] for w in listed] == ["default"], listed
    for agent in ("coder", "my writer"):
        proc = cli(daemon, "import-qwenpaw", str(spaces / agent))
        assert proc.returncode == 0 and "notes:    1" in proc.stdout, proc.stderr


def test_qwenpaw_home_whose_config_json_qwenpaw_has_to_repair_is_still_its_home(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # QwenPaw reads a hand-edited config.json with comments or trailing commas by
    # repairing it. Not parsed here, the home was not known for one: import-qwenpaw and
    # workspace.open served it as a workspace, making recalld's folders in ~/.qwenpaw.
    home = tmp_path / "qwenpaw"
    ws = home / "workspaces" / "alpha"
    (ws / "memory" / "2026-01-02").mkdir(parents=True)
    (ws / "memory" / "2026-01-02" / "n.md").write_text("- the otter\n", "utf-8")
    (ws / "agent.json").write_text(json.dumps({"id": "alpha"}), "utf-8")
    (home / "workspaces" / "notes").mkdir()  # not an agent's
    profiles = json.dumps({"alpha": {"id": "alpha", "workspace_dir": str(ws)}})
    for text in ('{\n  // the agents\n  "agents": {"profiles": ' + profiles + '}\n}\n',
                 '{"agents": {"profiles": ' + profiles + ',},}',
                 '{"agents": {"active_agent": "alpha"}}'):
        (home / "config.json").write_text(text, "utf-8")
        before = tree(home)
        proc = cli(daemon, "import-qwenpaw", str(home))
        assert proc.returncode == 2, proc.stdout
        assert (f"{home} is QwenPaw's home, not an agent's workspace; import each agent's "
                f"workspace (alpha: recalld import-qwenpaw {ws})") in proc.stderr, text
        with pytest.raises(InvalidParams, match="QwenPaw's home, not an agent's workspace"):
            daemon.call("workspace.open", {"agent_id": "home", "path": str(home)})
        assert tree(home) == before
    listed = daemon.call("workspace.list")["workspaces"]
    assert [w["agent_id"] for w in listed] == ["default"], listed
