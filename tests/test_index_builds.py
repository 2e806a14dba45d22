"""The index's builds through a real daemon and a real socket: restarts, damaged state,
``reindex``, first builds (one commit, worker processes) and a killed daemon's workers."""

from __future__ import annotations

import json
import signal
import struct
from pathlib import Path
from typing import Any

import pytest
from test_index_daemon import open_ws, paths, search, workspace, write
from waits import wait_for, wait_job, wait_value, workspace_status

from recalld.daemon.index.passes import APPLY_MIN_FILES, POOL_BATCH, POOL_MIN_FILES
from recalld.ipc.errors import AlreadyRunning

__all__ = ["workspace"]  # the fixture, used by name


def test_restart_is_incremental_and_keeps_results(daemon_factory: Any, workspace: Path) -> None:
    config = f'[workspaces.w]\npath = "{workspace}"\n[daemon]\npersist_delay_s = 0.05\n'
    d = daemon_factory(config)
    d.call("index.sync", {"agent_id": "w"})
    before = search(d, "train Zurich")
    assert before["results"]
    assert d.stop() == 0

    # Changed while the daemon was down: found by the startup reconcile.
    write(workspace, "digest/personal/food.md", "I like ramen, dumplings and raclette.\n")
    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
    d2.call("index.sync", {"agent_id": "w"})  # the startup reconcile runs in the background
    status = d2.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")["index"]
    assert ws["loaded_generation"] is not None
    startup = ws["watcher"]["last_reconcile"]
    assert startup["reason"] == "startup", startup
    assert startup["found"] == {"added": 0, "changed": 1, "deleted": 0}
    after = search(d2, "train Zurich")
    assert [(r["path"], r["start_line"], r["end_line"]) for r in after["results"]] == [
        (r["path"], r["start_line"], r["end_line"]) for r in before["results"]]
    assert paths(search(d2, "raclette")) == ["digest/personal/food.md"]


def _flip_array_byte(path: Path, name: str) -> None:
    """Flip the first byte of array ``name`` in an array file: its checksum is then the only
    thing that can tell (header, layout and size stay valid)."""
    data = bytearray(path.read_bytes())
    (header_len,) = struct.unpack_from("<I", data, 12)
    header = json.loads(bytes(data[48:48 + header_len]))
    entry = next(a for a in header["arrays"] if a["name"] == name)
    data[entry["offset"]] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "flip_data", "truncate", "delete_manifests"])
def test_corrupt_state_is_rebuilt_while_search_answers(
    daemon_factory: Any, workspace: Path, damage: str
) -> None:
    config = f'[workspaces.w]\npath = "{workspace}"\n[daemon]\npersist_delay_s = 0.05\n'
    d = daemon_factory(config)
    d.call("index.sync", {"agent_id": "w"})
    expected = paths(search(d, "ECONNREFUSED"))
    assert d.stop() == 0
    index_dir = workspace / "mem_metadata" / "index"
    if damage == "flip":
        target = sorted(index_dir.glob("bm25.g*.arr"))[-1]
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "flip_data":
        _flip_array_byte(sorted(index_dir.glob("bm25.g*.arr"))[-1], "tfs")
    elif damage == "truncate":
        target = sorted(index_dir.glob("chunks.g*.jsonl.zst"))[-1]
        target.write_bytes(target.read_bytes()[:-7])
    else:
        for manifest in index_dir.glob("MANIFEST-*.json"):
            manifest.unlink()
    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
    answer = search(d2, "ECONNREFUSED", sync=True)  # answers at once, checked or not
    if damage != "flip_data":  # a changed term count may reorder until the reload
        assert paths(answer) == expected

    def index_status(daemon: Any) -> dict[str, Any]:
        status = daemon.call("daemon.status")
        found: dict[str, Any] = next(
            w for w in status["workspaces"] if w["agent_id"] == "w")["index"]
        return found

    # The large files' checksums are checked once the workspace serves; then a good
    # generation is committed again.
    index = wait_value(lambda: index_status(d2),
                       lambda index: index["load_checked"] and index["last_commit"],
                       "the checked load and a new commit")
    assert index["files"] == 4
    if damage in ("flip", "flip_data"):
        assert "bm25" in index["load_corrupt"]
    if damage == "flip_data":  # found by the checksums after serving, not by the load
        assert "failed its checksums" in d2.log()
    elif damage == "truncate":
        assert "chunks" in index["load_corrupt"]
    assert paths(search(d2, "ECONNREFUSED")) == expected
    assert d2.stop() == 0
    d3 = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
    d3.call("index.sync", {"agent_id": "w"})
    index = wait_value(lambda: index_status(d3), lambda index: index["load_checked"],
                       "the checked load")
    assert index["load_corrupt"] == {}
    assert paths(search(d3, "ECONNREFUSED")) == expected


