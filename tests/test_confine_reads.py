"""The state reads of an open workspace never go through a link swapped in since it
opened (in place of ``mem_metadata/`` or a folder below): nothing of another agent's
state is read into this one's memory or answers, and the workspace stops at once,
saying why, rather than retrying in the background what cannot succeed.

The seam tests guard a folder under tmp_path as an open workspace does and drive the
storage layer's readers (a generation's load, a log's replay, a folder's listing, the
stat check of a generation's files) on real files; the daemon tests swap a real
daemon's folders at different moments.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_confine_writes import metadata_linked
from waits import wait_committed, wait_for, workspace_status

from recalld.daemon.memory import changelog, dreamundo, runjournal
from recalld.daemon.store import confine
from recalld.daemon.store.applog import AppendLog, replay
from recalld.daemon.store.arrays import write_arrays
from recalld.daemon.store.errors import CorruptState, StorageIOError
from recalld.daemon.store.fsio import REAL, read_verified
from recalld.daemon.store.manifest import GenerationStore
from recalld.ipc import errors


def _alices_generation(meta: Path) -> None:
    store = GenerationStore(meta / "index", REAL)
    store.open()
    with store.transaction() as txn:
        txn.add("bm25", write_arrays(REAL, txn.path("bm25", ".arr"),
                                     {"p": np.arange(7, dtype=np.int32)}, {"who": "alice"}))


@pytest.fixture
def swapped(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An open workspace ``bob`` whose ``mem_metadata/`` was swapped for a link to
    ``alice``'s (holding an index generation and a log); yields both."""
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    _alices_generation(alice / "mem_metadata")
    log = AppendLog(alice / "mem_metadata" / "inbox" / "inbox.jsonl")
    log.open()
    log.append([{"secret": "alice's"}])
    log.close()
    bob.mkdir()
    with metadata_linked(bob, alice):
        yield bob, alice


def test_the_storage_readers_refuse_a_link_in_place_of_a_folder(
        swapped: tuple[Path, Path]) -> None:
    bob, alice = swapped
    meta = bob / "mem_metadata"
    # bob's index load took alice's generation (her chunks and postings) as its own.
    with pytest.raises(StorageIOError, match="mem_metadata is a symbolic link"):
        GenerationStore(meta / "index", REAL).load()
    (manifest,) = (p.name for p in (alice / "mem_metadata" / "index").glob("MANIFEST-*"))
    with pytest.raises(StorageIOError, match="mem_metadata is a symbolic link"):
        read_verified(meta / "index" / manifest, None)
    # A log's replay read alice's records before bob's append was refused.
    with pytest.raises(StorageIOError, match="symbolic link"):
        replay(meta / "inbox" / "inbox.jsonl", REAL, repair=False)
    with pytest.raises(OSError, match="symbolic link"):
        REAL.listdir(meta / "index")
    with pytest.raises(OSError, match="symbolic link"):
        confine.stat_file(meta / "index" / manifest)
    # A link deeper down, and one in place of the state file itself.
    (meta.parent / "mem_metadata").unlink()
    (meta / "inbox").mkdir(parents=True)
    (meta / "index").symlink_to(alice / "mem_metadata" / "index")
    with pytest.raises(StorageIOError, match="index is a symbolic link"):
        GenerationStore(meta / "index", REAL).load()
    (meta / "inbox" / "inbox.jsonl").symlink_to(alice / "mem_metadata" / "inbox" / "inbox.jsonl")
    # A link in the file's own place is damage (as a FIFO or a folder there is), never
    # followed: none of alice's records is read (the log's open sets it aside).
    assert replay(meta / "inbox" / "inbox.jsonl", REAL, repair=False)[0] == []
    with pytest.raises(CorruptState, match="not a regular file \\(a symbolic link\\)"):
        read_verified(meta / "inbox" / "inbox.jsonl", None)
    # The list of dream runs (their ids), and the journals of runs under way.
    runs = alice / "mem_metadata" / "dream" / "runs"
    runs.mkdir(parents=True)
    (runs / "20261101T000000Z-a1b2c3.json").write_text("{}")
    (runs / "20261101T000000Z-a1b2c3.journal").write_text("{}\n")
    (meta / "dream").mkdir()
    (meta / "dream" / "runs").symlink_to(runs)
    with pytest.raises(StorageIOError, match="runs is a symbolic link"):
        changelog.record_ids(meta / "dream" / "runs")
    with pytest.raises(StorageIOError, match="runs is a symbolic link"):
        runjournal.running_runs(meta / "dream" / "runs", ())
    # Below no workspace, reads are as ever.
    assert replay(alice / "mem_metadata" / "inbox" / "inbox.jsonl", REAL,
                  repair=False)[0] == [{"secret": "alice's"}]


def test_the_owner_is_told_of_a_link_met_below_its_folder(
        swapped: tuple[Path, Path]) -> None:
    bob, _alice = swapped
    met: list[OSError] = []
    with confine.told(bob, met.append):
        with pytest.raises(OSError):
            REAL.listdir(bob / "mem_metadata" / "index")
    assert [str(e.filename) for e in met] == [str(bob / "mem_metadata")]
    with pytest.raises(OSError):  # no longer told once the block ended
        REAL.listdir(bob / "mem_metadata" / "index")
    assert len(met) == 1


