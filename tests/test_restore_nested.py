"""A backup and a restore of a workspace that holds another agent's (each shared with the
other, as the daemon allows): the other's files are its own, backed up and restored with
it alone."""

from __future__ import annotations

import shutil
import stat
import zipfile
from pathlib import Path

from conftest import DaemonFactory
from test_backup import tree, write_tree


def test_a_restore_leaves_the_files_of_a_workspace_inside_alone(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The restore of the outer workspace removed the inner one's notes written since its
    # backup and put back the inner one's edited notes: another agent's memory changed,
    # with no snapshot of its own and while it served.
    outer = tmp_path / "team"
    inner = outer / "memory" / "sub"
    write_tree(outer, {"memory/2026-07-24/plan.md": "Die Fähre fährt um acht.\n"})
    write_tree(inner, {"memory/2026-07-24/log.md": "Лодка ждёт у пристани.\n"})
    d = daemon_factory(f'[workspaces.team]\npath = "{outer}"\nshared_with = ["sub"]\n'
                       f'[workspaces.sub]\npath = "{inner}"\nshared_with = ["team"]\n')
    archive = d.call("backup.create", {"agents": ["team"]})["file"]

    # Since the backup: each writes a note and edits one.
    write_tree(outer, {"memory/2026-07-25/later.md": "Nicht im Backup.\n",
                       "memory/2026-07-24/plan.md": "Die Fähre fährt um neun.\n"})
    write_tree(inner, {"memory/2026-07-25/later.md": "Не в резервной копии.\n",
                       "memory/2026-07-24/log.md": "Лодка ушла.\n"})
    inner_before = tree(inner)
    plan = d.call("backup.restore", {"file": archive, "dry_run": True})["plans"][0]
    assert plan["removes"] == ["memory/2026-07-25/later.md"], plan
    done = d.call("backup.restore", {"file": archive})["restored"][0]
    assert (done["written"], done["removed"]) == (1, 1), done
    assert tree(inner) == inner_before
    assert (outer / "memory/2026-07-24/plan.md").read_text() == "Die Fähre fährt um acht.\n"
    assert not (outer / "memory/2026-07-25/later.md").exists()
    found = d.call("memory.search", {"agent_id": "sub", "query": "ушла", "sync": True})
    assert [r["path"] for r in found["results"]] == ["memory/2026-07-24/log.md"]


def test_a_backup_holds_the_files_of_a_workspace_inside_only_as_its_own(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The outer workspace's backup held the inner one's notes and state (its pending
    # turns) as its own notes: restored on another machine, the inner agent's turns were
    # written as a note is, readable by others, and would be mixed into the outer's.
    outer = tmp_path / "team"
    inner = outer / "memory" / "sub"
    write_tree(outer, {"memory/2026-07-24/plan.md": "Die Fähre fährt um acht.\n"})
    write_tree(inner, {"memory/2026-07-24/log.md": "Лодка ждёт у пристани.\n"})
    config = (f'[workspaces.team]\npath = "{outer}"\nshared_with = ["sub"]\n'
              f'[workspaces.sub]\npath = "{inner}"\nshared_with = ["team"]\n')
    d = daemon_factory(config)
    d.call("memory.add_turns", {"agent_id": "sub", "session_id": "s", "messages": [
        {"role": "user", "content": "мой личный план"}]})
    made = d.call("backup.create", {"agents": ["team"]})
    with zipfile.ZipFile(made["file"]) as zf:
        names = zf.namelist()
    assert [n for n in names if "memory/sub" in n] == [], names
    assert "agents/team/memory/2026-07-24/plan.md" in names
    every = d.call("backup.create", {})["file"]
    with zipfile.ZipFile(every) as zf:
        names = zf.namelist()
    assert [n for n in names if "memory/sub" in n] == [], names
    assert "agents/sub/memory/2026-07-24/log.md" in names
    assert d.stop() == 0

    shutil.rmtree(outer)
    fresh = daemon_factory(None)
    restored = fresh.call("backup.restore", {"file": every})["restored"]
    assert sorted(r["agent_id"] for r in restored) == ["default", "sub", "team"]
    pending = inner / "mem_metadata" / "sessions" / "pending.jsonl"
    assert "мой личный план" in pending.read_text(encoding="utf-8")
    assert stat.S_IMODE(pending.stat().st_mode) == 0o600
    found = fresh.call("memory.search", {"agent_id": "sub", "query": "пристани",
                                         "sync": True})
    assert [r["path"] for r in found["results"]] == ["memory/2026-07-24/log.md"]
