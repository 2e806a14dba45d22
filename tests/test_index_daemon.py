"""The index through a real daemon and a real socket: search, filters, links, freshness
(restarts, damage and rebuilds are in ``test_index_builds.py``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from recalld.ipc.errors import InvalidParams

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


def test_a_neighbour_with_nothing_to_show_leaves_its_place_to_the_next(
        daemon: Any, tmp_path: Path) -> None:
    # An empty note (as an editor creates on a click on a link to a missing note) and one
    # of nothing but keys come first by path; the notes after them are shown instead.
    root = tmp_path / "ws"
    write(root, "digest/wiki/hub.md",
          "# Hub\nechidnaword: [[blank]] [[Keys only]] [[first|1]] [[second#Part]]\n")
    write(root, "digest/wiki/blank.md", "")
    write(root, "digest/wiki/Keys only.md", "---\nname: keys\ndescription: none\n---\n")
    write(root, "digest/wiki/first.md", "# First\nthe first one\n")
    write(root, "digest/wiki/second.md", "# Second\n## Part\nthe second one\n")
    open_ws(daemon, root)
    for limit in (1, 2, 5):
        res = search(daemon, "echidnaword", max_results=limit)
        assert paths(res) == ["digest/wiki/hub.md"]
        assert len(res["results"][0]["links"]) == 4
        assert [(e["path"], e["via"]) for e in res["expanded"]] == [
            ("digest/wiki/first.md", "digest/wiki/hub.md"),
            ("digest/wiki/second.md", "digest/wiki/hub.md")][:limit], limit
    assert "the second one" in search(daemon, "echidnaword")["expanded"][1]["text"]


def test_a_hit_min_score_drops_stays_a_neighbour_of_a_hit_linking_it(
        daemon: Any, tmp_path: Path) -> None:
    # x holds the query's word once in a long text: min_score drops it from the results,
    # but y, a result, links it, and a neighbour has no score to fall short of.
    root = tmp_path / "ws"
    write(root, "digest/wiki/y.md", "# Y\nlemurword lemurword lemurword [[x]]\n")
    write(root, "digest/wiki/x.md",
          "# X\nlemurword " + " ".join(f"w{i}" for i in range(300)) + "\n")
    open_ws(daemon, root)
    scores = {r["path"]: r["score"] for r in search(daemon, "lemurword")["results"]}
    cut = (scores["digest/wiki/y.md"] + scores["digest/wiki/x.md"]) / 2
    res = search(daemon, "lemurword", min_score=cut)
    assert paths(res) == ["digest/wiki/y.md"]
    assert [(e["path"], e["via"], e["start_line"]) for e in res["expanded"]] == [
        ("digest/wiki/x.md", "digest/wiki/y.md", 1)]


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
