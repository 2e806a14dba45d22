"""The daemon's state files are the owner's only (0600), whatever the umask: the record
of workspaces holds the model keys given in ``workspace.open``'s ``config``, the logs
and records hold the users' texts, and a workspace may lie in a folder others can enter.
A state file an earlier start left readable is tightened when it is next written, and
every file in the state folder at the next start. Notes are the user's: a new one is made
as an editor makes it, a rewritten one keeps its mode.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from conftest import DaemonFactory
from fakes.provider_server import FakeProvider
from hooks import start_hook

KEY = "sk-proj-Zq8Rt2Lm5Vx9Bn3Kc7Hw1Jd4Fg6"
#: A start hook (hooks.start_hook): the daemon runs with this umask, as a shell's sets it.
UMASK_022 = "os.umask(0o022)"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _loose(*roots: Path, notes: Path) -> dict[str, int]:
    """Files below ``roots`` (but the notes below ``notes``) that others may read."""
    found = {}
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder) / name
                if path.is_relative_to(notes) and not path.is_relative_to(
                        notes / "mem_metadata"):
                    continue
                if _mode(path) & 0o077:
                    found[str(path)] = _mode(path)
    return found


def _use(d: object, ws: Path, key: str, fake: FakeProvider) -> None:
    """Open ``ws`` with a chat model whose key is ``key`` (the fake provider: a stop's
    flush of the turns gets its answer at once), add a turn and a note."""
    call = d.call  # type: ignore[attr-defined]
    call("workspace.open", {"agent_id": "coder", "path": str(ws), "config": {
        "chat_model_config": {"base_url": f"{fake.url}/v1", "model_name": "m",
                              "api_key": key}}})
    call("memory.add_turns", {"agent_id": "coder", "session_id": "s1", "messages": [
        {"role": "user", "content": "the heron fishes at dawn by the mill"}]})
    call("memory.add_note", {"agent_id": "coder", "content": "the mill pond freezes in May"})


def test_state_files_are_private_and_notes_keep_their_mode(
        daemon_factory: DaemonFactory, tmp_path: Path, fake: FakeProvider) -> None:
    ws = tmp_path / "shared" / "coder"  # a workspace in a folder others may enter
    ws.mkdir(parents=True)
    os.chmod(ws.parent, 0o755)
    d = daemon_factory(**start_hook(daemon_factory.tmp_path, UMASK_022))
    _use(d, ws, KEY, fake)
    record = d.data_dir / "state" / "workspaces.json"
    assert KEY in record.read_text()  # the daemon needs it to run
    assert _loose(d.data_dir, ws, notes=ws) == {}
    # The daemon's own folders too; a workspace's note folders are made as an editor
    # makes them, under the umask.
    d.call("workspace.open", {"agent_id": "own", "config": {"embedding_model_config": {
        "base_url": f"{fake.url}/v1", "model_name": "e", "api_key": KEY}}})
    d.call("memory.add_note", {"agent_id": "own", "content": "a note in the data folder"})
    d.call("memory.search", {"agent_id": "own", "query": "note", "sync": True})
    homes = d.data_dir / "workspaces"
    own = homes / "own"
    folders = {Path(f): _mode(Path(f)) for f, _, _ in os.walk(d.data_dir)
               if Path(f) == homes or not Path(f).is_relative_to(homes)}
    assert d.data_dir / "state" / "embeddings" in folders
    assert {f: m for f, m in folders.items() if m != 0o700} == {}
    assert _mode(ws / "mem_metadata" / "index") == 0o700
    days = [p for p in (own / "memory").iterdir() if p.is_dir()]  # made by the note's write
    assert days
    assert {_mode(f) for f in (own / "memory", ws / "digest", *days)} == {0o755}, days
    note = ws / "digest" / "hand.md"
    d.call("memory.topic_write", {"agent_id": "coder", "path": "digest/hand.md",
                                  "name": "hand", "description": "d", "type": "user",
                                  "body": "the first draft"})
    assert _mode(note) == 0o644  # a new note, as an editor makes it under umask 022
    os.chmod(note, 0o600)  # its user made it private
    d.call("memory.topic_edit", {"agent_id": "coder", "path": "digest/hand.md",
                                 "old": "first", "new": "second"})
    assert "second draft" in note.read_text()
    assert _mode(note) == 0o600
    assert d.stop() == 0

    # State an older recalld left readable is tightened as it is next written.
    for folder, _, names in os.walk(d.data_dir):
        for name in names:
            os.chmod(Path(folder) / name, 0o644)
    for folder, _, names in os.walk(ws / "mem_metadata"):
        for name in names:
            os.chmod(Path(folder) / name, 0o644)
    d2 = daemon_factory(**start_hook(daemon_factory.tmp_path, UMASK_022),
                        RECALLD_DATA_DIR=str(d.data_dir))
    d2.call("workspace.close", {"agent_id": "coder"})  # to open it with another key
    _use(d2, ws, KEY + "2", fake)
    assert KEY + "2" in record.read_text()
    for path in (record, d.data_dir / "state" / "jobs.journal",
                 ws / "mem_metadata" / "sessions" / "pending.jsonl"):
        assert _mode(path) == 0o600, path
    assert d2.stop() == 0


def test_state_files_an_older_recalld_left_open_are_made_private_at_start(
        daemon_factory: DaemonFactory, tmp_path: Path, fake: FakeProvider) -> None:
    d = daemon_factory(**start_hook(daemon_factory.tmp_path, UMASK_022))
    _use(d, tmp_path / "coder", KEY, fake)
    assert d.stop() == 0
    state = d.data_dir / "state"
    loose = {}
    for folder, _, names in os.walk(state):
        for name in names:
            os.chmod(Path(folder) / name, 0o644)
            loose[Path(folder) / name] = 0o600
    assert {state / "workspaces.json", state / "scheduler.json"} <= loose.keys()
    # Not followed: a link's target, nor a FIFO, is the daemon's to change.
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's")
    os.chmod(outside, 0o644)
    (state / "a-link").symlink_to(outside)
    os.mkfifo(state / "a-fifo", 0o644)
    os.chmod(state / "a-fifo", 0o644)
    d2 = daemon_factory(**start_hook(daemon_factory.tmp_path, UMASK_022),
                        RECALLD_DATA_DIR=str(d.data_dir))
    d2.call("daemon.status")  # a start that writes neither file
    assert {path: _mode(path) for path in loose} == loose
    assert _mode(outside) == 0o644 and _mode(state / "a-fifo") == 0o644
    assert "workspaces.json" in d2.log() and "private (mode 600)" in d2.log()
    assert d2.stop() == 0


UMASK_000 = "os.umask(0o000)"


def _made(top: Path, leaf: Path) -> dict[Path, int]:
    """The modes of ``leaf`` and its folders below ``top`` (those the test did not make)."""
    return {f: _mode(f) for f in (leaf, *leaf.parents) if f.is_relative_to(top) and f != top}


def test_base_folders_made_on_the_way_are_private_whatever_the_umask(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # None of the XDG folders exists: the daemon and install-service make them, and the
    # folders on the way, 0700 (as the XDG specification asks), not open to every user
    # as a umask of 000 would make them.
    env = daemon_factory.environment()
    home = Path(env["HOME"])
    runtime = Path(env["XDG_RUNTIME_DIR"])
    d = daemon_factory(
        **start_hook(daemon_factory.tmp_path, UMASK_000),
        args=["--log-file", str(home / "logs" / "r" / "recalld.log")],
        XDG_DATA_HOME=str(home / "deep" / "share"), XDG_RUNTIME_DIR=str(runtime / "a" / "b"),
        XDG_CONFIG_HOME=str(home / "conf" / "ig"))
    d.call("daemon.ping")
    made = {**_made(home, d.data_dir), **_made(runtime, d.socket_path.parent),
            **_made(home, home / "logs" / "r")}
    assert set(made) >= {home / "deep", home / "deep" / "share", runtime / "a",
                         home / "logs"}, made
    assert {f: m for f, m in made.items() if m != 0o700} == {}
    assert d.stop() == 0
    proc = subprocess.run(
        [sys.executable, "-m", "recalld.ipc", "install-service", "--write-only"],
        env=d.env, capture_output=True, text=True, timeout=60, check=False, umask=0)
    assert proc.returncode == 0, proc.stderr
    units = _made(home, home / "conf" / "ig" / "systemd" / "user")
    assert home / "conf" in units and (home / "conf" / "ig" / "systemd") in units
    assert {f: m for f, m in units.items() if m != 0o700} == {}


def test_workspace_folders_are_made_as_an_editor_makes_them_whatever_the_umask(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Under a umask of 000 the folders a workspace open makes were 0777: others could
    # move its derived state away and put a forged one in its place, or its notes.
    d = daemon_factory(**start_hook(daemon_factory.tmp_path, UMASK_000))
    ws = tmp_path / "new" / "deep" / "coder"
    d.call("workspace.open", {"agent_id": "coder", "path": str(ws)})
    made = _made(tmp_path, ws)
    made.update({f: _mode(f) for f in ws.iterdir() if f.is_dir()})
    meta = ws / "mem_metadata"
    assert made.pop(meta) == 0o700
    assert set(made) >= {tmp_path / "new", ws, ws / "memory", ws / "digest"}, made
    assert {f: m for f, m in made.items() if m != 0o755} == {}
    assert d.stop() == 0
