"""What the vector status says while the provider fails and once it answers again."""

from __future__ import annotations

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


def test_an_error_the_provider_recovered_from_is_past(daemon_factory: Any,
                                                      tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\nandesite\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
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
        d = covered_daemon(daemon_factory, root, fake)
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


def test_an_answer_that_cannot_be_read_does_not_park_the_text(daemon_factory: Any,
                                                             tmp_path: Path) -> None:
    # Answers broken in transit or by the provider (not JSON, another count of vectors)
    # for a round of one text: the fault is the answer's, not the text's, so the text is
    # sent again rather than parked for an hour.
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\ntuff\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        for n, broken in enumerate((Reply(raw=b'{"data": [{"embedding": [0.1,'),
                                    Reply(missing=1)), start=2):
            fake.script(broken)
            write(root, f"memory/2026-05-0{n}/m.md", f"# M{n}\n\nignimbrite {n}\n")
            d.call("index.sync", {"agent_id": "w"})
            st = wait_value(lambda: vectors_status(d), lambda st, n=n: st["parked"] or (
                st["total"] == n and st["coverage"] >= 1.0), "the text embedded or parked")
            assert st["parked"] == 0 and st["embedded"] == n, st
        assert d.stop() == 0


def test_a_text_whose_answers_keep_breaking_is_parked_alone(daemon_factory: Any,
                                                            tmp_path: Path) -> None:
    # The provider's answer breaks for one text every time while it embeds the others:
    # that shows the fault is the text's, and only its chunk waits.
    root = tmp_path / "ws"
    for i in range(3):
        write(root, f"memory/2026-05-0{i + 1}/n.md", f"# N{i}\n\nperlite {i}\n")
    write(root, "memory/2026-05-04/odd.md", "# Odd\n\nvitrophyre\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        fake.reply_for = lambda body: (Reply(raw=b"<html>upstream error</html>")
                                       if any("vitrophyre" in t for t in body["input"])
                                       else None)
        # Its three failed rounds (``isolate_after``) come one short backoff after another.
        d = daemon_factory(fake_config(root, fake) + "backfill_backoff_s = 0.05\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda st: st["parked"] == 1
                        and st["embedded"] == 3, "the odd text parked, the others embedded")
        assert st["parked_paths"][0].startswith("memory/2026-05-04/odd.md"), st
        assert "not valid JSON" in st["parked_error"] and "failed" in st["parked_error"]
        assert d.stop() == 0


def test_a_call_waiting_out_a_retry_after_says_so(daemon_factory: Any,
                                                  tmp_path: Path) -> None:
    # The provider asks the backfill's call to come back in 3 s: the call waits inside
    # its retry loop, and the status says it waits, why and for how long.
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\nbasanite\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        fake.script(Reply(status=429, headers={"Retry-After": "3"}))
        write(root, "memory/2026-05-02/m.md", "# M\n\nphonolite\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda st: st["state"] == "backoff" or (
            st["total"] == 2 and st["coverage"] >= 1.0), "the wait or the vector")
        assert st["state"] == "backoff" and 0 < st["wait_s"] <= 3, st
        assert "HTTP 429" in st["last_error"], st
        out = recalld("status", env=d.env).stdout
        assert "backoff (next try in " in out, out
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["total"] == 2 and st["coverage"] >= 1.0, "both vectors")
        assert st["wait_s"] is None and st["last_error"] is None and st["health"] == "ok", st
        assert d.stop() == 0


def test_a_health_check_waiting_out_a_retry_after_says_so(daemon_factory: Any,
                                                          tmp_path: Path) -> None:
    # The same wait inside the first ping's call: the status says it waits, not only
    # that a health check is under way.
    root = tmp_path / "ws"
    write(root, "memory/2026-05-01/n.md", "# N\n\ntephrite\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        fake.script(Reply(status=503, headers={"Retry-After": "3"}))
        d = daemon_factory(fake_config(root, fake))
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d), lambda st: st["wait_s"] is not None or (
            st["total"] and st["coverage"] >= 1.0), "the wait or the vector")
        assert st["state"] == "health_check" and 0 < st["wait_s"] <= 3, st
        assert "HTTP 503" in st["last_error"], st
        st = wait_covered(d)
        assert st["wait_s"] is None and st["last_error"] is None and st["health"] == "ok", st
        assert d.stop() == 0
