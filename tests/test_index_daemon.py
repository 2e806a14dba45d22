"""The index through a real daemon and a real socket: search, freshness, restarts, damage."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest
from waits import wait_for, wait_job, wait_value, workspace_status

from recalld.daemon.index.passes import APPLY_MIN_FILES, POOL_BATCH, POOL_MIN_FILES
from recalld.ipc.errors import AlreadyRunning, InvalidParams

COMMUTE = """---
name: commute-routine
description: how the zugfahrt to the office works
tags: [travel, routine]
---
# Commute

I take the 7:40 train to Zurich every weekday.
The connection failed with ECONNREFUSED inside handleWebSocketReconnect.

## Notes

See [[digest/wiki/trains]] for the timetable.
"""

CHINESE = """# 周末

我每天坐火车去苏黎世上班。
周末我们去爬山，天气很好。
"""

TRAINS = """---
name: trains
description: Swiss rail facts
---
The SBB runs every 30 minutes on the main line.
related:: [[memory/2026-07-23/commute.md]]
"""


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", COMMUTE)
    write(root, "memory/2026-07-24/weekend.md", CHINESE)
    write(root, "digest/wiki/trains.md", TRAINS)
    write(root, "digest/personal/food.md", "I like ramen and dumplings.\n")
    return root


def search(d: Any, query: str, **params: Any) -> dict[str, Any]:
    result: dict[str, Any] = d.call(
        "memory.search", {"agent_id": "w", "query": query, **params})
    return result


def paths(result: dict[str, Any]) -> list[str]:
    return [r["path"] for r in result["results"]]


def open_ws(d: Any, root: Path) -> dict[str, Any]:
    """Open ``root`` as workspace ``w`` and wait until its files are indexed (an open
    returns before the startup reconcile of a first build has applied them)."""
    info: dict[str, Any] = d.call("workspace.open", {"agent_id": "w", "path": str(root)})
    d.call("index.sync", {"agent_id": "w"})
    return info


def test_a_plain_search_of_a_small_index_needs_no_call_slot(daemon_factory: Any,
                                                              workspace: Path,
                                                              tmp_path: Path) -> None:
    # One call slot per connection. A keyword search of a small index nobody writes
    # runs on the connection's reader, so it answers while another call holds the
    # slot; a search that may wait (sync) queues for the slot like any other call.
    # Nothing in the background may hold w's index lock meanwhile (a search then waits
    # its turn, rightly): no commit after the first build's changes, no idle trim.
    d = daemon_factory("[daemon]\nmax_concurrent_calls_per_connection = 1\n"
                       "persist_delay_s = 3600\nidle_trim_s = 0\n")
    open_ws(d, workspace)
    other = tmp_path / "other"
    # Opening 400 notes takes far longer than a search, also when a short background
    # task of w's (its first look at its folder) holds its index lock a moment.
    for i in range(400):
        write(other, f"memory/2026-07-{i % 28 + 1:02d}/n{i}.md", f"note {i} about trains\n")
    with d.connect() as conn:
        frames = [{"jsonrpc": "2.0", "id": 1, "method": "workspace.open",
                   "params": {"agent_id": "x", "path": str(other)}},
                  {"jsonrpc": "2.0", "id": 2, "method": "memory.search",
                   "params": {"agent_id": "w", "query": "ECONNREFUSED"}}]
        conn.send_bytes(b"".join(orjson.dumps(f) + b"\n" for f in frames))
        first, second = conn.recv_response(), conn.recv_response()
        assert (first["id"], second["id"]) == (2, 1), (first, second)
        assert first["result"]["results"][0]["path"] == "memory/2026-07-23/commute.md"
        frames[0]["params"] = {"agent_id": "x"}
        frames[0]["method"] = "workspace.close"
        frames[1]["params"] = {"agent_id": "w", "query": "ECONNREFUSED", "sync": True}
        conn.send_bytes(b"".join(orjson.dumps(f) + b"\n" for f in frames))
        first, second = conn.recv_response(), conn.recv_response()
        assert (first["id"], second["id"]) == (1, 2), (first, second)
        assert second["result"]["results"][0]["path"] == "memory/2026-07-23/commute.md"


def test_search_finds_english_chinese_identifiers_and_frontmatter(daemon: Any,
                                                                  workspace: Path) -> None:
    open_ws(daemon, workspace)
    answer = search(daemon, "ECONNREFUSED")
    hit = answer["results"][0]
    assert hit["path"] == "memory/2026-07-23/commute.md"
    lines = COMMUTE.splitlines()
    # The hit's line range holds the identifier, 1-based and inclusive in the file.
    assert any("ECONNREFUSED" in line for line in lines[hit["start_line"] - 1:hit["end_line"]])
    # The text form is sent once, for all results; a hit has none of its own.
    assert "rendered" not in hit
    assert answer["rendered"].startswith(
        f"========== memory/2026-07-23/commute.md:{hit['start_line']}-{hit['end_line']} "
        f"[score={hit['score']:.4f}] ==========\n")
    assert hit["vector"] is None and hit["keyword"] == hit["score"]
    # By its parts too, and in lower case.
    assert paths(search(daemon, "websocket reconnect"))[0] == "memory/2026-07-23/commute.md"
    assert paths(search(daemon, "爬山"))[0] == "memory/2026-07-24/weekend.md"
    assert paths(search(daemon, "苏黎世"))[0] == "memory/2026-07-24/weekend.md"
    # A word found only in the frontmatter description.
    assert "memory/2026-07-23/commute.md" in paths(search(daemon, "zugfahrt"))
    assert search(daemon, "nonexistentword")["results"] == []


def test_filters_and_link_expansion(daemon: Any, workspace: Path) -> None:
    open_ws(daemon, workspace)
    assert paths(search(daemon, "train", filters={"bucket": "wiki"})) == ["digest/wiki/trains.md"]
    only_daily = paths(search(daemon, "train", filters={"path_prefix": "memory"}))
    assert only_daily and all(p.startswith("memory/") for p in only_daily)
    # Written as a shell would, it is the same folder; "." is the whole workspace.
    for same in ("./memory", "memory//", "/memory/./"):
        assert paths(search(daemon, "train", filters={"path_prefix": same})) == only_daily
    assert paths(search(daemon, "train", filters={"path_prefix": ["."]})) == paths(
        search(daemon, "train"))
    with pytest.raises(InvalidParams, match="inside the workspace"):
        search(daemon, "train", filters={"path_prefix": "memory/../.."})
    assert paths(search(daemon, "天气", filters={"date_from": "2026-07-24"})) == [
        "memory/2026-07-24/weekend.md"]
    assert search(daemon, "天气", filters={"date_to": "2026-07-23"})["results"] == []
    for bad in ({"date_from": "yesterday"}, {"colour": "red"}):
        with pytest.raises(InvalidParams):
            search(daemon, "x", filters=bad)

    # "SBB" is only in the wiki node; its neighbour comes back through link expansion.
    res = search(daemon, "SBB")
    assert paths(res) == ["digest/wiki/trains.md"]
    assert res["results"][0]["links"] == ["memory/2026-07-23/commute.md"]
    expanded = {e["path"]: e["via"] for e in res["expanded"]}
    assert expanded == {"memory/2026-07-23/commute.md": "digest/wiki/trains.md"}
    # Links follow edits: both directions dropped, a new one found.
    write(workspace, "memory/2026-07-23/commute.md", COMMUTE.replace("[[digest/wiki/trains]]", ""))
    write(workspace, "digest/wiki/trains.md", TRAINS.replace(
        "[[memory/2026-07-23/commute.md]]", "[[digest/personal/food]]"))
    res = search(daemon, "SBB", sync=True)
    assert res["results"][0]["links"] == ["digest/personal/food.md"]
    assert [e["path"] for e in res["expanded"]] == ["digest/personal/food.md"]


NODE = """---
name: harbour-ferries
description: ferry knowledge
type: reference
---
# Timetable

