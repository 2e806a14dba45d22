"""``workspace.open`` without a path: the workspace where it is open, else where it is
recorded, else its configured or default place. That is what a bridge or a middleware
sends, for an agent whose workspace was opened elsewhere (``recalld workspace open X
--path DIR``). From outside: a real daemon, real folders."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle


def test_an_open_without_a_path_finds_the_workspace_where_it_is(daemon: DaemonHandle,
                                                                tmp_path: Path) -> None:
    home = tmp_path / "coder-memory"
    (home / "memory" / "2026-11-30").mkdir(parents=True)
    (home / "memory" / "2026-11-30" / "n.md").write_text("the quokka lives in Perth\n")
    first = daemon.call("workspace.open", {"agent_id": "coder", "path": str(home)})
    assert first["path"] == str(home.resolve())

    again = daemon.call("workspace.open", {"agent_id": "coder"})  # open: served as it is
    assert again["path"] == first["path"] and again["opened_at"] == first["opened_at"]

    daemon.call("workspace.close", {"agent_id": "coder"})
    reopened = daemon.call("workspace.open", {"agent_id": "coder"})  # recorded there
    assert reopened["path"] == first["path"]
    found = daemon.call("memory.search", {"agent_id": "coder", "query": "quokka",
                                          "sync": True})
    assert [r["path"] for r in found["results"]] == ["memory/2026-11-30/n.md"]
    assert not (daemon.data_dir / "workspaces" / "coder").exists()

    # Forgotten, it has no place but the default one.
    daemon.call("workspace.close", {"agent_id": "coder", "forget": True})
    fresh = daemon.call("workspace.open", {"agent_id": "coder"})
    assert fresh["path"] == str((daemon.data_dir / "workspaces" / "coder").resolve())
