"""Fault and path containment seen from outside: a real daemon, a real socket, real files.

A workspace that cannot open at start is ``failed`` with its reason while the daemon serves
the others.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from clirun import run_recalld
from conftest import DaemonFactory, DaemonHandle
from waits import wait_for

from recalld.ipc import errors
from recalld.ipc.client import Client

SCRIPT = Path(sys.executable).parent / "recalld"


def recalld(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_recalld(args, env=env, timeout=120)


def test_a_workspace_that_cannot_open_at_start_fails_alone(daemon_factory: DaemonFactory,
                                                           tmp_path: Path) -> None:
    # A path on a "disk" that is not there: its parent is a plain file, so nothing can be
    # created below it (as on an unmounted mount point made read-only).
    (tmp_path / "unmounted").write_text("not a directory\n", encoding="utf-8")
    gone = tmp_path / "unmounted" / "ws"
    lockdir = tmp_path / "lockdir"
    (lockdir / "mem_metadata" / "recalld.lock").mkdir(parents=True)
    lockfifo = tmp_path / "lockfifo"
    (lockfifo / "mem_metadata").mkdir(parents=True)
    os.mkfifo(lockfifo / "mem_metadata" / "recalld.lock")
    indexfile = tmp_path / "indexfile"
    (indexfile / "mem_metadata").mkdir(parents=True)
    (indexfile / "mem_metadata" / "index").write_text("garbage\n", encoding="utf-8")
    good = tmp_path / "good"
    (good / "memory").mkdir(parents=True)
    (good / "memory" / "facts.md").write_text(
        "# Facts\n\nThe quokka ledger is kept in the blue binder.\n", encoding="utf-8")
    config = "".join(f'[workspaces.{name}]\npath = "{path}"\n\n' for name, path in (
        ("gone", gone), ("lockdir", lockdir), ("lockfifo", lockfifo), ("indexfile", indexfile),
        ("good", good)))

    daemon = daemon_factory(config)  # waits until it answers: it did not exit
    status = daemon.call("daemon.status")
    states = {w["agent_id"]: w for w in status["workspaces"]}
    assert states["good"]["state"] == "ready"
    assert states["default"]["state"] == "ready"
    for name in ("gone", "lockdir", "lockfifo", "indexfile"):
        assert states[name]["state"] == "failed", states[name]
        assert states[name]["error"], states[name]
    # The lock file is named: "cannot lock workspace <root>: not a regular file; remove
    # it" sent the user to remove the workspace folder.
    for name, said in (("lockdir", "Is a directory"), ("lockfifo", "not a regular file")):
        lock = tmp_path / name / "mem_metadata" / "recalld.lock"
        assert states[name]["error"].startswith(
            f"cannot lock workspace {lock.parents[1]}: {lock}: {said}"), states[name]
    with Client(daemon.socket_path) as c:
        hits = c.search("good", "quokka ledger", sync=True).results
    assert any("blue binder" in h.text for h in hits)

    shown = recalld("status", env=daemon.env)
    assert shown.returncode == 0, shown.stderr
    for name in ("gone", "lockdir", "indexfile"):
        line = next(x for x in shown.stdout.splitlines() if name in x)
        assert "failed" in line, shown.stdout
    doctor = recalld("doctor", "--json", env=daemon.env)
    checks = json.loads(doctor.stdout)["checks"]
    failing = {c["name"] for c in checks if c["status"] == "fail"}
    assert {"workspace gone", "workspace lockdir", "workspace indexfile"} <= failing, checks
    assert daemon.stop() == 0




def _texts(daemon: DaemonHandle, agent: str, query: str) -> str:
    with Client(daemon.socket_path) as c:
        return "\n".join(r.text for r in c.search(agent, query, sync=True).results)


LINKED = "# Bob\n\nThe zanzibar vault code is kept by bob alone.\n"
OWN = "# Alice\n\nAlice waters the zanzibar ferns on Mondays.\n"


def test_a_directory_link_out_of_the_workspace_is_not_indexed(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    other = tmp_path / "other-agent" / "memory"
    other.mkdir(parents=True)
    (other / "vault.md").write_text(LINKED, encoding="utf-8")
    alice = tmp_path / "alice"
    config = f'[workspaces.alice]\npath = "{alice}"\n'
    daemon = daemon_factory(config)
    (alice / "memory" / "x").symlink_to(other, target_is_directory=True)
    (alice / "memory" / "own.md").write_text(OWN, encoding="utf-8")
    found = _texts(daemon, "alice", "zanzibar")
    assert "ferns" in found
    assert "vault" not in found
    assert daemon.stop() == 0
    daemon = daemon_factory(config)
    found = _texts(daemon, "alice", "zanzibar")
    assert "ferns" in found and "vault" not in found
    # A link that stays in the workspace is not followed either: scans never descend a
    # link below a root, and a folder event of one must not index what the next scan
    # drops again.
    (alice / "archive").mkdir()
    (alice / "archive" / "kept.md").write_text(
        "# Kept\n\nThe zanzibar archive lives in the attic.\n", encoding="utf-8")
    (alice / "memory" / "inside").symlink_to(alice / "archive", target_is_directory=True)
    (alice / "memory" / "later.md").write_text("# Later\n\nzanzibar after the link\n",
                                               encoding="utf-8")
    found = _texts(daemon, "alice", "zanzibar attic")
    assert "after the link" in found and "attic" not in found


def test_a_note_folder_linked_out_of_the_workspace_is_not_listed(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    other = tmp_path / "other-agent"
    (other / "memory" / "2026-07-01").mkdir(parents=True)
    (other / "memory" / "2026-07-01" / "vault.md").write_text(LINKED, encoding="utf-8")
    (other / "digest").mkdir()
    (other / "digest" / "plan.md").write_text(
        "---\nname: Vault plan\ndescription: bob's plan\n---\nbody\n", encoding="utf-8")
    mallory = tmp_path / "mallory"
    mallory.mkdir()
    # The note folders themselves are links to another agent's.
    (mallory / "memory").symlink_to(other / "memory", target_is_directory=True)
    (mallory / "digest").symlink_to(other / "digest", target_is_directory=True)
    kept = tmp_path / "kept"
    (kept / "notes" / "2026-07-01").mkdir(parents=True)
    (kept / "notes" / "2026-07-01" / "own.md").write_text(OWN, encoding="utf-8")
    (kept / "memory").symlink_to(kept / "notes", target_is_directory=True)
    daemon = daemon_factory()
    for agent, root in (("mallory", mallory), ("kept", kept)):
        daemon.call("workspace.open", {"agent_id": agent, "path": str(root)})
        daemon.call("index.sync", {"agent_id": agent})
    assert daemon.call("memory.list", {"agent_id": "mallory"})["files"] == []
    index = daemon.call("memory.index", {"agent_id": "mallory"})
    assert index["entries"] == [] and "Vault" not in index["rendered"]
    assert "vault" not in _texts(daemon, "mallory", "zanzibar")
    # A note folder linked within its workspace is listed.
    listed = daemon.call("memory.list", {"agent_id": "kept"})["files"]
    assert [f["path"] for f in listed] == ["memory/2026-07-01/own.md"]


def test_notes_indexed_through_a_link_before_are_removed(daemon_factory: DaemonFactory,
                                                         tmp_path: Path) -> None:
    alice = tmp_path / "alice"
    config = f'[workspaces.alice]\npath = "{alice}"\n'
    daemon = daemon_factory(config)
    (alice / "memory" / "x").mkdir(parents=True)
    (alice / "memory" / "x" / "vault.md").write_text(LINKED, encoding="utf-8")
    assert "vault" in _texts(daemon, "alice", "zanzibar")
    assert daemon.stop() == 0
    # While the daemon is down the folder becomes a link to the same note elsewhere: the
    # index holds a note that now lies outside the workspace.
    other = tmp_path / "other-agent" / "memory"
    other.parent.mkdir(parents=True)
    (alice / "memory" / "x").rename(other)
    (alice / "memory" / "x").symlink_to(other, target_is_directory=True)
    daemon = daemon_factory(config)
    wait_for(lambda: "vault" not in _texts(daemon, "alice", "zanzibar"),
              "the linked note to leave the index")


def test_a_resource_link_out_of_the_workspace_is_not_catalogued(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    other = tmp_path / "other-agent" / "resource"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("bob's private contract terms\n", encoding="utf-8")
    alice = tmp_path / "alice"
    config = f'[workspaces.alice]\npath = "{alice}"\n'
    daemon = daemon_factory(config)
    (alice / "resource" / "x").symlink_to(other, target_is_directory=True)
    (alice / "resource" / "own.txt").write_text("alice's shopping list\n", encoding="utf-8")

    def catalogued() -> int:
        ws = next(w for w in daemon.call("daemon.status")["workspaces"]
                  if w["agent_id"] == "alice")
        return sum(ws["resource"]["files"].values())

    wait_for(lambda: catalogued() >= 1, "the own resource file to be catalogued")
    assert catalogued() == 1
    assert daemon.stop() == 0
    daemon = daemon_factory(config)
    wait_for(lambda: catalogued() >= 1, "the catalog after a restart")
    assert catalogued() == 1


SHARING = """
[workspaces.alice]
shared_with = ["bob"]

