"""Searching a shared workspace in PostgreSQL gives the hits the local index gives.

One daemon opens two workspaces that share one workspace on a real PostgreSQL
(tests/pgserver.py): ``loc`` searches its own index (``search_mode = "local"``), ``srv``
searches in the server (``search_mode = "server"``). A generated workspace (English
notes, identifiers, Chinese and mixed notes, digest nodes with authors) is written into
``loc``; once both replicas hold every file, the same queries of several shapes go to
both and must return the same hits, in the same order, with the same scores.
"""

from __future__ import annotations

import random
import re
import unicodedata
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import cli
from test_remote_hang import SITECUSTOMIZE
from waits import wait_for

WORDS = ("river", "garden", "invoice", "deploy", "kernel", "picnic", "budget", "tennis",
         "vaccine", "harbor", "lantern", "orchard", "compiler", "mortgage", "glacier",
         "festival", "quartz", "saddle", "meadow", "violin", "cathedral", "bakery",
         "satellite", "pottery", "monsoon", "ledger", "canyon", "archive", "falcon")
IDENTS = ("ECONNREFUSED", "handleWebSocketReconnect", "retry_backoff_ms", "config.toml",
          "v4.27.3", "QX_TORVEL_5831", "k8s-operator", "parseRequests")
ZH = ("数据库连接超时", "机器学习模型", "北京的天气很好", "周末去公园散步", "项目进度报告",
      "服务器部署失败", "向量检索系统", "会议纪要整理", "自然语言处理", "家庭聚会安排")


def generate(seed: int) -> dict[str, str]:
    """About 150 notes: daily notes in English, Chinese and both, digest nodes with an
    ``author``; identifiers and rare words scattered so exact hits and BM25 both matter."""
    rng = random.Random(seed)
    notes: dict[str, str] = {}
    for i in range(120):
        day = f"2026-07-{1 + i % 20:02d}"
        kind = i % 4
        lines = [f"# Note {i} {rng.choice(WORDS)}"]
        for _ in range(rng.randint(2, 12)):
            words = rng.sample(WORDS, rng.randint(3, 9))
            if kind in (1, 3):
                words.insert(rng.randrange(len(words) + 1), rng.choice(ZH))
            if rng.random() < 0.2:
                words.append(rng.choice(IDENTS))
            if kind == 1:
                words = [w for w in words if w in ZH or rng.random() < 0.2]
            lines.append(" ".join(words))
        if i % 17 == 0:
            lines.append(f"the rare word zorblax{i // 17} appears once")
        notes[f"memory/{day}/n{i}.md"] = "\n".join(lines) + "\n"
    for j in range(30):
        bucket = ("wiki", "personal", "procedure")[j % 3]
        # One author, or several (a flow list, block list lines).
        author = ("alice", "bob", "[bob, carol]", "\n  - carol\n  - alice")[j % 4]
        body = "\n\n".join(" ".join([*rng.sample(WORDS, 6), rng.choice(ZH)])
                           for _ in range(rng.randint(1, 4)))
        notes[f"digest/{bucket}/node{j}.md"] = (
            f"---\nname: node{j}\nauthor: {author}\n---\n# Node {j}\n\n{body}\n")
    # An author whose name holds a NUL (YAML's "\0"), which no PostgreSQL text value holds.
    notes["digest/wiki/mallory.md"] = '---\nauthor: "mal\\0lory"\n---\n# Mallory\n\nledger\n'
    # A day's folder in full-width digits: no date (a filter's dates are ASCII).
    notes["memory/\uff12\uff10\uff12\uff16-\uff10\uff17-\uff12\uff15/fw.md"] = "festival\n"
    # A folder named decomposed (macOS) holding a note named composed.
    notes[f"memory/2026-07-04/{unicodedata.normalize('NFD', 'Réunions')}/équipe.md"] = (
        "# Équipe\n\nmeadow violin rehearsal\n")
    # The same note in several places, written last first: tied hits.
    for k in reversed(range(8)):
        notes[f"memory/2026-07-{21 + k % 3}/twin{k}.md"] = "the heron waits at the estuary\n"
    return notes


