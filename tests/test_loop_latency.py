"""Long work stays off the event loop: a heavy search does not delay another client's ping."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import DaemonFactory

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
    stop = threading.Event()
    failure: list[BaseException] = []

    def search_loop() -> None:
        try:
            with d.connect(timeout=120) as conn:
                while not stop.is_set():
                    took_ms.append(conn.call("memory.search", heavy)["took_ms"])
        except BaseException as exc:
            failure.append(exc)

    searcher = threading.Thread(target=search_loop, daemon=True)
    latencies: list[float] = []
    with d.connect() as pinger:
        for _ in range(20):
            assert pinger.call("daemon.ping")["pong"] is True
        searcher.start()
        end = time.monotonic() + 180
        # Ping for as long as it takes the daemon to run several heavy searches.
        while len(took_ms) < 6 or len(latencies) < 300:
            assert not failure, failure
            assert time.monotonic() < end, (len(took_ms), len(latencies))
            started = time.perf_counter()
            assert pinger.call("daemon.ping")["pong"] is True
            latencies.append(time.perf_counter() - started)
        stop.set()
    searcher.join(timeout=120)
    assert not failure, failure
    took_ms.sort()
    latencies.sort()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    # The searches really were heavy: each one alone is worth dozens of pings...
    assert took_ms[len(took_ms) // 2] >= 20, took_ms
    # ...yet the pings that ran meanwhile were answered at once.
    assert p50 < 0.01, (p50, p99, took_ms)
    assert p99 < 0.05, (p50, p99, took_ms)
