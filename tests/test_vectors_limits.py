"""Workspaces of one vector space share its embedding client: the batch and input limits
it applies are the strictest of theirs, and the status says which apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider
from test_vectors_daemon import write
from waits import wait_value


def vectors_of(d: Any, agent: str) -> dict[str, Any]:
    ws = next(w for w in d.call("daemon.status")["workspaces"] if w["agent_id"] == agent)
    out: dict[str, Any] = ws["index"]["vectors"]
    return out


def covered(d: Any, agent: str) -> dict[str, Any]:
    return wait_value(lambda: vectors_of(d, agent),
                      lambda st: st["total"] and st["coverage"] >= 1.0, f"{agent} covered")


def test_a_workspace_with_stricter_limits_is_sent_within_them(daemon_factory: Any,
                                                              tmp_path: Path) -> None:
    loose, strict = tmp_path / "loose", tmp_path / "strict"
    for i in range(5):
        write(loose, f"memory/2026-03-0{i + 1}/l.md", f"# L{i}\n\nloose note {i}\n")
        write(strict, f"memory/2026-03-0{i + 1}/s.md",
              f"# S{i}\n\nstrict note {i} " + "long words " * 40 + "\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        def config(limits: str) -> dict[str, Any]:
            return {"embedding_model_config": {
                "backend": "openai", "base_url": f"{fake.url}/v1", "api_key": "k",
                "model_name": "m", "dimensions": 8, **limits}}

        d = daemon_factory()
        d.call("workspace.open", {"agent_id": "loose", "path": str(loose), "config": config({})})
        provider = covered(d, "loose")["provider"]
        assert (provider["max_batch_size"], provider["max_input_length"]) == (10, 8192)
        sent = len(fake.requests)
        # Same provider and model (one vector space), but this workspace says the
        # provider takes at most 2 texts a request and the model 50 tokens a text.
        d.call("workspace.open", {"agent_id": "strict", "path": str(strict), "config": config(
            {"max_batch_size": 2, "max_input_length": 50})})
        covered(d, "strict")
        inputs = [r.json["input"] for r in fake.requests[sent:]]
        assert inputs and max(len(i) for i in inputs) == 2, inputs
        # 50 tokens: at most 150 ASCII characters (a third of a token each).
        assert max(len(t) for i in inputs for t in i) <= 150, inputs
        for agent in ("loose", "strict"):
            provider = vectors_of(d, agent)["provider"]
            assert (provider["max_batch_size"], provider["max_input_length"]) == (2, 50)
        # Once it is closed, the limits of the workspace left apply again.
        d.call("workspace.close", {"agent_id": "strict"})
        provider = vectors_of(d, "loose")["provider"]
        assert (provider["max_batch_size"], provider["max_input_length"]) == (10, 8192)
        assert d.stop() == 0