QUERIES: list[tuple[str, dict[str, Any] | None]] = [
    ("garden", None),
    ("river budget", None),
    ("what happened with the kernel compiler deploy", None),
    ("ECONNREFUSED", None),
    ("handleWebSocketReconnect retry", None),
    ("config.toml v4.27.3", None),
    ("QX_TORVEL_5831", None),
    ("zorblax3", None),
    ("数据库连接超时", None),
    ("机器学习", None),
    ("北京 天气", None),
    ("向量检索 satellite", None),
    ("会", None),
    ("meadow violin", {"path_prefix": "memory/2026-07-03"}),
    ("meadow violin", {"path_prefix": "memory/2026-07-04/Réunions"}),
    ("meadow violin", {"path_prefix": unicodedata.normalize(
        "NFD", "memory/2026-07-04/Réunions/équipe.md")}),
    ("festival", {"date_from": "2026-07-05", "date_to": "2026-07-09"}),
    ("festival", {"date_from": "2026-07-15"}),
    ("archive falcon", {"bucket": "wiki"}),
    ("ledger", {"author": "alice"}),
    ("ledger", {"author": "mal\x00lory"}),
    ("garden river invoice deploy kernel picnic budget tennis", {"author": "carol"}),
    ("nothingmatchesthisword", None),
    ("heron estuary", None),
    # A question whose words the notes do not use but one: the keyword branch sees
    # little of it.
    ("what was decided about the budget when the connections timed out", None),
]


def config(dsn: str, name: str, extra: str = "") -> str:
    out = ""
    for agent, mode in (("loc", "local"), ("srv", "server")):
        out += (f'[workspaces.{agent}]\nremote = {{ kind = "postgres", dsn = "{dsn}", '
                f'name = "{name}", host = "host{agent}", search_mode = "{mode}" }}\n{extra}')
    return out


def ws_status(d: DaemonHandle, agent: str) -> dict[str, Any]:
    for ws in d.call("daemon.status")["workspaces"]:
        if ws["agent_id"] == agent:
            return dict(ws)
    raise AssertionError(f"no workspace {agent}")


def ws_root(d: DaemonHandle, agent: str) -> Path:
    return d.data_dir / "workspaces" / agent


def search(d: DaemonHandle, agent: str, query: str, filters: dict[str, Any] | None,
           n: int = 5) -> dict[str, Any]:
    params: dict[str, Any] = {"agent_id": agent, "query": query, "max_results": n,
                              "sync": True}
    if filters:
        params["filters"] = filters
    return dict(d.call("memory.search", params))


def searched_as_several(d: DaemonHandle) -> dict[str, Any]:
    return dict(d.call("memory.search", {"agent_id": "srv", "query": "ECONNREFUSED",
                                         "agents": ["srv"], "sync": True}))


def hits(answer: dict[str, Any]) -> list[tuple[str, int, int, bool]]:
    return [(r["path"], r["start_line"], r["end_line"], bool(r.get("exact")))
            for r in answer["results"]]


def same_ranking(local: dict[str, Any], server: dict[str, Any], *, tol: float) -> None:
    """The same hits in the same order, tied ones too (by place on both sides), with
    scores equal within ``tol``."""
    a, b = local["results"], server["results"]
    assert hits(local) == hits(server)
    for x, y in zip(a, b, strict=True):
        assert x["score"] == pytest.approx(y["score"], rel=tol, abs=tol), (x, y)
    texts = {(r["path"], r["start_line"]): r["text"] for r in b}
    for r in a:
        assert texts[(r["path"], r["start_line"])] == r["text"]


def shared_pair(daemon_factory: DaemonFactory, pg: PgServer, extra: str = "",
                name: str = "") -> DaemonHandle:
    name = name or "s" + uuid.uuid4().hex[:12]
    d = daemon_factory(config(pg.dsn, name, extra))
    for agent in ("loc", "srv"):
        wait_for(lambda a=agent: ws_status(d, a)["remote"]["state"] == "online",
                 what=f"{agent} online")
    notes = generate(seed=20)
    base = ws_root(d, "loc")
    for rel, text in notes.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")

    def replicated() -> bool:
        other = ws_root(d, "srv")
        # Each replica's files are there before its catch-up has ended: wait for both.
        return all((other / rel).exists() for rel in notes) and all(
            ws_status(d, a)["remote"]["outbox"] == 0 and not ws_status(d, a)["remote"]["behind"]
            for a in ("loc", "srv"))
    wait_for(replicated, deadline_s=120, what="every note on both replicas")
    return d


