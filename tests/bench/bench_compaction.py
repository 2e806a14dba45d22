"""Searches while edits fill the keyword index's delta until it compacts: the compaction
in place, under the index lock (the baseline: how every compaction ran before ADR 0032),
against off the lock (what recalld does), in turns, in process.

A ``WorkspaceIndex`` over a synthetic workspace (``synth.generate``, built once and kept in
``bench-results/compaction-ws-<notes>``, so later runs load its saved index). Each round
starts the index service on it, searches every 20 ms from one task (a fixed mix of
queries) while another appends to notes one edit at a time (``synth.EditStream``, each
edit synced) until the keyword index has compacted, then searches on for a second.
Reported per way: the searches' p50 / p99 / max and how many took over 100 ms, the edits it
took, and the median over the rounds. The baseline is the same code with every apply
compacting in place (``IndexState.apply(compact=True)``, as a rebuild does).

    .venv/bin/python tests/bench/run.py compaction [--notes 3000] [--rounds 2]
    .venv/bin/python tests/bench/bench_compaction.py --notes 300 --rounds 1   # quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synth

from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.index.filters import Filters
from recalld.daemon.index.prepare import PreparedBatch
from recalld.daemon.index.records import ApplyStats
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.state import IndexState
from recalld.daemon.workspaces import Workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
QUERIES = ["python release notes", "deploy rollback plan", "error handling", "数据库 迁移",
           "meeting summary", "cache invalidation"]
WAYS = ("in_place", "off_lock")


@contextlib.contextmanager
def compacting(way: str) -> Iterator[None]:
    """``in_place``: every apply compacts in place under the lock (the baseline)."""
    if way == "off_lock":
        yield
        return
    real = IndexState.apply

    def in_place(self: IndexState, batches: list[PreparedBatch], *, stage: bool = False,
                 compact: bool = True) -> ApplyStats:
        return real(self, batches, stage=stage, compact=True)

    IndexState.apply = in_place  # type: ignore[method-assign]
    try:
        yield
    finally:
        IndexState.apply = real  # type: ignore[method-assign]


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


async def one_round(ws: Path, way: str, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rcc-") as tmp, compacting(way):
        cfg = DaemonConfig(socket_path=Path(tmp) / "s", data_dir=Path(tmp) / "d",
                           config_path=Path(tmp) / "c.toml")
        index = WorkspaceIndex(Workspace("bench", ws, WorkspaceSettings()), cfg,
                               cpu=trio.CapacityLimiter(2), background=trio.CapacityLimiter(1))
        latencies: list[float] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(index.run)
            await index.sync()
            merges = index.state.bm25.stats()["merges"]
            start = index.state.bm25.stats()

            async def search() -> None:
                i = 0
                while True:
                    t0 = time.perf_counter()
                    await index.candidates(QUERIES[i % len(QUERIES)], 5, Filters(), None)
                    latencies.append(time.perf_counter() - t0)
                    i += 1
                    await trio.sleep(0.02)

            nursery.start_soon(search)
            stream = synth.EditStream(ws, seed=seed)
            edits = 0
            t0 = time.perf_counter()
            with trio.fail_after(900):
                while index.state.bm25.stats()["merges"] == merges:
                    stream.next()
                    edits += 1
                    await index.sync()
            took = time.perf_counter() - t0
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    return {"way": way, "edits": edits, "edit_s": round(took, 2), "searches": len(latencies),
            "p50_ms": round(_pct(latencies, 50) * 1000, 2),
            "p99_ms": round(_pct(latencies, 99) * 1000, 1),
            "max_ms": round(max(latencies) * 1000, 1),
            "over_100ms": sum(1 for x in latencies if x > 0.1),
            "keyword_before": start}


def workspace(notes: int) -> Path:
    ws = REPO_ROOT / "bench-results" / f"compaction-ws-{notes}"
    if not (ws / "memory").is_dir():
        print(f"generating {notes} notes in {ws}", file=sys.stderr)
        synth.generate(ws, notes=notes, seed=0)
    return ws


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    ws = workspace(args.notes)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    trio.run(one_round, ws, "off_lock", 0)  # builds or loads, and settles the delta
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            result = trio.run(one_round, ws, way, 1 + len(rounds))
            print(json.dumps(result), file=sys.stderr)
            rounds.append(result)
    medians = {way: {key: statistics.median(x[key] for x in rounds if x["way"] == way)
                     for key in ("edits", "searches", "p50_ms", "p99_ms", "max_ms",
                                 "over_100ms")} for way in WAYS}
    doc = {"bench": "compaction", "started": started, "notes": args.notes,
           "machine": {"python": platform.python_version(), "platform": platform.platform()},
           "rounds": rounds, "medians": medians}
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
