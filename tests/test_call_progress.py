"""The daemon side of call progress: milestones in order, counts from worker threads,
nothing without a token, the body's own error unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio

from recalld.daemon.rpc.call_progress import TOPIC, CallProgress, check_token
from recalld.ipc.errors import InvalidBackup, InvalidParams


class Sink:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, topic: str, payload: Mapping[str, Any]) -> bool:
        assert topic == TOPIC
        self.sent.append(dict(payload))
        return True


async def test_phases_counts_and_their_order() -> None:
    sink = Sink()
    progress = CallProgress(sink, "t1", "backup.create", interval_s=0.01)

    def work() -> None:  # as the backup does, in a worker thread
        progress.phase("listing files")
        for _ in range(3):
            progress.advance()
        progress.phase("writing the archive", total=3, bytes_total=30)
        for _ in range(3):
            progress.advance(1, 10)

    async with progress.pumping():
        await trio.to_thread.run_sync(work)
    phases = [(r["phase"], r["done"], r["total"], r["bytes_done"]) for r in sink.sent]
    assert phases[0] == ("listing files", 0, None, None)
    assert ("listing files", 3, None, None) in phases
    assert phases[-1] == ("writing the archive", 3, 3, 30)
    writing = [p for p in phases if p[0] == "writing the archive"]
    assert writing[0] == ("writing the archive", 0, 3, 0)
    assert [p[1] for p in writing] == sorted(p[1] for p in writing)
    assert phases.index(("listing files", 3, None, None)) < phases.index(writing[0])
    assert all(r["token"] == "t1" and r["method"] == "backup.create" for r in sink.sent)
    assert len(sink.sent) == len({tuple(sorted(r.items())) for r in sink.sent})  # no repeats


async def test_without_a_token_nothing_is_sent_and_errors_pass_unchanged() -> None:
    sink = Sink()
    quiet = CallProgress(sink, None, "backup.restore")
    async with quiet.pumping():
        quiet.phase("checking the archive", total=1)
        quiet.advance()
    assert sink.sent == [] and not quiet.enabled
    loud = CallProgress(sink, "t2", "backup.restore")
    with pytest.raises(InvalidBackup, match="refusing"):
        async with loud.pumping():
            loud.phase("checking the archive", total=1)
            raise InvalidBackup("refusing backup /x.zip: no such file")


def test_tokens_are_checked() -> None:
    assert check_token(None) is None and check_token("a" * 64) == "a" * 64
    for bad in ("", "a" * 65, 7, ["t"]):
        with pytest.raises(InvalidParams):
            check_token(bad)
