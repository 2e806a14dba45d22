"""A provider that keeps failing on one text (a 5xx or a dropped connection every time
that text is in the call) while it embeds every other: the backfill does not stall on
it. The text is singled out and parked with the reason; an outage of the whole provider
parks nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider, Reply
from test_vectors import BACKFILL, FAST, Harness, ask, full, passage_counts, wait_for, write

from recalld.daemon.index.parking import PARKED_LOG
from recalld.daemon.index.spaces import VectorSpaces
from recalld.daemon.providers.breaker import BreakerConfig
from recalld.daemon.providers.bridge import ProviderBridge

WORD = "quasarflux"


def notes(root: Path) -> None:
    # The failing note is the shortest, so it shares the round's first batch with others.
    write(root, "memory/2026-05-09/bad.md", f"# Bad\n\n{WORD}\n")
    for i in range(9):
        write(root, f"memory/2026-05-0{i}/n{i}.md" if i else "memory/2026-04-30/n0.md",
              f"# Note {i}\n\nan ordinary note, number {i}, about lighthouses\n")


def harness(tmp_path: Path, bridge: ProviderBridge) -> Harness:
    # As the daemon's defaults have it, a call's own retries are enough to open the
    # circuit: the text that fails alone leaves it open for the next one.
    h = Harness(tmp_path, bridge)
    h.spaces = VectorSpaces(h.cfg.state_dir / "embeddings", bridge, policy=FAST,
                            breaker_config=BreakerConfig(failure_threshold=FAST.max_attempts,
                                                         open_base_s=0.05, open_max_s=0.2),
                            environ={})
    return h


def failing(reply: Reply) -> Any:
    return lambda body: reply if any(WORD in t for t in body.get("input") or []) else None


@pytest.mark.parametrize("reply", [Reply(status=500), Reply(drop=True)],
                         ids=["http-500", "dropped"])
async def test_a_text_the_provider_keeps_failing_on_is_parked_alone(
        tmp_path: Path, bridge: ProviderBridge, reply: Reply) -> None:
    h = harness(tmp_path, bridge)
    notes(h.root)
    with FakeProvider(dims=8) as fake:
        fake.reply_for = failing(reply)
        async with h.open(h.emb(fake)) as (index, worker):
            await wait_for(lambda: worker.status()["parked"] == 1
                           and worker.state == "waiting", timeout_s=20)
            st = worker.status()
            assert (st["total"], st["embedded"], st["pending"]) == (10, 9, 1), st
            assert st["parked_paths"] == ["memory/2026-05-09/bad.md:1-3"]
            assert "failed" in st["parked_error"] and "while the provider embedded others" \
                in st["parked_error"], st["parked_error"]
            if reply.status == 500:
                assert "HTTP 500" in st["parked_error"]
            # The good texts that shared its batch were sent again only until the batch
            # was split (each failed call is FAST.max_attempts requests).
            counts = passage_counts(fake)
            most = BACKFILL.isolate_after * FAST.max_attempts + 1
            assert {t: n for t, n in counts.items() if n > most and WORD not in t} == {}
            # The failing text itself: its calls until it was struck enough, then one
            # alone (parked though the circuit it opened refused the next text's call).
            bad = next(t for t in counts if WORD in t)
            assert counts[bad] <= (BACKFILL.isolate_after + 1) * FAST.max_attempts, counts
            # Its failures may have left the circuit open for a moment.
            await wait_for(lambda: worker.target.client.breaker.state != "open")
            res = await ask(index, "lighthouses")
            assert res["mode"] == "hybrid" and res["vector_hits"] == 9
            res = await ask(index, WORD)
            assert res["results"][0]["path"] == "memory/2026-05-09/bad.md"
            # A note written later is embedded at once, not held behind the parked one.
            write(h.root, "memory/2026-05-10/late.md", "# Late\n\nanother lighthouse\n")
            await index.sync()
            await wait_for(lambda: worker.status()["embedded"] == 10
                           and worker.state == "waiting")
            assert worker.status()["parked"] == 1


async def test_an_outage_of_the_whole_provider_parks_nothing(
        tmp_path: Path, bridge: ProviderBridge) -> None:
    h = harness(tmp_path, bridge)
    notes(h.root)
    with FakeProvider(dims=8) as fake:
        # The health check passes; then every call fails for many rounds.
        fake.script(Reply(), *[Reply(status=503)] * 6)
        async with h.open(h.emb(fake)) as (_, worker):
            await wait_for(lambda: fake.pending_script() == 0, timeout_s=20)
            assert worker.status()["parked"] == 0
            await full(worker)
            assert worker.status()["parked"] == 0


async def test_texts_sent_one_by_one_and_all_refused_alone_are_the_providers_fault(
        tmp_path: Path, bridge: ProviderBridge) -> None:
    # A provider that fails every batch (HTTP 500) and refuses every text alone (HTTP
    # 400), but its health check's: the batches go text by text once struck enough, and
    # when it refuses every one of them that is no fault of theirs, as when a batch
    # refused as a whole is sent text by text. No text is parked as its own (the log
    # would keep them from being tried again after a restart); the provider is failing.
    h = harness(tmp_path, bridge)
    notes(h.root)

    def reply(body: Any) -> Reply | None:
        texts = body.get("input") or []
        if texts == ["ping"]:
            return None
        return Reply(status=500 if len(texts) > 1 else 400)

    with FakeProvider(dims=8) as fake:
        fake.reply_for = reply
        async with h.open(h.emb(fake)) as (_, worker):
            await wait_for(lambda: any(len(r.json["input"]) == 1 and r.json["input"] != ["ping"]
                                       for r in fake.requests)
                           and worker.state == "waiting", timeout_s=20)
            st = worker.status()
            assert st["parked"] == st["pending"] == 10, st
            assert st["health"] == "fail" and "HTTP 400" in st["parked_error"], st
    log = h.root / "mem_metadata" / PARKED_LOG
    assert not log.exists() or log.read_bytes() == b"", log.read_bytes()