[workspaces.bob]

[workspaces.carol]
"""


def test_jobs_and_events_show_only_what_the_agent_may_read(
        daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(SHARING)
    with daemon.connect() as bob_events, daemon.connect() as anon_events:
        bob_events.call("events.subscribe", {"topics": ["job.state"], "agent_id": "bob"})
        anon_events.call("events.subscribe", {"topics": ["job.*", "daemon.*"]})
        ids = {a: daemon.call("jobs.submit", {"agent_id": a, "kind": "reindex"})["job_id"]
               for a in ("carol", "alice", "bob")}

        def owners(agent: str | None) -> set[str]:
            params = {} if agent is None else {"agent_id": agent}
            return {j["agent_id"] for j in daemon.call("jobs.list", params)["jobs"]}

        assert owners("bob") == {"alice", "bob"}
        assert owners("alice") == {"alice"}
        assert owners("carol") == {"carol"}
        assert owners(None) == set()  # the default agent has no jobs: not everyone's
        # bob hears of alice's and his own jobs until both are done, never of carol's.
        done: set[str] = set()
        while done != {ids["alice"], ids["bob"]}:
            event = bob_events.recv()["params"]
            assert event["agent_id"] in ("alice", "bob"), event
            if event["state"] in ("succeeded", "failed", "cancelled"):
                done.add(event["job_id"])
        for params in ({"agent_id": "bob", "kind": "reindex", "extra": 1},
                       {"agent_id": "../bob", "kind": "reindex"}):
            try:
                daemon.call("jobs.submit", params)
            except errors.InvalidParams:
                continue
            raise AssertionError(f"jobs.submit accepted {params}")
        for method, params in (("jobs.list", {"agent_id": "bob", "all": True}),
                               ("jobs.get", {"agent_id": "bob", "job_id": ids["bob"],
                                             "x": 1}),
                               ("jobs.cancel", {"agent_id": "a/b", "job_id": ids["bob"]}),
                               # Without agent_id: the default workspace is not assumed.
                               ("jobs.submit", {"kind": "reindex"}),
                               ("jobs.get", {"job_id": ids["bob"]}),
                               ("jobs.cancel", {"job_id": ids["bob"]}),
                               ("memory.list", {"agent_id": "alice", "as_agent": "../bob"}),
                               ("memory.index", {"agent_id": "alice", "as_agent": ""})):
            try:
                daemon.call(method, params)
            except errors.InvalidParams:
                continue
            raise AssertionError(f"{method} accepted {params}")
        # The anonymous subscriber (the default agent) heard nothing of the three jobs:
        # the first event it gets is the daemon's own reload, published after them all.
        daemon.signal(signal.SIGHUP)
        event = anon_events.recv()["params"]
        assert event["topic"] == "daemon.reloaded", event



def test_the_agents_a_workspace_is_shared_with_hear_it_close(
        daemon_factory: DaemonFactory) -> None:
    daemon = daemon_factory(SHARING)
    with daemon.connect() as bob_events, daemon.connect() as carol_events:
        for agent, conn in (("bob", bob_events), ("carol", carol_events)):
            conn.call("events.subscribe", {"topics": ["workspace.*", "daemon.*"],
                                           "agent_id": agent})
        daemon.call("workspace.close", {"agent_id": "alice"})
        daemon.call("workspace.open", {"agent_id": "alice"})
        daemon.signal(signal.SIGHUP)  # a daemon event for all, after alice's

        def heard(conn: Any) -> list[str]:
            topics = []
            while (event := conn.recv()["params"])["topic"] != "daemon.reloaded":
                topics.append(f"{event['topic']} {event['agent_id']}")
            return topics

        assert heard(bob_events) == ["workspace.closed alice", "workspace.opened alice"]
        assert heard(carol_events) == []

def test_workspace_roots_and_folders_are_checked(daemon_factory: DaemonFactory,
                                                 tmp_path: Path) -> None:
    alice = tmp_path / "alice"
    bob = tmp_path / "bob"
    config = (f'[workspaces.alice]\npath = "{alice}"\nshared_with = ["carol"]\n\n'
              f'[workspaces.bob]\npath = "{bob}"\n')
    daemon = daemon_factory(config)
    refused = [
        ({"agent_id": "x1", "path": "/"}, "system folder"),
        ({"agent_id": "x2", "path": "/etc"}, "system folder"),
        ({"agent_id": "x3", "path": "/usr/share/x3"}, "system folder"),
        ({"agent_id": "x4", "path": "/proc/self"}, "system folder"),
        ({"agent_id": "x5", "path": str(bob / "memory" / "x5")}, "inside the workspace"),
        ({"agent_id": "x6", "path": str(tmp_path)}, "around the workspace"),
        ({"agent_id": "x7", "path": str(bob)}, "already open for agent 'bob'"),
        ({"agent_id": "x8", "path": str(tmp_path / "x8"), "config": {"daily_dir": "../up"}},
         "inside the workspace"),
        ({"agent_id": "x9", "path": str(tmp_path / "x9"), "config": {"resource_dir": "/etc"}},
         "inside the workspace"),
        # The daemon's own folders: their files would be served as the agent's notes
        # (the record of every workspace with the model keys handed over, every job).
        ({"agent_id": "x11", "path": str(daemon.data_dir / "state")}, "recalld's own folder"),
        ({"agent_id": "x12", "path": str(daemon.data_dir / "backups" / "x12")},
         "lies inside recalld's own folder"),
        ({"agent_id": "x13", "path": str(daemon.config_path.parent)},
         "holds recalld's configuration file"),
        ({"agent_id": "x14", "path": str(daemon.socket_path.parent)},
         "holds recalld's socket"),
    ]
    for params, why in refused:
        try:
            daemon.call("workspace.open", params)
        except errors.InvalidParams as exc:
            assert why in exc.message, (params, exc.message)
            continue
        raise AssertionError(f"workspace.open accepted {params}")
    assert not Path("/etc/memory").exists()
    assert not (daemon.data_dir / "state" / "memory").exists()
    assert not (daemon.config_path.parent / "memory").exists()
    assert not (daemon.socket_path.parent / "memory").exists()
    (tmp_path / "afile").write_text("x\n", encoding="utf-8")
    try:
        daemon.call("workspace.open", {"agent_id": "x10", "path": str(tmp_path / "afile")})
    except errors.InvalidParams as exc:
        assert "not a directory" in exc.message
    else:
        raise AssertionError("a file was opened as a workspace")
    # A folder whose name only begins with another workspace's lies beside it, not in it.
    beside = daemon.call("workspace.open", {"agent_id": "x15", "path": f"{bob}by"})
    assert beside["state"] == "ready"
    # alice shares with carol, carol with alice: carol may keep a workspace inside
    # alice's (one sharing alone is not enough: each reads the other's files as its own).
    try:
        daemon.call("workspace.open", {"agent_id": "carol", "path": str(alice / "carol")})
    except errors.InvalidParams as exc:
        assert "inside the workspace of agent 'alice'" in exc.message, exc.message
    else:
        raise AssertionError("a workspace was opened inside one it does not share with")
    inside = daemon.call("workspace.open", {"agent_id": "carol", "path": str(alice / "carol"),
                                            "config": {"shared_with": ["alice"]}})
    assert inside["state"] == "ready"
    assert daemon.call("daemon.ping")["pong"] is True
    # The same around another: erin sharing her notes with finn gave finn her pending
    # turns as his own files once he opened a workspace around hers.
    erin, outer = tmp_path / "outer" / "memory" / "erin", tmp_path / "outer"
    daemon.call("workspace.open", {"agent_id": "erin", "path": str(erin),
                                   "config": {"shared_with": ["finn"]}})
    daemon.call("memory.add_turns", {"agent_id": "erin", "session_id": "s1", "messages": [
        {"role": "user", "content": "my PIN hint is the heron"}]})
    # Nor may a workspace open to everyone take the files of one not shared with it.
    for erin_shares, finn in (([], {"memory_isolation": False}), (["finn"], {}),
                              ([], {"shared_with": ["*"]})):
        daemon.call("workspace.close", {"agent_id": "erin"})
        daemon.call("workspace.open", {"agent_id": "erin", "path": str(erin),
                                       "config": {"shared_with": erin_shares}})
        try:
            daemon.call("workspace.open", {"agent_id": "finn", "path": str(outer),
                                           "config": finn})
        except errors.InvalidParams as exc:
            assert "around the workspace of agent 'erin'" in exc.message, exc.message
        else:
            raise AssertionError(f"a workspace ({finn}) was opened around one not shared "
                                 f"with it both ways (erin shares with {erin_shares})")
    daemon.call("workspace.close", {"agent_id": "erin"})
    daemon.call("workspace.open", {"agent_id": "erin", "path": str(erin),
                                   "config": {"shared_with": ["gus"]}})
    daemon.call("workspace.open", {"agent_id": "gus", "path": str(outer),
                                   "config": {"shared_with": ["erin"]}})
    # Nested as allowed, they open again after a restart, where each is only recorded
    # when the other opens: both were refused as "not shared" and failed.
    assert daemon.stop() == 0
    again = daemon_factory(**{k: daemon.env[k] for k in (
        "HOME", "XDG_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME")})
    states = {w["agent_id"]: w["state"] for w in again.call("workspace.list")["workspaces"]}
    assert {a: states.get(a) for a in ("alice", "carol", "erin", "gus")} == dict.fromkeys(
        ("alice", "carol", "erin", "gus"), "ready"), states


def test_a_lock_file_that_is_a_link_out_of_the_workspace_is_never_written(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The workspace lock was opened through a link: a workspace copied from elsewhere with
    # its lock file a link to ~/.bashrc had that file truncated to the daemon's pid.
    root, victim = tmp_path / "ws", tmp_path / "bashrc"
    victim.write_text("export PATH=$HOME/bin:$PATH\n")
    (root / "mem_metadata").mkdir(parents=True)
    (root / "mem_metadata" / "recalld.lock").symlink_to(victim)
    try:
        daemon.call("workspace.open", {"agent_id": "linked", "path": str(root)})
    except errors.RecalldError as exc:
        assert "recalld.lock is a symbolic link; remove it" in exc.message, exc.message
    else:
        raise AssertionError("opened through a linked lock file")
    assert victim.read_text() == "export PATH=$HOME/bin:$PATH\n"
    assert daemon.call("daemon.ping")["pong"] is True


def test_a_log_that_is_a_link_out_of_the_workspace_is_never_appended_to(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The workspace's logs (inbox, change logs) were opened for appending through links:
    # a copied workspace had the daemon cut another file short (here: emptied it).
    root, victim = tmp_path / "ws", tmp_path / "notes.jsonl"  # a file it reads as a log
    victim.write_text('{"kept": true}\n')
    (root / "mem_metadata" / "inbox").mkdir(parents=True)
    (root / "mem_metadata" / "inbox" / "inbox.jsonl").symlink_to(victim)
    # A link in the log's own place is damage, as a folder or FIFO there is: set aside
    # (the link renamed, never followed), a new log made, the workspace served.
    daemon.call("workspace.open", {"agent_id": "linked", "path": str(root)})
    assert "inbox.jsonl is not a regular file (a symbolic link)" in daemon.log()
    inbox = root / "mem_metadata" / "inbox"
    [aside] = [p for p in inbox.iterdir() if ".corrupt" in p.name]
    assert aside.is_symlink() and aside.readlink() == victim
    assert victim.read_text() == '{"kept": true}\n'
    assert daemon.call("daemon.ping")["pong"] is True


def test_the_folder_another_agent_opens_by_default_is_its_own(daemon: DaemonHandle) -> None:
    # <data>/workspaces/<id> is where that agent's workspace opens when it names no path.
    # Another agent opened there kept it out for good, and was served the notes it left
    # there when it closed with forget (its files stay).
    home = daemon.data_dir / "workspaces"
    with Client(daemon.socket_path) as c:
        c.workspace_open("kea.2")
        c.add_note("kea.2", "the kea hides its spare key under the third stone")
        c.call("workspace.close", {"agent_id": "kea.2", "forget": True})
        for taken in (home / "kea.2", home / "never-came"):
            try:
                c.workspace_open("tui", path=str(taken))
                raise AssertionError(f"{taken} opened for tui")
            except errors.InvalidParams as exc:
                assert f"where the workspace of agent {taken.name!r} opens" in str(exc), exc
        assert c.workspace_open("never-came")["path"] == str(home / "never-came")
        assert c.workspace_open("kea.2")["path"] == str(home / "kea.2")
        assert "kea" in c.search("kea.2", "spare key")[0].text
        # Its own default folder, and a folder of its own there under another name, open.
        assert c.workspace_open("tui", path=str(home / "tui"))["state"] == "ready"
        assert c.workspace_open("moa", path=str(home / "moa notes"))["state"] == "ready"
