"""How long searches wait while a commit starts serving the files it just wrote.

After every commit the index serves the keyword index's main segment and the chunk table
from private copies of their generation files (ADR 0020): ``adopt_saved`` after an edit's
commit, ``reload_saved`` after a large pass's. Two ways, in turns on one saved generation
of a synthetic workspace, in this process, with trio as the daemon runs it:

- ``under_lock`` (the baseline): the copies are made in the worker thread that holds the
  index lock, as ``adopt_saved(state, gen)`` does on its own.
- ``before_lock`` (what the index does): ``map_saved(gen)`` first, then the lock for the
  adopt or reload only.

Meanwhile a search task searches back to back (each under the lock, as a search of a
large index runs); reported per way and kind: the serve's wall time, the longest a search
waited for its answer during it, and the searches answered meanwhile. Medians over the
rounds; the JSON also has each round and the load average.

    .venv/bin/python tests/bench/bench_serve_saved.py --notes 3000 --rounds 5
    .venv/bin/python tests/bench/bench_serve_saved.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synth

from recalld.daemon.index.persist import (
    IndexStore,
    adopt_saved,
    map_saved,
    reload_saved,
    snapshot,
)
from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.state import IndexState

WAYS = ("under_lock", "before_lock")
KINDS = ("adopt", "reload")
QUERIES = ("alpha", "记忆", "meeting notes", "deploy", "weekend plans")


def build(ws: Path, meta: Path) -> tuple[IndexState, IndexStore]:
    """The workspace's index, built here and committed once."""
    rels = sorted(str(p.relative_to(ws)) for p in ws.rglob("*.md"))
    state = IndexState()
    batches = [prepare_files(ws, rels[i:i + 512], max_chars=2000, digests={})
               for i in range(0, len(rels), 512)]
    state.apply(batches)
    store = IndexStore(meta)
    store.save(snapshot(state))
    return state, store


async def one(state: IndexState, store: IndexStore, way: str, kind: str) -> dict[str, Any]:
    gen = store.store.current
    assert gen is not None
    serve = reload_saved if kind == "reload" else adopt_saved
    lock = trio.Lock()
    done = trio.Event()
    waits: list[float] = []

    async def search() -> None:
        i = 0
        while not done.is_set():
            asked = time.perf_counter()
            async with lock:
                await trio.to_thread.run_sync(state.keyword_search, QUERIES[i % len(QUERIES)], 10)
            waits.append(time.perf_counter() - asked)
            i += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(search)
        await trio.sleep(0.05)  # the searches are under way
        waits.clear()
        started = time.perf_counter()
        if way == "under_lock":
            async with lock:
                await trio.to_thread.run_sync(serve, state, gen)
        else:
            saved = await trio.to_thread.run_sync(map_saved, gen)
            async with lock:
                await trio.to_thread.run_sync(partial(serve, state, gen, saved))
        took = time.perf_counter() - started
        done.set()
    state.evict()
    return {"serve_s": round(took, 4), "longest_wait_ms": round(max(waits) * 1e3, 2),
            "searches": len(waits)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--notes", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="300 notes, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.notes, args.rounds = 300, 2
    tmp = Path(tempfile.mkdtemp(prefix="serve-saved-"))
    try:
        ws = tmp / "ws"
        gen = synth.generate(ws, notes=args.notes, seed=1)
        t0 = time.perf_counter()
        state, store = build(ws, tmp / "meta")
        print(f"built {len(state.files)} files, {len(state.chunks)} chunks in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        current = store.store.current
        assert current is not None
        sizes = {name: current.path(name).stat().st_size for name in ("bm25", "chunk_table")}
        runs: dict[str, list[dict[str, Any]]] = {f"{k}/{w}": [] for k in KINDS for w in WAYS}
        for r in range(args.rounds):
            for kind in KINDS:
                for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                    res = trio.run(one, state, store, way, kind)
                    res["load"] = round(os.getloadavg()[0], 2)
                    runs[f"{kind}/{way}"].append(res)
                    print(kind, way, json.dumps(res), file=sys.stderr, flush=True)
        medians = {name: {k: statistics.median(x[k] for x in rs)
                          for k in ("serve_s", "longest_wait_ms", "searches")}
                   for name, rs in runs.items()}
        print(json.dumps({
            "bench": "serve_saved", "notes": gen.notes, "files": len(state.files),
            "chunks": len(state.chunks), "file_bytes": sizes, "rounds": args.rounds,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "medians": medians, "runs": runs}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
