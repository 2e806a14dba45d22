"""Vectors through a real daemon: config, health check log, backfill, hybrid search, status."""

from __future__ import annotations

import base64
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fakes.provider_server import FakeProvider, Reply
from test_cli import recalld
from waits import wait_value

RENDER = re.compile(r"^========== memory/2026-07-23/commute\.md:\d+-\d+ \[score=\d\.\d{4} "
                    r"vector=-?\d\.\d{4} keyword=\d+\.\d{4}\] ==========\n")


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def vectors_status(d: Any, agent_id: str = "w") -> dict[str, Any]:
    status = d.call("daemon.status")
    ws = next(w for w in status["workspaces"] if w["agent_id"] == agent_id)
    out: dict[str, Any] = ws["index"]["vectors"]
    return out


def fake_config(root: Path, fake: FakeProvider) -> str:
    """A daemon config serving ``root`` as workspace ``w`` with vectors from ``fake``."""
    return (f'[workspaces.w]\npath = "{root}"\n'
            f'embedding_model_config = {{backend = "openai", base_url = "{fake.url}/v1", '
            f'api_key = "k", model_name = "m", dimensions = 8}}\n'
            '[daemon]\npersist_delay_s = 0.05\n')


def wait_covered(d: Any) -> dict[str, Any]:
    """The vectors status once every chunk (at least one) has its vector."""
    return wait_value(lambda: vectors_status(d),
                      lambda st: st["coverage"] >= 1.0 and st["total"] > 0, "every vector")


def covered_daemon(daemon_factory: Any, root: Path, fake: FakeProvider) -> Any:
    """A daemon serving ``root`` as workspace ``w`` with vectors from ``fake``, once every
    chunk of it has its vector."""
    d = daemon_factory(fake_config(root, fake))
    d.call("index.sync", {"agent_id": "w"})
    wait_covered(d)
    return d


