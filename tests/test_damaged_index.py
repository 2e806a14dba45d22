"""Index files damaged under a running daemon, seen from outside: a real daemon, real
clients searching over the real socket, the live generation files truncated or overwritten.

The daemon stays up, every search answers (from the private copies it serves from), health
turns ``degraded`` naming the damaged files, and a new generation (a compact, a reindex)
restores them; the Markdown is never touched and a restart loads the repaired index.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle
from waits import wait_for

from recalld.ipc.client import Client
from recalld.ipc.errors import RecalldError

AGENT = "default"
# Long enough that nothing re-saves the index by itself while the test looks at it.
CONFIG = "[daemon]\npersist_delay_s = 3600.0\n"
NOTES = 60
QUERY = "heron"


def _write_notes(root: Path) -> None:
    for i in range(NOTES):
        day = root / "memory" / f"2026-07-{i % 28 + 1:02d}"
        day.mkdir(parents=True, exist_ok=True)
        (day / f"note{i}.md").write_text(
            f"# Note {i}\n\nThe heron count at pond {i} was {i * 3}; "
            f"the keeper logged marker{i} beside it.\n\n## More\n\n"
            + " ".join(f"word{i}x{j}" for j in range(40)) + "\n", encoding="utf-8")


def _markdown(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "memory").rglob("*.md"))}


def _workspace(daemon: DaemonHandle) -> dict[str, Any]:
    status = daemon.call("daemon.status")
    return next(w for w in status["workspaces"] if w["agent_id"] == AGENT)




def _committed(daemon: DaemonHandle) -> bool:
    idx = _workspace(daemon)["index"]
    return bool(idx["last_commit"]) and not idx["uncommitted_changes"] and idx["load_checked"]


def _array_files(root: Path) -> dict[str, Path]:
    found = {p.name.split(".")[0]: p for p in (root / "mem_metadata" / "index").glob("*.arr")}
    assert {"bm25", "chunk_table"} <= set(found), found
    return found


def _mapped_copies(daemon: DaemonHandle, root: Path) -> set[str]:
    """The unnamed files in the index folder the daemon has mapped (its private copies)."""
    index_dir = str(root / "mem_metadata" / "index") + "/"
    with open(f"/proc/{daemon.pid}/maps", encoding="utf-8") as f:
        fields = [line.split(maxsplit=5) for line in f]
    return {f[5].strip() for f in fields
            if len(f) == 6 and f[5].startswith(index_dir) and f[5].strip().endswith("(deleted)")}


class Searchers:
    """Client threads searching in a loop until stopped; every answer is kept."""

    def __init__(self, daemon: DaemonHandle, clients: int = 3) -> None:
        self._daemon = daemon
        self._stop = threading.Event()
        self.answers: list[tuple[str, list[str]]] = []
        self.errors: list[str] = []
        self.broken: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def _run(self, i: int) -> None:
        try:
            with Client(self._daemon.socket_path) as c:
                n = 0
                while not self._stop.is_set():
                    query = QUERY if n % 2 == 0 else f"marker{(i * 7 + n) % NOTES}"
                    n += 1
                    try:
                        hits = c.search(AGENT, query, max_results=5).results
                        self.answers.append((query, [h.path for h in hits]))
                    except RecalldError as exc:  # a clear error is allowed, a dead socket not
                        assert exc.message, exc
                        self.errors.append(exc.message)
        except BaseException as exc:
            self.broken.append(exc)

    def __enter__(self) -> Searchers:
        for t in self._threads:
            t.start()
        wait_for(lambda: len(self.answers) >= 10 or bool(self.broken), "the first searches")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def _damage(files: dict[str, Path], how: str) -> None:
    for path in files.values():
        size = path.stat().st_size
        if how == "truncate":
            os.truncate(path, size // 3)
        else:  # garbage over every byte, same size, same inode
            with path.open("r+b") as f:
                f.write(os.urandom(size))


def _check_damaged(daemon: DaemonHandle, files: dict[str, Path], root: Path) -> None:
    def degraded() -> bool:
        return _workspace(daemon)["health"]["state"] == "degraded"

    wait_for(degraded, "health to turn degraded")
    health = _workspace(daemon)["health"]
    reasons = "\n".join(health["reasons"])
    for path in files.values():
        assert str(path.relative_to(root)) in reasons, reasons
    damaged = _workspace(daemon)["index"]["damaged_files"]
    assert {"bm25", "chunk_table"} <= set(damaged), damaged
    with Client(daemon.socket_path) as c:
        report = c.index_verify(AGENT)
    assert report["ok"] is False
    assert report["live"] == {"ok": True, "damaged": {}}, report["live"]
    assert {"bm25", "chunk_table"} <= set(report["generation"]["corrupt"]), report["generation"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncate", "garbage"])
def test_live_index_files_damaged_under_searches(daemon_factory: DaemonFactory,
                                                 tmp_path: Path, how: str) -> None:
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    root = tmp_path / "data" / "workspaces" / AGENT
    _write_notes(root)
    daemon = daemon_factory(CONFIG, **env)
    with Client(daemon.socket_path) as c:
        c.index_sync(AGENT)
        c.index_compact(AGENT)  # a generation saved and then served from its files
        before = [h.path for h in c.search(AGENT, QUERY, max_results=5).results]
    assert len(before) == 5
    wait_for(lambda: _committed(daemon), "the first commit")
    markdown = _markdown(root)
    files = _array_files(root)

    with Searchers(daemon) as searchers:
        _damage(files, how)
        _check_damaged(daemon, files, root)
        # Edits after the damage are indexed as usual.
        extra = root / "memory" / "2026-07-30" / "late.md"
        extra.parent.mkdir(parents=True, exist_ok=True)
        extra.write_text("# Late\n\nA late egret note with quillwort.\n", encoding="utf-8")
        with Client(daemon.socket_path) as c:
            hits = c.search(AGENT, "quillwort", max_results=3, sync=True).results
        assert [h.path for h in hits] == ["memory/2026-07-30/late.md"]
        count = len(searchers.answers)
        wait_for(lambda: len(searchers.answers) > count + 20, "searches after the damage")
    assert not searchers.broken, searchers.broken
    assert not searchers.errors, searchers.errors[:3]
    assert daemon.proc.poll() is None, daemon.log()[-2000:]
    for query, paths in searchers.answers:  # whole answers, from the right notes
        if query == QUERY:
            assert len(paths) == 5, (query, paths)
        else:
            i = int(query.removeprefix("marker"))
            assert paths[:1] == [f"memory/2026-07-{i % 28 + 1:02d}/note{i}.md"], (query, paths)

    with Client(daemon.socket_path) as c:
        if how == "truncate":
            c.index_compact(AGENT)  # saves a new generation from what the daemon holds
        else:
            job = c.jobs_submit(AGENT, "reindex")
            wait_for(lambda: c.jobs_get(AGENT, job["job_id"])["state"] == "succeeded",
                      "the reindex")
    wait_for(lambda: _workspace(daemon)["health"]["state"] == "clean", "health to be clean")
    assert _workspace(daemon)["index"]["damaged_files"] == {}
    with Client(daemon.socket_path) as c:
        report = c.index_verify(AGENT)
        assert report["ok"] is True, report
        assert [h.path for h in c.search(AGENT, QUERY, max_results=5).results] == before
    # The copies served from are the current generation's two: none left behind.
    assert len(_mapped_copies(daemon, root)) == 2, _mapped_copies(daemon, root)
    extra.unlink()
    assert _markdown(root) == markdown
    assert daemon.stop() == 0

    daemon = daemon_factory(CONFIG, **env)  # the repaired generation loads as it is
    with Client(daemon.socket_path) as c:
        c.index_sync(AGENT)
        assert [h.path for h in c.search(AGENT, QUERY, max_results=5).results] == before
    wait_for(lambda: _workspace(daemon)["index"]["load_checked"], "the load checks")
    assert _workspace(daemon)["index"]["load_corrupt"] == {}
    assert daemon.stop() == 0



def _flip_current_manifest(daemon: DaemonHandle, root: Path) -> Path:
    """Two generations saved, then a bit of the current one's manifest flipped."""
    with Client(daemon.socket_path) as c:
        c.index_sync(AGENT)
        c.index_compact(AGENT)
        c.index_compact(AGENT)
    manifests = sorted((root / "mem_metadata" / "index").glob("MANIFEST-*.json"))
    assert len(manifests) == 2, manifests
    data = bytearray(manifests[-1].read_bytes())
    data[len(data) // 2] ^= 0x04
    manifests[-1].write_bytes(bytes(data))
    return manifests[-1]


def test_a_damaged_current_manifest_fails_verify(daemon_factory: DaemonFactory,
                                                 tmp_path: Path) -> None:
    # The committed generation's manifest no longer verifies: the generation an
    # index.verify can still read is an older one, which is no proof of the committed one.
    root = tmp_path / "data" / "workspaces" / AGENT
    _write_notes(root)
    daemon = daemon_factory(CONFIG, RECALLD_DATA_DIR=str(tmp_path / "data"))
    manifest = _flip_current_manifest(daemon, root)
    with Client(daemon.socket_path) as c:
        report = c.index_verify(AGENT)
    generation = report["generation"]
    assert generation["skipped"] == [{"manifest": manifest.name,
                                      "why": "manifest checksum mismatch"}], generation
    assert generation["ok"] is False and report["ok"] is False, report
    assert daemon.stop() == 0


def test_a_current_manifest_damaged_under_the_daemon_is_named_and_saved_again(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    # Like a damaged data file of the current generation: health names it until a new
    # generation is saved, so a restart does not fall back to an older one unawares.
    root = tmp_path / "data" / "workspaces" / AGENT
    _write_notes(root)
    daemon = daemon_factory(CONFIG, RECALLD_DATA_DIR=str(tmp_path / "data"))
    manifest = _flip_current_manifest(daemon, root)
    wait_for(lambda: _workspace(daemon)["health"]["state"] == "degraded",
             "health to turn degraded")
    reasons = "\n".join(_workspace(daemon)["health"]["reasons"])
    assert str(manifest.relative_to(root)) in reasons, reasons
    assert _workspace(daemon)["index"]["damaged_files"]["manifest"]["file"] == str(
        manifest.relative_to(root))
    with Client(daemon.socket_path) as c:
        c.index_compact(AGENT)  # saves a new generation from what the daemon holds
        wait_for(lambda: _workspace(daemon)["health"]["state"] == "clean",
                 "health to be clean")
        assert c.index_verify(AGENT)["ok"] is True
    assert daemon.stop() == 0
