"""A provider that refuses some inputs (HTTP 400 for a text it will not embed, or for a
batch too big as a whole): only the chunks of the refused texts wait, the others get
their vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply
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
        assert "HTTP 400" in st["last_error"]
        res = d.call("memory.search", {"agent_id": "w", "query": "tides"})
        assert res["mode"] == "hybrid" and res["vector_hits"] == 7
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
