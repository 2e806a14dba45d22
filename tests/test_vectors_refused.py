"""A provider that refuses some inputs (HTTP 400 for a text it will not embed, or for a
batch too big as a whole): only the chunks of the refused texts wait, the others get
their vectors."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply
from test_cli import recalld
from test_vectors_daemon import vectors_status, write
from waits import wait_value


class Refusing(FakeProvider):
    """Answers 400 to a batch holding a text with ``word``, or of more than ``most`` texts."""

    def __init__(self, word: str, most: int = 100) -> None:
        super().__init__(dims=8)
        self.word, self.most = word, most

    def _answer(self, path: str, req: Any, reply: Reply) -> Any:
        texts = req.get("input") or []
        if len(texts) > self.most or any(self.word in t for t in texts):
            raise ValueError("input refused")
        return super()._answer(path, req, reply)


def config(root: Path, fake: FakeProvider) -> str:
    return (f'[workspaces.w]\npath = "{root}"\n'
            f'embedding_model_config = {{backend = "openai", base_url = "{fake.url}/v1", '
            'api_key = "k", model_name = "m", dimensions = 8, max_batch_size = 3}\n')


def notes(root: Path) -> None:
    # The refused note is the shortest: its batch is the round's first.
    write(root, "memory/2026-03-09/bad.md", "# Bad\n\nzyx\n")
    for i in range(7):
        write(root, f"memory/2026-03-0{i + 1}/n{i}.md",
              f"# Note {i}\n\nan ordinary note, number {i}, about tides\n")


def test_a_refused_text_parks_only_its_own_chunk(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    notes(root)
    with Refusing("zyx") as fake:
        d = daemon_factory(config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["state"] == "waiting" and st["embedded"] == 7,
                        "every other chunk embedded", deadline_s=30)
        assert (st["total"], st["pending"], st["parked"]) == (8, 1, 1)
        assert st["parked_paths"] == ["memory/2026-03-09/bad.md:1-3"]
        assert "HTTP 400" in st["last_error"]
        # The parked chunk waits an hour, whatever the rate: no time to full coverage.
        assert st["eta_s"] is None, st
        res = d.call("memory.search", {"agent_id": "w", "query": "tides"})
        assert res["mode"] == "hybrid" and res["vector_hits"] == 7
        # Later a round goes well and a query is rate-limited: the chunk is still parked
        # for the provider's refusal, not for the later error.
        write(root, "memory/2026-03-10/later.md", "# Later\n\nanother note about tides\n")
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["embedded"] == 8,
                   "the later note embedded", deadline_s=30)
        fake.script(Reply(status=429, headers={"Retry-After": "30"}))
        res = d.call("memory.search", {"agent_id": "w", "query": "tides and moons"})
        assert "HTTP 429" in res["vector_error"]
        st = vectors_status(d)
        assert st["parked"] == 1 and "HTTP 429" in st["last_error"]
        assert "HTTP 400" in st["parked_error"] and "input refused" in st["parked_error"]
        # The parked chunk does not leave the workspace pending (it catches up only when
        # the provider takes its text): the JSON says clean, as the CLI does.
        ws = wait_value(
            lambda: next(w for w in d.call("daemon.status")["workspaces"]
                         if w["agent_id"] == "w"),
            lambda ws: ws["health"]["state"] == "clean", "the workspace clean", deadline_s=5)
        assert not any(r.startswith("vectors") for r in ws["health"]["reasons"])
        health = ws["health"]["vectors"]
        assert (health["parked"], health["parked_error"]) == (1, st["parked_error"])
        out = recalld("status", env=d.env).stdout
        assert ("1 chunk(s) parked after errors on their texts (memory/2026-03-09/bad.md:1-3):"
                " embedding openai m: HTTP 400" in out), out
        assert "catches up by itself" not in out and "index:   clean" in out
        assert d.stop() == 0


def test_a_batch_refused_as_a_whole_is_sent_text_by_text(daemon_factory: Any,
                                                         tmp_path: Path) -> None:
    root = tmp_path / "ws"
    notes(root)
    with Refusing("no such word", most=1) as fake:
        d = daemon_factory(config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["state"] == "idle" and st["coverage"] >= 1.0,
                        "every chunk embedded", deadline_s=30)
        assert (st["embedded"], st["parked"]) == (8, 0)
        assert d.stop() == 0


def with_new_model(daemon_factory: Any, root: Path, old: FakeProvider,
                   new: FakeProvider) -> Any:
    """A daemon serving ``root`` with model m2 from ``new``, its state holding every
    chunk's vector of model m from ``old``."""
    notes(root)
    d = daemon_factory(config(root, old))
    d.call("index.sync", {"agent_id": "w"})
    wait_value(lambda: vectors_status(d), lambda st: st["coverage"] >= 1.0
               and st["total"] == 8, "the old model's vectors")
    assert d.stop() == 0
    d = daemon_factory(config(root, new).replace('"m"', '"m2"'),
                       RECALLD_DATA_DIR=str(d.data_dir))
    d.call("index.sync", {"agent_id": "w"})
    return d


