"""A search over several workspaces where only some have vectors: a keyword-only answer
scores in BM25 units, a hybrid one in fused units, so their hits are merged by rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from test_vectors_daemon import write
from waits import wait_value


def test_keyword_and_hybrid_workspaces_share_the_places(daemon_factory: Any,
                                                        tmp_path: Path) -> None:
    with_vectors, keyword_only = tmp_path / "v", tmp_path / "k"
    write(with_vectors, "memory/2026-04-01/bread.md",
          "# Bread\n\nSourdough bread with rye flour, bread every Sunday.\n")
    write(with_vectors, "memory/2026-04-02/mill.md", "# Mill\n\nThe mill grinds rye.\n")
    for i in range(30):
        # A rare word in a bigger workspace: high BM25 scores for modest matches.
        write(keyword_only, f"memory/2026-04-{i + 1:02d}/k{i}.md",
              f"# K{i}\n\nbought bread {i} and a kettle\n" if i < 3 else f"# K{i}\n\nrain {i}\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        config = (f'[workspaces.v]\npath = "{with_vectors}"\nshared_with = ["*"]\n'
                  'embedding_model_config = {backend = "openai", '
                  f'base_url = "{fake.url}/v1", api_key = "k", model_name = "m", '
                  'dimensions = 8}\n'
                  f'[workspaces.k]\npath = "{keyword_only}"\nshared_with = ["*"]\n')
        d = daemon_factory(config)
        for agent in ("v", "k"):
            d.call("index.sync", {"agent_id": agent})

        def coverage() -> float:
            ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == "v")
            return float(ws["index"]["vectors"]["coverage"])

        wait_value(coverage, lambda c: c >= 1.0, "the vectors of v")
        own = {agent: d.call("memory.search", {"agent_id": agent, "query": "bread"})
               for agent in ("v", "k")}
        assert own["v"]["mode"] == "hybrid" and own["k"]["mode"] == "keyword"
        # The keyword-only workspace's weakest match outscores v's best in raw numbers.
        assert own["k"]["results"][-1]["score"] > own["v"]["results"][0]["score"]
        for agents in (["k", "v"], ["v", "k"]):
            answer = d.call("memory.search", {"agent_id": "v", "query": "bread",
                                              "agents": agents, "max_results": 3})
            assert answer["mode"] == "mixed"
            got = [(r["agent_id"], r["path"]) for r in answer["results"]]
            # Each workspace's first hit, then the second ones: v's best is not pushed out.
            first = [(a, own[a]["results"][0]["path"]) for a in agents]
            assert got[:2] == first, got
            assert got[2] == (agents[0], own[agents[0]]["results"][1]["path"])
        assert d.stop() == 0


def test_workspaces_holding_the_same_notes_pay_for_them_once(daemon_factory: Any,
                                                            tmp_path: Path) -> None:
    # Two workspaces of one vector space with the same notes (a copied folder), filled at
    # the same time: the texts one is embedding are waited for by the other, which then
    # finds them in the space's cache, instead of being sent to the provider twice.
    roots = {"a": tmp_path / "a", "b": tmp_path / "b"}
    for root in roots.values():
        for i in range(24):
            write(root, f"memory/2026-05-{i + 1:02d}/n{i}.md", f"# N{i}\n\ncopied note {i}\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        gate = fake.gate(lambda body: "# N0\n\ncopied note 0" in body.get("input", []))
        config = "".join(f'[workspaces.{agent}]\npath = "{root}"\n'
                         'embedding_model_config = {backend = "openai", '
                         f'base_url = "{fake.url}/v1", api_key = "k", model_name = "m", '
                         'dimensions = 8, max_batch_size = 6}\n'
                         for agent, root in roots.items())
        try:
            d = daemon_factory(config)

            def vectors() -> list[dict[str, Any]]:
                return [w["index"]["vectors"] for w in d.call("daemon.status")["workspaces"]
                        if w["agent_id"] in roots]

            # Both are filling while the provider holds the first answer.
            assert gate.entered.wait(60), "no backfill request came"
            wait_value(vectors, lambda vs: [v["state"] for v in vs] == ["embedding"] * 2,
                       "both backfills under way")
            gate.open()
            done = wait_value(vectors, lambda vs: len(vs) == 2 and all(
                v["coverage"] >= 1.0 and v["total"] == 24 for v in vs), "both covered")
        finally:
            gate.open()
        sent = [t for r in fake.requests for t in r.json["input"] if t != "ping"]
        assert sorted(sent) == sorted(f"# N{i}\n\ncopied note {i}" for i in range(24))
        assert sorted((v["provider_texts"], v["cache_texts"]) for v in done) == [(0, 24),
                                                                                (24, 0)]
        res = d.call("memory.search", {"agent_id": "b", "query": "copied note 7"})
        assert res["mode"] == "hybrid" and res["vector_hits"]
        assert d.stop() == 0