def test_server_search_returns_the_local_hits(daemon_factory: DaemonFactory,
                                             pg_server: PgServer) -> None:  # noqa: F811
    d = shared_pair(daemon_factory, pg_server)
    status = ws_status(d, "srv")["remote"]
    assert status["search_mode"] == "server"
    assert ws_status(d, "loc")["remote"]["search_mode"] == "local"
    shown = cli(d, "status")
    assert re.search(r"remote: +online, outbox 0, searched in the server \(", shown), shown
    compared = 0
    for query, filters in QUERIES:
        local = search(d, "loc", query, filters)
        server = search(d, "srv", query, filters)
        assert "search_mode" not in local
        assert server["search_mode"] == "server", server.get("server_error")
        assert server["mode"] == local["mode"] == "keyword"
        same_ranking(local, server, tol=1e-9)
        compared += bool(local["results"])
    # Most shapes find something; the nonsense word finds nothing on both sides.
    assert compared >= len(QUERIES) - 1
    # A folder named decomposed on disk is found by its name typed composed, and the
    # other way round, in the server as in the local index.
    team = f"memory/2026-07-04/{unicodedata.normalize('NFD', 'Réunions')}/équipe.md"
    for agent in ("loc", "srv"):
        for prefix in ("memory/2026-07-04/Réunions", unicodedata.normalize("NFD", team)):
            found = search(d, agent, "meadow violin", {"path_prefix": prefix})
            assert [r["path"] for r in found["results"]] == [team], (agent, prefix)
    assert ws_status(d, "srv")["remote"]["search"]["server_searches"] >= len(QUERIES)
    # A larger pool, as an agent asking for more would get.
    for query in ("garden river", "项目进度报告", "parseRequests"):
        same_ranking(search(d, "loc", query, None, n=30), search(d, "srv", query, None, n=30),
                     tol=1e-9)


def test_server_search_sees_an_edit_made_just_before(daemon_factory: DaemonFactory,
                                                    pg_server: PgServer) -> None:  # noqa: F811
    d = shared_pair(daemon_factory, pg_server)
    p = ws_root(d, "srv") / "memory/2026-08-01/fresh.md"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("# Fresh\nquibbleworth arrived today\n", encoding="utf-8")
    # ``sync`` waits until this host's change is on the server.
    got = search(d, "srv", "quibbleworth", None)
    assert got["search_mode"] == "server"
    assert [r["path"] for r in got["results"]] == ["memory/2026-08-01/fresh.md"]
    p.unlink()
    got = search(d, "srv", "quibbleworth", None)
    assert got["results"] == []


