"""The indexing process pool: real worker processes, started on demand, stopped when idle."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import trio

from recalld.daemon.index.prepare import prepare_files
from recalld.daemon.index.procpool import PoolUnavailable, PreparePool
from recalld.daemon.index.state import IndexState


async def test_calls_run_in_other_processes_and_the_pool_stops_when_idle(
    autojump_clock: trio.abc.Clock,
) -> None:
    pool = PreparePool(2, idle_s=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        assert not pool.alive
        pids = set()
        async with trio.open_nursery() as calls:
            async def one() -> None:
                pids.add(await pool.call(os.getpid))

            for _ in range(4):
                calls.start_soon(one)
        assert pids and os.getpid() not in pids
        assert pool.alive and pool.status()["starts"] == 1
        await trio.sleep(6.0)
        assert not pool.alive
        assert await pool.call(os.getpid) != os.getpid()  # started again on demand
        assert pool.status()["starts"] == 2
        nursery.cancel_scope.cancel()
    assert not pool.alive


async def test_a_pass_holding_the_pool_stops_it_when_it_ends(
    autojump_clock: trio.abc.Clock,
) -> None:
    pool = PreparePool(1, idle_s=600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        with pool.holding():
            with pool.holding():  # a second pass at the same time
                first = await pool.call(os.getpid)
            assert pool.alive  # the other pass still holds it
            assert await pool.call(os.getpid) == first
        assert not pool.alive  # at once, not idle_s later
        with pool.holding():
            assert await pool.call(os.getpid) != first  # started again on demand
        assert not pool.alive and pool.status()["starts"] == 2
        nursery.cancel_scope.cancel()


async def test_a_dead_worker_makes_the_call_fall_back() -> None:
    pool = PreparePool(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        failed = []

        async def one(fn: object) -> None:
            try:
                await pool.call(fn)  # type: ignore[arg-type]
            except PoolUnavailable:
                failed.append(fn)

        async with trio.open_nursery() as calls:  # the queued call fails over too
            calls.start_soon(one, partial(os._exit, 3))
            await trio.sleep(0.01)
            calls.start_soon(one, partial(time.sleep, 0.5))
        assert len(failed) == 2
        assert not pool.alive
        assert await pool.call(os.getpid) != os.getpid()
        nursery.cancel_scope.cancel()


async def test_prepared_in_a_process_indexes_like_prepared_here(tmp_path: Path) -> None:
    notes = {
        f"memory/2026-07-{d:02d}/n{i}.md": f"# Day {d}\n\nword{i} 周末爬山 [[n{(i + 1) % 5}]]\n"
        for d in (1, 2) for i in range(5)
    }
    for rel, text in notes.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    rels = sorted(notes)
    pool = PreparePool(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        remote = await pool.call(partial(prepare_files, tmp_path, rels, max_chars=2000,
                                         digests={}))
        nursery.cancel_scope.cancel()
    local = prepare_files(tmp_path, rels, max_chars=2000, digests={})
    a, b = IndexState(), IndexState()
    a.apply([remote])
    b.apply([local])
    for query in ("word3", "周末", "day"):
        assert a.keyword_search(query, 5) == b.keyword_search(query, 5)
        assert a.keyword_search(query, 5)
    assert a.graph.to_records() == b.graph.to_records()
    assert len(a.graph) > 0


async def test_a_long_call_keeps_the_pool_without_waking_it(autojump_clock: trio.abc.Clock) -> None:
    pool = PreparePool(1, idle_s=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await pool.call(os.getpid)
        await trio.sleep(4.0)
        # Running across the idle deadline: the pool stays, and stops idle_s after it ends.
        await pool.call(partial(time.sleep, 0.3))
        assert pool.alive
        await trio.sleep(4.9)
        assert pool.alive
        await trio.sleep(0.2)
        assert not pool.alive
        nursery.cancel_scope.cancel()


def test_daemon_main_module_is_light_for_spawned_workers() -> None:
    # A spawned worker imports the daemon's main module again (``python -m
    # recalld.daemon.main``); it must not pull the daemon (trio, numpy, hnswlib) in.
    code = ("import sys, recalld.daemon.main; "
            "sys.exit(bool({'trio', 'numpy', 'hnswlib'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
