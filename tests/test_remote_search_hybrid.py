"""Hybrid searches of a shared workspace in PostgreSQL give the hits the local index gives.

The set-up of ``test_remote_search.py`` (one daemon, ``loc`` searching its own index,
``srv`` searching in the server, one shared workspace on a real PostgreSQL), with an
embedding model faked as a real HTTP server: both branches and their fusion compared,
first while the server scans the vectors exactly, then through its HNSW index.
"""

from __future__ import annotations

import pytest
from conftest import DaemonFactory, DaemonHandle
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote_search import QUERIES, hits, search, shared_pair, ws_status
from waits import wait_for


def test_hybrid_server_search_returns_the_local_hits(daemon_factory: DaemonFactory,
                                                    pg_server: PgServer) -> None:  # noqa: F811
    from fakes.provider_server import FakeProvider

    with FakeProvider(dims=16, api_key="k") as fake:
        # The server holds one vector per chunk: the local replica compares like with like
        # when it scores chunks by their own vector. The blind-keyword guard is on (its
        # default) on both sides.
        vec = (f'embedding_model_config = {{ backend = "openai", base_url = "{fake.url}/v1", '
               'api_key = "k", model_name = "m", dimensions = 16 }\n'
               'search = { vector_window_chars = 0 }\n')
        d = shared_pair(daemon_factory, pg_server, vec)

        def embedded() -> bool:
            for agent in ("loc", "srv"):
                v = ws_status(d, agent)["index"]["vectors"] or {}
                if not v.get("total") or v.get("embedded") != v.get("total"):
                    return False
            return True
        wait_for(embedded, deadline_s=120, what="every chunk embedded")
        compare_hybrid(d)
        # The first searches scan the vectors exactly; the HNSW index of the space is
        # built in the background meanwhile, and later searches go through it.
        wait_for(lambda: hnsw_index_valid(pg_server, 16), what="HNSW index built")
        compare_hybrid(d)


def hnsw_index_valid(pg: PgServer, dims: int) -> bool:
    import psycopg

    with psycopg.connect(pg.dsn) as conn:
        row = conn.execute("SELECT bool_and(x.indisvalid) FROM pg_class c JOIN pg_index x"
                           " ON x.indexrelid = c.oid WHERE c.relname LIKE %s",
                           (f"recalld_embeddings_hnsw_{dims}_%",)).fetchone()
    return bool(row and row[0])


def compare_hybrid(d: DaemonHandle) -> None:
    for query, filters in QUERIES:
        local = search(d, "loc", query, filters)
        server = search(d, "srv", query, filters)
        assert server["search_mode"] == "server", server.get("server_error")
        assert local["mode"] == server["mode"] == "hybrid"
        # The keyword branch weighs what it weighs locally (the blind-keyword guard): a
        # query whose words the notes miss fuses its chance keyword matches at a lower
        # weight in the server too.
        assert server["keyword_weight"] == pytest.approx(local["keyword_weight"], abs=1e-3), (
            query, local["keyword_weight"], server["keyword_weight"])
        # Local vectors are stored as float16, the server's as float32: similarities
        # differ in the fourth digit, so near ties may trade places; the hits agree.
        assert server["vector_hits"] == local["vector_hits"]
        top_local = {(r["path"], r["start_line"]) for r in local["results"]}
        top_server = {(r["path"], r["start_line"]) for r in server["results"]}
        assert len(top_local ^ top_server) <= 2, (hits(local), hits(server))
        for x, y in zip(local["results"], server["results"], strict=False):
            if (x["path"], x["start_line"]) == (y["path"], y["start_line"]):
                if x["keyword"] is not None and y["keyword"] is not None:
                    assert x["keyword"] == pytest.approx(y["keyword"], rel=1e-9)
                if x["vector"] is not None and y["vector"] is not None:
                    assert x["vector"] == pytest.approx(y["vector"], abs=5e-3)
