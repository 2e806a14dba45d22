"""A host waiting for vectors another host of the shared workspace claimed waits for the
notification that they were stored, rather than asking the server again and again.

The embedding host runs with a hook that records each ``embeddings.get_or_claim`` in
``CLAIMS`` and has host ``OTHER`` claim the texts first (another host embedding them), and
makes the longest wait for them an hour: only the notification ends it. The clock is a
host whose LISTEN is refused (``test_remote_wakeups.py``), reading the feed every 0.05 s.
A server without pgvector has no vectors to share: each host embeds by itself.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, remote_status, write
from test_remote_wakeups import SITECUSTOMIZE, reads
from waits import wait_for

from recalld.daemon.config import RemoteConfig
from recalld.daemon.remote import db, embeddings

CLAIMING = """
if os.environ.get("CLAIMS"):
    import json
    from recalld.daemon.remote import embeddings, replica

    replica.CLAIM_WAIT_S = 3600.0
    get_or_claim = embeddings.get_or_claim

    def claimed_elsewhere(conn, workspace_id, space, hashes, host):
        with open(os.environ["CLAIMS"], "a") as f:
            f.write(json.dumps([workspace_id, space, list(hashes)]) + "\\n")
        get_or_claim(conn, workspace_id, space, hashes, os.environ["OTHER"])
        return get_or_claim(conn, workspace_id, space, hashes, host)

    embeddings.get_or_claim = claimed_elsewhere
"""


def vectors(d: DaemonHandle) -> dict[str, int]:
    for ws in d.call("daemon.status")["workspaces"]:
        if ws["agent_id"] == "default":
            return dict(ws["index"]["vectors"] or {})
    raise AssertionError("no default workspace")


def test_a_host_waits_for_claimed_vectors_until_told_they_are_stored(
        daemon_factory: DaemonFactory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    from fakes.provider_server import FakeProvider

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE + CLAIMING, encoding="utf-8")
    name = "c" + uuid.uuid4().hex[:12]
    claims, deaf_log = tmp_path / "claims.log", tmp_path / "deaf.log"
    with FakeProvider(dims=4, api_key="k") as fake:
        vec = (f'embedding_model_config = {{ backend = "openai", base_url = "{fake.url}/v1", '
               'api_key = "k", model_name = "m", dimensions = 4 }\n')
        host = daemon_factory(config(pg_server.dsn, name, "waits") + vec,
                              PYTHONPATH=str(hooks), CLAIMS=str(claims), OTHER="busy")
        deaf = daemon_factory(config(pg_server.dsn, name, "deaf"), PYTHONPATH=str(hooks),
                              FEEDS=str(deaf_log), CATCH_UP_S="0.05", DEAF="1")
        wait_for(lambda: remote_status(host)["state"] == "online", what="online")
        wait_for(lambda: reads(deaf_log) >= 1, what="the clock going")
        write(host, "memory/2026-12-13/otter.md", "# Otter\nfloats on its back\n")
        wait_for(lambda: reads(claims) >= 1, what="the vectors asked for")
        asked = reads(claims)
        ticks = reads(deaf_log)
        wait_for(lambda: reads(deaf_log) >= ticks + 20, what="the clock's ticks")
        assert reads(claims) == asked, "asked again while the other host embeds"
        assert not vectors(host).get("embedded")
        # The other host stores them: the waiting host is told, and takes them.
        conn = db.connect(RemoteConfig(dsn=pg_server.dsn, name="x"))
        try:
            for line in claims.read_text().splitlines():
                ws, space, hashes = json.loads(line)
                embeddings.store(conn, ws, space, [(h, [0.5, 0.5, 0.5, 0.5]) for h in hashes])
        finally:
            conn.close()
        wait_for(lambda: vectors(host).get("embedded") == vectors(host).get("total") != 0,
                 what="the stored vectors taken")
        # The provider was never asked for them here (only the daemon's own probe).
        assert not any(b"otter" in r.body.lower() for r in fake.requests), fake.requests
    del deaf


def test_a_server_without_pgvector_embeds_and_searches_on_each_host_and_says_why(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    import psycopg
    from fakes.provider_server import FakeProvider

    # A database of a role that may not create the vector extension (a superuser's to
    # create): the schema's embeddings table is skipped, everything else works.
    role = "v" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN".encode())
        conn.execute(f"CREATE DATABASE {role} OWNER {role}".encode())
    dsn = f"postgresql://{role}@127.0.0.1:{pg_server.port}/{role}"
    try:
        with FakeProvider(dims=4, api_key="k") as fake:
            vec = (f'embedding_model_config = {{ backend = "openai", base_url = '
                   f'"{fake.url}/v1", api_key = "k", model_name = "m", dimensions = 4 }}\n')
            d = daemon_factory(config(dsn, "team", "plain", ', search_mode = "server"') + vec)
            wait_for(lambda: remote_status(d)["state"] == "online", what="online")
            write(d, "memory/2026-12-14/heron.md", "# Heron\nstands in the reeds\n")
            wait_for(lambda: remote_status(d)["vectors"]["embedded_here"] >= 1,
                     what="embedded here")
            status = remote_status(d)
            assert status["vectors"]["not_shared"] == embeddings.NO_TABLE, status
            # Not a fault of the connection: nothing asked of a table that is not there.
            assert status["state"] == "online" and status["last_error"] is None, status
            # A search with vectors is not sent to a server that has none: the host's
            # own index answers it, saying why.
            wait_for(lambda: remote_status(d)["search"]["chunks_ready"], what="chunked")
            found = d.call("memory.search", {"agent_id": "default", "query": "heron reeds"})
            assert found["search_mode"] == "local" and found["mode"] == "hybrid", found
            assert [r["path"] for r in found["results"]] == ["memory/2026-12-14/heron.md"]
            assert found["server_error"].startswith(embeddings.NO_TABLE), found
            assert remote_status(d)["search"]["last_error"] is None, remote_status(d)
            assert "recalld_embeddings" not in d.log(), d.log()
            d.stop()
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)".encode())
            conn.execute(f"DROP ROLE IF EXISTS {role}".encode())
