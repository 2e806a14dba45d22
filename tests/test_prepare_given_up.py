"""A note's preparation given up as too slow stops: the worker thread masking it is
abandoned when the limit passes (``chunkplan.rows_of``), and masking checks for that
every few hundred token runs or anchors (``redact.find_spans``'s ``check``), so the
thread gives its CPU token back at once instead of masking the note to its end. The
check changes nothing a completed masking finds.
"""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path

import pytest
import trio
from waits import until

from recalld.daemon.memory.redact import CHECK_EVERY, redact_note
from recalld.daemon.remote import chunkplan, chunks, db

sys.path.insert(0, str(Path(__file__).parent / "bench"))

import redact_corpus


def keys_note(lines: int) -> str:
    """Lines of keys after a credential word: some 1.5 s of CPU a megabyte to mask."""
    return "# Keys\n\n" + "".join(f"key {i}: sk-{secrets.token_hex(20)}\n"
                                  for i in range(lines))


async def test_a_preparation_given_up_gives_its_cpu_token_back_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 3.5 MB: masking it whole takes over 5 s of CPU, whatever the load (CPU time, not
    # wall time, is measured: a loaded machine stretches the one, not the other).
    data = keys_note(64_000).encode()
    monkeypatch.setattr(db, "PREPARE_TIMEOUT_S", 0.05)
    cpu = trio.CapacityLimiter(1)
    assert await chunkplan.rows_of("memory/keys.md", data, 1200, cpu) is None
    given_up = time.process_time()
    await until(lambda: cpu.borrowed_tokens == 0, what="the CPU token given back")
    assert time.process_time() - given_up < 1.0
    # The token serves the next note.
    rows = await chunkplan.rows_of("memory/small.md", b"# Small\nthe otter naps\n", 1200,
                                   cpu)
    assert rows is not None and any("otter naps" in r.text for r in rows), rows


def test_a_checked_masking_finds_what_an_unchecked_one_finds() -> None:
    calls = 0

    def check() -> None:
        nonlocal calls
        calls += 1

    texts = sorted({item.text for item in redact_corpus.generate(seed=5, per_kind=2)})
    big = "\n\n".join(texts) + "\n" + keys_note(4 * CHECK_EVERY)
    for text in [*texts, big]:
        assert redact_note(text, check=check) == redact_note(text)
    assert calls > 4  # checked along the way, not only once
    rows = chunks.chunk_rows("memory/big.md", big.encode(), check=check)
    assert rows == chunks.chunk_rows("memory/big.md", big.encode())
