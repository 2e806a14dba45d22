"""A server search answers a note's text as the local index does, whatever characters
it holds: NUL (which no PostgreSQL text value takes) and U+FFFD alike.

The set-up of ``test_remote_search.py``: one daemon, ``loc`` searching its own index,
``srv`` searching in the server, one shared workspace on a real PostgreSQL.
"""

from __future__ import annotations

import uuid
from typing import Any

from conftest import DaemonFactory
from pgserver import PgServer, pg_server  # noqa: F401 (fixture)
from test_remote_search import config, search, ws_root, ws_status
from waits import wait_for

NOTES = {
    # A NUL in the frontmatter, the heading and the body, and a real U+FFFD beside it.
    "digest/people/nul.md": (b'---\nauthor: ["Zo\x00e", bob]\n---\n# Head\x00ing okapi\n'
                             b"body okapi \x00 and \xef\xbf\xbd0 and \xef\xbf\xbd\n"),
    # Invalid UTF-8, read as U+FFFD: an author written so is another name than the NUL's.
    "digest/people/bad.md": b"---\nauthor: Zo\xffe\n---\n# Bad\nokapi latin\n",
}


def answer(found: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(r["path"], r["chunk_id"], r["heading"], r["text"]) for r in found["results"]]


def test_server_answers_text_with_nul_and_replacement_characters_as_locally(
        daemon_factory: DaemonFactory, pg_server: PgServer) -> None:  # noqa: F811
    d = daemon_factory(config(pg_server.dsn, "s" + uuid.uuid4().hex[:12]))
    for agent in ("loc", "srv"):
        wait_for(lambda a=agent: ws_status(d, a)["remote"]["state"] == "online",
                 what=f"{agent} online")
    for rel, data in NOTES.items():
        p = ws_root(d, "loc") / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    wait_for(lambda: all((ws_root(d, "srv") / rel).exists() for rel in NOTES)
             and ws_status(d, "loc")["remote"]["outbox"] == 0, what="both notes on srv")
    wait_for(lambda: ws_status(d, "srv")["remote"]["search"]["chunks_ready"],
             what="chunks in the server")
    for filters in (None, {"author": "Zo\x00e"}, {"author": "Zo\ufffde"},
                    {"author": "bob"}):
        local = search(d, "loc", "okapi", filters, n=10)
        server = search(d, "srv", "okapi", filters, n=10)
        assert server["search_mode"] == "server", server.get("server_error")
        assert answer(server) == answer(local), filters
        assert local["results"] or filters == {"author": "Zo\ufffde"}
    [hit] = search(d, "srv", "body", None)["results"]
    assert "\x00 and \ufffd0 and \ufffd\n" in hit["text"] + "\n", hit
