"""Link expansion under search filters: a neighbour the filters leave out is listed in the
hit's links but its text is not shown."""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonHandle
from test_links_daemon import write


def test_neighbours_pass_the_filters_the_hits_pass(daemon: DaemonHandle,
                                                  tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "digest/wiki/kafka.md",
          "---\nauthor: alice\n---\n# Kafka\nzebrafish broker notes, see [[standup]], "
          "[[Retention]] and [[memory/2026-08-02/review|the review]]\n")
    write(root, "digest/wiki/retention.md", "---\nauthor: alice\n---\n# Retention\nsegments\n")
    write(root, "memory/2026-08-01/standup.md", "# Standup\ntalked about the broker\n")
    write(root, "memory/2026-08-02/review.md", "---\nauthor: alice\n---\n# Review\nlag\n")
    daemon.call("workspace.open", {"agent_id": "w", "path": str(root)})

    def search(**filters: object) -> tuple[list[str], list[str], list[str]]:
        answer = daemon.call("memory.search", {"agent_id": "w", "query": "zebrafish",
                                               "sync": True, "filters": filters or None})
        results = answer["results"]
        return ([r["path"] for r in results], results[0]["links"] if results else [],
                [e["path"] for e in answer["expanded"]])

    every = ["digest/wiki/retention.md", "memory/2026-08-01/standup.md",
             "memory/2026-08-02/review.md"]
    assert search() == (["digest/wiki/kafka.md"], every, every)
    # Each filter holds for the neighbours; the hit's links still name them all.
    assert search(path_prefix="digest/wiki") == (
        ["digest/wiki/kafka.md"], every, ["digest/wiki/retention.md"])
    assert search(bucket="wiki") == (["digest/wiki/kafka.md"], every,
                                      ["digest/wiki/retention.md"])
    assert search(path_prefix=["digest", "memory/2026-08-02"]) == (
        ["digest/wiki/kafka.md"], every,
        ["digest/wiki/retention.md", "memory/2026-08-02/review.md"])
    assert search(author="alice") == (["digest/wiki/kafka.md"], every,
                                      ["digest/wiki/retention.md",
                                       "memory/2026-08-02/review.md"])
    # From the other side: a daily note's neighbour in the digest is no daily note.
    answer = daemon.call("memory.search", {
        "agent_id": "w", "query": "broker", "sync": True,
        "filters": {"date_from": "2026-08-01", "date_to": "2026-08-01"}})
    assert [r["path"] for r in answer["results"]] == ["memory/2026-08-01/standup.md"]
    assert answer["results"][0]["links"] == ["digest/wiki/kafka.md"]
    assert answer["expanded"] == []
