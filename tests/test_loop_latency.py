"""Long work stays off the event loop: a heavy search does not delay another client's ping."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import DaemonFactory, DaemonHandle, RawConnection

SYLLABLES = ["ka", "lo", "mir", "tsu", "ven", "dra", "pol", "quen", "sa", "tor", "bel", "nix"]


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def _write_workspace(root: Path, vocab: list[str], rng: random.Random, files: int) -> None:
    day = root / "memory" / "2026-01-05"
    day.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        sections = [f"## part {k}\n\n" + " ".join(rng.choices(vocab, k=60)) for k in range(4)]
        (day / f"note-{i:04d}.md").write_text(f"# note {i}\n\n" + "\n\n".join(sections) + "\n")


def _pings_while(d: DaemonHandle, work: Callable[[RawConnection], None],
                 done: Callable[[], bool]) -> list[float]:
    """Ping latencies (sorted, at least 300) while another connection repeats ``work``
    until ``done()``."""
    stop = threading.Event()
    failure: list[BaseException] = []

    def loop() -> None:
        try:
            with d.connect(timeout=120) as conn:
                while not stop.is_set():
                    work(conn)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=loop, daemon=True)
    latencies: list[float] = []
    with d.connect() as pinger:
        for _ in range(20):
            assert pinger.call("daemon.ping")["pong"] is True
        worker.start()
        end = time.monotonic() + 180
        try:
            while not done() or len(latencies) < 300:
                assert not failure, failure
                assert time.monotonic() < end, len(latencies)
                started = time.perf_counter()
                assert pinger.call("daemon.ping")["pong"] is True
                latencies.append(time.perf_counter() - started)
        finally:
            stop.set()
            worker.join(timeout=120)
    assert not failure, failure
    return sorted(latencies)


@pytest.mark.slow
def test_a_heavy_search_does_not_delay_another_clients_ping(
    daemon_factory: DaemonFactory,
) -> None:
    rng = random.Random(7)
    vocab = _vocabulary(rng, 4000)
    d = daemon_factory()
    ws = Path(d.call("workspace.list")["workspaces"][0]["path"])
    _write_workspace(ws, vocab, rng, files=700)
    synced = d.call("index.sync", {"agent_id": "default"}, timeout=300)
    assert synced["chunks"] >= 2000, synced
    heavy = {"agent_id": "default", "query": " ".join(rng.sample(vocab, 3000)),
             "max_results": 5}

    took_ms: list[float] = []

    def search(conn: RawConnection) -> None:
        took_ms.append(conn.call("memory.search", heavy)["took_ms"])

    latencies = _pings_while(d, search, lambda: len(took_ms) >= 6)
    took_ms.sort()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    # The searches really were heavy: each one alone is worth dozens of pings...
    assert took_ms[len(took_ms) // 2] >= 20, took_ms
    # ...yet the pings that ran meanwhile were answered at once.
    assert p50 < 0.01, (p50, p99, took_ms)
    assert p99 < 0.05, (p50, p99, took_ms)


@pytest.mark.slow
def test_capturing_large_batches_of_turns_does_not_delay_pings(
    daemon_factory: DaemonFactory,
) -> None:
    rng = random.Random(11)
    vocab = _vocabulary(rng, 2000)
    d = daemon_factory()
    secret = "sk-" + "A1b2C3d4" * 5
    # 20 messages of ~30k characters each: sanitizing and redacting them takes a
    # noticeable fraction of a second, which must not be spent on the event loop.
    messages = [{"role": "assistant",
                 "content": " ".join(rng.choices(vocab, k=4000)) + f" key {secret}"}
                for _ in range(20)]
    calls: list[int] = []

    def capture(conn: RawConnection) -> None:
        conn.call("memory.add_turns", {"agent_id": "default", "session_id": "big",
                                       "messages": messages})
        calls.append(1)

    latencies = _pings_while(d, capture, lambda: len(calls) >= 4)
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    assert p50 < 0.01, (p50, p99)
    assert p99 < 0.05, (p50, p99)
