"""Workspaces of one vector space sending different API keys: each key is its own
workspaces' only; a key the provider refuses fails the workspaces that send it, not the
others (their vectors, searches and status stay as they were)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from test_vectors_daemon import vectors_status, write
from waits import wait_value


def test_a_refused_key_fails_only_the_workspace_sending_it(daemon_factory: Any,
                                                           tmp_path: Path) -> None:
    good, revoked = tmp_path / "good", tmp_path / "revoked"
    write(good, "memory/2026-05-01/n.md", "# Cliffs\n\nbasalt cliffs over the bay\n")
    write(revoked, "memory/2026-05-01/n.md", "# Tors\n\ngranite tors on the moor\n")
    with FakeProvider(dims=8, api_key="sk-good-0001") as fake:
        def config(key: str) -> dict[str, Any]:
            return {"embedding_model_config": {
                "backend": "openai", "base_url": f"{fake.url}/v1", "api_key": key,
                "model_name": "m", "dimensions": 8}}

        d = daemon_factory()
        d.call("workspace.open", {"agent_id": "good", "path": str(good),
                                  "config": config("sk-good-0001")})
        wait_value(lambda: vectors_status(d, "good"), lambda st: st["coverage"] >= 1.0,
                   "the good key's vectors")
        d.call("workspace.open", {"agent_id": "revoked", "path": str(revoked),
                                  "config": config("sk-revoked-0002")})
        st = wait_value(lambda: vectors_status(d, "revoked"),
                        lambda st: st["health"] == "fail", "the revoked key refused")
        assert "401" in st["last_error"] and "sk-revoked" not in str(st), st
        # The workspace sending the good key keeps embedding and searching by vector.
        write(good, "memory/2026-05-02/n.md", "# Shards\n\nobsidian shards by the shore\n")
        d.call("index.sync", {"agent_id": "good"})
        st = wait_value(lambda: vectors_status(d, "good"),
                        lambda st: st["total"] == 2 and st["coverage"] >= 1.0,
                        "the new note's vector")
        assert st["health"] == "ok" and st["last_error"] is None, st
        res = d.call("memory.search", {"agent_id": "good", "query": "obsidian shards"})
        assert res["mode"] == "hybrid" and res.get("vector_error") is None, res
        assert res["results"][0]["vector"] is not None, res["results"]
        # Each request went with the key of the workspace whose texts it carried.
        for req in fake.requests:
            texts = " ".join(req.json.get("input") or [])
            if "granite" in texts:
                assert req.headers["authorization"] == "Bearer sk-revoked-0002"
            elif "basalt" in texts or "obsidian" in texts:
                assert req.headers["authorization"] == "Bearer sk-good-0001"
        assert vectors_status(d, "revoked")["health"] == "fail"
        assert d.stop() == 0