def test_daemon_backfills_and_searches_hybrid(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md",
          "# Commute\n\nThe 7:40 train to Zurich failed with ECONNREFUSED.\n")
    write(root, "digest/personal/food.md", "# Food\n\nRamen and dumplings.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        config = fake_config(root, fake)
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        st = wait_covered(d)
        assert st["enabled"] and st["embedded"] == st["total"] == 2 and st["dims"] == 8
        assert st["health"] == "ok" and st["provider"]["breaker"]["state"] == "closed"
        assert "k" not in str(st["provider"].get("endpoint"))
        res = d.call("memory.search", {"agent_id": "w", "query": "ECONNREFUSED"})
        assert res["mode"] == "hybrid" and res["vector_hits"] == 2
        top = res["results"][0]
        assert top["path"] == "memory/2026-07-23/commute.md" and top["exact"] is True
        assert RENDER.match(res["rendered"]), res["rendered"]
        assert f"[EMBEDDING HEALTH CHECK] name=w workspace_dir={root} -> OK" in d.log()
        assert "vector_hits=2 keyword_hits=1" in d.log()
        assert d.stop() == 0
    # The daemon-wide cache of that space holds both texts.
    caches = list((d.data_dir / "state" / "embeddings").glob("openai-m-8-*.log"))
    assert len(caches) == 1 and len(caches[0].read_text().splitlines()) == 2


def test_hnswlib_is_loaded_only_for_a_workspace_with_vectors(daemon_factory: Any,
                                                             tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\n\nThe 7:40 train to Zurich.\n")
    d = daemon_factory(f'[workspaces.w]\npath = "{root}"\n')  # keyword search only
    d.call("index.sync", {"agent_id": "w"})
    assert d.call("memory.search", {"agent_id": "w", "query": "Zurich"})["results"]
    assert "hnswlib" not in Path(f"/proc/{d.pid}/maps").read_text()
    assert d.stop() == 0
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        res = d.call("memory.search", {"agent_id": "w", "query": "Zurich"})
        assert res["mode"] == "hybrid" and res["vector_hits"] == 1
        assert "hnswlib" in Path(f"/proc/{d.pid}/maps").read_text()  # on demand
        assert d.stop() == 0


def test_daemon_health_check_failure_is_visible(daemon_factory: Any, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/a.md", "# A\n\nnothing to see\n")
    config = (f'[workspaces.w]\npath = "{root}"\n'
              'embedding_model_config = {backend = "openai", '
              'base_url = "http://127.0.0.1:9/v1", api_key = "k", model_name = "m", '
              'dimensions = 8}\n')
    d = daemon_factory(config)
    d.call("index.sync", {"agent_id": "w"})
    st = wait_value(lambda: vectors_status(d), lambda st: st["health"] == "fail",
                    "the failed health check")
    assert st["enabled"] and st["coverage"] == 0.0 and st["last_error"]
    prefix = f"[EMBEDDING HEALTH CHECK] name=w workspace_dir={root} -> FAIL "
    assert re.search(re.escape(prefix) + r"\S", d.log())
    res = d.call("memory.search", {"agent_id": "w", "query": "nothing"})
    assert res["mode"] == "keyword" and res["results"]


def test_a_query_is_embedded_while_a_backfill_call_is_held(daemon_factory: Any,
                                                           tmp_path: Path) -> None:
    # The provider holds every backfill request of the second note until the test opens
    # the gate; a search meanwhile still embeds its query (hybrid, no vector_error).
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md",
          "# Commute\n\nThe 7:40 train to Zurich failed with ECONNREFUSED.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        gate = fake.gate(lambda body: any("HELD-BACKFILL" in t for t in body.get("input", [])))
        config = fake_config(root, fake)
        try:
            d = daemon_factory(config)
            d.call("index.sync", {"agent_id": "w"})
            st = wait_covered(d)
            assert st["eta_s"] == 0.0
            write(root, "memory/2026-07-24/later.md",
                  "# Later\n\nHELD-BACKFILL: the trains to Zurich run late on Sundays.\n")
            d.call("index.sync", {"agent_id": "w"})
            assert gate.entered.wait(20), "the backfill request never came"
            res = d.call("memory.search", {"agent_id": "w", "query": "Zurich trains"})
            assert res["mode"] == "hybrid" and "vector_error" not in res, res
            assert gate.held == 1 and not gate.released.is_set()
            st = vectors_status(d)
            assert st["embedded"] < st["total"] and st["state"] == "embedding"
            assert st["eta_s"] != 0.0
            gate.open()
            st = wait_covered(d)
            assert st["eta_s"] == 0.0 and st["pending"] == 0
        finally:
            gate.open()


def test_a_failed_batch_keeps_the_batches_answered_before_it(daemon_factory: Any,
                                                             tmp_path: Path) -> None:
    # One backfill round sends two provider batches of two texts: the first is answered,
    # the second's answer is broken (one vector short). The first batch's vectors are kept
    # (installed, cached, never asked for again); only the second batch is sent again.
    root = tmp_path / "ws"
    for i in range(4):
        write(root, f"memory/2026-07-2{i}/n{i}.md", f"# N{i}\n\nnote {i} about trains.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        # The health check, batch 1, batch 2.
        fake.script(Reply(), Reply(), Reply(missing=1))
        config = fake_config(root, fake).replace("dimensions = 8}",
                                                  "dimensions = 8, max_batch_size = 2}")
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        st = wait_covered(d)
        assert (st["embedded"], st["total"], st["parked"]) == (4, 4, 0), st
        assert "asked for 2 vectors, got 1" in st["provider"]["last_error"]
        assert st["cache"]["entries"] == 4
        sent = Counter(t for r in fake.requests for t in r.json["input"] if t != "ping")
        assert sorted(sent.values()) == [1, 1, 2, 2], sent
        res = d.call("memory.search", {"agent_id": "w", "query": "trains"})
        assert res["mode"] == "hybrid" and res["vector_hits"] == 4
        assert d.stop() == 0


def test_backfill_rate_leaves_idle_time_out(daemon_factory: Any, tmp_path: Path) -> None:
    # A first stretch of backfill, an idle spell, then 12 new chunks in rounds of 4: the
    # rate (and so the time to full coverage) is that of the work, not diluted by the
    # idle spell, so it is at least the new chunks over the wall time they took.
    root = tmp_path / "ws"
    for i in range(8):
        write(root, f"memory/2026-07-20/a{i}.md", f"# A{i}\n\nfirst stretch {i}.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        config = fake_config(root, fake).replace("dimensions = 8}",
                                                  "dimensions = 8, max_batch_size = 1}")
        d = daemon_factory(config)
        d.call("index.sync", {"agent_id": "w"})
        wait_covered(d)
        idle_from = time.monotonic()
        # The idle spell itself is what this test is about.
        wait_value(lambda: vectors_status(d),
                   lambda st: st["state"] == "idle" and time.monotonic() - idle_from > 3.0,
                   "an idle spell of 3 s")
        gate = fake.gate(lambda body: any("second stretch" in t for t in body["input"]))
        try:
            started = time.monotonic()
            for i in range(12):
                write(root, f"memory/2026-07-21/b{i:02d}.md",
                      f"# B{i}\n\nsecond stretch {i:02d}.\n")
            d.call("index.sync", {"agent_id": "w"})
            assert gate.entered.wait(20), "the backfill request never came"
            gate.open()
            st = wait_value(lambda: vectors_status(d), lambda st: st["embedded"] == 20,
                            "every vector")
            took = time.monotonic() - started
        finally:
            gate.open()
        assert st["rate_per_s"] >= 12 / took, (st["rate_per_s"], took)
        assert d.stop() == 0


def test_removed_chunks_leave_the_vector_branch_while_the_backfill_waits(
        daemon_factory: Any, tmp_path: Path) -> None:
    # The provider holds the backfill's request for a new note; meanwhile one note is
    # deleted and one edited. A search still answers, and neither old chunk comes back.
    root = tmp_path / "ws"
    for i in range(4):
        write(root, f"memory/2026-07-2{i}/n{i}.md", f"# N{i}\n\nnote {i} about trains.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        gate = fake.gate(lambda body: any("HELD-BACKFILL" in t for t in body["input"]))
        d = daemon_factory(fake_config(root, fake))
        try:
            d.call("index.sync", {"agent_id": "w"})
            wait_covered(d)
            write(root, "memory/2026-07-25/held.md", "# Held\n\nHELD-BACKFILL note.\n")
            d.call("index.sync", {"agent_id": "w"})
            assert gate.entered.wait(20), "the backfill request never came"
            (root / "memory/2026-07-21/n1.md").unlink()
            write(root, "memory/2026-07-22/n2.md", "# N2\n\nrewritten.\n")
            d.call("index.sync", {"agent_id": "w"})
            for old in ("# N1\n\nnote 1 about trains.", "# N2\n\nnote 2 about trains."):
                res = d.call("memory.search", {"agent_id": "w", "query": old,
                                               "max_results": 10})
                assert res["mode"] == "hybrid" and res["vector_hits"] == 2, res
                paths = {r["path"]: r["vector"] for r in res["results"]}
                assert "memory/2026-07-21/n1.md" not in paths
                # The rewritten note has no vector yet: its old one must not stand in.
                assert paths.get("memory/2026-07-22/n2.md") is None, paths
        finally:
            gate.open()
        assert d.stop() == 0


def test_a_query_that_can_find_nothing_is_not_embedded(daemon_factory: Any,
                                                       tmp_path: Path) -> None:
    # A blank query, or filters that no note passes (each kind, and two that pass
    # notes but no note passes both): no result whatever the query's vector, so no
    # call to the provider for it.
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/commute.md", "# Commute\n\nThe 7:40 train to Zurich.\n")
    write(root, "digest/travel/rail.md", "---\nauthor: alice\n---\n# Rail\n\nZurich lines.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        sent = len(fake.requests)
        # Nor one that shows nothing: invisible characters, a lone combining mark.
        for query in ("", "   ", "\n\t", "\u200b", "\ufeff \u200b\u2060", "\u00ad\u200e",
                      "\u0301", "\u3164\u2800"):
            res = d.call("memory.search", {"agent_id": "w", "query": query})
            assert res["results"] == [] and res["vector_hits"] == 0, (query, res)
        for filters in ({"path_prefix": "memory/2026-07-2"}, {"path_prefix": ["nowhere", "x/y"]},
                        {"date_from": "2026-07-24"}, {"bucket": "work"},
                        {"author": "bob"}, {"author": "alice", "path_prefix": "memory"},
                        {"bucket": "travel", "date_to": "2026-07-23"}):
            # Each query another: none is answered from the cache of query vectors.
            res = d.call("memory.search", {"agent_id": "w", "query": f"Zurich {filters}",
                                           "filters": filters})
            assert res["results"] == [] and res["vector_hits"] == 0, (filters, res)
            assert "vector_error" not in res, (filters, res)
        assert len(fake.requests) == sent  # no query was embedded
        assert d.call("memory.search", {"agent_id": "w", "query": "Zurich"})["results"]
        res = d.call("memory.search", {"agent_id": "w", "query": "Zurich train",
                                       "filters": {"author": "alice"}})
        assert [r["path"] for r in res["results"]] == ["digest/travel/rail.md"], res
        assert res["mode"] == "hybrid" and len(fake.requests) == sent + 2
        assert d.stop() == 0


def test_hybrid_results_bring_their_linked_notes_wherever_the_keyword_branch_ranked_them(
        daemon_factory: Any, tmp_path: Path) -> None:
    # A dozen notes the keyword branch ranks first, each linking two notes of its own,
    # and one whose text is the query (the fake's vector of it is the query's): fusion
    # ranks that one first, from deep in the keyword pool. Every third note's first
    # neighbour is empty: it has nothing to show and leaves its place to the next.
    root = tmp_path / "ws"
    empty = {f"memory/2026-08-02/x{i}a.md" for i in range(0, 12, 3)}
    for i in range(12):
        write(root, f"memory/2026-08-01/n{i:02d}.md",
              f"purple purple elephant elephant dance dance {i}\n"
              f"[[memory/2026-08-02/x{i}a]] [[memory/2026-08-02/x{i}b]]\n")
        for side in "ab":
            rel = f"memory/2026-08-02/x{i}{side}.md"
            write(root, rel, "" if rel in empty else f"neighbour {side} {i}\n")
    write(root, "memory/2026-08-03/z.md", "purple elephant dance")
    write(root, "memory/2026-08-03/zz.md", "the z note's neighbour\n[[memory/2026-08-03/z]]\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        for query in ("purple elephant dance", "elephant dance purple"):
            res = d.call("memory.search", {"agent_id": "w", "query": query})
            assert res["mode"] == "hybrid"
            results = res["results"]
            assert len(results) == 5
            # Each result's linked notes, in result order, up to max_results of them.
            want: list[tuple[str, str]] = []
            for hit in results:
                want += [(other, hit["path"]) for other in hit["links"]
                         if other not in {r["path"] for r in results} | {p for p, _ in want}
                         | empty]
            assert [(e["path"], e["via"]) for e in res["expanded"]] == want[:5], query
        top = d.call("memory.search", {"agent_id": "w", "query": "purple elephant dance"})
        assert top["results"][0]["path"] == "memory/2026-08-03/z.md"
        assert top["expanded"][0]["path"] == "memory/2026-08-03/zz.md"
        assert d.stop() == 0


def test_a_secret_in_a_query_is_not_sent_to_the_embedding_provider(daemon_factory: Any,
                                                                   tmp_path: Path) -> None:
    """A recall built from a user's message holding a key embeds it masked, as the
    notes' chunks are embedded."""
    root = tmp_path / "ws"
    token = "ghp_" + "Zq8Wx7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9Ff8Dd7S"
    write(root, "memory/2026-07-23/deploy.md", "# Deploy\n\nThe deploy token is rotated.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        sent = len(fake.requests)
        res = d.call("memory.search", {"agent_id": "w", "query": f"is {token} the deploy token"})
        assert res["mode"] == "hybrid" and res["vector_hits"] >= 1
        d.call("memory.recall", {"agent_id": "w", "messages": [
            {"role": "user", "content": f"my new token: {token}, where is the deploy doc?"}]})
        bodies = [r.body.decode() for r in fake.requests[sent:]]
        assert len(bodies) == 2 and all("[REDACTED]" in b for b in bodies), bodies
        assert not any(token in b for b in bodies)
        assert d.stop() == 0
    cached = "".join(p.read_text(errors="replace")
                     for p in (d.data_dir / "state" / "embeddings").glob("*"))
    assert token not in cached


def test_the_cli_says_when_a_query_could_not_be_embedded(daemon_factory: Any,
                                                         tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/kiln.md", "# Kiln\n\nThe kiln reached 1240 degrees.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        fake.script(Reply(status=400))  # the query's embedding is refused
        proc = recalld("search", "kiln degrees", "--agent", "w", env=d.env)
        assert proc.returncode == 0, proc.stderr
        assert "memory/2026-07-23/kiln.md" in proc.stdout
        assert "keyword results only" in proc.stderr and "HTTP 400" in proc.stderr
        # A query embedded as usual: nothing to say.
        proc = recalld("search", "kiln", "--agent", "w", env=d.env)
        assert "kiln.md" in proc.stdout and "keyword results only" not in proc.stderr
        assert d.stop() == 0


def test_a_base_url_with_credentials_sends_them(daemon_factory: Any, tmp_path: Path) -> None:
    # A provider behind a proxy with basic auth: the URL's user and password are sent
    # (one Authorization header: theirs, not the key's), and shown nowhere.
    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/slate.md", "# Slate\n\nThe slate roof leaks.\n")
    with FakeProvider(dims=8) as fake:
        url = fake.url.replace("http://", "http://proxyuser:pr0xy-pass@") + "/v1"
        d = daemon_factory(fake_config(root, fake).replace(f"{fake.url}/v1", url))
        d.call("index.sync", {"agent_id": "w"})
        st = wait_covered(d)
        assert st["health"] == "ok" and "pr0xy-pass" not in str(st)
        basic = "Basic " + base64.b64encode(b"proxyuser:pr0xy-pass").decode()
        assert {r.headers.get("authorization") for r in fake.requests} == {basic}
        assert d.call("memory.search", {"agent_id": "w", "query": "roof"})["mode"] == "hybrid"
        assert "pr0xy-pass" not in d.log() and "Traceback" not in d.log()
        assert d.stop() == 0


def test_a_query_typed_composed_or_decomposed_is_one_query(daemon_factory: Any,
                                                           tmp_path: Path) -> None:
    # "Zoë" typed composed (NFC) or decomposed (NFD: macOS file names, some keyboards) is
    # one text to Unicode and to the keyword index; the query's vector was the embedding
    # of the bytes as sent, so the two forms ranked the notes differently.
    import unicodedata

    root = tmp_path / "ws"
    write(root, "memory/2026-07-23/trip.md", "# Trip\n\nMet Zoë at the café in Malmö.\n")
    # A note written decomposed is embedded composed, as a query is: the same words
    # typed either way find it by their vector too.
    hanna = "# Hanna\n\nHannă spoke of Kraków and Đà Nẵng."
    write(root, "memory/2026-07-24/hanna.md", unicodedata.normalize("NFD", hanna) + "\n")
    for i in range(6):
        write(root, f"digest/wiki/n{i}.md", f"# Note {i}\n\nAnother note, number {i}.\n")
    with FakeProvider(dims=8, api_key="k") as fake:
        d = covered_daemon(daemon_factory, root, fake)
        answers = []
        for form in ("NFC", "NFD"):
            query = unicodedata.normalize(form, "Zoë café Malmö")
            sent = len(fake.requests)
            res = d.call("memory.search", {"agent_id": "w", "query": query, "max_results": 7})
            assert res["mode"] == "hybrid"
            res.pop("took_ms")
            answers.append(res)
            embedded = [t for r in fake.requests[sent:] for t in r.json["input"]]
            assert embedded in ([unicodedata.normalize("NFC", query)], []), embedded
        assert answers[0] == answers[1]
        assert answers[0]["results"][0]["path"] == "memory/2026-07-23/trip.md"
        texts = [t for r in fake.requests for t in r.json["input"]]
        assert all(unicodedata.is_normalized("NFC", t) for t in texts), texts
        res = d.call("memory.search", {"agent_id": "w", "query": hanna, "max_results": 7})
        top = res["results"][0]
        # The fake's vector is the text's hash: one text, one vector.
        assert top["path"] == "memory/2026-07-24/hanna.md" and top["vector"] > 0.999, res
