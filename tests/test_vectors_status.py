"""The coverage a workspace's status shows is the index's own, also while the backfill
waits on a provider that is down (at the health check or backing off)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply
from test_cli import recalld
from test_vectors_daemon import (
    covered_daemon,
    fake_config,
    vectors_status,
    wait_covered,
    write,
)
from waits import wait_value


def coverage(d: Any) -> tuple[int, int, int]:
    st = vectors_status(d)
    return st["embedded"], st["total"], st["pending"]


def test_stored_vectors_count_while_the_health_check_fails(daemon_factory: Any,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(3):
        write(root, f"memory/2026-05-0{i + 1}/n{i}.md", f"# N{i}\n\nquartz {i}\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        config = fake_config(root, fake)
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        assert d.stop() == 0
        fake.script(*[Reply(status=503)] * 200)
        d = daemon_factory(config, RECALLD_DATA_DIR=str(d.data_dir))
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["health"] == "fail", "failing")
        wait_value(lambda: coverage(d), lambda c: c == (3, 3, 0), "the stored vectors",
                   deadline_s=20)
        # Notes come and go meanwhile: the counts say so.
        write(root, "memory/2026-05-08/late.md", "# Late\n\nwritten during the outage\n")
        (root / "memory/2026-05-01/n0.md").unlink()
        assert d.call("index.sync", {"agent_id": "w"})["chunks"] == 3
        wait_value(lambda: coverage(d), lambda c: c == (2, 3, 1), "the new note pending",
                   deadline_s=20)
        assert vectors_status(d)["state"] == "health_check"
        assert d.stop() == 0


def test_a_workspace_opened_with_a_new_key_sends_it(daemon_factory: Any,
                                                    tmp_path: Path) -> None:
    # A rotated key: the workspace is opened again with the new one, which must be what
    # the provider gets from then on (not the old key, until a restart).
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\nbasalt\n")
    with FakeProvider(dims=8, api_key="sk-rotated-0002") as fake:
        def config(key: str) -> dict[str, Any]:
            return {"embedding_model_config": {
                "backend": "openai", "base_url": f"{fake.url}/v1", "api_key": key,
                "model_name": "m", "dimensions": 8}}

        d = daemon_factory()
        d.call("workspace.open", {"agent_id": "w", "path": str(root),
                                  "config": config("sk-revoked-0001")})
        st = wait_value(lambda: vectors_status(d), lambda st: st["health"] == "fail",
                        "the refused key")
        assert "401" in st["last_error"] and "sk-revoked" not in str(st)
        d.call("workspace.close", {"agent_id": "w"})
        d.call("workspace.open", {"agent_id": "w", "path": str(root),
                                  "config": config("sk-rotated-0002")})
        st = wait_covered(d)
        assert st["health"] == "ok"
        assert fake.requests[-1].headers["authorization"] == "Bearer sk-rotated-0002"
        assert d.stop() == 0


def test_a_provider_failing_searches_shows_in_status(daemon_factory: Any,
                                                     tmp_path: Path) -> None:
    # Every vector is in, so only searches call the provider: their failures are what
    # tells that it fails now (a key revoked since the health check passed).
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\ngranite\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(fake_config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        assert wait_covered(d)["health"] == "ok"
        fake.script(Reply(status=401))
        res = d.call("memory.search", {"agent_id": "w", "query": "granite"})
        assert res["mode"] == "keyword" and "401" in res["vector_error"]
        st = vectors_status(d)
        assert st["health"] == "fail" and "401" in st["last_error"]
        out = recalld("status", env=d.env).stdout
        assert "embedding provider failing" in out and "401" in out, out
        # A revoked key does not come back by itself: the fix says how a new one applies.
        assert ("a fixed embedding_model_config applies when the workspace opens again: "
                "recalld workspace close w; recalld workspace open w") in out, out
        # The provider answers again: so does the status.
        assert d.call("memory.search", {"agent_id": "w", "query": "granite"})["mode"] == "hybrid"
        assert vectors_status(d)["health"] == "ok"
        assert d.stop() == 0


def test_a_provider_echoing_the_key_never_shows_it(daemon_factory: Any,
                                                   tmp_path: Path) -> None:
    # Some providers and proxies quote the key they refused in the error body; a key
    # that looks like no known key format must still be masked wherever the error goes:
    # the search answer, the status and the log.
    key = "team7-embedding-access-2231"
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\nobsidian\n")
    echo = Reply(status=401, raw=f'{{"error": "API key provided: {key} is revoked"}}'.encode())
    with FakeProvider(dims=8, api_key=key) as fake:
        d = daemon_factory(fake_config(root, fake).replace('api_key = "k"', f'api_key = "{key}"'))
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        fake.script(echo)
        res = d.call("memory.search", {"agent_id": "w", "query": "obsidian"})
        assert res["mode"] == "keyword" and "401" in res["vector_error"]
        # A new note's vector is refused the same way by the backfill.
        fake.script(*[echo] * 20)
        write(root, "memory/2026-05-02/m.md", "# M\n\nbasalt\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda st: st["state"] == "backoff",
                        "the refused round")
        assert "401" in st["last_error"]
        out = recalld("status", "--verbose", env=d.env).stdout
        # Each vector space has its line of internals (it was a blank "vector_spaces:").
        assert "  vector_spaces " in out and "cache.entries=" in out, out
        assert d.stop() == 0
        for where, text in (("search", str(res)), ("status", str(st)), ("cli", out),
                            ("log", d.log())):
            assert key not in text, where


def test_a_query_refused_for_now_says_why_at_once(daemon_factory: Any,
                                                  tmp_path: Path) -> None:
    # A provider that asks to wait longer than a search may (Retry-After past the query's
    # deadline), or keeps failing until then: the search answers keyword-only at once or
    # at the deadline, with the provider's own error, not a bare "took too long".
    root, other = tmp_path / "ws", tmp_path / "other"
    write(root, "memory/2026-05-01/n.md", "# N\n\ngneiss\n")
    write(other, "memory/2026-05-01/n.md", "# N\n\nschist\n")
    with FakeProvider(dims=8, api_key="k") as fake, FakeProvider(dims=8) as fake2:
        # Another provider (so another vector space) for workspace w2.
        config = fake_config(root, fake) + fake_config(other, fake2).split("[daemon]")[0] \
            .replace("[workspaces.w]", "[workspaces.w2]")
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        fake.script(Reply(status=429, headers={"Retry-After": "100"}))
        started = time.monotonic()
        res = d.call("memory.search", {"agent_id": "w", "query": "gneiss"})
        assert time.monotonic() - started < 2.0
        assert res["mode"] == "keyword" and "HTTP 429" in res["vector_error"], res
        assert "HTTP 429" in vectors_status(d)["last_error"]
        # While that Retry-After runs, searches do not ask again: keyword-only at once,
        # saying why.
        sent = len(fake.requests)
        for query in ("gneiss rock", "gneiss and marble", "metamorphic"):
            res = d.call("memory.search", {"agent_id": "w", "query": query})
            assert res["mode"] == "keyword", res
            assert "Retry-After" in res["vector_error"] and "HTTP 429" in res["vector_error"]
        assert len(fake.requests) == sent
        d.call("index.sync", {"agent_id": "w2"})
        wait_value(lambda: d.call("memory.search", {"agent_id": "w2", "query": "schist"}),
                   lambda res: res["mode"] == "hybrid", "w2's vectors")
        fake2.script(*[Reply(status=502, raw=b"<html>Bad Gateway</html>")] * 20)
        res = d.call("memory.search", {"agent_id": "w2", "query": "schist rock"})
        assert res["mode"] == "keyword" and "HTTP 502" in res["vector_error"], res
        assert d.stop() == 0


def test_a_model_change_the_old_vectors_cannot_serve_says_so(daemon_factory: Any,
                                                             tmp_path: Path) -> None:
    # From an OpenAI model to an Ollama one, with the OpenAI key gone from the config: the
    # old vectors cannot embed a query, so searches are keyword-only until the new model's
    # vectors are complete, and the status and log must not claim the old ones serve.
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\nrhyolite\n")
    with FakeProvider(dims=8) as fake:
        d = covered_daemon(daemon_factory, root, fake)
        assert d.stop() == 0
        gate = fake.gate(lambda body: body.get("input") != ["ping"])
        ollama = (f'[workspaces.w]\npath = "{root}"\nembedding_model_config = '
                  f'{{backend = "ollama", base_url = "{fake.url}", model_name = "m", '
                  'dimensions = 8}\n')
        d = daemon_factory(ollama, RECALLD_DATA_DIR=str(d.data_dir), OPENAI_API_KEY="")
        gate.entered.wait(30)
        st = vectors_status(d)
        assert st["migrating"] and st["serving_space"] is None, st
        res = d.call("memory.search", {"agent_id": "w", "query": "rhyolite"})
        assert res["mode"] == "keyword"
        out = recalld("status", env=d.env).stdout
        gate.open()
        assert d.stop() == 0
        assert "vectors serve searches meanwhile" not in out, out
        assert "keyword-only" in out, out
        assert "the old vectors serve" not in d.log()