def test_a_model_change_finishes_though_the_new_model_refuses_a_text(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Every chunk has its vector from the old model; the new one refuses one text. The
    # change must still finish (that chunk waits in the new space), or the old space would
    # serve for good and no note written since would ever be found by vector.
    root = tmp_path / "ws"
    with FakeProvider(dims=8) as old, Refusing("zyx") as new:
        d = with_new_model(daemon_factory, root, old, new)
        st = wait_value(lambda: vectors_status(d),
                        lambda st: not st["migrating"] and st["state"] == "waiting",
                        "the change finished", deadline_s=30)
        assert st["serving_space"] == st["space"] and "m2" in st["space"]
        assert (st["embedded"], st["total"], st["parked"]) == (7, 8, 1), st
        write(root, "memory/2026-03-10/late.md", "# Late\n\nwritten after the change, tides\n")
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["embedded"] == 8, "the new note")
        res = d.call("memory.search", {"agent_id": "w", "query": "written after the change"})
        assert res["mode"] == "hybrid"
        assert any(r["path"] == "memory/2026-03-10/late.md" and r["vector"] is not None
                   for r in res["results"]), res["results"]
        assert d.stop() == 0


def test_a_new_model_that_refuses_everything_leaves_the_old_one_serving(
        daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    # Every chunk holds its heading: the new model refuses every text.
    with FakeProvider(dims=8) as old, Refusing("#") as new:
        d = with_new_model(daemon_factory, root, old, new)
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["state"] == "waiting" and st["parked"] == 8,
                        "every chunk parked", deadline_s=30)
        assert st["migrating"] and st["serving_space"] != st["space"], st
        # A provider that refuses every text is failing, though the ping went through.
        assert st["health"] == "fail" and "HTTP 400" in st["last_error"], st
        res = d.call("memory.search", {"agent_id": "w", "query": "tides"})
        assert res["mode"] == "hybrid" and res["vector_hits"] == 8  # the old space, all
        assert d.stop() == 0


def test_chunks_behind_a_failing_provider_say_what_brings_their_vectors(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Vectors of the wrong size (no wait changes that), then an outage (the backfill
    # resumes by itself): the chunks waiting behind each are not said to catch up alike.
    for name, reply, for_good in (("dims", Reply(dims=16), True),
                                  ("outage", Reply(status=503), False)):
        root = tmp_path / name
        notes(root)
        with FakeProvider(dims=8) as fake:
            fake.reply_for = lambda _body, r=reply: r
            d = daemon_factory(config(root, fake))
            d.call("index.sync", {"agent_id": "w"})
            st = wait_value(partial(vectors_status, d), lambda st: st["health"] == "fail"
                            and st["counted"] and st["pending"] == 8, "the provider failing")
            assert st["provider"]["fails_for_good"] is for_good, st
            res = d.call("memory.search", {"agent_id": "w", "query": "tides"})
            assert res["results"] and res["vector_hits"] == 0
            out = recalld("status", env=d.env).stdout
            assert "pending: vectors: 0 of 8 chunks embedded" in out, out
            assert "catches up by itself" not in out, out
            if for_good:
                assert "no wait brings their vectors" in out and "resumes by itself" not in out
                assert "stopped: the provider fails for good" in out
            else:
                assert "resumes by itself once the embedding provider answers" in out
                assert "no wait" not in out and "waiting for the provider" in out
            assert d.stop() == 0
