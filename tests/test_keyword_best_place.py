"""The keyword branch's best hit keeps a place among the first results of a hybrid search
(``search.keyword_best_within``, ``fusion.keep_within``), through a real daemon with the
fake embedding provider, and the list operation itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, fake_vector, unit
from test_vectors_daemon import vectors_status, write
from waits import wait_value

from recalld.daemon.config import SearchConfig
from recalld.daemon.index.fusion import Fused, keep_within

# The keyword branch's best note says "harbour ferry" twice; nine others say it once.
BEST = "memory/2026-07-20/best.md"
NOTES = {BEST: "# Note best\n\nThe harbour ferry, the harbour ferry again, left at dawn.\n"}
NOTES.update({f"memory/2026-07-2{i}/n{i}.md":
              f"# Note {i}\n\nThe harbour ferry left at dawn with crate {word}.\n"
              for i, word in enumerate(("apples", "bricks", "cables", "drums", "eggs",
                                        "fabric", "glass", "honey", "iron"), start=1)})


def _fused(keys: list[int]) -> list[Fused]:
    return [Fused(key=k, score=1.0 / (i + 1), keyword=None, vector=None, exact=False)
            for i, k in enumerate(keys)]


def test_keep_within_moves_one_candidate_up() -> None:
    fused = _fused([10, 11, 12, 13, 14, 15, 16])
    moved = keep_within(fused, 16, 5)
    assert [f.key for f in moved] == [10, 11, 12, 13, 16, 14, 15]
    # Already within the first five, missing, no key or 0: the list as it was.
    assert [f.key for f in keep_within(fused, 12, 5)] == [10, 11, 12, 13, 14, 15, 16]
    assert [f.key for f in keep_within(fused, 99, 5)] == [10, 11, 12, 13, 14, 15, 16]
    assert [f.key for f in keep_within(fused, None, 5)] == [10, 11, 12, 13, 14, 15, 16]
    assert [f.key for f in keep_within(fused, 16, 0)] == [10, 11, 12, 13, 14, 15, 16]
    assert [f.key for f in keep_within(fused, 15, 1)] == [15, 10, 11, 12, 13, 14, 16]
    assert SearchConfig().keyword_best_within == 5


def _query() -> str:
    """A query whose words every note holds (no exact hit) and whose fake vector puts the
    keyword branch's best note below the fifth place of the vector branch."""
    texts = {rel: text.rstrip("\n") for rel, text in NOTES.items()}
    for extra in range(200):
        query = "harbour ferry" + "?" * extra
        q = unit(fake_vector(query, 8))
        cos = {rel: float(q @ unit(fake_vector(t, 8))) for rel, t in texts.items()}
        order = sorted(cos, key=lambda rel: -cos[rel])
        if order.index(BEST) >= 6:
            return query
    raise AssertionError("no query variant puts the note low enough")


def _config(root: Path, fake: FakeProvider, within: int | None) -> str:
    # The keyword branch gets no weight in the fusion: the fused order is the vector
    # branch's, which puts the keyword branch's best hit low.
    search = "keyword_weight = 0.0, vector_weight = 1.0, length_penalty = 0.0"
    if within is not None:
        search += f", keyword_best_within = {within}"
    return (f'[workspaces.w]\npath = "{root}"\n'
            f'embedding_model_config = {{backend = "openai", base_url = "{fake.url}/v1", '
            f'api_key = "k", model_name = "m", dimensions = 8}}\n'
            f"search = {{{search}}}\n[daemon]\npersist_delay_s = 0.05\n")


def _wait_idle(d: Any) -> None:
    wait_value(lambda: vectors_status(d),
               lambda st: st["total"] and st["coverage"] >= 1.0 and st["state"] == "idle",
               "every chunk embedded and the backfill idle")


def test_keyword_best_hit_keeps_a_place_in_the_first_five(daemon_factory: Any,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for rel, text in NOTES.items():
        write(root, rel, text)
    query = _query()
    paths: dict[int | None, list[str]] = {}
    with FakeProvider(dims=8, api_key="k") as fake:
        for within in (0, None):
            d = daemon_factory(_config(root, fake, within))
            d.call("index.sync", {"agent_id": "w"})
            _wait_idle(d)
            res = d.call("memory.search", {"agent_id": "w", "query": query,
                                           "max_results": 10})
            assert res["mode"] == "hybrid" and res["keyword_hits"] == len(NOTES), res
            assert not any(r.get("exact") for r in res["results"])
            paths[within] = [r["path"] for r in res["results"]]
            # The note the keyword branch ranks first is the one that says it twice.
            best_kw = max(res["results"], key=lambda r: r["keyword"] or 0.0)
            assert best_kw["path"] == BEST, res["rendered"]
            assert d.stop() == 0
    off, on = paths[0], paths[None]
    # Without the rule the fused order is the vector branch's: the note is below place 6.
    assert off.index(BEST) >= 6, off
    # With the default it is fifth, and the others keep their order around it.
    assert on.index(BEST) == 4, on
    assert [p for p in on if p != BEST] == [p for p in off if p != BEST]
