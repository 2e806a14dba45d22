"""Parked texts stay parked across restarts: a text the provider refuses, or keeps
failing on, is not sent again after a restart before its time; a changed embedding config
tries it again at once; once due, one call alone decides whether it is parked again."""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

import orjson
from fakes.provider_server import FakeProvider, Reply
from test_cli import recalld
from test_vectors import FAST, passage_counts, wait_for
from test_vectors_daemon import vectors_status, write
from test_vectors_failing_text import WORD, failing, harness
from test_vectors_failing_text import notes as failing_notes
from test_vectors_refused import Refusing, config, notes
from waits import wait_value

from recalld.daemon.index.parking import PARKED_LOG


def sent(fake: FakeProvider, word: str, skip: int = 0) -> int:
    """Embedding requests after the first ``skip`` that hold a text with ``word``."""
    return sum(1 for r in fake.requests[skip:] if r.path.endswith("/embeddings")
               and any(word in t for t in r.json.get("input") or []))


def parked_waiting(d: Any) -> dict[str, Any]:
    return wait_value(lambda: vectors_status(d),
                      lambda st: st["state"] == "waiting" and st["parked"] == 1,
                      "the refused chunk parked, nothing else to do", deadline_s=30)


def test_a_refused_text_stays_parked_after_a_restart(daemon_factory: Any,
                                                     tmp_path: Path) -> None:
    root = tmp_path / "ws"
    notes(root)
    with Refusing("zyx") as fake:
        d = daemon_factory(config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        parked_waiting(d)
        assert d.stop() == 0
        before = len(fake.requests)
        d = daemon_factory(config(root, fake), RECALLD_DATA_DIR=str(d.data_dir))
        d.call("index.sync", {"agent_id": "w"})
        st = parked_waiting(d)
        # Parked from before the restart: not sent again, and status says why and where.
        assert sent(fake, "zyx", before) == 0
        assert (st["total"], st["embedded"]) == (8, 7), st
        assert st["parked_paths"] == ["memory/2026-03-09/bad.md:1-3"]
        assert "HTTP 400" in st["parked_error"] and "input refused" in st["parked_error"]
        assert d.stop() == 0
        # Another embedding config (here the input length): it is tried again at once.
        before = len(fake.requests)
        changed = config(root, fake).replace("max_batch_size = 3",
                                             "max_batch_size = 3, max_input_length = 4000")
        d = daemon_factory(changed, RECALLD_DATA_DIR=str(d.data_dir))
        d.call("index.sync", {"agent_id": "w"})
        st = parked_waiting(d)
        assert sent(fake, "zyx", before) >= 1
        assert "HTTP 400" in st["parked_error"]
        assert d.stop() == 0


def test_a_lone_text_refused_alone_is_parked_as_its_own(daemon_factory: Any,
                                                       tmp_path: Path) -> None:
    # Every other chunk has its vector; then a note the provider refuses is written: its
    # text goes alone, and its refusal is that text's (the provider just embedded the
    # others), so it is parked like a text refused out of a batch: kept across a restart,
    # the provider not marked failing.
    root = tmp_path / "ws"
    for i in range(4):
        write(root, f"memory/2026-04-0{i + 1}/n{i}.md", f"# N{i}\n\nsandbar number {i}\n")
    with Refusing("qrv") as fake:
        d = daemon_factory(config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["state"] == "idle"
                   and st["total"] == 4 and st["embedded"] == 4, "the good notes embedded")
        write(root, "memory/2026-04-09/odd.md", "# Odd\n\nqrv\n")
        d.call("index.sync", {"agent_id": "w"})
        st = parked_waiting(d)
        assert st["health"] == "ok" and "HTTP 400" in st["parked_error"], st
        assert d.stop() == 0
        before = len(fake.requests)
        d = daemon_factory(config(root, fake), RECALLD_DATA_DIR=str(d.data_dir))
        d.call("index.sync", {"agent_id": "w"})
        st = parked_waiting(d)
        assert sent(fake, "qrv", before) == 0
        assert st["parked_paths"] == ["memory/2026-04-09/odd.md:1-3"]
        assert "input refused" in st["parked_error"]
        # The fix says when it is tried again: not only every hour.
        out = recalld("status", env=d.env).stdout
        assert ("tried again when their hour is up (a restart keeps them parked until "
                "then), and at once when the workspace opens with a changed "
                "embedding_model_config") in out, out
        assert d.stop() == 0


async def test_a_failing_text_due_again_costs_one_call(tmp_path: Path, bridge: Any) -> None:
    h = harness(tmp_path, bridge)
    failing_notes(h.root)
    log = h.root / "mem_metadata" / PARKED_LOG
    with FakeProvider(dims=8) as fake:
        fake.reply_for = failing(Reply(status=500))
        async with h.open(h.emb(fake)) as (_, worker):
            await wait_for(lambda: worker.status()["parked"] == 1
                           and worker.state == "waiting", timeout_s=20)
        # Closed and opened again: the text stays parked, nothing sent for it.
        before = len(fake.requests)
        h.spaces = h.new_spaces()
        async with h.open(h.emb(fake)) as (_, worker):
            await wait_for(lambda: worker.status()["parked"] == 1
                           and worker.state == "waiting", timeout_s=20)
            assert sent(fake, WORD, before) == 0
            assert "HTTP 500" in (worker.status()["parked_error"] or "")
        # Its time has come (the record says so): tried again, alone, once.
        rec = orjson.loads(log.read_bytes().splitlines()[-1].split(b" ", 1)[1])
        rec["until"] = time.time() - 1
        line = orjson.dumps(rec)
        log.write_bytes(f"{_crc(line)} ".encode() + line + b"\n")
        before = len(fake.requests)
        h.spaces = h.new_spaces()
        async with h.open(h.emb(fake)) as (_, worker):
            await wait_for(lambda: sent(fake, WORD, before) > 0
                           and worker.status()["parked"] == 1
                           and worker.state == "waiting", timeout_s=20)
            assert sent(fake, WORD, before) <= FAST.max_attempts, passage_counts(fake, before)
            assert _parked_at(log) > rec["at"]


def _crc(line: bytes) -> str:
    return f"{zlib.crc32(line):08x}"


def _parked_at(log: Path) -> float:
    rec = orjson.loads(log.read_bytes().splitlines()[-1].split(b" ", 1)[1])
    return float(rec["at"])


def parked_records(root: Path) -> list[dict[str, Any]]:
    log = root / "mem_metadata" / PARKED_LOG
    return [orjson.loads(line.split(b" ", 1)[1]) for line in log.read_bytes().splitlines()]


def test_a_deleted_notes_parked_text_leaves_the_parking_log(daemon_factory: Any,
                                                            tmp_path: Path) -> None:
    root = tmp_path / "ws"
    notes(root)
    write(root, "memory/2026-03-08/worse.md", "# Worse\n\nzyx again, and more\n")
    with Refusing("zyx") as fake:
        d = daemon_factory(config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["state"] == "waiting"
                   and st["parked"] == 2, "both refused chunks parked", deadline_s=30)
        assert len({r["h"] for r in parked_records(root)}) == 2
        (root / "memory/2026-03-09/bad.md").unlink()
        d.call("index.sync", {"agent_id": "w"})
        # Resting again (one chunk still parked), the deleted note's text is dropped.
        st = wait_value(lambda: vectors_status(d), lambda st: st["state"] == "waiting"
                        and st["total"] == 8 and st["parked"] == 1, "bad.md gone")
        assert st["parked_paths"] == ["memory/2026-03-08/worse.md:1-3"]
        wait_value(lambda: parked_records(root), lambda recs: len({r["h"] for r in recs}) == 1,
                   "the deleted note's text dropped from the log", deadline_s=30)
        assert d.stop() == 0
        d = daemon_factory(config(root, fake), RECALLD_DATA_DIR=str(d.data_dir))
        d.call("index.sync", {"agent_id": "w"})
        parked_waiting(d)
        assert "1 text(s) stay parked from before the restart" in d.log()
        assert d.stop() == 0
