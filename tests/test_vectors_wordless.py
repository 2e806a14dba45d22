"""Chunks that show no word (only markup, rules, punctuation, symbols or invisible
characters) get no vector: their texts never go to the provider, they count in no
coverage, and the vector branch never returns them. Nor is a query of the kind embedded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.provider_server import FakeProvider
from test_vectors import NOTES, Harness, ask, full, passage_counts, wait_for
from test_vectors_daemon import fake_config, vectors_status, wait_covered, write
from waits import wait_value

from recalld.daemon.index import vector_fill
from recalld.daemon.memory.slugs import shows_no_word
from recalld.daemon.providers.bridge import ProviderBridge

WORDS = {
    "memory/2026-07-23/ramen.md": "# Ramen\n\nTonkotsu at the station, 7 pm.\n",
    "memory/2026-07-24/zh.md": "# 会议\n\n周三讨论预算。\n",
    "digest/work/ar.md": "# \u0645\u0644\u0627\u062d\u0638\u0629\n\n\u0661\u0662\u0663\n",
}
# Each note below is, or holds, a chunk without a letter or a digit.
WORDLESS = {
    "memory/2026-07-20/zw.md": "\u200b\u200b\n",
    "memory/2026-07-20/hash.md": "#\n",
    "memory/2026-07-20/rules.md": "---\n---\n",
    "memory/2026-07-21/marks.md": "***\n\n* * *\n\n___\n",
    "memory/2026-07-21/bidi.md": "\ufeff\u200e\u2063 \u3164\u2800\n",
    "memory/2026-07-21/tasks.md": "- [ ]\n- [x] \u2014 \u2026 !?\n",
    "memory/2026-07-22/table.md": "| | |\n|---|:---:|\n",
    "memory/2026-07-22/html.md": "<br/>\n<hr>\n&nbsp;&#8203;\n</div>\n",
    "memory/2026-07-22/cjk_punct.md": "\u3002\u3001\u300c\u300d\uff01\n",
    "memory/2026-07-22/sections.md": "# Trip\n\nTrain to Zurich.\n\n##\n\n---\n\n##\n",
}
QUERIES = ("weather tomorrow", "x", "#", "---", "- [ ]", "\u3002", "\U0001f680", "<br>",
           "ramen", "Zurich", "预算")



@pytest.mark.parametrize(("text", "none"), [
    ("#", True), ("---\n---", True), ("\u200b\u200b", True), ("- [x] \u2014 !?", True),
    ("<br/>\n&nbsp;&#x200b;</div>", True), ("\u3164\u2800\u0301", True), ("\U0001f680", True),
    ("\u3002\u300c\u300d", True), ("_", True), ("x", False), ("[x] buy milk", False),
    ("<b>bold</b>", False), ("&amp; co", False), ("\u4e2d", False), ("\u0663", False),
    ("\u2460", False), ("\u3164\ud55c", False), ("<div class=\"a\">", False),
    ("- [ ]\n" * 500 + "z", False)])
def test_what_shows_no_word(text: str, none: bool) -> None:
    assert shows_no_word(text) is none


def sent_texts(fake: FakeProvider) -> list[str]:
    """The texts sent to the provider, chunks' and queries' (not the health check's)."""
    return [text for text in passage_counts(fake) if text != "ping"]


def vector_hits(d: Any) -> list[dict[str, Any]]:
    """The results that the vector branch found, for each of ``QUERIES``."""
    out: list[dict[str, Any]] = []
    for query in QUERIES:
        res = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": 20})
        assert res["mode"] == ("keyword" if shows_no_word(query) else "hybrid"), res
        out += [hit for hit in res["results"] if hit["vector"] is not None]
    return out


def test_chunks_that_show_no_word_get_no_vector(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for rel, text in {**WORDS, **WORDLESS}.items():
        write(root, rel, text)
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(fake_config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        st = wait_covered(d)
        sent = sent_texts(fake)
        assert sent and not [t for t in sent if shows_no_word(t)], sent
        # Every chunk that needs a vector has one: 3 notes and the trip's first chunk.
        assert (st["total"], st["embedded"], st["pending"]) == (4, 4, 0), sent
        assert st["coverage"] == 1.0 and st["eta_s"] == 0.0, st
        hits = vector_hits(d)
        assert hits and not [hit for hit in hits if shows_no_word(hit["text"])], hits
        # A note edited to show no word leaves the vector branch and the count.
        write(root, "memory/2026-07-23/ramen.md", "#\n\n---\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda s: s["total"] == 3, "3 chunks")
        assert st["coverage"] == 1.0, st
        hits = vector_hits(d)
        assert hits and not [hit for hit in hits if shows_no_word(hit["text"])], hits
        assert not [t for t in sent_texts(fake) if shows_no_word(t)]
        assert d.stop() == 0
        # After a restart: nothing is sent again and the coverage holds.
        before = len(fake.requests)
        d = daemon_factory(fake_config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        st = wait_covered(d)
        assert (st["total"], st["embedded"]) == (3, 3), st
        assert not [t for t in sent_texts(fake) if shows_no_word(t)]
        assert set(passage_counts(fake, before)) <= {"ping"}, passage_counts(fake, before)
        assert d.stop() == 0


def test_chunks_that_show_no_word_are_no_keyword_hits(daemon_factory: Any,
                                                      tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-21/tasks.md", "- [ ]\n- [x] \u2014 !?\n")
    write(root, "memory/2026-07-22/html.md", "<br/>\n<hr>\n&nbsp;&#8203;\n</div>\n")
    # A section's last chunk of a rule and a break: its heading is its first chunk's.
    write(root, "memory/2026-07-22/long.md",
          "# Budget\n\n" + ("money " * 333 + "\n\n") * 2 + "---\n\n***\n")
    write(root, "digest/work/ok.md", "# Layout\n\nUse <br> and &nbsp; sparingly; [x] done.\n")
    write(root, "memory/2026-07-23/cake.md",
          "# Birthday\n\n" + "cake " * 450 + "\n\n\U0001f382\U0001f389 \u2014 \U0001f382\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')
    d.call("index.sync", {"agent_id": "w"})
    res = d.call("memory.search", {"agent_id": "w", "query": "money"})
    assert max(hit["end_line"] for hit in res["results"]) == 5, res  # lines 7-9 apart
    for query in ("x", "br", "hr", "div", "nbsp", "8203", "Budget", "<br>"):
        res = d.call("memory.search", {"agent_id": "w", "query": query})
        assert not [hit for hit in res["results"] if shows_no_word(hit["text"])], res
    # Markup words in a chunk that shows words are found as they were.
    for query in ("br", "nbsp", "Budget"):
        res = d.call("memory.search", {"agent_id": "w", "query": query})
        assert res["results"], (query, res)
    # A chunk of pictographs alone is found by them, not by its heading.
    for query in ("\U0001f382", "\U0001f389 party"):
        res = d.call("memory.search", {"agent_id": "w", "query": query})
        assert [hit["path"] for hit in res["results"]] == ["memory/2026-07-23/cake.md"], res
    res = d.call("memory.search", {"agent_id": "w", "query": "Birthday"})
    assert res["results"] and not [hit for hit in res["results"] if shows_no_word(hit["text"])]
    assert d.stop() == 0


async def test_a_model_change_completes_beside_chunks_that_show_no_word(
        tmp_path: Path, bridge: ProviderBridge) -> None:
    h = Harness(tmp_path, bridge)
    for rel, text in {**NOTES, **WORDLESS}.items():
        write(h.root, rel, text)
    with FakeProvider(dims=8) as old, FakeProvider(dims=8) as new:
        async with h.open(h.emb(old, "m1")) as (index, worker):
            await full(worker)
            await wait_for(lambda: index.status()["uncommitted_changes"] == 0
                           and index.last_commit is not None)
        h.spaces = h.new_spaces()
        async with h.open(h.emb(new, "m2")) as (index, worker):
            # The new space is swapped in once the chunks that need a vector have one.
            await wait_for(lambda: not worker.migrating and worker.state == "idle")
            st = worker.status()
            assert st["serving_space"] == st["space"] == index.state.vector_space, st
            assert (st["total"], st["embedded"], st["coverage"]) == (4, 4, 1.0), st
    for fake in (old, new):
        assert not [t for t in sent_texts(fake) if shows_no_word(t)], sent_texts(fake)


async def test_a_vector_stored_for_a_chunk_that_shows_no_word_is_dropped(
        tmp_path: Path, bridge: ProviderBridge, monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(tmp_path, bridge)
    for rel, text in {**NOTES, **WORDLESS}.items():
        write(h.root, rel, text)
    with FakeProvider(dims=8) as fake:
        # As a release that embedded every chunk left the workspace.
        with monkeypatch.context() as patch:
            patch.setattr(vector_fill, "shows_no_word", lambda _text: False)
            async with h.open(h.emb(fake)) as (index, worker):
                await full(worker)
                assert worker.total == 4 + len(WORDLESS) + 1  # the trip's 2 chunks
                await wait_for(lambda: index.status()["uncommitted_changes"] == 0
                               and index.last_commit is not None)
        before = len(fake.requests)
        async with h.open(h.emb(fake)) as (index, worker):
            await wait_for(lambda: worker.counted() and worker.state == "idle")
            assert (worker.total, worker.embedded) == (4, 4)
            chunks = index.state.chunks
            assert not [key for key in chunks if shows_no_word(chunks.text(key))
                        and chunks.embedding(key) is not None]
            for query in QUERIES:
                res = await ask(index, query, max_results=20)
                hits = [r for r in res["results"] if r["vector"] is not None]
                assert not [r for r in hits if shows_no_word(r["text"])], (query, hits)
        assert not [t for t in passage_counts(fake, before) if shows_no_word(t)]
