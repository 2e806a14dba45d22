"""A daemon whose embedding provider asks it to wait (Retry-After) in the middle of a
backfill call: searches keep off the provider meanwhile, and the status stays true."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply
from test_reload_workspaces import _reload
from test_vectors_daemon import (
    covered_daemon,
    fake_config,
    vectors_status,
    wait_covered,
    write,
)
from waits import wait_value


def retry_after_waited(d: Any, fake: FakeProvider, root: Path, text: str) -> dict[str, Any]:
    """Workspace w's status once the backfill's call for a new note holding ``text``
    (written in ``root``) waits out the provider's Retry-After of 40 s, its first answer."""
    fake.script(Reply(status=429, headers={"Retry-After": "40"}))
    write(root, "memory/2026-07-24/dentist.md", text)
    d.call("index.sync", {"agent_id": "w"})
    return wait_value(lambda: vectors_status(d),
                      lambda st: st["state"] == "backoff" and (st["wait_s"] or 0) > 1,
                      "the backfill call waiting out the Retry-After")


def test_a_search_keeps_off_a_provider_a_backfill_call_waits_for(daemon_factory: Any,
                                                                  tmp_path: Path) -> None:
    # The backfill's call for a new note is answered 429 with Retry-After: 40 s and waits
    # that out before its next try. A search meanwhile sends no query to the provider
    # (it would only be asked to wait again): keyword results at once, saying why.
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\n\nThe 7:40 train to Zurich.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        st = retry_after_waited(d, fake, root, "# Dentist\n\nThe dentist on Friday.\n")
        assert "HTTP 429" in st["last_error"], st
        sent = len(fake.requests)
        for query in ("dentist appointment", "a train to Zurich", "Friday"):
            res = d.call("memory.search", {"agent_id": "w", "query": query})
            assert res["mode"] == "keyword" and res["results"], res
            assert "Retry-After" in res["vector_error"], res["vector_error"]
            assert "HTTP 429" in res["vector_error"], res["vector_error"]
        assert len(fake.requests) == sent
        assert d.stop() == 0


def test_a_workspace_of_the_same_space_waits_out_the_retry_after_too(
        daemon_factory: Any, tmp_path: Path) -> None:
    # Workspaces w and v embed in one vector space. While w's backfill call waits out the
    # provider's Retry-After, v's backfill waits too (its status says so) rather than
    # send its new note to be refused the same way.
    roots = {agent: tmp_path / agent for agent in "wv"}
    write(roots["w"], "memory/2026-07-23/commute.md", "# Commute\n\nThe train to Zurich.\n")
    write(roots["v"], "memory/2026-07-23/bus.md", "# Bus\n\nThe bus to Bern.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        config = fake_config(roots["w"], fake) + fake_config(roots["v"], fake).replace(
            "[workspaces.w]", "[workspaces.v]").replace(
            "[daemon]\npersist_delay_s = 0.05\n", "")
        d = daemon_factory(config)
        for agent in "wv":
            d.call("index.sync", {"agent_id": agent})
        wait_covered(d)
        wait_value(lambda: vectors_status(d, "v"), lambda st: st["coverage"] >= 1.0,
                   "v's vectors")
        retry_after_waited(d, fake, roots["w"], "# Dentist\n\nOn Friday.\n")
        write(roots["v"], "memory/2026-07-24/plumber.md", "# Plumber\n\nPLUMBER-MONDAY.\n")
        d.call("index.sync", {"agent_id": "v"})
        st = wait_value(lambda: vectors_status(d, "v"),
                        lambda st: st["state"] == "backoff" and (st["wait_s"] or 0) > 1,
                        "v's backfill waiting for the same Retry-After")
        assert "Retry-After" in st["last_error"] and st["pending"] == 1, st
        assert not any("PLUMBER-MONDAY" in t for r in fake.requests for t in r.json["input"])
        assert d.stop() == 0


