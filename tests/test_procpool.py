"""The indexing process pool: real worker processes, started on demand, stopped when idle."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio
from half_answer import write_part_of_an_answer_then_die

from recalld.daemon.index import bm25 as bm25_mod
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


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (exited or a zombie not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return True


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
        # Its idle process is ended, not left to exit in its own time.
        deadline = time.monotonic() + 30.0
        while not _gone(first) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _gone(first)
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


async def test_a_worker_killed_part_way_through_its_answer_fails_the_call_over() -> None:
    # The OOM killer may end a worker while it writes a large answer: the call (and the
    # one queued behind it) fails over at once, not waiting for the rest of a message
    # that never comes; another worker's call is answered; the pool starts afresh.
    pool = PreparePool(2)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        with pool.holding():
            pool.warm()  # both processes idle: the two calls go one to each
            outcomes: dict[str, object] = {}

            async def one(name: str, fn: object) -> None:
                try:
                    outcomes[name] = await pool.call(fn)  # type: ignore[arg-type]
                except PoolUnavailable as exc:
                    outcomes[name] = exc

            with trio.fail_after(60):  # (it waited forever)
                async with trio.open_nursery() as calls:
                    calls.start_soon(one, "killed", write_part_of_an_answer_then_die)
                    calls.start_soon(one, "other", partial(time.sleep, 0.2))
            assert isinstance(outcomes["killed"], PoolUnavailable), outcomes
            assert outcomes["other"] is None or isinstance(outcomes["other"], PoolUnavailable)
            assert not pool.alive
            assert await pool.call(os.getpid) != os.getpid()
            assert pool.status()["starts"] == 2
        nursery.cancel_scope.cancel()
    assert not pool.alive


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
    # Files, chunks and links cross the process boundary whole (their ``__reduce__``).
    assert remote.files == local.files
    assert sum(len(f.links) for f in remote.files) == len(notes)
    a, b = IndexState(), IndexState()
    a.apply([remote])
    b.apply([local])
    for query in ("word3", "周末", "day"):
        assert a.keyword_search(query, 5) == b.keyword_search(query, 5)
        assert a.keyword_search(query, 5)
    assert a.graph.to_records() == b.graph.to_records()
    assert len(a.graph) > 0


async def test_a_pass_of_worker_vocabularies_indexes_like_batches_prepared_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pool's processes keep one vocabulary each over a pass and send only the terms
    # new to it; applied in order, the index is the one per-batch vocabularies give
    # (merged as a pass's batches of 128 files are, not put in the delta).
    monkeypatch.setattr(bm25_mod, "SMALL_ADD_DOCS", 0)
    rels = []
    for i in range(24):
        rel = f"memory/2026-07-{i % 3 + 1:02d}/n{i}.md"
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# Note {i}\n\nshared words 周末爬山 only{i} 第{i}天\n",
                                    encoding="utf-8")
        rels.append(rel)
    batches = [rels[i:i + 3] for i in range(0, len(rels), 3)]
    pool = PreparePool(2)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        remote = [await pool.call(partial(prepare_files, tmp_path, b, max_chars=2000,
                                          digests={}, vocab="pass-1")) for b in batches]
        nursery.cancel_scope.cancel()
    assert all(b.vocab is not None and b.vocab.pid != os.getpid() for b in remote)
    sent = sum(len(b.terms.split("\n")) for b in remote)
    local = [prepare_files(tmp_path, b, max_chars=2000, digests={}) for b in batches]
    assert sent < sum(len(b.terms.split("\n")) for b in local)  # shared terms sent once
    a, b = IndexState(), IndexState()
    a.apply(remote[:4], stage=True)
    a.apply(remote[4:])
    b.apply(local[:4], stage=True)
    b.apply(local[4:])
    got, want = a.bm25.to_arrays(), b.bm25.to_arrays()
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    assert a.keyword_search("周末", 30) == b.keyword_search("周末", 30)
    assert len(a.keyword_search("only7", 5)) == 1


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


async def test_a_warmed_pool_is_the_one_the_next_calls_use(
    autojump_clock: trio.abc.Clock,
) -> None:
    pool = PreparePool(2, idle_s=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        pool.warm()
        assert pool.alive and pool.status()["starts"] == 1
        pool.warm()  # already started: nothing more
        with pool.holding():
            pids = {await pool.call(os.getpid) for _ in range(4)}
        assert os.getpid() not in pids and pool.status()["starts"] == 1
        assert not pool.alive  # the pass that held it ended
        pool.warm()
        assert pool.alive and pool.status()["starts"] == 2
        await trio.sleep(5.5)  # no call came: stopped once idle, as after a call
        assert not pool.alive
        nursery.cancel_scope.cancel()


def test_daemon_main_module_is_light_for_spawned_workers() -> None:
    # A spawned worker imports the daemon's main module again (``python -m
    # recalld.daemon.main``); it must not pull the daemon (trio, numpy, hnswlib) in.
    code = ("import sys, recalld.daemon.main; "
            "sys.exit(bool({'trio', 'numpy', 'hnswlib'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


async def test_a_stopped_pool_starts_no_processes() -> None:
    # Once its run() has ended (the daemon stopping), a scan still going in a thread can
    # ask for a warm pool or a call: neither starts worker processes.
    pool = PreparePool(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        nursery.cancel_scope.cancel()
    pool.warm()
    assert not pool.alive and pool.status()["starts"] == 0
    with pytest.raises(PoolUnavailable):
        await pool.call(os.getpid)
    assert not pool.alive and pool.status()["starts"] == 0
