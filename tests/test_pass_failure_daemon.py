"""A real daemon whose notes fail to read (out of memory, or EIO from the disk): it serves
what a failed pass applied and its other workspace, retries the rest, and lists the notes
it cannot read until they read again or go.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from markers import marker
from pass_notes import ADDED, BAD_AT, BEFORE, _write
from test_cli import recalld
from waits import wait_value, workspace_status

from recalld.daemon.index.procpool import cpu_count

# Loaded by every process of the daemon (its worker processes too) through PYTHONPATH:
# while the trigger file exists, reading a note of the listed names runs out of memory
# (or, with FAILING_ERROR=eio, fails as a failing disk does).
SITECUSTOMIZE = """\
import os
names = os.environ.get("FAILING_NAMES")
if names:
    from pathlib import Path
    from recalld.daemon.index import prepare
    _trigger = Path(os.environ["FAILING_TRIGGER"])
    _real = prepare._read_note
    def _read_note(root, rel, real_root=None):
        if _trigger.exists() and rel.rsplit("/", 1)[-1] in names.split(","):
            if os.environ.get("FAILING_ERROR") != "eio":
                raise MemoryError("reading " + rel)
            if os.path.exists(os.path.join(root, rel)):  # a removed note reads as gone
                import errno
                raise OSError(errno.EIO, os.strerror(errno.EIO), rel)
        return _real(root, rel, real_root)
    prepare._read_note = _read_note
"""


# Loaded by every process of the daemon through PYTHONPATH: the first worker process to
# read a note while the trigger file exists (it takes the file) writes part of an answer
# and is killed, as a worker the OOM killer ends while it sends a large result.
DYING_WORKER = """\
import os
if os.environ.get("DYING_TRIGGER"):
    from recalld.daemon.index import prepare
    _real = prepare._read_note
    def _read_note(root, rel, real_root=None):
        import multiprocessing
        trigger = os.environ["DYING_TRIGGER"]
        if multiprocessing.parent_process() is None:  # the daemon: reads as it would
            return _real(root, rel, real_root)
        try:
            os.rename(trigger, trigger + ".taken")
        except FileNotFoundError:
            return _real(root, rel, real_root)
        from half_answer import write_part_of_an_answer_then_die
        write_part_of_an_answer_then_die()
    prepare._read_note = _read_note