def test_reindex_job_and_exclusivity(daemon: Any, workspace: Path) -> None:
    open_ws(daemon, workspace)
    with daemon.connect() as conn:
        conn.send([
            {"jsonrpc": "2.0", "id": 1, "method": "jobs.submit",
             "params": {"agent_id": "w", "kind": "reindex"}},
            {"jsonrpc": "2.0", "id": 2, "method": "jobs.submit",
             "params": {"agent_id": "w", "kind": "reindex"}},
        ])
        answers = {a["id"]: a for a in conn.recv()}
    assert "result" in answers[1]
    assert answers[2]["error"]["code"] == AlreadyRunning.code
    job_id = answers[1]["result"]["job_id"]
    job = wait_job(daemon, job_id)
    assert job["state"] == "succeeded", job
    assert job["result"]["files"] == 4
    assert job["progress"]["done"] == job["progress"]["total"] == 4
    assert paths(search(daemon, "ECONNREFUSED")) == ["memory/2026-07-23/commute.md"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_first_build_is_committed_once_at_its_end(daemon_factory: Any,
                                                   tmp_path: Path) -> None:
    # Three applies (APPLY_MIN_FILES twice, then the rest), prepared in the worker
    # processes; with a 50 ms persist delay each would be committed on its own if the
    # persist loop did not wait for the pass to end.
    root = tmp_path / "many"
    files = 2 * APPLY_MIN_FILES + 76
    assert files >= POOL_MIN_FILES
    body = " ".join(f"term{j} 记忆{j % 97}" for j in range(30))  # applies far over 50 ms apart
    for i in range(files):
        write(root, f"memory/2026-05-{i % 28 + 1:02d}/n{i}.md", f"# N{i}\n\nword{i} {body}\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n[daemon]\npersist_delay_s = 0.05\n')
    d.call("index.sync", {"agent_id": "w"}, timeout=240)  # waits for the whole build
    index = wait_value(lambda: (workspace_status(d, "w") or {})["index"],
                       lambda index: index["last_commit"], "the first commit")
    assert (index["last_commit"]["files"], index["last_commit"]["generation"]) == (files, 1)


def test_large_workspace_is_built_in_worker_processes(daemon: Any, tmp_path: Path) -> None:
    root = tmp_path / "big"
    for i in range(600):
        write(root, f"memory/2026-06-{i % 28 + 1:02d}/n{i}.md",
              f"# Note {i}\n\nmarker{i} shared words [[n{(i + 1) % 600}]]\n")
    open_ws(daemon, root)
    for i in (0, 299, 599):
        assert paths(search(daemon, f"marker{i}", sync=True))[:1] == [
            f"memory/2026-06-{i % 28 + 1:02d}/n{i}.md"]
    pool = daemon.call("daemon.status", {})["queues"]["prepare_pool"]
    # Started while the first scan was still listing the notes, and used by the pass.
    assert pool["calls"] >= -(-600 // POOL_BATCH) and pool["starts"] == 1
    status = next(w for w in daemon.call("daemon.status", {})["workspaces"]
                  if w["agent_id"] == "w")
    assert status["index"]["files"] == 600 and status["index"]["links"] == 600


def _last_commit(d: Any) -> dict[str, Any]:
    """The workspace's last commit once everything applied is committed."""
    index = wait_value(lambda: workspace_status(d, "w")["index"],
                       lambda i: i["last_commit"] and not i["uncommitted_changes"],
                       "everything applied is committed")
    commit: dict[str, Any] = index["last_commit"]
    return commit


def test_after_a_first_build_searches_answer_as_after_a_restart(daemon_factory: Any,
                                                                 tmp_path: Path) -> None:
    # A first build of this size runs in the worker processes, and once committed its
    # state is loaded back from the files, as a warm start loads it: searches (with
    # linked notes), edits and a restart must not tell the difference.
    root = tmp_path / "big"
    for i in range(600):
        write(root, f"memory/2026-06-{i % 28 + 1:02d}/n{i}.md",
              f"# Note {i}\n\nmarker{i} shared 周末爬山 words [[n{(i + 1) % 600}]]\n\n"
              f"more {i % 7} text related:: [[n{(i + 13) % 600}]]\n")
    config = f'[workspaces.w]\npath = "{root}"\n[daemon]\npersist_delay_s = 0.05\n'
    d = daemon_factory(config)
    d.call("index.sync", {"agent_id": "w"}, timeout=240)
    assert _last_commit(d)["files"] == 600
    queries = ["marker7", "shared 周末", "more 3 text", "n100 words", "爬山"]

    def answers(handle: Any) -> list[object]:
        return [[(r["path"], r["start_line"], r["end_line"], r["score"])
                 for r in search(handle, q, max_results=8)["results"]] for q in queries]

    built = answers(d)
    assert all(built) and built[0][0][0] == "memory/2026-06-08/n7.md"
    # An edit after the build: searchable at once, and committed.
    write(root, "memory/2026-06-08/n7.md", "# Note 7\n\nrewritten 冰川 [[n9]]\n")
    assert paths(search(d, "冰川", sync=True)) == ["memory/2026-06-08/n7.md"]
    assert "marker7" not in str(search(d, "marker7")["results"])
    edited = answers(d)
    _last_commit(d)
    assert d.stop() == 0
    d2 = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
    d2.call("index.sync", {"agent_id": "w"})
    assert answers(d2) == edited
    assert paths(search(d2, "冰川")) == ["memory/2026-06-08/n7.md"]


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.update(int(c) for c in (task / "children").read_text().split())
    return out


@pytest.mark.slow
def test_killed_daemon_leaves_no_worker_processes(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "big"
    for i in range(1500):  # their build is still under way when the workers are first seen
        write(root, f"memory/2026-06-{i % 28 + 1:02d}/n{i}.md",
              f"# Note {i}\n\n" + " ".join(f"w{(i * j) % 997}" for j in range(300)) + "\n")
    d = daemon_factory()
    d.call("workspace.open", {"agent_id": "w", "path": str(root)})  # killed while building
    workers = wait_for(
        lambda: d.call("daemon.status", {})["queues"]["prepare_pool"]["alive"]
        and _children(d.pid), "the build's worker processes")
    d.signal(signal.SIGKILL)
    d.proc.wait(10)
    wait_for(lambda: not [p for p in workers if Path(f"/proc/{p}").exists()],
             "the worker processes to exit")
