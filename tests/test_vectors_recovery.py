"""What the vector status says while the provider fails and once it answers again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply
from test_cli import recalld
from test_vectors_daemon import fake_config, vectors_status, wait_covered, write
from waits import wait_value


def test_an_error_the_provider_recovered_from_is_past(daemon_factory: Any,
                                                      tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\nandesite\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(fake_config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        # A round whose every attempt is rate-limited (the retry loop gives up), then
        # the provider answers again.
        fake.script(*[Reply(status=429, headers={"Retry-After": "0"})] * 5)
        write(root, "memory/2026-05-02/m.md", "# M\n\ndacite\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda st: st["state"] == "backoff",
                        "the rate-limited round")
        assert "HTTP 429" in st["last_error"] and st["health"] == "fail"
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["total"] == 2 and st["coverage"] >= 1.0, "both vectors")
        assert st["health"] == "ok" and st["last_error"] is None, st
        # The provider's own record keeps it, with its time: before the answer since.
        provider = st["provider"]
        assert "HTTP 429" in provider["last_error"]
        assert provider["last_error_at"] <= provider["last_ok"]
        out = recalld("status", env=d.env).stdout
        assert "429" not in out, out
        assert d.stop() == 0
