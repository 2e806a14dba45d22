"""Disk full through real calls: the daemon's own error code and message, no internal path.

The daemon runs as a real process, started with a hook that swaps the storage
layer's filesystem seam for a ``FailingFS`` (fail the k-th write, with ENOSPC or EDQUOT)
armed when a trigger file exists: the disk fills while the daemon serves, and empties
again when the file is removed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from hooks import start_hook
from markers import marker
from waits import wait_log

from recalld.ipc import errors

LAUNCHER = (
    "import errno, os, sys\n"
    "from pathlib import Path\n"
    "from recalld.daemon.store import failingfs, fsio\n"
    "trigger = Path(os.environ['DISK_FULL_TRIGGER'])\n"
    "class Full(failingfs.FailingFS):\n"
    "    def _check(self, op):\n"
    "        return trigger.exists() and super()._check(op)\n"
    "full = Full(int(os.environ['DISK_FULL_AT']), persistent=True,\n"
    "            err=getattr(errno, os.environ['DISK_FULL_ERRNO']))\n"
    "fsio.REAL.__class__ = Full\n"
    "fsio.REAL.__dict__.update(vars(full))\n"
)


def _raw_error(d: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    with d.connect() as conn:
        conn.request(method, params)
        answer: dict[str, Any] = conn.recv_response()
    assert "error" in answer, answer
    return dict(answer["error"])


@pytest.mark.parametrize(("err", "fail_at"), [("ENOSPC", 1), ("EDQUOT", 3)])
def test_disk_full_has_its_own_code_and_no_internal_path(
        daemon_factory: Any, tmp_path: Path, err: str, fail_at: int) -> None:
    root = tmp_path / "ws"
    trigger = tmp_path / "disk-is-full"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n', **start_hook(tmp_path, LAUNCHER),
                       DISK_FULL_TRIGGER=str(trigger), DISK_FULL_AT=str(fail_at),
                       DISK_FULL_ERRNO=err)
    first = d.call("memory.add_note", {"agent_id": "w", "content": "before: the disk had room"})
    trigger.touch()
    for n in range(fail_at - 1):
        # The writes before the k-th find room (unless the index's own saves, which write
        # through the same seam, took them first: then this is the disk-full answer).
        with contextlib.suppress(errors.DiskFull):
            d.call("memory.add_note", {"agent_id": "w", "content": f"still room {n}"})
    turns = {"agent_id": "w", "session_id": "s1",
             "messages": [{"role": "user", "content": "while the disk is full"}]}
    for method, params in (
            ("memory.add_note", {"agent_id": "w", "content": "while the disk is full"}),
            ("memory.add_turns", turns)):
        error = _raw_error(d, method, params)
        assert error["code"] == errors.DISK_FULL == -32011, error
        assert error["message"].startswith("disk full"), error
        assert error.get("data") == {"errno": err}
        sent = orjson.dumps(error).decode()
        assert str(tmp_path) not in sent and "mem_metadata" not in sent, sent
        assert isinstance(errors.error_from_wire(error), errors.DiskFull)
    assert d.call("daemon.ping")["pong"] is True
    # Nothing half-written: the note holds only what was saved before.
    note = (root / first["path"]).read_text()
    assert "before: the disk had room" in note and "while the disk is full" not in note
    assert d.call("memory.add_turns", {**turns, "messages": []})["pending_turns"] == 0
    # Space again: the same calls succeed.
    trigger.unlink()
    d.call("memory.add_note", {"agent_id": "w", "content": "after: room again"})
    assert d.call("memory.add_turns", turns)["pending_turns"] == 1
    assert "after: room again" in (root / first["path"]).read_text()


# The disk fills when a file of a given name is created (a restore's temp files are named
# after their targets): the restore fails at a known file, whatever the index wrote before.
NAMED_LAUNCHER = (
    "import errno, os, sys\n"
    "from recalld.daemon.store import fsio\n"
    "real_open_write = fsio.FS.open_write_at\n"
    "def open_write(self, folder, name, *args):\n"
    "    if (os.path.exists(os.environ['DISK_FULL_TRIGGER'])\n"
    "            and os.environ['DISK_FULL_NAME'] in name):\n"
    "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
    "    return real_open_write(self, folder, name, *args)\n"
    "fsio.FS.open_write_at = open_write\n"
)


def _notes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted((root / "memory").rglob("*")) if p.is_file()}


@pytest.mark.parametrize("full_at", ["n0.md", "n3.md", "n5.md"])
def test_a_restore_that_fills_the_disk_changes_nothing_and_keeps_serving(
        daemon_factory: Any, tmp_path: Path, full_at: str) -> None:
    root = tmp_path / "ws"
    for n in range(6):
        note = root / "memory" / "2026-07-23" / f"n{n}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"# Note {n}\n{marker(n, 'backedup')} zeppelin\n")
    trigger = tmp_path / "disk-is-full"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n',
                       **start_hook(tmp_path, NAMED_LAUNCHER),
                       DISK_FULL_TRIGGER=str(trigger), DISK_FULL_NAME=full_at)
    d.call("index.sync", {"agent_id": "w"})
    archive = d.call("backup.create", {"agents": ["w"]})["file"]
    # An earlier restore, whose rollback point a failed restore must leave as it is.
    earlier = d.call("backup.restore", {"file": archive, "agents": ["w"]})["snapshot"]
    (root / "memory" / "2026-07-24").mkdir()
    (root / "memory" / "2026-07-24" / "later.md").write_text("# Later\nafterwards\n")
    for n in range(6):
        edited = f"# Note {n}\n{marker(n, 'edited')}\n"
        (root / "memory" / "2026-07-23" / f"n{n}.md").write_text(edited)
    d.call("index.sync", {"agent_id": "w"})
    before = _notes(root)

    trigger.touch()
    with pytest.raises(errors.DiskFull, match=full_at):
        d.call("backup.restore", {"file": archive, "agents": ["w"]})
    # Nothing half-restored: every note as it was, none removed, no temp file left.
    assert _notes(root) == before
    # Nor a new rollback point: rolling back still undoes the earlier restore.
    listed_backups = d.call("backup.list")
    assert listed_backups["rollback"]["snapshot"] == earlier
    assert [b["file"] for b in listed_backups["backups"]
            if b["name"].startswith("pre-restore-")] == [earlier]
    # The workspace still serves what it had.
    listed = {w["agent_id"]: w["state"] for w in d.call("workspace.list")["workspaces"]}
    assert listed["w"] == "ready", listed
    hits = d.call("memory.search", {"agent_id": "w", "query": marker(3, "edited"), "sync": True})
    assert [h["path"] for h in hits["results"]] == ["memory/2026-07-23/n3.md"]

    trigger.unlink()
    d.call("backup.restore", {"file": archive, "agents": ["w"]})
    restored = (root / "memory/2026-07-23/n3.md").read_text()
    assert restored == f"# Note 3\n{marker(3, 'backedup')} zeppelin\n"
    assert not (root / "memory/2026-07-24/later.md").exists()
    hits = d.call("memory.search", {"agent_id": "w", "query": marker(3, "backedup")})
    assert [h["path"] for h in hits["results"]] == ["memory/2026-07-23/n3.md"]


@pytest.mark.parametrize("how", ["close", "stop"])
def test_a_full_disk_at_close_or_stop_is_not_a_failure(
        daemon_factory: Any, tmp_path: Path, how: str) -> None:
    root = tmp_path / "ws"
    note = root / "memory" / "2026-07-23" / "n.md"
    note.parent.mkdir(parents=True)
    note.write_text("# Note\nsaved before\n")
    trigger = tmp_path / "disk-is-full"
    # Saves follow changes at once (the default waits 2 s to batch them).
    config = f'[workspaces.w]\npath = "{root}"\n[daemon]\npersist_delay_s = 0.05\n'
    d = daemon_factory(config, **start_hook(tmp_path, LAUNCHER), DISK_FULL_TRIGGER=str(trigger),
                       DISK_FULL_AT="1", DISK_FULL_ERRNO="ENOSPC")
    d.call("index.sync", {"agent_id": "w"})
    trigger.touch()
    (note.parent / "late.md").write_text("# Late\nunsavedchange\n")
    d.call("index.sync", {"agent_id": "w"})
    # The index has the change in memory and cannot save it.
    wait_log(d.log_path, "saving the index failed", "a failed save")
    if how == "close":
        d.call("workspace.close", {"agent_id": "w"})
        assert "workspace w failed" not in d.log()
        d.call("workspace.open", {"agent_id": "w", "path": str(root)})
        hits = d.call("memory.search", {"agent_id": "w", "query": "unsavedchange",
                                        "sync": True})
        assert [h["path"] for h in hits["results"]] == ["memory/2026-07-23/late.md"]
    # The Markdown holds every change: a full disk at the end is logged, not an error exit.
    assert d.stop() == 0, d.log()
    assert "Traceback" not in d.log()
    trigger.unlink()
    d2 = daemon_factory(config)
    hits = d2.call("memory.search", {"agent_id": "w", "query": "unsavedchange", "sync": True})
    assert [h["path"] for h in hits["results"]] == ["memory/2026-07-23/late.md"]


SUBMIT_FULL = (
    "import errno, os, sys\n"
    "from pathlib import Path\n"
    "from recalld.daemon.store import fsio\n"
    "trigger = Path(os.environ['DISK_FULL_TRIGGER'])\n"
    "class Full(fsio.FS):\n"
    "    def write(self, fd, data):\n"
    "        if trigger.exists() and b'\"op\":\"submit\"' in bytes(data):\n"
    "            raise OSError(errno.ENOSPC, 'No space left on device')\n"
    "        super().write(fd, data)\n"
    "fsio.REAL.__class__ = Full\n"
)


def test_turns_saved_when_their_job_cannot_be_queued_are_not_an_error(
        daemon_factory: Any, tmp_path: Path) -> None:
    """The turns were saved but recording their auto_memory job failed (the disk filled
    up between the two writes): the call answered disk full, so a caller adding them
    again had them twice. Now it answers with the saved counters, without a job."""
    root = tmp_path / "ws"
    trigger = tmp_path / "disk-is-full"
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\nauto_memory_interval = 1\n',
                       **start_hook(tmp_path, SUBMIT_FULL), DISK_FULL_TRIGGER=str(trigger))
    trigger.touch()
    params = {"agent_id": "w", "session_id": "s1",
              "messages": [{"role": "user", "content": "the disk is nearly full"}]}
    answer = d.call("memory.add_turns", params)
    assert answer["pending_messages"] == 1 and "job_id" not in answer, answer
    assert d.call("memory.add_turns", {"agent_id": "w", "session_id": "s1", "flush": True,
                                       "request_id": "r1"})["pending_messages"] == 1
    wait_log(d.log_path, "no auto_memory job could be queued", "the warning")
    trigger.unlink()  # room again: the next turn queues the job for all of them
    answer = d.call("memory.add_turns", params)
    assert answer["pending_messages"] == 2 and "job_id" in answer, answer
