"""Writes below an open workspace's folder never go through a link swapped in since it
opened (the folder itself, ``mem_metadata/``, a folder below): they are refused, the
link's target is left as it was, and the workspace says why at its next use.

The seam tests guard a folder under tmp_path as an open workspace does and drive the
storage layer's writers (atomic publish, append logs, removals, the scratch file of the
vector index) on real files; the daemon test swaps a real daemon's folder.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes.provider_server import FakeProvider
from test_jobs import running
from test_jobs_held import bob_dream_held
from waits import wait_committed, wait_for, wait_value

from recalld.daemon.backup import AgentSource, create_backup
from recalld.daemon.backup_check import open_checked
from recalld.daemon.backup_restore import apply_restore, plan_restore
from recalld.daemon.index.vectors import _scratch
from recalld.daemon.jobrecords import JobContext
from recalld.daemon.jobs import JobManager
from recalld.daemon.memory import changelog
from recalld.daemon.remote.localfs import Confinement
from recalld.daemon.store import confine
from recalld.daemon.store.applog import AppendLog
from recalld.daemon.store.errors import StorageIOError
from recalld.daemon.store.fsio import FS, REAL, adopt_file, atomic_write, ensure_dir, publish_copy
from recalld.ipc import errors
from recalld.ipc.errors import PathOutsideWorkspace


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry below ``root``: its size and mtime, to tell any write."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def swapped(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An open workspace ``bob`` whose ``mem_metadata/`` was swapped for a link to
    another agent's (``alice``'s, holding a run record and a log); yields both."""
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    runs = alice / "mem_metadata" / "dream" / "runs"
    runs.mkdir(parents=True)
    (runs / "20261101T000000Z-a1b2c3.json").write_text("{}")
    (runs / "20261101T000000Z-a1b2c3.md").write_text("# run\n")
    (alice / "mem_metadata" / "inbox.jsonl").write_text("{}\n")
    (bob / "old").mkdir(parents=True)
    with metadata_linked(bob, alice):
        yield bob, alice


@contextlib.contextmanager
def metadata_linked(bob: Path, alice: Path) -> Iterator[None]:
    """``bob`` (a folder) guarded as an open workspace, its ``mem_metadata/`` a link to
    ``alice``'s, for the ``with`` block."""
    confine.guard(bob)
    try:
        (bob / "mem_metadata").symlink_to(alice / "mem_metadata")
        yield
    finally:
        confine.release(bob)


def test_the_storage_writers_refuse_a_link_in_place_of_a_folder(
        swapped: tuple[Path, Path]) -> None:
    bob, alice = swapped
    before = tree(alice)
    meta = bob / "mem_metadata"
    with pytest.raises(StorageIOError, match="mem_metadata is a symbolic link"):
        atomic_write(REAL, meta / "catalog.jsonl", b"bob's\n")
    with pytest.raises(StorageIOError, match="symbolic link"):
        ensure_dir(REAL, meta / "index")  # is_dir() follows the link; mkdir does not
    with pytest.raises(StorageIOError, match="symbolic link"):
        atomic_write(REAL, meta / "dream" / "runs" / "x.json", b"{}")
    with pytest.raises(StorageIOError, match="symbolic link"):
        AppendLog(meta / "inbox.jsonl").open()
    with pytest.raises(OSError, match="symbolic link"):
        REAL.unlink(meta / "inbox.jsonl")
    # A dream's pruning of old run records removed the other agent's records.
    with pytest.raises(StorageIOError, match="symbolic link"):
        changelog.prune_records(meta / "dream" / "runs", keep=0)
    (alice / "mem_metadata" / "index").mkdir()
    before = tree(alice)
    with pytest.raises(StorageIOError, match="symbolic link"), _scratch(meta / "index"):
        pass
    assert tree(alice) == before
    # The daemon's own folders, below no workspace, are used as ever.
    ensure_dir(REAL, bob.parent / "state")
    atomic_write(REAL, bob.parent / "state" / "x.json", b"{}")
    assert (bob.parent / "state" / "x.json").read_bytes() == b"{}"


def test_a_link_in_place_of_the_workspace_folder_takes_no_write(tmp_path: Path) -> None:
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    (alice / "mem_metadata").mkdir(parents=True)
    (bob / "mem_metadata").mkdir(parents=True)
    confine.guard(bob)
    try:
        atomic_write(REAL, bob / "mem_metadata" / "a.json", b"bob's own")
        bob.rename(tmp_path / "bob.old")
        bob.symlink_to(alice)
        before = tree(alice)
        with pytest.raises(StorageIOError, match="now leads to"):
            atomic_write(REAL, bob / "mem_metadata" / "a.json", b"bob's")
        with pytest.raises(OSError, match="now leads to"):
            REAL.fsync_dir(bob / "mem_metadata")
        assert tree(alice) == before
    finally:
        confine.release(bob)
    assert (tmp_path / "bob.old" / "mem_metadata" / "a.json").read_bytes() == b"bob's own"