def test_the_counts_follow_the_notes_while_a_call_waits_out_a_retry_after(
        daemon_factory: Any, tmp_path: Path) -> None:
    # While the backfill's call waits out a Retry-After of 40 s, a note is written and
    # the one note with a vector deleted: the status counts them at once, not after the
    # call ends.
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\n\nThe train to Zurich.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        st = retry_after_waited(d, fake, root, "# Dentist\n\nOn Friday.\n")
        assert (st["embedded"], st["total"]) == (1, 2), st
        write(root, "memory/2026-07-25/plumber.md", "# Plumber\n\nOn Monday.\n")
        (root / "memory/2026-07-23/commute.md").unlink()
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d),
                        lambda st: (st["embedded"], st["total"]) == (0, 2),
                        "the counts of the notes on disk")
        assert st["state"] == "backoff" and st["pending"] == 2 and st["coverage"] == 0.0, st
        assert d.stop() == 0


def test_a_failed_round_s_error_goes_once_its_note_is_deleted(daemon_factory: Any,
                                                              tmp_path: Path) -> None:
    # The provider fails (500) every call holding one new note's text; the note is
    # deleted while the backfill waits to try again. Once a search's query is embedded
    # (the provider answers again), no error holds: neither the backfill's nor the
    # breaker's (the provider's own last_error keeps it, with its time).
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\n\nThe train to Zurich.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        # Retry-After: 0 has the call's own retries go at once, not over seconds of
        # backoff; the round still fails, and the breaker its failures opened holds the
        # backfill's next round as before.
        fake.reply_for = lambda body: Reply(status=500, headers={"Retry-After": "0"}) if any(
            "DOOMED" in t for t in body["input"]) else None
        write(root, "memory/2026-07-24/doomed.md", "# Doomed\n\nDOOMED note.\n")
        d.call("index.sync", {"agent_id": "w"})
        st = wait_value(lambda: vectors_status(d),
                        lambda st: st["provider"]["breaker"]["last_error"] is not None
                        and st["state"] == "backoff", "a failed call of the new note")
        (root / "memory/2026-07-24/doomed.md").unlink()
        d.call("index.sync", {"agent_id": "w"})
        wait_value(lambda: vectors_status(d),
                   lambda st: st["state"] == "idle" and st["total"] == 1, "the backfill idle")
        res = d.call("memory.search", {"agent_id": "w", "query": "a train to Zurich"})
        assert res["mode"] == "hybrid", res
        st = vectors_status(d)
        assert st["health"] == "ok" and st["coverage"] == 1.0, st
        assert st["last_error"] is None, st
        assert st["provider"]["breaker"]["last_error"] is None, st["provider"]
        assert "HTTP 500" in st["provider"]["last_error"], st["provider"]
        assert d.stop() == 0


def test_a_stricter_workspace_joining_the_space_gets_vectors_of_its_own_cut(
        daemon_factory: Any, tmp_path: Path) -> None:
    # w embeds a note whole (the default input budget); v, joining the same vector space
    # at a reload with a budget of 16 tokens, holds the same note. The cached vector is
    # of the whole text: v's is made of the text cut as its budget cuts it.
    text = "# Long\n\n" + "The fox jumps over the dog by the river bank. " * 4 + "\n"
    roots = {agent: tmp_path / agent for agent in "wv"}
    for root in roots.values():
        write(root, "memory/2026-07-23/fox.md", text)
    with FakeProvider(dims=8, api_key="k") as fake:
        config = fake_config(roots["w"], fake)
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        sent = len(fake.requests)
        _reload(d, config + fake_config(roots["v"], fake).replace(
            "[workspaces.w]", "[workspaces.v]").replace(
            "dimensions = 8}", "dimensions = 8, max_input_length = 16}").replace(
            "[daemon]\npersist_delay_s = 0.05\n", ""))
        d.call("index.sync", {"agent_id": "v"})
        st = wait_value(lambda: vectors_status(d, "v"),
                        lambda st: st["coverage"] == 1.0 and st["total"] == 1, "v's vector")
        assert st["provider"]["max_input_length"] == 16
        inputs = [t for r in fake.requests[sent:] for t in r.json["input"] if t != "ping"]
        assert len(inputs) == 1 and text.startswith(inputs[0]) and len(inputs[0]) < 60, inputs
        assert st["provider_texts"] == 1 and st["cache_texts"] == 0, st
        assert d.stop() == 0
