"""More workspaces than the per-user inotify instance limit and than a low soft limit on
open files allows, all watched and served by one daemon."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory
from hooks import start_hook
from waits import wait_for

from recalld.daemon import inotify
from recalld.ipc import errors
from recalld.ipc.client import Client

pytestmark = pytest.mark.skipif(not inotify.available(), reason="inotify is Linux-only")


def inotify_instances(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue  # closed meanwhile
    return count


#: Start hook: the daemon starts with a soft limit of 64 open files (the hard one as it
#: is), as one started in a session's 1024 is for a few hundred agents.
LOW_SOFT_LIMIT = "\n".join([
    "import resource",
    "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]",
    "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))"])


def test_more_workspaces_than_inotify_instances_are_all_watched(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The per-user limit on inotify instances is often 128 for every program of the user
    # together: a daemon holding one per workspace stopped watching after a few dozen.
    # Each open workspace also keeps a few descriptors open: past the soft limit on open
    # files the next one failed to open, and every agent's calls with "internal error".
    daemon = daemon_factory(**start_hook(tmp_path, LOW_SOFT_LIMIT))
    assert "open files limit raised from 64 to" in daemon.log()
    agents = [f"agent-{i:03d}" for i in range(140)]
    with Client(daemon.socket_path) as c:
        roots = [Path(c.workspace_open(a)["path"]) for a in agents]

    def watchers() -> dict[str, Any] | None:
        listed = daemon.call("workspace.list")["workspaces"]
        states = {w["agent_id"]: w["index"]["watcher"]["state"] for w in listed
                  if w["agent_id"] in agents}
        return states if set(states.values()) == {"watching"} else None

    wait_for(watchers, "every workspace's watcher to watch")
    assert inotify_instances(daemon.pid) == 1
    # A note written into the first and the last is found through its watch.
    for i in (0, 139):
        note = roots[i] / "memory" / "2026-12-01" / "stove.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"# Stove\nThe stove of agent {i} is a Morsø 7110.\n", encoding="utf-8")
        hits = daemon.call("memory.search", {"agent_id": agents[i], "query": "Morsø stove",
                                             "sync": True})["results"]
        assert [h["path"] for h in hits] == ["memory/2026-12-01/stove.md"]
    assert daemon.call("workspace.close", {"agent_id": agents[5]})
    assert inotify_instances(daemon.pid) == 1


def index_copies(pid: int, root: Path) -> int:
    """Open descriptors of ``root``'s private copies of its mapped index files."""
    prefix = f"{root}/mem_metadata/index/#"
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix)
        except OSError:
            continue  # closed meanwhile
    return count


def test_a_closed_workspace_lets_go_of_its_mapped_index(daemon: Any) -> None:
    # Its index state stayed in reference cycles among its services, freed only by a full
    # garbage collection that an idle daemon may not run for hours: each close (and each
    # close and reopen) kept the private copies of its mapped files open, their disk
    # space and descriptors with them.
    root = Path(daemon.call("workspace.open", {"agent_id": "w"})["path"])
    daemon.call("memory.add_note", {"agent_id": "w", "content": "the lynx hunts at dusk"})
    daemon.call("index.sync", {"agent_id": "w"})
    daemon.call("index.compact", {"agent_id": "w"})
    assert index_copies(daemon.pid, root) > 0
    for _ in range(2):
        daemon.call("workspace.close", {"agent_id": "w"})
        assert index_copies(daemon.pid, root) == 0
        daemon.call("workspace.open", {"agent_id": "w"})
        hits = daemon.call("memory.search", {"agent_id": "w", "query": "lynx"})["results"]
        assert len(hits) == 1


def test_a_failed_workspace_opened_again_lets_go_of_the_one_it_replaces(
        daemon: Any, tmp_path: Path) -> None:
    # The failed one stayed in the registry's reference cycles after the open that
    # replaced it, its mapped files' private copies open, until a full collection.
    root = tmp_path / "ws"
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    daemon.call("memory.add_note", {"agent_id": "w", "content": "the lynx hunts at dusk"})
    daemon.call("index.sync", {"agent_id": "w"})
    daemon.call("index.compact", {"agent_id": "w"})
    one = index_copies(daemon.pid, root)
    assert one > 0
    (tmp_path / "other").mkdir()
    for _ in range(2):
        # A link takes the folder's place: the next use fails the workspace.
        root.rename(tmp_path / "away")
        root.symlink_to(tmp_path / "other")
        with pytest.raises(errors.RecalldError, match="now leads to"):
            daemon.call("memory.add_note", {"agent_id": "w", "content": "not here"})
        root.unlink()
        (tmp_path / "away").rename(root)
        assert daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
        hits = daemon.call("memory.search", {"agent_id": "w", "query": "lynx"})["results"]
        assert len(hits) == 1
        assert index_copies(daemon.pid, root) == one
