"""``recalld search`` and the other listing commands on a real daemon: what they ask for
and what they say about it."""

from __future__ import annotations

from conftest import DaemonHandle
from test_cli import as_json, recalld


def test_more_results_than_the_daemon_gives_is_said(daemon: DaemonHandle) -> None:
    # The daemon gives at most 100 hits a search: -n above that got 100 with no word,
    # as if the memory held no more.
    day = daemon.data_dir / "workspaces" / "default" / "memory" / "2026-11-30"
    day.mkdir(parents=True)
    for i in range(105):
        (day / f"heron-{i:03d}.md").write_text(f"# Heron {i}\n\nA heron by pond {i}.\n",
                                               encoding="utf-8")
    daemon.call("index.sync", {"agent_id": "default"})
    said = "recalld: note: at most 100 results are given, not 500"
    proc = recalld("search", "heron", "-n", "500", "--sync", "--json", env=daemon.env)
    assert len(as_json(proc)["results"]) == 100
    assert said in proc.stderr.splitlines(), proc.stderr
    proc = recalld("search", "heron", "-n", "500", "--sync", env=daemon.env)
    assert proc.stdout.count("==========") == 200 and said in proc.stderr.splitlines()
    proc = recalld("search", "heron", "-n", "100", "--sync", "--json", env=daemon.env)
    assert len(as_json(proc)["results"]) == 100 and "at most" not in proc.stderr


def test_more_records_or_runs_than_the_daemon_lists_is_said(daemon: DaemonHandle) -> None:
    # memory.changes lists at most 500 records: `changes -n 1000` said nothing of it.
    proc = recalld("changes", "-n", "1000", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no change records yet\n", proc.stdout
    assert proc.stderr == "recalld: note: at most 500 records are given, not 1000\n", \
        proc.stderr
    proc = recalld("changes", "-n", "500", env=daemon.env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # And dream.runs at most 200.
    proc = recalld("dream", "--runs", "300", env=daemon.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "recalld: note: at most 200 runs are given, not 300\n", proc.stderr