def test_a_link_in_place_of_the_metadata_folder_stops_the_workspace_alone(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Swapped for a link to alice's metadata while bob served, bob's next index commit
    # wrote its generation into alice's index folder (alice, started again, would load
    # bob's notes), and bob went on serving: no use of bob looked below its folder.
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    d = daemon_factory("".join(f'[workspaces.{a}]\npath = "{tmp_path / a}"\n'
                               for a in ("alice", "bob")))
    (alice / "memory" / "2026-12-01").mkdir(parents=True)
    (alice / "memory" / "2026-12-01" / "owl.md").write_text("# Owl\n\nalice's owl\n")
    wait_committed(d, "alice")
    wait_committed(d, "bob")
    (bob / "mem_metadata").rename(tmp_path / "bob-meta")
    (bob / "mem_metadata").symlink_to(alice / "mem_metadata")
    before = tree(alice)
    (bob / "memory" / "2026-12-02").mkdir(parents=True)
    (bob / "memory" / "2026-12-02" / "wombat.md").write_text("# Wombat\n\nbob's wombat\n")
    # bob's commit, refused or written (then into alice's folder).
    wait_for(lambda: "bob: saving the index failed" in d.log() or tree(alice) != before,
             "bob's commit")
    assert tree(alice) == before
    assert ("mem_metadata is a symbolic link, which recalld does not read or write through"
            in d.log())
    with pytest.raises(errors.UnknownWorkspace, match=r"bob/mem_metadata now leads to "):
        d.call("memory.add_note", {"agent_id": "bob", "content": "bob's note"})
    found = d.call("memory.search", {"agent_id": "alice", "query": "owl"})["results"]
    assert [r["path"] for r in found] == ["memory/2026-12-01/owl.md"]
    assert tree(alice) == before


def test_a_replicas_removal_goes_not_through_a_link_in_place_of_the_workspace(
        tmp_path: Path) -> None:
    # A note deleted on another host was removed below the workspace folder as it was
    # opened by name: with a link in that folder's place, from the other agent's notes.
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    for root in (bob, alice):
        (root / "memory" / "2026-12-01").mkdir(parents=True)
        (root / "memory" / "2026-12-01" / "a.md").write_text(f"# {root.name}\n")
    replica = Confinement(bob, ("memory", "digest"))
    confine.guard(bob)
    try:
        bob.rename(tmp_path / "bob.old")
        bob.symlink_to(alice)
        with pytest.raises(OSError, match="now leads to"):
            replica.remove("memory/2026-12-01/a.md")
    finally:
        confine.release(bob)
    assert (alice / "memory" / "2026-12-01" / "a.md").read_text() == "# alice\n"


#: The folders of bob's workspace, as a backup names them.
DIRS = {"daily_dir": "memory", "digest_dir": "digest", "session_dir": "mem_session",
        "resource_dir": "resource", "metadata_dir": "mem_metadata"}


def backup_of_bob(bob: Path, archive: Path) -> Path:
    """``archive``, a backup of bob's workspace at ``bob`` holding one note."""
    (bob / "memory" / "2026-12-01").mkdir(parents=True)
    (bob / "memory" / "2026-12-01" / "b.md").write_text("# bob\n")
    create_backup(archive, [AgentSource("bob", bob, DIRS)])
    return archive


def test_a_restore_writes_nothing_through_a_link_in_place_of_the_workspace(
        tmp_path: Path) -> None:
    # A link put in the workspace folder's place between the plan of a restore and its
    # writes: the backup's notes were written into the link's target (alice's folder),
    # and the notes the backup lacks removed from it.
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    archive = backup_of_bob(bob, tmp_path / "b.zip")
    (bob / "memory" / "2026-12-01" / "later.md").write_text("# bob, later\n")
    (alice / "memory" / "2026-12-01").mkdir(parents=True)
    (alice / "memory" / "2026-12-01" / "later.md").write_text("# alice\n")
    checked = open_checked(archive)
    plan = plan_restore(checked, "bob", bob, DIRS)
    bob.rename(tmp_path / "bob.old")
    bob.symlink_to(alice)
    before = tree(alice)
    with pytest.raises((OSError, StorageIOError, PathOutsideWorkspace), match="now leads to"):
        apply_restore(checked, plan)
    assert tree(alice) == before


def test_a_restore_makes_the_workspace_folder_where_there_was_none(tmp_path: Path) -> None:
    # A guarded workspace folder is never made again by its writes (one moved away would
    # be hidden by the new one), but a restore to a folder that does not exist yet makes it.
    bob, elsewhere = tmp_path / "bob", tmp_path / "new" / "bob"
    archive = backup_of_bob(bob, tmp_path / "b.zip")
    checked = open_checked(archive)
    apply_restore(checked, plan_restore(checked, "bob", elsewhere, DIRS))
    assert (elsewhere / "memory" / "2026-12-01" / "b.md").read_text() == "# bob\n"


def test_a_dream_whose_metadata_folder_became_a_link_writes_nothing_there(
        daemon_factory: Any, fake: FakeProvider, tmp_path: Path) -> None:
    # With no use of bob in between, the dream saved its catalog, its run record and its
    # journal by path: through the link, into alice's metadata.
    d = daemon_factory(None)
    alice, bob, held = bob_dream_held(d, fake, tmp_path)
    job_id = d.call("jobs.submit", {"agent_id": "bob", "kind": "auto_dream"})["job_id"]
    assert held.entered.wait(30)
    (bob / "mem_metadata").rename(tmp_path / "bob-meta")
    (bob / "mem_metadata").symlink_to(alice / "mem_metadata")
    before = tree(alice)
    held.open()
    # The job's end, read from the job journal: a call naming bob would stop it first.
    journal = Path(d.env["XDG_DATA_HOME"]) / "recalld" / "state" / "jobs.journal"
    ended = [f'"job_id":"{job_id}"', '"finished_at":1']
    wait_for(lambda: any(all(t in line for t in ended)
                         for line in journal.read_text().splitlines()), "the dream's end")
    assert tree(alice) == before
    # (An end is journaled before the job shows it: the two may be a moment apart.)
    job = wait_value(lambda: d.call("jobs.get", {"agent_id": "bob", "job_id": job_id}),
                     lambda job: job["state"] != "running", "the job to show its end")
    assert job["state"] == "failed", job
    assert "mem_metadata is a symbolic link, which recalld does not read" in job["error"]
    # Refused as a path out of the workspace, not an internal error (-32603).
    assert job["error_code"] == errors.PATH_OUTSIDE_WORKSPACE, job
    assert tree(alice) == before


async def test_a_job_writes_nothing_through_a_link_once_its_workspace_let_go(
        tmp_path: Path) -> None:
    # A workspace that failed (a link took the place of its mem_metadata/) gave up its
    # folder's guard while its dream, cut short, still saved its catalog on its way out:
    # by path, through the link, into alice's metadata.
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    (bob / "mem_metadata").mkdir(parents=True)
    (alice / "mem_metadata").mkdir(parents=True)
    entered, go, ended = trio.Event(), trio.Event(), trio.Event()
    refused: list[str] = []

    async def dream(job: JobContext) -> dict[str, Any]:
        entered.set()
        await go.wait()
        try:
            atomic_write(REAL, bob / "mem_metadata" / "catalog.jsonl.zst", b"bob's")
        except StorageIOError as exc:
            refused.append(str(exc))
        finally:
            ended.set()
        return {}

    jobs = JobManager(folder_of=lambda agent: bob if agent == "bob" else None)
    jobs.register("auto_dream", dream)
    async with running(jobs):
        confine.guard(bob)  # the workspace, open
        await jobs.submit("bob", "auto_dream")
        await entered.wait()
        (bob / "mem_metadata").rename(tmp_path / "bob-meta")
        (bob / "mem_metadata").symlink_to(alice / "mem_metadata")
        confine.release(bob)  # it failed and let its folder go
        go.set()
        await ended.wait()
    assert refused and "mem_metadata is a symbolic link" in refused[0], refused
    assert list((alice / "mem_metadata").iterdir()) == []
    with confine.at(bob / "mem_metadata" / "x") as (folder, _):
        assert folder is None  # the job, ended, let the folder go too


class _NoLinks(FS):
    """A file system where hard links fail as across devices (publish_copy copies)."""

    def link(self, src: Path, dst: Path) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))


def test_a_copy_or_an_adopted_file_reads_nothing_through_a_link(tmp_path: Path) -> None:
    # A copy made where a hard link fails, and a natively written file adopted, read
    # their source by path: through a link in place of its folder, alice's bytes.
    bob, alice = tmp_path / "bob", tmp_path / "alice"
    (alice / "index").mkdir(parents=True)
    (alice / "index" / "gen.bin").write_bytes(b"alice's postings")
    (alice / "index" / ".x.tmp-0123456789ab").write_bytes(b"alice's graph")
    (bob / "mirror").mkdir(parents=True)
    (bob / "index").symlink_to(alice / "index")
    confine.guard(bob)
    try:
        with pytest.raises(StorageIOError, match="index is a symbolic link"):
            publish_copy(_NoLinks(), bob / "index" / "gen.bin", bob / "mirror" / "gen.bin")
        with pytest.raises(StorageIOError, match="index is a symbolic link"):
            adopt_file(REAL, bob / "index" / ".x.tmp-0123456789ab", bob / "mirror" / "g.bin")
    finally:
        confine.release(bob)
    assert list((bob / "mirror").iterdir()) == []
    assert (alice / "index" / ".x.tmp-0123456789ab").read_bytes() == b"alice's graph"
