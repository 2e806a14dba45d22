"""A workspace folder replaced by a link to another agent's workspace while it is open.

The daemon keeps a workspace's resolved folder; its readers, scans and index writes work
by path. A link put in the folder's place (``mv bob bob.old; ln -s alice bob``) led all
of them into the other workspace: bob's search and ``memory.read`` served alice's
isolated notes, and bob's index was saved into alice's metadata folder. Now bob stops
(``failed``, saying where its folder leads) and nothing of alice's reaches it. Real
daemon, real socket, real files and links.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle
from waits import wait_value, workspace_status

from recalld.ipc import errors

CONFIG = """
[workspaces.alice]

[workspaces.bob]
"""
NOTE = "memory/2026-07-03/facts.md"


def _open(daemon: DaemonHandle, agent: str, text: str) -> Path:
    root = Path(daemon.call("workspace.open", {"agent_id": agent})["path"])
    (root / NOTE).parent.mkdir(parents=True, exist_ok=True)
    (root / NOTE).write_text(f"# Facts\n\n{text}\n", encoding="utf-8")
    daemon.call("index.sync", {"agent_id": agent})
    return root


def _bob_sees(daemon: DaemonHandle) -> str:
    """What bob's search and read give for alice's word: their texts, or the refusal."""
    try:
        found = daemon.call("memory.search", {"agent_id": "bob", "query": "quokkaword",
                                              "sync": True})
        read = daemon.call("memory.read", {"agent_id": "bob", "path": NOTE})
    except errors.UnknownWorkspace as exc:
        return f"refused: {exc.message}"
    return found["rendered"] + read["text"]


def test_a_link_in_place_of_the_folder_stops_the_workspace(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    daemon = daemon_factory(CONFIG, **env)
    alice = _open(daemon, "alice", "Alice keeps the quokkaword in her isolated notes.")
    bob = _open(daemon, "bob", "Bob deploys on Fridays.")
    os.rename(bob, bob.with_name("bob.old"))
    os.symlink(alice, bob)

    def refused() -> str | None:
        seen = _bob_sees(daemon)
        assert "quokkaword" not in seen, f"bob was served alice's note: {seen}"
        return seen if seen.startswith("refused") else None

    refusal = wait_value(refused, bool, "bob stopped once its folder led to alice's", 60)
    assert f"now leads to {alice}" in str(refusal)
    entry = workspace_status(daemon, "bob")
    assert entry is not None and entry["state"] == "failed"
    assert f"now leads to {alice}" in entry["error"]

    # Alice is served as before, and her index holds only her notes.
    hits = daemon.call("memory.search", {"agent_id": "alice", "query": "quokkaword"})
    assert [h["path"] for h in hits["results"]] == [NOTE]
    assert not daemon.call("memory.search", {"agent_id": "alice",
                                             "query": "Fridays"})["results"]
    daemon.stop()
    daemon = daemon_factory(CONFIG, **env)
    assert not daemon.call("memory.search", {"agent_id": "alice",
                                             "query": "Fridays"})["results"]
    # At the next start, bob's recorded folder is alice's: refused, not opened.
    entry = workspace_status(daemon, "bob")
    assert entry is not None and entry["state"] == "failed"


def test_status_alone_tells_a_replaced_folder_with_no_timer(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Nothing looks at the folder on a timer (an idle daemon wakes for nothing): the next
    # use does, and a status is one.
    daemon = daemon_factory(CONFIG, RECALLD_DATA_DIR=str(tmp_path / "data"))
    alice = _open(daemon, "alice", "Alice keeps the quokkaword in her isolated notes.")
    bob = _open(daemon, "bob", "Bob deploys on Fridays.")
    os.rename(bob, bob.with_name("bob.old"))
    os.symlink(alice, bob)
    entry = workspace_status(daemon, "bob")
    assert entry is not None and entry["state"] == "failed", entry
    assert f"now leads to {alice}" in entry["error"]
    assert workspace_status(daemon, "alice")["state"] == "ready"  # type: ignore[index]


def test_a_folder_linked_to_anothers_is_never_opened_whoever_opens_first(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # At a start the workspaces open together: bob's folder, now a link to alice's, must
    # not take alice's folder when bob comes first (alice would then be refused and bob
    # serve her notes). Made certain here by closing alice before bob opens.
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    daemon = daemon_factory(CONFIG, **env)
    alice = _open(daemon, "alice", "Alice keeps the quokkaword in her isolated notes.")
    bob = _open(daemon, "bob", "Bob deploys on Fridays.")
    daemon.call("workspace.close", {"agent_id": "bob"})
    os.rename(bob, bob.with_name("bob.old"))
    os.symlink(alice, bob)
    # Closed and forgotten: only the configuration names alice's folder now, as at a
    # start before alice's open has come.
    daemon.call("workspace.close", {"agent_id": "alice", "forget": True})
    try:
        daemon.call("workspace.open", {"agent_id": "bob"})
    except errors.InvalidParams as exc:
        assert "through a link to" in exc.message, exc.message
        assert "the folder of workspace 'alice'" in exc.message, exc.message
    else:
        raise AssertionError("bob opened at alice's folder")
    # Named there with "..", through a folder that does not exist: no link to blame.
    dotted = bob.parent / "nowhere" / ".." / alice.name
    try:
        daemon.call("workspace.open", {"agent_id": "bob", "path": str(dotted)})
    except errors.InvalidParams as exc:
        assert f"leads through .. to {alice}, the folder of workspace 'alice': open it " \
               "at a path of its own" in exc.message, exc.message
    else:
        raise AssertionError("bob opened at alice's folder")
    assert daemon.call("workspace.open", {"agent_id": "alice"})["path"] == str(alice)
    hits = daemon.call("memory.search", {"agent_id": "alice", "query": "quokkaword"})
    assert [h["path"] for h in hits["results"]] == [NOTE]


def test_a_memory_folder_moved_out_with_a_link_left_keeps_its_notes(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # `mv memory /elsewhere; ln -s /elsewhere memory` (here: to alice's memory/): the link
    # is not followed out of bob's workspace, and what bob's memory/ holds is unknown,
    # not gone. Every note of it was dropped from bob's index, as from an empty folder.
    daemon = daemon_factory(CONFIG, RECALLD_DATA_DIR=str(tmp_path / "data"))
    alice = _open(daemon, "alice", "Alice keeps the quokkaword in her isolated notes.")
    bob = _open(daemon, "bob", "Bob deploys on Fridays.")
    os.rename(bob / "memory", tmp_path / "bob-memory")
    os.symlink(alice / "memory", bob / "memory")

    def watcher() -> dict[str, Any]:
        entry = workspace_status(daemon, "bob")
        assert entry is not None
        found: dict[str, Any] = entry["index"]["watcher"]
        return found

    def said(cause: str) -> list[str]:
        return [line for line in daemon.log().splitlines()
                if "watch failed" in line and cause in line]

    first = wait_value(watcher, lambda w: "symbolic link" in str(w["why"]),
                       "bob's watcher failed")
    # Its retries (with backoff) meet the same cause: said once, in words, no traceback.
    wait_value(watcher, lambda w: w["errors"] > first["errors"], "a retry of bob's watch")
    linked = said("symbolic link")
    assert len(linked) == 1 and "WARNING" in linked[0], linked
    # A watch set up again between the move and the link found no folder there: another
    # cause, said once too (whether it comes depends on that timing).
    others = [line for line in said("") if "symbolic link" not in line]
    assert len(others) <= 1 and all("No such file or directory" in o for o in others), others
    assert "Traceback" not in daemon.log()
    for query, paths in (("Fridays", [NOTE]), ("quokkaword", [])):
        hits = daemon.call("memory.search", {"agent_id": "bob", "query": query,
                                             "sync": True})["results"]
        assert [h["path"] for h in hits] == paths, query
    assert watcher()["state"] == "failed"

    os.unlink(bob / "memory")
    os.rename(tmp_path / "bob-memory", bob / "memory")
    (bob / NOTE).write_text("# Facts\n\nBob deploys on Tuesdays now.\n", encoding="utf-8")
    wait_value(watcher, lambda w: w["state"] == "watching", "bob's memory/ watched again")
    hits = daemon.call("memory.search", {"agent_id": "bob", "query": "Tuesdays",
                                         "sync": True})["results"]
    assert [h["path"] for h in hits] == [NOTE]
    assert not daemon.call("memory.search", {"agent_id": "bob", "query": "Fridays"})["results"]
    assert daemon.call("index.verify", {"agent_id": "bob"})["ok"] is True
    # Once watched again, the same cause is news again.
    os.rename(bob / "memory", tmp_path / "bob-memory")
    os.symlink(alice / "memory", bob / "memory")
    wait_value(watcher, lambda w: "symbolic link" in str(w["why"]),
               "bob's watcher failed again")
    assert len(said("symbolic link")) == 2


@pytest.mark.parametrize("replaced", ["folder", "metadata_dir"])
def test_the_first_quick_search_after_a_link_took_the_place_is_refused(
        daemon_factory: DaemonFactory, tmp_path: Path, replaced: str) -> None:
    # A short keyword search answers on the connection's reader; deciding that reads
    # no folder, and the search itself still looks, the first time it is asked.
    daemon = daemon_factory(CONFIG, RECALLD_DATA_DIR=str(tmp_path / "data"))
    alice = _open(daemon, "alice", "Alice keeps the quokkaword in her isolated notes.")
    bob = _open(daemon, "bob", "Bob keeps the quokkaword too, in his own notes.")
    query = {"agent_id": "bob", "query": "quokkaword"}
    assert [h["path"] for h in daemon.call("memory.search", query)["results"]] == [NOTE]
    moved, target = ((bob, alice) if replaced == "folder"
                     else (bob / "mem_metadata", alice / "mem_metadata"))
    os.rename(moved, moved.with_name(moved.name + ".old"))
    os.symlink(target, moved)
    with pytest.raises(errors.UnknownWorkspace) as refused:
        daemon.call("memory.search", query)
    assert f"{moved} now leads to {target}" in refused.value.message
    assert [h["path"] for h in daemon.call(
        "memory.search", {"agent_id": "alice", "query": "quokkaword"})["results"]] == [NOTE]


@pytest.mark.parametrize("linked", ["mem_metadata/index", "mem_metadata/sessions",
                                    "mem_session"])
def test_a_link_in_place_of_a_workspace_folder_is_named_once(
        daemon: DaemonHandle, tmp_path: Path, linked: str) -> None:
    # The error names the link where it lies, once: not "index: index is a symbolic link".
    root = tmp_path / "linked-ws"
    (root / linked).parent.mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (root / linked).symlink_to(tmp_path / "other")
    with pytest.raises(errors.RecalldError) as caught:
        daemon.call("workspace.open", {"agent_id": "linked", "path": str(root)})
    message = caught.value.message
    name = linked.rsplit("/", 1)[-1]
    assert message.count(name) == 1 and "is a symbolic link" in message, message