The lake ferry leaves Bürkliplatz hourly from April to October.

# Tickets

A day pass for the ferry costs the same as the tram pass, and the GA covers it.
"""


def test_a_linked_neighbour_is_its_best_matching_chunk_never_bare_frontmatter(
        daemon: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/lake.md", "We rode the wombatboat. See [[digest/wiki/ferry]].\n")
    write(root, "digest/wiki/ferry.md", NODE)
    open_ws(daemon, root)
    node_lines = NODE.splitlines()

    def neighbour(query: str) -> dict[str, Any]:
        # Hits from the daily notes only; the node is reached through the link.
        res = search(daemon, query, filters={"path_prefix": "memory"})
        assert paths(res) == ["memory/2026-07-23/lake.md"]
        (item,) = res["expanded"]
        assert item["path"] == "digest/wiki/ferry.md"
        assert item["via"] == "memory/2026-07-23/lake.md"
        # Its lines are the file's, 1-based and inclusive.
        assert item["text"].strip() == "\n".join(
            node_lines[item["start_line"] - 1:item["end_line"]]).strip()
        assert "name: harbour-ferries" not in item["text"]
        return item

    # The query's own words pick the neighbour's chunk.
    assert "day pass" in neighbour("wombatboat pass")["text"]
    assert "Bürkliplatz" in neighbour("wombatboat Bürkliplatz")["text"]
    # Nothing of the query in the neighbour: its first chunk with body text.
    assert "Bürkliplatz" in neighbour("wombatboat")["text"]
    # A neighbour that is nothing but frontmatter is left out.
    write(root, "digest/wiki/ferry.md", "---\nname: empty\ndescription: nothing\n---\n")
    res = search(daemon, "wombatboat", sync=True)
    assert paths(res) == ["memory/2026-07-23/lake.md"] and res["expanded"] == []


def test_a_search_after_a_write_sees_it_in_hits_links_and_neighbours(
        daemon: Any, tmp_path: Path) -> None:
    # Searches keep what they read until the next write (chunks, link neighbours, term
    # postings, scores): a write between two identical searches must show in the second.
    root = tmp_path / "ws"
    lake, ferry, tram = ("memory/2026-07-23/lake.md", "digest/wiki/ferry.md",
                         "digest/wiki/tram.md")
    write(root, lake, "We rode the wombatboat. See [[digest/wiki/ferry]].\n")
    write(root, ferry, NODE)
    open_ws(daemon, root)
    for _ in range(3):
        res = search(daemon, "wombatboat")
        assert paths(res) == [lake] and res["results"][0]["links"] == [ferry]
        assert [e["path"] for e in res["expanded"]] == [ferry]
        assert "Bürkliplatz" in res["expanded"][0]["text"]
    # The neighbour's text changes.
    write(root, ferry, NODE.replace("Bürkliplatz", "Bellevue"))
    res = search(daemon, "wombatboat", sync=True)
    assert "Bellevue" in res["expanded"][0]["text"]
    # The hit's text and its link change; a new note holds the query's word too.
    write(root, tram, "# Tram\n\nThe tram pass covers the city.\n")
    write(root, lake, "We rode the wombatboat again. See [[digest/wiki/tram]].\n")
    res = search(daemon, "wombatboat", sync=True)
    assert paths(res) == [lake] and "again" in res["results"][0]["text"]
    assert res["results"][0]["links"] == [tram]
    assert [e["path"] for e in res["expanded"]] == [tram]
    write(root, "memory/2026-07-24/boat.md", "Another wombatboat trip, a longer one.\n")
    res = search(daemon, "wombatboat", sync=True)
    assert sorted(paths(res)) == [lake, "memory/2026-07-24/boat.md"]
    (root / lake).unlink()
    res = search(daemon, "wombatboat", sync=True)
    assert paths(res) == ["memory/2026-07-24/boat.md"] and res["expanded"] == []


def test_changes_are_searchable_after_sync(daemon: Any, workspace: Path) -> None:
    open_ws(daemon, workspace)
    note = write(workspace, "memory/2026-07-25/new.md", "The quokka visited at noon.\n")
    assert paths(search(daemon, "quokka", sync=True)) == ["memory/2026-07-25/new.md"]

    # Editor save: write a temp file, rename over the note.
    tmp = note.with_name(".new.md.swp")
    tmp.write_text("The wombat replaced the quokka.\nSecond line.\n", encoding="utf-8")
    os.replace(tmp, note)
    daemon.call("index.sync", {"agent_id": "w"})
    assert paths(search(daemon, "wombat")) == ["memory/2026-07-25/new.md"]

    # Rename, then move a whole directory, then delete.
    note.rename(note.with_name("renamed.md"))
    daemon.call("index.sync", {"agent_id": "w"})
    assert paths(search(daemon, "wombat")) == ["memory/2026-07-25/renamed.md"]
    shutil.move(str(workspace / "memory/2026-07-25"), str(workspace / "memory/2026-07-26"))
    daemon.call("index.sync", {"agent_id": "w"})
    assert paths(search(daemon, "wombat")) == ["memory/2026-07-26/renamed.md"]
    (workspace / "memory/2026-07-26/renamed.md").unlink()
    daemon.call("index.sync", {"agent_id": "w"})
    assert search(daemon, "wombat")["results"] == []

    status = daemon.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == "w")
    assert ws["index"]["files"] == 4
    assert ws["index"]["pending_changes"] == 0


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
