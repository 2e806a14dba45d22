"""Shared workspaces searched in the server: the server's chunks are made at the chunk
size of the host that searches there, whichever host uploads the note (a host with
another ``chunk_max_chars`` chunked its uploads at its own size)."""

from __future__ import annotations

import psycopg
from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote import config, converged, notes, remote_status, write
from waits import wait_for

TEXT = "# Burrows\n\n" + "\n\n".join(
    f"Paragraph {i}: the armadillo digs burrow number {i} under the fig tree. " * 3
    for i in range(20)) + "\n"


def server_chunks(pg: PgServer, name: str) -> dict[str, int]:
    """How many chunks the server holds of each note of shared workspace ``name``."""
    with psycopg.connect(pg.dsn) as conn:
        return {str(p): int(str(n)) for p, n in conn.execute(
            "SELECT c.path, count(*) FROM recalld_chunks c JOIN recalld_workspaces w"
            " USING (workspace_id) WHERE w.name = %s GROUP BY c.path", (name,))}


def test_server_chunks_follow_the_searching_host_not_the_uploader(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    name = "tchunksize"
    a = daemon_factory(config(pg_server.dsn, name, "hosta", ', search_mode = "server"'))
    b = daemon_factory("[daemon]\nchunk_max_chars = 200\n"
                       + config(pg_server.dsn, name, "hostb"))
    for d in (a, b):
        wait_for(lambda d=d: remote_status(d)["state"] == "online", what="online")
    wait_for(lambda: remote_status(a)["search"]["chunks_ready"], what="chunked")
    write(b, "digest/wiki/from-b.md", TEXT)
    write(a, "digest/wiki/from-a.md", TEXT)
    wait_for(lambda: len(notes(a)) == 2 and converged(a, b), what="converged")
    counts = server_chunks(pg_server, name)
    assert counts["digest/wiki/from-b.md"] == counts["digest/wiki/from-a.md"] < 5
    res = a.call("memory.search", {"agent_id": "default", "query": "armadillo burrow",
                                   "sync": True, "max_results": 10})
    assert res["search_mode"] == "server"
    spans = {(r["start_line"], r["end_line"]) for r in res["results"]
             if r["path"] == "digest/wiki/from-b.md"}
    assert spans == {(r["start_line"], r["end_line"]) for r in res["results"]
                     if r["path"] == "digest/wiki/from-a.md"}

    # The searching host's size changes: every file is chunked again at the new size.
    a.stop()
    a.config_path.write_text("[daemon]\nchunk_max_chars = 300\n"
                             + config(pg_server.dsn, name, "hosta", ', search_mode = "server"'))
    a2 = daemon_factory(None, HOME=str(a.home), XDG_DATA_HOME=str(a.home / "data"),
                        XDG_CONFIG_HOME=str(a.home / "config"))
    wait_for(lambda: remote_status(a2)["search"]["chunks_ready"], what="chunked again")
    again = server_chunks(pg_server, name)
    assert again["digest/wiki/from-b.md"] == again["digest/wiki/from-a.md"] > 10
