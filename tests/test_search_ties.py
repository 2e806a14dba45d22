"""Hits of equal score rank by place (path, then line), not by the order notes were
indexed in: the same notes written in another order, rebuilt, or split between the
keyword index's merged rows and its recent delta give the same answer."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from test_index_daemon import open_ws, write
from waits import wait_job

TWIN = "the heron waited by the cold river at dawn\n"
# Written in this order: the keys follow it, the answer must not.
NAMES = ["zeta", "mike", "alpha", "kilo", "bravo", "yankee", "delta", "echo", "lima",
         "oscar", "hotel", "golf", "xray", "nov", "papa"]


def ranked(d: Any, query: str, n: int) -> list[tuple[str, int, float]]:
    answer = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": n})
    return [(r["path"], r["start_line"], r["score"]) for r in answer["results"]]


def by_place(hits: list[tuple[str, int, float]]) -> bool:
    """Is every run of (nearly) equal scores in path, then line, order?"""
    return all(a[:2] < b[:2] for a, b in itertools.pairwise(hits)
               if abs(a[2] - b[2]) <= 1e-9 * a[2])


def test_tied_hits_rank_by_place_whatever_the_indexing_order(daemon: Any,
                                                              tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/other.md", "a heron, once\n\nnothing else here at all today\n")
    open_ws(daemon, root)
    # Some merged into the main rows, the others in the delta: scored by other code.
    for name in NAMES[:7]:
        write(root, f"memory/{name}.md", TWIN)
        daemon.call("index.sync", {"agent_id": "w"})
    daemon.call("index.compact", {"agent_id": "w"})
    for name in NAMES[7:]:
        # The same text twice in one note: its chunks tie too, and rank by line.
        write(root, f"memory/{name}.md", f"{TWIN}\n{'filler words ' * 200}\n\n{TWIN}")
        daemon.call("index.sync", {"agent_id": "w"})
    live = {n: ranked(daemon, "heron river dawn", n) for n in (1, 2, 5, 40)}
    every = live[40]
    assert len(every) > len(NAMES) + 1 and by_place(every), every
    twins = [h for h in every if abs(h[2] - every[0][2]) <= 1e-9 * every[0][2]]
    assert len(twins) >= len(NAMES), every
    # A short list is the head of the long one: the run of ties at the cut is taken
    # whole, however far past the pool (three times max_results) it goes.
    for n in (1, 2, 5):
        assert live[n] == every[:n], n
    job = daemon.call("jobs.submit", {"agent_id": "w", "kind": "reindex"})
    wait_job(daemon, job["job_id"])
    rebuilt = {n: ranked(daemon, "heron river dawn", n) for n in (1, 2, 5, 40)}
    assert [[h[:2] for h in v] for v in rebuilt.values()] == [
        [h[:2] for h in v] for v in live.values()]