"""


def _found(d: Any, agent: str, i: int) -> bool:
    hits = d.call("memory.search", {"agent_id": agent, "query": marker(i),
                                    "max_results": 3})["results"]
    return any(h["path"].endswith(f"/n{i:05d}.md") for h in hits)


def _index_status(d: Any, agent: str) -> dict[str, Any]:
    status: dict[str, Any] = (workspace_status(d, agent) or {"index": {}})["index"]
    return status


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_daemon_serves_what_a_failed_pass_applied_and_the_other_workspace(
        daemon_factory: Any, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, 0, BEFORE)
    _write(b, 0, 50)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    trigger = tmp_path / "memory-runs-out"
    # No commit while the failure is on: what a search finds comes from the passes alone.
    config = (f'[workspaces.a]\npath = "{a}"\n[workspaces.b]\npath = "{b}"\n'
              '[daemon]\npersist_delay_s = 600\n')
    bad = f"n{BEFORE + BAD_AT:05d}.md"
    env = {"PYTHONPATH": str(hooks), "FAILING_NAMES": bad, "FAILING_TRIGGER": str(trigger)}
    d = daemon_factory(config, **env)
    d.call("index.sync", {"agent_id": "a"}, timeout=100)
    d.call("index.sync", {"agent_id": "b"}, timeout=100)
    assert d.stop() == 0  # commits the first build
    # Written while the daemon is down: its startup reconcile is one large pass.
    added = _write(a, BEFORE, ADDED)
    trigger.touch()
    d = daemon_factory(config, **env)
    status = wait_value(lambda: _index_status(d, "a"),
                        lambda s: s.get("watcher", {}).get("errors"),
                        "the startup pass of a fails", 100)
    assert "MemoryError: reading" in status["watcher"]["last_error"], status
    # What the failed pass applied is found (it is listed as indexed), before any commit.
    listed = status["files"]
    assert BEFORE < listed < BEFORE + ADDED
    assert status["loaded_generation"] == 1 and status["last_commit"] is None
    for i in (BEFORE, BEFORE + 255, BEFORE + 511):
        assert _found(d, "a", i), i
    assert _found(d, "a", 7)
    # The other workspace serves and indexes as before.
    assert _found(d, "b", 3)
    (b / "memory/2026-07-01/late.md").write_text(f"# Late\n\n{marker(99999)} in b\n")
    d.call("index.sync", {"agent_id": "b"}, timeout=120)
    hits = d.call("memory.search", {"agent_id": "b", "query": marker(99999)})["results"]
    assert [h["path"] for h in hits] == ["memory/2026-07-01/late.md"]
    # Memory again: the watcher's retry indexes the rest of a.
    trigger.unlink()
    # (The retry comes after the watcher's backoff, at most restart_backoff_max_s.)
    wait_value(lambda: _index_status(d, "a"), lambda s: s.get("files") == BEFORE + ADDED,
               "every note of a is indexed", 150)
    for i in (BEFORE + BAD_AT, BEFORE + ADDED - 1, BEFORE + 100):
        assert _found(d, "a", i), i
    assert len(added) == ADDED


@pytest.mark.timeout(120)
def test_a_daemon_lists_the_notes_it_cannot_read_until_they_read_or_go(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "w"
    rels = _write(root, 0, 40)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    trigger = tmp_path / "disk-fails"
    edited, new = rels[7], "memory/2026-07-01/n00090.md"
    others = [f"memory/2026-07-01/n0009{i}.md" for i in (1, 2, 3)]
    env = {"PYTHONPATH": str(hooks),
           "FAILING_NAMES": ",".join(p.rsplit("/", 1)[1] for p in [edited, new, *others]),
           "FAILING_TRIGGER": str(trigger), "FAILING_ERROR": "eio"}
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n', **env)
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable"] == 0
    trigger.touch()
    (root / edited).write_text(f"# Note 7\n\n{marker(7)} rewritten with freshword\n")
    (root / new).write_text(f"# Note 90\n\n{marker(90)} never read\n")
    for rel in others:
        (root / rel).write_text("# Another\n\nnever read either\n")
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    listed = [edited, new, *others]
    status = _index_status(d, "w")
    assert status["unreadable"] == 5 and status["unreadable_paths"] == listed
    health = (workspace_status(d, "w") or {})["health"]
    assert health["state"] == "degraded" and health["unreadable_paths"] == listed
    assert any("5 note(s) could not be read" in r and edited in r for r in health["reasons"])
    # The first few in last_errors (many must not push other errors out).
    eio = os.strerror(errno.EIO)
    assert {e["what"]: e["error"] for e in health["last_errors"]
            if e["what"].startswith("read ")} == {f"read {p}": eio for p in listed[:3]}
    verbose = recalld("status", "--verbose", env=d.env)
    assert f"w: could not be read: {', '.join(listed)}" in verbose.stdout, verbose.stdout
    # The fix said is the one that helps (the disk, the permissions), not a reindex.
    assert "check the disk and the permissions" in verbose.stdout, verbose.stdout
    for rel in others:
        (root / rel).unlink()
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable_paths"] == [edited, new]
    # The last version read stays searchable; the daemon answers on.
    assert _found(d, "w", 7) and not _found(d, "w", 90)
    assert not d.call("memory.search", {"agent_id": "w", "query": "freshword"})["results"]
    # Removed: no longer listed.
    (root / new).unlink()
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable_paths"] == [edited]
    # Readable again (the next change to it is read): indexed, and health has no reason
    # of it left.
    trigger.unlink()
    (root / edited).write_text(f"# Note 7\n\n{marker(7)} rewritten with freshword again\n")
    d.call("index.sync", {"agent_id": "w"}, timeout=60)
    assert _index_status(d, "w")["unreadable"] == 0
    hits = d.call("memory.search", {"agent_id": "w", "query": "freshword"})["results"]
    assert [h["path"] for h in hits] == [edited]
    health = (workspace_status(d, "w") or {})["health"]
    assert health["unreadable"] == 0 and health["state"] != "degraded", health


@pytest.mark.skipif(cpu_count() < 2, reason="one core: a daemon starts no worker processes")
@pytest.mark.timeout(180)
def test_a_worker_killed_while_answering_fails_no_pass_and_no_stop(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "w"
    _write(root, 0, BEFORE)  # a first build large enough for the worker processes
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(DYING_WORKER, encoding="utf-8")
    trigger = tmp_path / "a-worker-dies"
    trigger.touch()
    env = {"PYTHONPATH": f"{hooks}{os.pathsep}{Path(__file__).parent}",
           "DYING_TRIGGER": str(trigger)}
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n', **env)
    d.call("index.sync", {"agent_id": "w"}, timeout=120)
    assert not trigger.exists() and trigger.with_name("a-worker-dies.taken").exists()
    # Its batch was prepared in a thread: nothing of the pass is missing.
    assert _index_status(d, "w")["files"] == BEFORE
    for i in (0, 300, BEFORE - 1):
        assert _found(d, "w", i), i
    assert "indexing worker processes failed" in d.log()
    assert d.stop() == 0  # and stops: no thread waits on the dead worker's message
