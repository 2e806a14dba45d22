"""Embeddings computed once per (vector space, text) for every host of a shared workspace.

Rows of ``recalld_embeddings`` (pgvector): a vector per ``(workspace_id, space, text
hash)``, or a *claim* (no vector yet, ``claimed_by`` a host, ``claimed_at`` a time). A host
that needs vectors asks for them in one transaction (:func:`get_or_claim`): those stored
are returned, absent ones are claimed by it (``INSERT ... ON CONFLICT DO NOTHING``, so two
hosts never claim one text), and claims older than ``CLAIM_STALE_S`` (a host that died
mid-call) are taken over. The claimant asks its provider and stores the vectors
(:func:`store`); the others wait for them, woken by the notification both send on the
workspace's channel (``db.VECTORS_STORED``). A failed provider call gives its claims back
(:func:`release`).

Vectors cross the wire as pgvector's text form (``[0.1,0.2,...]``), so no adapter
package is needed. Blocking psycopg calls: run them in worker threads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from recalld.daemon.arraytypes import F32
from recalld.daemon.remote.db import VECTORS_STORED, Conn, channel

CLAIM_STALE_S = 60
#: Why vectors are not shared where the server has no ``recalld_embeddings`` table.
NO_TABLE = ("the server lacks the vector extension (pgvector): each host embeds its "
            "texts itself")


def unshared(conn: Conn) -> str | None:
    """Why vectors cannot be shared on this server (its schema migration 2 was skipped:
    pgvector missing, or a role that may not create it), or None when they can."""
    row = conn.execute("SELECT to_regclass('recalld_embeddings')").fetchone()
    return NO_TABLE if row is None or row[0] is None else None


def _parse(text: str) -> F32:
    return np.array(text.strip("[]").split(","), dtype=np.float32)


def _text(vector: npt.ArrayLike) -> str:
    return "[" + ",".join(repr(float(x)) for x in np.asarray(vector, dtype=np.float32)) + "]"


def get_or_claim(conn: Conn, workspace_id: int, space: str, hashes: Sequence[str],
                 host: str) -> tuple[dict[str, F32], list[str]]:
    """(vectors stored, hashes now claimed by ``host``); the rest are claimed by others."""
    wanted = list(dict.fromkeys(hashes))
    with conn.transaction():
        rows = conn.execute(
            "SELECT text_hash, embedding::text FROM recalld_embeddings WHERE workspace_id = %s"
            " AND space = %s AND text_hash = ANY(%s) AND embedding IS NOT NULL",
            (workspace_id, space, wanted)).fetchall()
        found = {str(h): _parse(str(v)) for h, v in rows}
        rest = [h for h in wanted if h not in found]
        mine: list[str] = []
        if rest:
            mine = [str(r[0]) for r in conn.execute(
                "INSERT INTO recalld_embeddings (workspace_id, space, text_hash, claimed_by)"
                " SELECT %s, %s, unnest(%s::text[]), %s ON CONFLICT DO NOTHING"
                " RETURNING text_hash", (workspace_id, space, rest, host)).fetchall()]
            mine += [str(r[0]) for r in conn.execute(
                "UPDATE recalld_embeddings SET claimed_by = %s, claimed_at = now()"
                " WHERE workspace_id = %s AND space = %s AND text_hash = ANY(%s)"
                " AND embedding IS NULL AND (claimed_by = %s"
                " OR claimed_at < now() - make_interval(secs => %s))"
                " RETURNING text_hash",
                (host, workspace_id, space, [h for h in rest if h not in mine], host,
                 CLAIM_STALE_S)).fetchall()]
    return found, mine


def store(conn: Conn, workspace_id: int, space: str,
          items: Sequence[tuple[str, npt.ArrayLike]]) -> None:
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO recalld_embeddings (workspace_id, space, text_hash, embedding)"
            " VALUES (%s, %s, %s, %s::vector) ON CONFLICT (workspace_id, space, text_hash)"
            " DO UPDATE SET embedding = EXCLUDED.embedding, claimed_by = NULL",
            [(workspace_id, space, h, _text(v)) for h, v in items])
        cur.execute("SELECT pg_notify(%s, %s)", (channel(workspace_id), VECTORS_STORED))


def release(conn: Conn, workspace_id: int, space: str, hashes: Sequence[str],
            host: str) -> None:
    with conn.transaction():
        conn.execute(
            "DELETE FROM recalld_embeddings WHERE workspace_id = %s AND space = %s"
            " AND text_hash = ANY(%s) AND embedding IS NULL AND claimed_by = %s",
            (workspace_id, space, list(hashes), host))
        conn.execute("SELECT pg_notify(%s, %s)", (channel(workspace_id), VECTORS_STORED))
