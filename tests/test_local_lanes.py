"""The local embedding backend's two lanes: queries never wait behind a backfill call.

The encoder is a stand-in with the engine's interface (the real models are exercised in
test_embedding_backends.py): passage calls can be held on a threading event, so the test
checks conditions (a query answered while a passage call is still held), not timings.
"""

from __future__ import annotations

import threading

import numpy as np
import trio
from fakes.provider_server import fake_vector, unit

from recalld.daemon.providers.local import PASSAGE_CALL_CHARS, LocalEmbedder

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
