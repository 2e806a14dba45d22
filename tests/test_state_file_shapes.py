"""State files that are not files any more, seen from a restarted daemon: a directory, a
FIFO, a link to a device or a huge sparse file where a manifest or a generation file was.

They are damage like a garbled file: the workspace opens (never ``failed``, never waiting
on the FIFO or reading the device forever), the damage is named in ``load_corrupt`` and
the log, the index is rebuilt from the Markdown and answers as before the damage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle
from waits import wait_for

from recalld.daemon import remembered
from recalld.daemon.store.applog import encode_line
from recalld.ipc.client import Client
from recalld.ipc.errors import NotFound

AGENT = "default"
CONFIG = "[daemon]\npersist_delay_s = 0.2\n"
QUERIES = ("heron", "marker7", "keeper marker3")


def _write_notes(root: Path) -> None:
    for i in range(12):
        day = root / "memory" / f"2026-05-{i % 5 + 1:02d}"
        day.mkdir(parents=True, exist_ok=True)
        (day / f"n{i}.md").write_text(
            f"# Note {i}\n\nThe heron at pond {i}; the keeper wrote marker{i}.\n"
            f"See [[n{(i + 1) % 12}]].\n", encoding="utf-8")


def _workspace(daemon: DaemonHandle) -> dict[str, Any]:
    status = daemon.call("daemon.status")
    return next(w for w in status["workspaces"] if w["agent_id"] == AGENT)


def _answers(daemon: DaemonHandle) -> dict[str, list[tuple[str, int, float]]]:
    out = {}
    for query in QUERIES:
        hits = daemon.call("memory.search", {"agent_id": AGENT, "query": query,
                                             "max_results": 20, "sync": True})["results"]
        out[query] = [(h["path"], h["start_line"], round(h["score"], 4)) for h in hits]
    return out


def _committed(daemon: DaemonHandle) -> bool:
    ws = _workspace(daemon)
    idx = ws["index"]
    return (ws["state"] == "ready" and bool(idx["last_commit"])
            and not idx["uncommitted_changes"] and idx["load_checked"])


def _saved_workspace(daemon_factory: DaemonFactory, tmp_path: Path
                     ) -> tuple[dict[str, str], Path, dict[str, list[tuple[str, int, float]]]]:
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    root = tmp_path / "data" / "workspaces" / AGENT
    _write_notes(root)
    daemon = daemon_factory(CONFIG, **env)
    before = _answers(daemon)
    assert all(before.values()), before
    wait_for(lambda: _committed(daemon), "the first commit")
    assert daemon.stop() == 0
    return env, root / "mem_metadata" / "index", before


def _restart_and_check(daemon_factory: DaemonFactory, env: dict[str, str],
                       before: dict[str, list[tuple[str, int, float]]]) -> dict[str, str]:
    daemon = daemon_factory(CONFIG, **env)
    wait_for(lambda: _committed(daemon), "the rebuilt index to be saved")
    corrupt: dict[str, str] = _workspace(daemon)["index"]["load_corrupt"]
    assert _answers(daemon) == before
    assert daemon.call("index.verify", {"agent_id": AGENT})["ok"] is True
    assert "derived state was corrupt" in daemon.log()
    assert daemon.stop() == 0
    return corrupt


def test_generation_files_replaced_by_other_kinds_of_file(daemon_factory: DaemonFactory,
                                                          tmp_path: Path) -> None:
    env, index_dir, before = _saved_workspace(daemon_factory, tmp_path)
    files = {p.name.split(".")[0]: p for p in index_dir.glob("*.g0*")}
    files["bm25"].unlink()
    files["bm25"].mkdir()
    files["graph"].unlink()
    os.mkfifo(files["graph"])  # nobody will ever write to it
    files["catalog"].unlink()
    files["catalog"].symlink_to("/dev/zero")
    with files["chunks"].open("r+b") as f:
        f.truncate(1 << 40)  # a terabyte of holes

    corrupt = _restart_and_check(daemon_factory, env, before)
    assert "not a regular file" in corrupt["catalog"], corrupt
    # The directory, FIFO and link stay: the daemon removes only files it wrote.
    assert files["bm25"].is_dir() and files["graph"].is_fifo()


def test_a_manifest_replaced_by_a_directory_is_named_and_rebuilt(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    env, index_dir, before = _saved_workspace(daemon_factory, tmp_path)
    [manifest] = index_dir.glob("MANIFEST-*.json")
    manifest.unlink()
    manifest.mkdir()

    corrupt = _restart_and_check(daemon_factory, env, before)
    assert corrupt["manifest"] == f"{manifest.name}: not a regular file (a directory)"
    assert manifest.is_dir()


def test_logs_and_records_that_are_no_files_are_set_aside(daemon_factory: DaemonFactory,
                                                          tmp_path: Path) -> None:
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    root = tmp_path / "data" / "workspaces" / AGENT
    _write_notes(root)
    daemon = daemon_factory(CONFIG, **env)
    daemon.call("memory.add_turns", {"agent_id": AGENT, "session_id": "s1",
                                     "messages": [{"role": "user", "content": "first"}]})
    assert daemon.stop() == 0
    state = tmp_path / "data" / "state"
    meta = root / "mem_metadata"
    for path in (state / "workspaces.json", meta / "sessions" / "pending.jsonl"):
        path.unlink()
        path.mkdir()
    (state / "jobs.journal").unlink()
    os.mkfifo(state / "jobs.journal")  # nobody will ever write to it
    (meta / "inbox" / "inbox.jsonl").unlink()
    (meta / "inbox" / "inbox.jsonl").symlink_to("/dev/zero")

    daemon = daemon_factory(CONFIG, **env)
    assert _workspace(daemon)["state"] == "ready"
    answer = daemon.call("memory.add_turns", {
        "agent_id": AGENT, "session_id": "s2",
        "messages": [{"role": "user", "content": "second"}]})
    assert answer["pending_turns"] == 1
    job = daemon.call("jobs.submit", {"agent_id": AGENT, "kind": "reindex"})
    log = daemon.log()
    for name in ("jobs.journal", "inbox.jsonl", "pending.jsonl"):
        assert f"{name} is not a regular file" in log, log[-3000:]
    assert "workspaces.json does not verify (not a regular file (a directory))" in log
    assert daemon.stop() == 0
    aside = sorted(p.name.split(".corrupt")[0] for p in [*state.iterdir(), *meta.rglob("*")]
                   if ".corrupt" in p.name)
    assert aside == ["inbox.jsonl", "jobs.journal", "pending.jsonl", "workspaces.json"]

    daemon = daemon_factory(CONFIG, **env)  # what was written since is kept
    sessions = _workspace(daemon)["sessions"]
    assert sessions["pending_messages"] == 1, sessions
    assert daemon.call("jobs.get", {"agent_id": AGENT, "job_id": job["job_id"]})


def test_verified_state_records_of_another_shape_are_passed_by(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Records whose checksums match but whose shape does not (written by hand or by
    # another program): a workspace record keyed by no agent id ("../up", "a/b") was
    # served as a failed workspace no method can name, and `recalld status`, asking each
    # workspace for its jobs, failed for every agent; a job record with its params a list
    # stopped the start (exit 1: a restart loop under systemd), as did a scheduler
    # record whose time has no offset.
    state = tmp_path / "data" / "state"
    state.mkdir(parents=True, mode=0o700)
    (tmp_path / "data").chmod(0o700)
    entries = {agent: remembered.Remembered(path=str(tmp_path / f"ws{n}"), config=None,
                                            registered_at=1.0)
               for n, agent in enumerate(("kept", "../up", "a/b", "", "ab\x00c"))}
    remembered.save(state / "workspaces.json", entries)
    job = {"job_id": "0123456789abcdef", "agent_id": "kept", "kind": "reindex",
           "params": {}, "state": "succeeded", "submitted_at": 1.0, "finished_at": 2.0}
    bad = [{"params": [1, 2]}, {"agent_id": "../up"}, {"state": "weird"}, {"job_id": 5},
           {"submitted_at": "yesterday"}, {"error_code": "x"}, {"kind": None}]
    (state / "jobs.journal").write_bytes(b"".join(
        encode_line({**job, **fields, "job_id": fields.get("job_id", f"{n:016x}")})
        for n, fields in enumerate([{"job_id": job["job_id"]}, *bad])))
    (state / "scheduler.json").write_text(json.dumps({"version": 1, "entries": {
        "default/auto_dream": {"cron": "0 23 * * *", "tz": "Europe/Berlin",
                               "last_fired": "2026-06-01T23:00:00"}}}))
    daemon = daemon_factory(RECALLD_DATA_DIR=str(tmp_path / "data"), TZ="Europe/Berlin")
    assert [w["agent_id"] for w in daemon.call("daemon.status")["workspaces"]] == [
        "default", "kept"]
    log = daemon.log()
    assert "the record of '../up' is passed by: not an agent id" in log, log[-3000:]
    assert log.count("job journal: passing by the record of job") == len(bad), log[-3000:]
    with Client(daemon.socket_path) as c:
        assert [j["job_id"] for j in c.jobs_of_every_workspace()] == [job["job_id"]]
    dream = next(w for w in daemon.call("daemon.status")["workspaces"]
                 if w["agent_id"] == "default")["dream"]
    assert dream["tz"] == "Europe/Berlin" and dream["next_run"], dream  # from now on
    assert dream["last_fired"] != "2026-06-01T23:00:00", dream


def _add_turn(daemon: DaemonHandle, text: str) -> int:
    """One user turn added to session s1; the messages pending there since."""
    answer = daemon.call("memory.add_turns", {
        "agent_id": AGENT, "session_id": "s1",
        "messages": [{"role": "user", "content": text}]})
    return int(answer["pending_messages"])


def test_turns_acknowledged_after_the_workspace_folder_was_removed_survive(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """The open pending-turns log pointed at a removed file: turns acknowledged after the
    workspace folder was moved away and removed (and made again) were lost at restart.
    While the folder is gone a turn is refused (recalld does not make the folder again,
    empty), so nothing is acknowledged that could be lost; once it is back, turns go on."""
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    root = tmp_path / "data" / "workspaces" / AGENT
    _write_notes(root)
    daemon = daemon_factory(CONFIG, **env)

    assert _add_turn(daemon, "before") == 1
    gone = root.with_name("gone")
    root.rename(gone)
    for path in sorted(gone.rglob("*"), reverse=True):  # rm -r
        path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    gone.rmdir()
    with pytest.raises(NotFound, match="missing"):
        _add_turn(daemon, "while it is gone")
    (root / "memory").mkdir(parents=True, exist_ok=True)
    acknowledged = _add_turn(daemon, "after it is made again")
    daemon.kill()

    daemon = daemon_factory(CONFIG, **env)
    answer = daemon.call("memory.add_turns", {"agent_id": AGENT, "session_id": "s1"})
    assert answer["pending_messages"] == acknowledged


def test_turns_acknowledged_after_the_log_was_saved_over_survive(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    """An editor's save (a copy written beside the log, renamed over it) left the open
    pending-turns log appending to the unlinked file: turns acknowledged from then on were
    lost at restart. The copy is kept beside the log, whose records stay in place."""
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    root = tmp_path / "data" / "workspaces" / AGENT
    _write_notes(root)
    daemon = daemon_factory(CONFIG, **env)

    assert _add_turn(daemon, "before the save") == 1
    pending = root / "mem_metadata" / "sessions" / "pending.jsonl"
    copy = pending.with_name(".pending.jsonl.swp")
    copy.write_bytes(pending.read_bytes().replace(b"before the save", b"edited by hand!"))
    copy.rename(pending)
    assert _add_turn(daemon, "after the save") == 2
    kept = [p.name for p in pending.parent.iterdir() if p.name.startswith("pending.jsonl.")]
    assert len(kept) == 1 and b"edited by hand!" in (pending.parent / kept[0]).read_bytes()
    daemon.kill()

    daemon = daemon_factory(CONFIG, **env)
    answer = daemon.call("memory.add_turns", {"agent_id": AGENT, "session_id": "s1"})
    assert answer["pending_messages"] == 2