def _config(tmp_path: Path) -> str:
    return "".join(f'[workspaces.{a}]\npath = "{tmp_path / a}"\n' for a in ("alice", "bob"))


def _notes(tmp_path: Path) -> tuple[Path, Path]:
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    (alice / "memory" / "2026-12-01").mkdir(parents=True)
    (alice / "memory" / "2026-12-01" / "owl.md").write_text(
        "# Owl\n\nalice's owl, a longer note so its files differ in size\n")
    (bob / "memory" / "2026-12-01").mkdir(parents=True)
    (bob / "memory" / "2026-12-01" / "w.md").write_text("# Wombat\n\nbob's wombat\n")
    return alice, bob


def _bob(d: Any) -> dict[str, Any]:
    found: list[dict[str, Any]] = [w for w in d.call("workspace.list")["workspaces"]
                                   if w["agent_id"] == "bob"]
    return found[0]


def test_a_link_in_place_of_the_index_folder_stops_the_workspace_at_once(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A link in place of mem_metadata/index (below the folder a use looks at): bob's
    # check of its generation's files stat-ed alice's (her files' sizes in bob's status),
    # and bob served on, its persist loop retrying the refused save with backoff.
    d = daemon_factory(_config(tmp_path))
    alice, bob = _notes(tmp_path)
    wait_committed(d, "alice")
    wait_committed(d, "bob")
    (bob / "mem_metadata" / "index").rename(tmp_path / "bob-index")
    (bob / "mem_metadata" / "index").symlink_to(alice / "mem_metadata" / "index")
    assert "!= expected" not in str(workspace_status(d, "bob"))  # alice's files' sizes
    ws = wait_for(lambda: (w := _bob(d))["state"] == "failed" and w, "bob failed")
    assert "mem_metadata/index is a symbolic link" in ws["error"], ws
    assert "!= expected" not in ws["error"]
    with pytest.raises(errors.UnknownWorkspace, match="index is a symbolic link"):
        d.call("memory.search", {"agent_id": "bob", "query": "owl"})
    # alice serves on, and a commit of hers passes while bob retries nothing.
    (alice / "memory" / "2026-12-01" / "fox.md").write_text("# Fox\n\nalice's fox\n")
    wait_committed(d, "alice")
    assert d.call("memory.search", {"agent_id": "alice", "query": "fox"})["results"]
    assert d.log().count("bob: saving the index failed") <= 1
    # Put back and opened again, bob serves its own notes.
    (bob / "mem_metadata" / "index").unlink()
    (tmp_path / "bob-index").rename(bob / "mem_metadata" / "index")
    d.call("workspace.open", {"agent_id": "bob"})
    found = d.call("memory.search", {"agent_id": "bob", "query": "wombat"})["results"]
    assert [r["path"] for r in found] == ["memory/2026-12-01/w.md"]


def test_a_workspace_whose_index_folder_is_a_link_is_refused_as_outside(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A link there before bob opened: its load refused to read through it, but the open
    # answered an internal error (-32603), with a traceback in the log.
    d = daemon_factory(None)
    alice, bob = _notes(tmp_path)
    d.call("workspace.open", {"agent_id": "alice", "path": str(alice)})
    wait_committed(d, "alice")
    (bob / "mem_metadata").mkdir()
    (bob / "mem_metadata" / "index").symlink_to(alice / "mem_metadata" / "index")
    before = sorted((p.name, p.stat().st_mtime_ns)
                    for p in (alice / "mem_metadata" / "index").iterdir())
    with pytest.raises(errors.PathOutsideWorkspace, match="index is a symbolic link"):
        d.call("workspace.open", {"agent_id": "bob", "path": str(bob)})
    assert "Traceback" not in d.log()
    assert sorted((p.name, p.stat().st_mtime_ns)
                  for p in (alice / "mem_metadata" / "index").iterdir()) == before
    found = d.call("memory.search", {"agent_id": "alice", "query": "owl"})["results"]
    assert [r["path"] for r in found] == ["memory/2026-12-01/owl.md"]


def test_the_undos_to_finish_are_not_listed_through_a_link(tmp_path: Path) -> None:
    # The markers of undos a kill cut short were listed by path: through a link in
    # place of bob's runs folder, alice's (each refused on its own, and passed by).
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    runs = alice / "mem_metadata" / "dream" / "runs"
    runs.mkdir(parents=True)
    (runs / "20261101T000000Z-a1b2c3.undoing").write_text("")
    (bob / "mem_metadata" / "dream").mkdir(parents=True)
    (bob / "mem_metadata" / "dream" / "runs").symlink_to(runs)
    confine.guard(bob)
    try:
        with pytest.raises(StorageIOError, match="runs is a symbolic link"):
            dreamundo.finish_pending(bob, bob / "mem_metadata" / "dream" / "runs",
                                     digest_dir="digest",
                                     catalog=bob / "mem_metadata" / "catalog.jsonl.zst")
    finally:
        confine.release(bob)
    assert [p.name for p in runs.iterdir()] == ["20261101T000000Z-a1b2c3.undoing"]