def test_server_search_falls_back_to_the_local_index_while_offline(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    d = shared_pair(daemon_factory, pg_server)
    before = search(d, "srv", "ECONNREFUSED", None)
    assert before["search_mode"] == "server"
    # Searched with ``agents`` (several workspaces), the answer says the same.
    assert searched_as_several(d)["search_mode"] == "server"
    pg_server.stop()
    try:
        wait_for(lambda: ws_status(d, "srv")["remote"]["state"] == "offline",
                 what="offline")
        fallbacks = ws_status(d, "srv")["remote"]["search"]["local_fallbacks"]
        during = search(d, "srv", "ECONNREFUSED", None)
        assert during["search_mode"] == "local" and during["server_error"]
        assert hits(during) == hits(before)
        status = ws_status(d, "srv")["remote"]
        assert status["search"]["local_fallbacks"] == fallbacks + 1
        several = searched_as_several(d)
        assert several["search_mode"] == "local"
        assert several["server_error"].startswith("srv: ")
        assert len(several["server_error"]) > len("srv: ")
        assert hits(several) == hits(before)
        assert status["last_error"]  # why the replica is offline
    finally:
        pg_server.start()
    # Online again, and once the server is known to hold every file's chunks (checked
    # at each connect), the server answers again.
    wait_for(lambda: search(d, "srv", "ECONNREFUSED", None)["search_mode"] == "server",
             what="searched in the server again")
    # Online, the replica no longer shows why it was offline as if it still held.
    status = ws_status(d, "srv")["remote"]
    assert status["state"] == "online", status
    assert status["last_error"] is None and status["last_error_at"] is None, status


def test_a_search_the_server_refuses_falls_back_and_shows_in_status(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    import psycopg

    # A role of its own, in a database of its own, whose password is its name: the
    # server's refusal repeats the name, and status must show it masked.
    role = "r" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{role}'")
        conn.execute(f"CREATE DATABASE {role} OWNER {role}")
    admin = pg_server.dsn.rsplit("/", 1)[0] + f"/{role}"
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")  # a superuser's to create
        dsn = f"postgresql://{role}:{role}@127.0.0.1:{pg_server.port}/{role}"
        d = daemon_factory(f'[workspaces.srv]\nremote = {{ kind = "postgres", dsn = "{dsn}", '
                           f'name = "team", host = "hostsrv", search_mode = "server" }}\n')
        p = ws_root(d, "srv") / "memory/2026-08-01/fresh.md"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("# Fresh\nquibbleworth arrived today\n", encoding="utf-8")

        def remote() -> dict[str, Any]:
            return dict(ws_status(d, "srv")["remote"])
        wait_for(lambda: remote()["state"] == "online" and remote()["outbox"] == 0
                 and remote()["search"]["chunks_ready"], what="on the server, chunked")
        # Its open connections stay; the first search's own connection is refused.
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {role} CONNECTION LIMIT 0")
        refused = search(d, "srv", "quibbleworth", None)
        assert refused["search_mode"] == "local"
        assert [r["path"] for r in refused["results"]] == ["memory/2026-08-01/fresh.md"]
        status = remote()
        assert status["state"] == "online"
        assert status["search"]["server_searches"] == 0
        assert status["search"]["local_fallbacks"] == 1
        error = status["search"]["last_error"]
        assert error == refused["server_error"]
        assert 'too many connections for role "***"' in error and role not in error
        assert status["server"] == f"postgresql://{role}:***@127.0.0.1:{pg_server.port}/{role}"
        # Accepted again: the next search runs in the server; the last error stays shown.
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {role} CONNECTION LIMIT -1")
        served = search(d, "srv", "quibbleworth", None)
        assert served["search_mode"] == "server"
        assert [r["path"] for r in served["results"]] == ["memory/2026-08-01/fresh.md"]
        status = remote()
        assert status["search"]["server_searches"] == 1
        assert status["search"]["local_fallbacks"] == 1
        assert status["search"]["last_error"] == error
        d.stop()
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_rows_written_before_the_server_kept_chunks_are_chunked(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    import psycopg

    name = "s" + uuid.uuid4().hex[:12]
    d = shared_pair(daemon_factory, pg_server, name=name)
    expected = {q: search(d, "loc", q, None) for q in ("garden", "数据库连接超时", "ECONNREFUSED")}
    d.stop()
    # As an older recalld left them: files without chunks, postings or totals.
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT workspace_id FROM recalld_workspaces WHERE name = %s",
                           (name,)).fetchone()
        assert row is not None
        ws = row[0]
        for table in ("recalld_chunks", "recalld_postings"):
            conn.execute(f"DELETE FROM {table} WHERE workspace_id = %s", (ws,))
        conn.execute("UPDATE recalld_files SET chunked_version = NULL WHERE workspace_id = %s",
                     (ws,))
        conn.execute("UPDATE recalld_workspaces SET search_chunks = 0, search_length = 0"
                     " WHERE workspace_id = %s", (ws,))
    d = daemon_factory(config(pg_server.dsn, name), RECALLD_DATA_DIR=str(d.data_dir))
    files = len(generate(seed=20))
    wait_for(lambda: ws_status(d, "srv")["remote"]["search"]["chunks_ready"],
             deadline_s=120, what="older rows chunked")
    assert ws_status(d, "srv")["remote"]["search"]["chunks_backfilled"] >= files
    for q, want in expected.items():
        got = search(d, "srv", q, None)
        assert got["search_mode"] == "server"
        assert want["results"]
        same_ranking(want, got, tol=1e-9)


def test_a_note_with_nul_bytes_goes_up_and_is_found_in_the_server(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    # NUL is valid in a note (a binary paste) but no PostgreSQL text value holds it: the
    # chunk rows carry it escaped (U+FFFD 0), and the changes after it go up as well.
    d = daemon_factory(config(pg_server.dsn, "s" + uuid.uuid4().hex[:12]))
    for agent in ("loc", "srv"):
        wait_for(lambda a=agent: ws_status(d, a)["remote"]["state"] == "online",
                 what=f"{agent} online")
    folder = ws_root(d, "srv") / "memory/2026-08-01"
    folder.mkdir(parents=True)
    (folder / "nul.md").write_bytes(b"# Paste \x00 here\nnulword \x00 after\n")
    (folder / "after.md").write_text("# After\nafterword\n", encoding="utf-8")
    got = search(d, "srv", "nulword", None)
    assert got["search_mode"] == "server", got.get("server_error")
    [hit] = got["results"]
    assert hit["path"] == "memory/2026-08-01/nul.md" and "after" in hit["text"]
    assert [r["path"] for r in search(d, "srv", "afterword", None)["results"]] == [
        "memory/2026-08-01/after.md"]
    remote = ws_status(d, "srv")["remote"]
    assert remote["state"] == "online" and remote["outbox"] == 0, remote
    wait_for(lambda: (ws_root(d, "loc") / "memory/2026-08-01/nul.md").read_bytes()
             == b"# Paste \x00 here\nnulword \x00 after\n"
             if (ws_root(d, "loc") / "memory/2026-08-01/nul.md").exists() else False,
             what="the note byte for byte on the other replica")


def test_a_note_over_the_index_limit_is_searched_in_the_server_as_locally(
        daemon_factory: DaemonFactory, pg_server: PgServer,  # noqa: F811
        tmp_path: Path) -> None:
    # The local index reads a note up to its first 8 MiB (partly_indexed); the server's
    # chunks of it stop at the same byte, so both find the same notes. The limit is cut
    # to 1 MiB here (the launcher hook of tests/test_remote_hang.py): the same rule on an
    # eighth of the text to mask, chunk and upload.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    max_note_bytes = 1 << 20
    name = "s" + uuid.uuid4().hex[:12]
    d = daemon_factory(f'[workspaces.srv]\nremote = {{ kind = "postgres", dsn = '
                       f'"{pg_server.dsn}", name = "{name}", search_mode = "server" }}\n',
                       PYTHONPATH=str(hooks), MAX_NOTE_BYTES=str(max_note_bytes))
    wait_for(lambda: ws_status(d, "srv")["remote"]["search"]["chunks_ready"],
             what="srv online")
    line = b"tern gull skua\n"
    head = b"# Dump\nheadword\n" + line * (max_note_bytes // len(line))
    assert len(head) >= max_note_bytes
    (ws_root(d, "srv") / "digest/dump.md").write_bytes(head + b"tailword beyond the limit\n")
    wait_for(lambda: search(d, "srv", "headword", None)["results"], what="the note in the server")
    got = search(d, "srv", "tailword", None)
    assert got["search_mode"] == "server" and got["results"] == [], got
    assert ws_status(d, "srv")["health"]["partly_indexed"] == 1  # so is the local index


def test_chunks_made_under_older_rules_are_made_again(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    """An upgrade that changes how notes are chunked, masked or tokenized (the local index
    reads every note again) has the server's chunks made again too: rows of the old rules
    would not meet the new rules' query terms."""
    import psycopg

    from recalld.daemon.index.persist import CHUNKING

    name = "s" + uuid.uuid4().hex[:12]
    d = shared_pair(daemon_factory, pg_server, name=name)
    queries = ("garden", "数据库连接超时", "ECONNREFUSED", "river budget")
    expected = {q: search(d, "loc", q, None) for q in queries}
    d.stop()
    files = len(generate(seed=20))
    # As an older recalld left them: every term spelled otherwise, and no record of the
    # rules (a recalld before the record), an older one, or one of the current rules
    # whose texts were kept the older way (a NUL as a bare U+FFFD: no "server_text").
    for rules in (None, {"rules": CHUNKING - 1}, {"rules": CHUNKING}):
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT workspace_id FROM recalld_workspaces WHERE name = %s",
                               (name,)).fetchone()
            assert row is not None
            ws = row[0]
            conn.execute("UPDATE recalld_postings SET term = term || '~'"
                         " WHERE workspace_id = %s", (ws,))
            conn.execute("DELETE FROM recalld_catalog WHERE workspace_id = %s"
                         " AND job = 'server_search'", (ws,))
            if rules is not None:
                conn.execute("INSERT INTO recalld_catalog (workspace_id, job, key, value)"
                             " VALUES (%s, 'server_search', 'chunks', %s)",
                             (ws, psycopg.types.json.Jsonb(rules)))
        d = daemon_factory(config(pg_server.dsn, name), RECALLD_DATA_DIR=str(d.data_dir))
        wait_for(lambda d=d: ws_status(d, "srv")["remote"]["search"]["chunks_ready"],
                 deadline_s=120, what="chunks made again")
        assert ws_status(d, "srv")["remote"]["search"]["chunks_backfilled"] >= files
        for q, want in expected.items():
            got = search(d, "srv", q, None)
            assert got["search_mode"] == "server" and want["results"]
            same_ranking(want, got, tol=1e-9)
        d.stop()
    # Chunks of the current rules are not made again at the next start.
    d = daemon_factory(config(pg_server.dsn, name), RECALLD_DATA_DIR=str(d.data_dir))
    wait_for(lambda: ws_status(d, "srv")["remote"]["search"]["chunks_ready"],
             deadline_s=120, what="chunks checked")
    assert ws_status(d, "srv")["remote"]["search"]["chunks_backfilled"] == 0
