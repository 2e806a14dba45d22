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


def test_a_provider_failing_for_good_gets_pings_not_texts(daemon_factory: Any,
                                                          tmp_path: Path) -> None:
    # The key is revoked after the vectors were made: a round fails for good. The notes
    # written since are neither sent nor parked (the key, not they, is at fault): only
    # pings go out until the provider answers one well, then they are embedded.
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\npumice\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = daemon_factory(fake_config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        fake.reply_for = lambda _body: Reply(status=401)
        sent = len(fake.requests)
        write(root, "memory/2026-05-02/m.md", "# M\n\nobsidian\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda st: st["state"] in (
            "health_check", "waiting"), "the refused round over")
        assert st["state"] == "health_check" and st["parked"] == 0, st
        assert st["provider"]["fails_for_good"] and "HTTP 401" in st["last_error"]
        write(root, "memory/2026-05-03/l.md", "# L\n\nscoria\n")
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d), lambda st: st["pending"] == 2, "both pending")
        # Another ping is refused after the new note came: still no text goes out.
        pings = sum(r.json["input"] == ["ping"] for r in fake.requests[sent:])
        wait_value(lambda: sum(r.json["input"] == ["ping"] for r in fake.requests[sent:]),
                   lambda n: n > pings, "another ping")
        st = vectors_status(d)
        assert st["parked"] == 0 and st["state"] == "health_check", st
        texts = [r.json["input"] for r in fake.requests[sent:] if r.json["input"] != ["ping"]]
        assert texts == [["# M\n\nobsidian"]], texts
        fake.reply_for = None
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["total"] == 3 and st["coverage"] >= 1.0, "all embedded")
        assert st["parked"] == 0 and st["health"] == "ok"
        assert d.stop() == 0
