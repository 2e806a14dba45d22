"""Restores while agents use the daemon, and restores into workspaces that changed shape."""

from __future__ import annotations

import hashlib
import os
import threading
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import DaemonFactory, DaemonHandle
from hooks import start_hook
from waits import CallsInThreads, wait_for, wait_value

from recalld.ipc.errors import InvalidParams, NotAllowed, NotFound, RecalldError


def _notes(root: Path, count: int) -> None:
    folder = root / "memory" / "2026-01-01"
    folder.mkdir(parents=True)
    for i in range(count):
        (folder / f"n{i}.md").write_text(f"Note {i} about the heron at pond {i}.\n")


def test_an_agent_reopening_during_a_restore_gets_the_restored_turns(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The restore closes the workspace to replace its pending turns; an agent that opens
    # it again meanwhile must get it once the files are in place, or it serves the turns
    # the restore replaced and appends new ones to the replaced (unlinked) log.
    root = tmp_path / "ws"
    _notes(root, 200)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    archive = daemon.call("backup.create", {"agents": ["w"]})["file"]  # no pending turns
    turn = {"agent_id": "w", "session_id": "s1",
            "messages": [{"role": "user", "content": "the kingfisher came back"}]}
    assert daemon.call("memory.add_turns", turn)["pending_messages"] == 1
    stop = threading.Event()
    opened: list[int] = []

    def agent() -> None:
        conn = daemon.connect()
        try:
            while not stop.is_set():
                try:
                    conn.call("workspace.open", {"agent_id": "w", "path": str(root)})
                    opened.append(1)
                except RecalldError:
                    pass
        finally:
            conn.close()

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        daemon.call("backup.restore", {"file": archive, "agents": ["w"]})
    finally:
        stop.set()
        thread.join()
    assert opened
    status = daemon.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")
    assert ws["sessions"]["pending_messages"] == 0, ws["sessions"]
    turn["messages"] = [{"role": "user", "content": "a grey wagtail today"}]
    assert daemon.call("memory.add_turns", turn)["pending_messages"] == 1
    log = (root / "mem_metadata" / "sessions" / "pending.jsonl").read_text()
    assert "grey wagtail" in log and "kingfisher" not in log


# The restore stops once its snapshot is recorded until the test opens the FIFO.
PAUSING = (
    "from recalld.daemon.rpc import ops_methods",
    "prune = ops_methods.prune_snapshots",
    "def paused(folder, keep):",
    "    with open(os.environ['RESTORE_PAUSE'], 'rb') as fifo:",
    "        fifo.read()",
    "    prune(folder, keep)",
    "ops_methods.prune_snapshots = paused",
)


def test_a_note_added_during_a_restore_is_in_its_snapshot_or_after_it(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Written after the snapshot and before the restored files, a note was in neither:
    # acknowledged, and lost for good (a rollback could not bring it back).
    fifo = tmp_path / "pause"
    os.mkfifo(fifo)
    d = daemon_factory(**start_hook(tmp_path, *PAUSING), RESTORE_PAUSE=str(fifo))
    root = tmp_path / "ws"
    _notes(root, 3)
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("memory.add_note", {"agent_id": "w", "content": "backed up: the heron"})
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    d.call("memory.add_note", {"agent_id": "w", "content": "before the restore: the egret"})
    calls = CallsInThreads(d)
    results = calls.results
    calls.start("restore", "backup.restore", {"file": archive, "agents": ["w"]})
    wait_for((d.data_dir / "backups" / "rollback.json").exists, "the snapshot recorded")
    calls.start("note", "memory.add_note", {
        "agent_id": "w", "content": "during the restore: the bittern"})
    # The restore, the note and the status call of the check in flight.
    wait_for(calls.answered_or_waiting(3, "note"), "the note written or waiting")
    with open(fifo, "wb"):
        pass
    calls.join()
    assert isinstance(results["restore"], dict), results
    note = next((root / "memory").glob("*/agent-notes.md")).read_text()
    with zipfile.ZipFile(results["restore"]["snapshot"]) as zf:
        snapshot = "".join(zf.read(n).decode() for n in zf.namelist()
                           if n.endswith("agent-notes.md"))
    assert "the egret" in snapshot and "the heron" in note and "the egret" not in note
    if isinstance(results["note"], dict):  # acknowledged: kept
        assert "the bittern" in note or "the bittern" in snapshot, (note, snapshot)


# Also stops memory.add_note once it has read the note (while it holds the note lock)
# when the file NOTE_ARM exists, until the test opens the FIFO NOTE_PAUSE.
PAUSING_NOTES = (
    *PAUSING,
    "import trio",
    "from recalld.daemon.rpc import agent_methods",
    "own_notes = agent_methods._own_notes",
    "async def read_then_pause(*args):",
    "    notes = await own_notes(*args)",
    "    if os.path.exists(os.environ['NOTE_ARM']):",
    "        os.unlink(os.environ['NOTE_ARM'])",
    "        await trio.to_thread.run_sync(lambda: open(os.environ['NOTE_PAUSE'], 'rb').read())",
    "    return notes",
    "agent_methods._own_notes = read_then_pause",
)


def test_a_note_that_waited_out_a_restore_and_one_after_it_are_both_kept(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A note call waiting for the restore held the closed workspace's note lock, a later
    # one the reopened workspace's: both read the note, and the first to write lost the
    # other's words (acknowledged, and gone).
    restore_pause, note_pause, arm = tmp_path / "restore", tmp_path / "note", tmp_path / "arm"
    os.mkfifo(restore_pause)
    os.mkfifo(note_pause)
    d = daemon_factory(**start_hook(tmp_path, *PAUSING_NOTES),
                       RESTORE_PAUSE=str(restore_pause),
                       NOTE_PAUSE=str(note_pause), NOTE_ARM=str(arm))
    root = tmp_path / "ws"
    _notes(root, 2)
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("memory.add_note", {"agent_id": "w", "content": "backed up: the heron"})
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    calls = CallsInThreads(d)
    results = calls.results
    restore = calls.start("restore", "backup.restore", {"file": archive, "agents": ["w"]})
    wait_for((d.data_dir / "backups" / "rollback.json").exists, "the snapshot recorded")
    arm.touch()
    calls.start("waited", "memory.add_note", {
        "agent_id": "w", "content": "waited out the restore: the bittern"})
    # Held by a lock: in flight with the restore and the status call of the check.
    wait_for(calls.answered_or_waiting(3, "waited"), "the note waiting for the restore")
    with open(restore_pause, "wb"):
        pass
    restore.join()
    assert isinstance(results["restore"], dict), results
    wait_for(lambda: not arm.exists(), "the waiting note read")
    calls.start("after", "memory.add_note", {
        "agent_id": "w", "content": "after the restore: the kingfisher"})
    wait_for(calls.answered_or_waiting(3, "after"), "the later note written or waiting")
    with open(note_pause, "wb"):
        pass
    calls.join()
    assert isinstance(results["waited"], dict) and isinstance(results["after"], dict), results
    note = next((root / "memory").glob("*/agent-notes.md")).read_text()
    assert "the heron" in note and "the bittern" in note and "the kingfisher" in note, note


def test_a_workspace_whose_real_path_is_not_utf8_is_refused_and_backups_go_on(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # A UTF-8 path whose symlink leads to a folder named in Latin-1: the workspace record,
    # status and backups cannot hold the resolved path. Opened anyway, it broke every
    # workspace.list, daemon.status and backup.create with an internal error.
    real = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    _notes(real, 1)
    link = tmp_path / "cafe"
    link.symlink_to(real)
    with pytest.raises(InvalidParams, match=r"caf\\xe9 has a path that is not valid UTF-8"):
        daemon.call("workspace.open", {"agent_id": "latin", "path": str(link)})
    listed = daemon.call("workspace.list")["workspaces"]
    assert "latin" not in [w["agent_id"] for w in listed]
    assert daemon.call("daemon.status")["workspaces"]
    made = daemon.call("backup.create")
    assert "latin" not in made["agents"] and made["agents"]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "mem_metadata" not in p.parts}


def test_a_folder_where_the_backup_has_a_file_and_back(daemon: DaemonHandle,
                                                       tmp_path: Path) -> None:
    # Files and folders that changed places since the backup: a restore makes the
    # workspace equal to the backup (the snapshot keeps what it removes), and the rollback
    # makes it equal to the snapshot. Both failed with an internal error, the first
    # after renaming some of the files into place.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-07-23"
    day.mkdir(parents=True)
    (day / "trip.md").write_text("The ferry to Lindau leaves at nine.\n")
    (day / "zoo.md").write_text("The zoo opens at ten.\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    archive = daemon.call("backup.create", {"agents": ["w"]})["file"]
    saved = _files(root)
    (day / "trip.md").unlink()
    (day / "trip.md").mkdir()
    (day / "trip.md" / "inner.md").write_text("An okapi in the garden.\n")
    (day / "zoo.md").write_text("The zoo is closed on Mondays.\n")
    changed = _files(root)

    def hits(query: str) -> list[str]:
        found = daemon.call("memory.search", {"agent_id": "w", "query": query, "sync": True})
        return [h["path"] for h in found["results"]]

    assert hits("okapi") == ["memory/2026-07-23/trip.md/inner.md"]
    done = daemon.call("backup.restore", {"file": archive, "agents": ["w"]})
    assert done["restored"][0]["removed"] == 1
    assert _files(root) == saved
    assert not [p.name for p in day.iterdir() if p.name.startswith(".")]
    assert hits("okapi") == [] and hits("Lindau") == ["memory/2026-07-23/trip.md"]
    daemon.call("backup.rollback")
    assert _files(root) == changed
    assert hits("okapi") == ["memory/2026-07-23/trip.md/inner.md"]

    # A folder in the way that holds what no backup covers (a hidden draft): refused
    # before anything changes, saying what to move.
    (day / "trip.md" / ".draft.md").write_text("not backed up\n")
    with pytest.raises(NotAllowed, match=r"trip\.md is, which holds memory/2026-07-23/"
                                         r"trip\.md/\.draft\.md"):
        daemon.call("backup.restore", {"file": archive, "agents": ["w"]})
    assert _files(root) == {**changed, "memory/2026-07-23/trip.md/.draft.md": b"not backed up\n"}
    assert hits("okapi") == ["memory/2026-07-23/trip.md/inner.md"]


def test_rollback_puts_back_the_config_file_a_restore_replaced_or_added(
        daemon_factory: DaemonFactory) -> None:
    # A backup made with its secrets carries its config file, which the restore puts in
    # place of this machine's: the rollback must bring this machine's back, secrets and
    # all, or remove the one the restore added where there was none.
    theirs = '[workspace_defaults]\nauto_memory_interval = 3\n'
    d1 = daemon_factory(theirs)
    archive = d1.call("backup.create", {"include_secrets": True})["file"]
    ours = ('[workspace_defaults]\nauto_memory_interval = 7\n'
            '[workspace_defaults.chat_model_config]\napi_key = "sk-ours-123"\n')
    d2 = daemon_factory(ours)
    assert d2.call("backup.restore", {"file": archive})["config_restored"] is True
    assert d2.config_path.read_text() == theirs
    rolled = d2.call("backup.rollback")
    assert d2.config_path.read_text() == ours
    assert rolled["rolled_back"]["config"] == "replaced" and rolled["config_restored"]
    d2.call("workspace.open", {"agent_id": "fresh"})
    listed = {w["agent_id"]: w for w in d2.call("workspace.list")["workspaces"]}
    assert listed["fresh"]["settings"]["auto_memory_interval"] == 7

    d3 = daemon_factory(None)
    d3.call("backup.restore", {"file": archive})
    assert d3.config_path.read_text() == theirs
    rolled = d3.call("backup.rollback")
    assert not d3.config_path.exists()
    assert rolled["rolled_back"]["config"] == "added"
    d3.call("workspace.open", {"agent_id": "fresh"})
    listed = {w["agent_id"]: w for w in d3.call("workspace.list")["workspaces"]}
    assert listed["fresh"]["settings"]["auto_memory_interval"] != 3


def _archive_with_config(path: Path, config: str) -> Path:
    note, cfg = b"hello\n", config.encode()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("agents/w/docs/readme.md", note)
        zf.writestr("daemon/config.toml", cfg)
        meta = {"format": "recalld-backup", "version": 1, "created": 0.0,
                "agents": {"w": {"path": "/x", "dirs": {"daily_dir": "docs"}}},
                "files": [{"path": "agents/w/docs/readme.md", "size": len(note),
                           "sha256": hashlib.sha256(note).hexdigest()},
                          {"path": "daemon/config.toml", "size": len(cfg),
                           "sha256": hashlib.sha256(cfg).hexdigest()}],
                "daemon": ["config.toml"], "secrets": False}
        zf.writestr("meta.json", orjson.dumps(meta))
    return path


def test_a_config_file_that_moves_an_open_workspace_is_not_put_in_place(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The workspace is open here, and its files are restored where it is; the backup's
    # config file places it elsewhere. Put in place, the next start would open the
    # workspace there: without the memory just restored (or not at all, /etc).
    d = daemon_factory(None)
    here = tmp_path / "here"
    d.call("workspace.open", {"agent_id": "w", "path": str(here)})
    default = d.data_dir / "workspaces" / "w"  # a configured one without a path opens there
    for elsewhere, config in ((tmp_path / "elsewhere", f'path = "{tmp_path / "elsewhere"}"'),
                              (Path("/etc"), 'path = "/etc"'),
                              (default, "auto_memory_interval = 3")):
        archive = _archive_with_config(tmp_path / f"{elsewhere.name}.zip",
                                       f"[workspaces.w]\n{config}\n")
        restored = d.call("backup.restore", {"file": str(archive)})
        assert restored["config_restored"] is False
        assert f"places w at {elsewhere}" in restored["config_kept"]
        assert not d.config_path.exists()
        assert (here / "memory/readme.md").read_text() == "hello\n"
        assert not (tmp_path / "elsewhere").exists() and not default.exists()


def test_a_restore_writes_nowhere_a_workspace_may_not_be(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # A foreign archive's config file (put in place where there is none) places its
    # workspace at the home folder, which holds recalld's own data: opening it there is
    # refused, and the restore wrote and removed files there before it tried.
    d = daemon_factory(None)
    home = Path(d.env["HOME"])
    (home / "docs").mkdir()
    (home / "docs" / "thesis.txt").write_text("years of work\n")
    archive = _archive_with_config(tmp_path / "foreign.zip",
                                   '[workspaces.w]\npath = "~"\ndaily_dir = "docs"\n')
    for dry_run in (True, False):
        with pytest.raises(InvalidParams, match="cannot restore workspace 'w' to "):
            d.call("backup.restore", {"file": str(archive), "dry_run": dry_run})
    assert (home / "docs" / "thesis.txt").read_text() == "years of work\n"
    assert sorted(p.name for p in (home / "docs").iterdir()) == ["thesis.txt"]
    assert not d.config_path.exists()
    assert not list((d.data_dir / "backups").glob("pre-restore-*"))


def test_a_restore_without_a_snapshot_leaves_no_older_rollback_behind(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The rollback point of an earlier restore would, after a restore without a
    # snapshot, undo everything since that earlier restore, this one included.
    root = tmp_path / "ws"
    day = root / "memory" / "2026-07-23"
    day.mkdir(parents=True)
    (day / "a.md").write_text("first\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    archive = daemon.call("backup.create", {"agents": ["w"]})["file"]
    daemon.call("backup.restore", {"file": archive})
    assert daemon.call("backup.list")["rollback"] is not None
    (day / "week.md").write_text("a week of notes\n")
    daemon.call("index.sync", {"agent_id": "w"})
    later = daemon.call("backup.create", {"agents": ["w"]})["file"]
    daemon.call("backup.restore", {"file": later, "snapshot": False})
    assert daemon.call("backup.list")["rollback"] is None
    with pytest.raises(NotFound):
        daemon.call("backup.rollback")
    assert (day / "week.md").read_text() == "a week of notes\n"


def test_a_backup_during_a_restore_waits_for_it_and_misses_no_workspace(
        daemon: DaemonHandle, tmp_path: Path) -> None:
    # The restore closes the workspace while it replaces its files: a backup of every
    # workspace taken meanwhile left it out, and said nothing.
    root = tmp_path / "ws"
    _notes(root, 400)
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})
    archive = daemon.call("backup.create", {"agents": ["w"]})["file"]
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(
        daemon.call("backup.restore", {"file": archive, "agents": ["w"]})))
    thread.start()
    try:
        wait_value(lambda: {w["agent_id"]: w.get("state") for w in
                            daemon.call("workspace.list")["workspaces"]}.get("w"),
                   lambda state: state != "ready", "the restore closing w", 30)
        made = daemon.call("backup.create", {})
    finally:
        thread.join()
    assert done and "w" in made["agents"] and made["agents"]["w"]["files"] >= 400


def test_the_command_line_says_what_became_of_the_backups_config_file(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    from test_cli import recalld

    d = daemon_factory(None)
    bad = _archive_with_config(tmp_path / "bad.zip",
                               '[workspace_defaults]\nauto_memory_interval = "often"\n')
    said = recalld("backup", "restore", str(bad), "--yes", env=d.env)
    assert said.returncode == 0, said.stderr
    assert "config file of the backup not put in place: " in said.stdout, said.stdout
    assert "auto_memory_interval" in said.stdout and not d.config_path.exists()
    good = _archive_with_config(tmp_path / "good.zip",
                                '[workspace_defaults]\nauto_memory_interval = 4\n')
    said = recalld("backup", "restore", str(good), "--yes", env=d.env)
    assert said.returncode == 0, said.stderr
    assert "config file restored (" in said.stdout, said.stdout
    said = recalld("backup", "rollback", "--yes", env=d.env)
    assert "config file rolled back (" in said.stdout and not d.config_path.exists()


def test_files_a_backup_cannot_hold_are_named_in_its_answer(daemon: DaemonHandle,
                                                            tmp_path: Path) -> None:
    from test_cli import recalld

    root = tmp_path / "ws"
    _notes(root, 2)
    day = root / "memory" / "2026-07-23"
    day.mkdir(parents=True, exist_ok=True)
    (day / os.fsdecode(b"r\xe9sum\xe9.md")).write_text("a note named in Latin-1\n")
    (root / "resource").mkdir(exist_ok=True)
    (root / "resource" / os.fsdecode(b"\xff.txt")).write_text("x\n")
    daemon.call("workspace.open", {"agent_id": "lat", "path": str(root)})
    made = daemon.call("backup.create", {"agents": ["lat"]})
    assert made["passed_by"] == {"lat": ["memory/2026-07-23/r\\xe9sum\\xe9.md",
                                         "resource/\\xff.txt"]}, made["passed_by"]
    assert made["agents"]["lat"]["files"] >= 2
    said = recalld("backup", "create", "--agent", "lat", env=daemon.env)
    assert said.returncode == 0, said.stderr
    assert ("left out of lat (names not UTF-8 or with a backslash: no archive can hold them): "
            "memory/2026-07-23/r\\xe9sum\\xe9.md, resource/\\xff.txt") in said.stdout
    assert daemon.call("backup.create", {"agents": ["default"]})["passed_by"] == {}


def test_restoring_some_agents_keeps_a_config_file_that_configures_others(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # The config file is whole: put in place for one agent, it would take away another
    # agent's settings and path on this machine.
    theirs = ('[workspaces.coder]\nauto_memory_interval = 3\n'
              '[workspaces.coder.chat_model_config]\napi_key = "sk-theirs-9"\n')
    d1 = daemon_factory(theirs)
    d1.call("workspace.open", {"agent_id": "coder"})
    archive = d1.call("backup.create", {"agents": ["coder"], "include_secrets": True})["file"]
    writer = tmp_path / "writer-notes"
    ours = f'[workspaces.writer]\npath = "{writer}"\nauto_memory_interval = 7\n'
    d2 = daemon_factory(ours)
    restored = d2.call("backup.restore", {"file": archive})
    assert restored["config_restored"] is False and d2.config_path.read_text() == ours
    assert "writer" in restored["config_kept"] and "daemon/config.toml" in restored["config_kept"]
    assert [r["agent_id"] for r in restored["restored"]] == ["coder"]
    listed = {w["agent_id"]: w for w in d2.call("workspace.list")["workspaces"]}
    assert Path(listed["writer"]["path"]) == writer
    # A daemon whose file configures only what the restore covers takes the backup's.
    d3 = daemon_factory('[workspaces.coder]\nauto_memory_interval = 5\n')
    restored = d3.call("backup.restore", {"file": archive})
    assert restored["config_restored"] is True and restored["config_kept"] is None
    assert d3.config_path.read_text() == theirs
    d3.call("backup.rollback")
    assert d3.config_path.read_text() == '[workspaces.coder]\nauto_memory_interval = 5\n'
