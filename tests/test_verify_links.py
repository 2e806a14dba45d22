"""``index.verify`` compares the saved link graph with the links the notes name now.

A real daemon serves a workspace from a generation whose graph does not match the notes
(saved consistently, every checksum right, as a writer with other link rules or a bug
would save it): verify names the notes and the edges that differ, and the reindex it
names mends them. Notes whose links a secret touches are not taken for differences.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import DaemonFactory, DaemonHandle
from waits import wait_for

from recalld.daemon.index.links import Link
from recalld.daemon.index.persist import IndexStore, snapshot
from recalld.daemon.index.state import IndexState
from recalld.ipc.cli_ops import verify_lines
from recalld.ipc.client import Client

AGENT = "default"
CONFIG = "[daemon]\npersist_delay_s = 3600.0\n"
DAY = "memory/2026-03-04"
TOKEN = "ghp_" + "Zq7Lm2Xw9Rt4Vb8Nc1Kd5Hs3Jf6Gp0Ya2We4"
NOTES = {
    f"{DAY}/heron.md": "# Heron\n\nSeen with [[Egret]] and [[digest/wiki/marsh|the marsh]].\n",
    f"{DAY}/Egret.md": "# Egret\n\nA white bird; see [[heron]].\n",
    "digest/wiki/marsh.md": "# Marsh\n\nBirds: [[heron]], [[Egret]], [[Ibis]] (none yet).\n",
    f"{DAY}/tokens.md": f"# Tokens\n\nThe old key [[{TOKEN}]] went to [[heron]].\n",
    f"{DAY}/plain.md": "# Plain\n\nNo links in this one at all.\n",
}


def _verify(daemon: DaemonHandle) -> dict[str, Any]:
    with Client(daemon.socket_path) as c:
        return c.index_verify(AGENT)


def _committed(daemon: DaemonHandle) -> bool:
    status = daemon.call("daemon.status")
    idx = next(w for w in status["workspaces"] if w["agent_id"] == AGENT)["index"]
    return bool(idx["last_commit"]) and not idx["uncommitted_changes"]


def test_a_saved_graph_unlike_the_notes_is_found_and_mended_by_reindex(
        daemon_factory: DaemonFactory, tmp_path: Path) -> None:
    env = {"RECALLD_DATA_DIR": str(tmp_path / "data")}
    root = tmp_path / "data" / "workspaces" / AGENT
    for rel, text in NOTES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    daemon = daemon_factory(CONFIG, **env)
    with Client(daemon.socket_path) as c:
        c.index_sync(AGENT)
        c.index_compact(AGENT)
    wait_for(lambda: _committed(daemon), "the first commit")
    report = _verify(daemon)
    assert report["ok"] is True, report
    assert report["links_differ"] == {"count": 0, "paths": []}
    assert report["links"]["files_checked"] == len(NOTES)
    assert report["links"]["edges_checked"] >= 7, report["links"]
    assert daemon.stop() == 0

    # The graph saved otherwise than the notes say: an edge to the wrong note, an edge
    # lost, and edges of a note that is not there; the files' stats stay as indexed, so
    # the next start reads none of them again.
    heron, egret, plain = f"{DAY}/heron.md", f"{DAY}/Egret.md", f"{DAY}/plain.md"
    tokens = f"{DAY}/tokens.md"
    ghost = f"{DAY}/ghost.md"
    state = IndexState()
    store = IndexStore(root / "mem_metadata")
    assert store.load(state).corrupt == {}
    state.graph.add_file(heron, [lk if lk.dst != egret else Link(heron, plain, "link", 3)
                                 for lk in state.graph.outgoing(heron)])
    state.graph.add_file(egret, [])
    state.graph.add_file(tokens, [])
    state.graph.add_file(ghost, [Link(ghost, heron, "link", 1)])
    store.save(snapshot(state))

    daemon = daemon_factory(CONFIG, **env)
    with Client(daemon.socket_path) as c:
        c.index_sync(AGENT)
    report = _verify(daemon)
    assert report["ok"] is False
    assert report["links_differ"] == {"count": 4,
                                      "paths": sorted([egret, ghost, heron, tokens])}
    links = report["links"]
    assert (links["missing_edges"], links["stale_edges"]) == (4, 2), links
    found = {(e["path"], e["dst"], e["found"]) for e in links["examples"]}
    assert found == {(heron, egret, "missing"), (heron, plain, "stale"),
                     (egret, heron, "missing"), (ghost, heron, "stale"),
                     (tokens, heron, "missing"), (tokens, "REDACTED", "missing")}, links
    assert TOKEN not in repr(report)  # the links as the index reads them: redacted
    lines = verify_lines(report)
    assert any("links in the index differ" in line and "reindex" in line and heron in line
               for line in lines), lines
    # Other checks see nothing wrong: only the graph differs.
    assert report["content_differs"]["count"] == 0 and report["chunks_consistent"]

    with Client(daemon.socket_path) as c:
        job = c.jobs_submit(AGENT, "reindex")
        wait_for(lambda: c.jobs_get(AGENT, job["job_id"])["state"] == "succeeded",
                 "the reindex")
    report = _verify(daemon)
    assert report["ok"] is True, report
    assert report["links_differ"]["count"] == 0
    assert daemon.stop() == 0
