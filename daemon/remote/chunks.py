"""A shared workspace's chunks in PostgreSQL, for searching in the server.

Every file row of a shared workspace has its chunks in ``recalld_chunks``: made by the
same code the local index uses (credentials masked, ``chunk_markdown``, the tokenizer),
each with its BM25 length (``tokenizer.doc_length``), and one ``recalld_postings`` row
per chunk and term with the term's count (an inverted index, read by index-only scans),
so a BM25 computed over these rows gives the scores the local index gives. The
workspace's row keeps the chunk count and the sum of lengths (``search_chunks``,
``search_length``) for the average length.

Only workspaces some host searches in the server pay for this: such a host sets the
workspace's ``search_chunked`` (:func:`start_chunking`), from then on the host that
uploads a change writes its chunks in the same transaction (:func:`replace`, called by
``db.upload``), and the backfill (:func:`backfill_todo`, :func:`backfill_file`) chunks
the files written before (``chunked_version`` differs from ``version``). The flag is set
under the workspace row's lock, which every upload takes first, so each upload either
saw it or committed before it and is backfilled. The workspace's catalog records the
chunking rules (``rules.CHUNKING``) its chunks were made under: a host on newer rules (an
upgrade changed the tokenizer or the masking) has every file chunked again, as the local
index reads every note again. It records the chunk size too (the ``chunk_max_chars`` of
the host that searches in the server): every host chunks the workspace's files at that
size, whatever its own, so the server's chunks are the ones that host's own index makes
(:func:`workspace_max_chars`).
Blocking psycopg calls: run them in worker threads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS, chunk_markdown
from recalld.daemon.index.embedcache import text_hash
from recalld.daemon.index.filters import authors_of
from recalld.daemon.index.prepare import CUT_MARGIN_BYTES, MAX_NOTE_BYTES, index_text
from recalld.daemon.index.rules import CHUNKING
from recalld.daemon.index.tokenizer import doc_length, tokenize
from recalld.daemon.memory.redact import Check

Conn = psycopg.Connection[tuple[object, ...]]
BACKFILL_PAGE = 100
# Where a workspace's catalog keeps the rules its server chunks were made under.
RULES_JOB, RULES_KEY = "server_search", "chunks"


@dataclass(frozen=True, slots=True)
class ChunkRow:
    """One chunk as the server stores it."""

    seq: int
    start_line: int
    end_line: int
    heading: str
    text: str
    text_hash: str
    author: str | None
    terms: list[str]
    tfs: list[int]
    doc_len: int


def chunk_rows(path: str, data: bytes, *, max_chars: int = DEFAULT_MAX_CHARS,
               check: Check = None) -> list[ChunkRow]:
    """The chunks of the note ``path`` holding ``data``, as the local index makes them
    (of its first ``MAX_NOTE_BYTES`` only: its text is the index's, ``prepare.index_text``,
    a secret the cut falls inside masked); ``check`` is called while masking it and
    between chunks, and may raise to end the work (``redact.find_spans``)."""
    text = index_text(data[:MAX_NOTE_BYTES + CUT_MARGIN_BYTES], len(data), check)[0]
    chunks = chunk_markdown(path, text, max_chars=max_chars)
    author = (author_column(authors_of(chunks[0].metadata.get("frontmatter")))
              if chunks else None)
    rows = []
    for seq, c in enumerate(chunks):
        if check is not None:
            check()
        tokens = tokenize(c.index_text)
        counts = Counter(tokens)
        # The hash is of the text as the local index has it (the embeddings' key).
        rows.append(ChunkRow(seq, c.start_line, c.end_line, pg_exact(c.heading),
                             pg_exact(c.text), text_hash(c.text),
                             author,
                             [pg_text(t) for t in counts], list(counts.values()),
                             doc_length(tokens)))
    return rows


def author_column(authors: tuple[str, ...]) -> str | None:
    """The ``author`` column of a note's chunks: its authors one per line (a name with a
    line break in it is no author), so a filter compares the lines
    (``search.filter_sql``)."""
    names = [pg_exact(a) for a in authors if "\n" not in a]
    return "\n".join(names) if names else None


def pg_text(text: str) -> str:
    """``text`` as a PostgreSQL text value can hold it: NUL (valid in a note) as U+FFFD.
    For terms, which are only compared; what is shown again goes through :func:`pg_exact`."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


#: How chunk texts, headings and authors are kept (recorded with the rules): 2, as
#: :func:`pg_exact` writes them.
SERVER_TEXT = 2
_MARK = "\ufffd"
_ESCAPED = re.compile("\ufffd([\ufffd0])")


def pg_exact(text: str) -> str:
    """``text`` as a PostgreSQL text value can hold it and :func:`from_pg` gives it back:
    NUL (valid in a note) as U+FFFD ``0``, U+FFFD itself doubled. So a server search
    answers a note's text, heading and chunk id as the local index does, and an author
    filter tells a NUL from a U+FFFD."""
    if "\x00" not in text and _MARK not in text:
        return text
    return text.replace(_MARK, _MARK * 2).replace("\x00", _MARK + "0")


def from_pg(text: str) -> str:
    """The text :func:`pg_exact` was given (a lone U+FFFD, as older rows hold one for a
    NUL, stays itself)."""
    if _MARK not in text:
        return text
    return _ESCAPED.sub(lambda m: _MARK if m.group(1) == _MARK else "\x00", text)


def replace(conn: Conn, workspace_id: int, path: str, rows: list[ChunkRow] | None,
            version: int) -> None:
    """Make ``path``'s chunks ``rows`` (None: the file is gone) and keep the workspace's
    totals in step. Inside the caller's transaction, which holds the workspace row's lock
    (the totals are read-modify-write)."""
    old = conn.execute(
        "DELETE FROM recalld_chunks WHERE workspace_id = %s AND path = %s RETURNING doc_len",
        (workspace_id, path)).fetchall()
    removed = len(old)
    removed_len = sum(int(str(r[0])) for r in old)
    conn.execute("DELETE FROM recalld_postings WHERE workspace_id = %s AND path = %s",
                 (workspace_id, path))
    rows = rows or []
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO recalld_chunks (workspace_id, path, seq, start_line, end_line,"
                " heading, text, text_hash, author, doc_len)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(workspace_id, path, r.seq, r.start_line, r.end_line, r.heading, r.text,
                  r.text_hash, r.author, r.doc_len) for r in rows])
            with cur.copy("COPY recalld_postings (workspace_id, term, path, seq, tf, doc_len)"
                          " FROM STDIN") as copy:
                for r in rows:
                    for term, tf in zip(r.terms, r.tfs, strict=True):
                        copy.write_row((workspace_id, term, path, r.seq, tf, r.doc_len))
    added_len = sum(r.doc_len for r in rows)
    if removed or rows:
        conn.execute(
            "UPDATE recalld_workspaces SET search_chunks = search_chunks + %s,"
            " search_length = search_length + %s WHERE workspace_id = %s",
            (len(rows) - removed, added_len - removed_len, workspace_id))
    conn.execute("UPDATE recalld_files SET chunked_version = %s"
                 " WHERE workspace_id = %s AND path = %s", (version, workspace_id, path))


def workspace_max_chars(conn: Conn, workspace_id: int) -> int:
    """The chunk size the workspace's server chunks are made at (see the module)."""
    row = conn.execute("SELECT value FROM recalld_catalog WHERE workspace_id = %s"
                       " AND job = %s AND key = %s",
                       (workspace_id, RULES_JOB, RULES_KEY)).fetchone()
    size = row[0].get("max_chars") if row is not None and isinstance(row[0], dict) else None
    return size if isinstance(size, int) and size > 0 else DEFAULT_MAX_CHARS


def _rules_current(conn: Conn, workspace_id: int, max_chars: int) -> bool:
    """Whether the workspace's chunks are made under this host's rules (or newer) and at
    ``max_chars``."""
    row = conn.execute("SELECT value FROM recalld_catalog WHERE workspace_id = %s"
                       " AND job = %s AND key = %s",
                       (workspace_id, RULES_JOB, RULES_KEY)).fetchone()
    value = row[0] if row is not None and isinstance(row[0], dict) else {}
    rules, kept = value.get("rules"), value.get("server_text", 1)
    return (isinstance(rules, int) and rules >= CHUNKING
            and isinstance(kept, int) and kept >= SERVER_TEXT
            and workspace_max_chars(conn, workspace_id) == max_chars)


def start_chunking(conn: Conn, workspace_id: int, max_chars: int = DEFAULT_MAX_CHARS
                   ) -> bool:
    """Have every later upload of the workspace write its chunks (see the module), at
    ``max_chars``, and mark every file for chunking again when its chunks were made under
    older rules than this host's or at another size; whether it did. Where that is so
    already, only reads: a server that refuses writes (read-only) can still be searched."""
    chunked = conn.execute("SELECT search_chunked FROM recalld_workspaces"
                           " WHERE workspace_id = %s", (workspace_id,)).fetchone()
    # A flag committed true stays so, and every upload after this read sees it.
    if chunked is not None and chunked[0] is True and _rules_current(conn, workspace_id,
                                                                        max_chars):
        return False
    with conn.transaction():
        # The workspace row first, as an upload takes it: no upload writes chunks under
        # the old rules after the files are marked.
        conn.execute("SELECT 1 FROM recalld_workspaces WHERE workspace_id = %s FOR UPDATE",
                     (workspace_id,))
        conn.execute("UPDATE recalld_workspaces SET search_chunked = true"
                     " WHERE workspace_id = %s AND NOT search_chunked", (workspace_id,))
        if _rules_current(conn, workspace_id, max_chars):
            return False
        marked = conn.execute(
            "UPDATE recalld_files SET chunked_version = NULL"
            " WHERE workspace_id = %s AND chunked_version IS NOT NULL", (workspace_id,))
        conn.execute(
            "INSERT INTO recalld_catalog (workspace_id, job, key, value) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (workspace_id, job, key) DO UPDATE SET value = EXCLUDED.value,"
            " updated_at = now()", (workspace_id, RULES_JOB, RULES_KEY,
                                   Jsonb({"rules": CHUNKING, "server_text": SERVER_TEXT,
                                          "max_chars": max_chars})))
        return marked.rowcount > 0


def backfill_todo(conn: Conn, workspace_id: int, skip: list[str], *,
                  limit: int = BACKFILL_PAGE) -> tuple[int, list[tuple[str, int]]]:
    """The workspace's chunk size and up to ``limit`` files (path, version) whose chunks
    are missing or stale, but those of ``skip``. The caller makes each one's rows
    outside any transaction (``chunkplan.rows_of``: masking a big note takes long) and
    stores them with :func:`backfill_file`."""
    todo = conn.execute(
        "SELECT path, version FROM recalld_files WHERE workspace_id = %s"
        " AND chunked_version IS DISTINCT FROM version AND path <> ALL(%s)"
        " ORDER BY version LIMIT %s", (workspace_id, skip, limit)).fetchall()
    return (workspace_max_chars(conn, workspace_id),
            [(str(path), int(str(version))) for path, version in todo])


def file_at(conn: Conn, workspace_id: int, path: str, version: int
            ) -> tuple[bool, bytes | None]:
    """Whether ``path`` is still at ``version``, and its content then (None: deleted)."""
    row = conn.execute("SELECT content, deleted FROM recalld_files WHERE workspace_id = %s"
                       " AND path = %s AND version = %s",
                       (workspace_id, path, version)).fetchone()
    if row is None:
        return False, None
    data = row[0]
    assert isinstance(data, bytes | memoryview)
    return True, None if row[1] else bytes(data)


def backfill_file(conn: Conn, workspace_id: int, path: str, version: int,
                  rows: list[ChunkRow] | None, max_chars: int) -> bool:
    """Store ``path``'s chunk ``rows`` made from its ``version`` at ``max_chars``, in a
    transaction of its own, unless the file or the workspace's chunk size changed since
    (its upload wrote the chunks, or the next page makes them again); whether it did."""
    with conn.transaction():
        # The workspace row first, as an upload takes it: the same lock order.
        conn.execute("SELECT 1 FROM recalld_workspaces WHERE workspace_id = %s"
                     " FOR UPDATE", (workspace_id,))
        row = conn.execute(
            "SELECT version FROM recalld_files WHERE workspace_id = %s AND path = %s"
            " FOR UPDATE", (workspace_id, path)).fetchone()
        if (row is None or int(str(row[0])) != version
                or workspace_max_chars(conn, workspace_id) != max_chars):
            return False
        replace(conn, workspace_id, path, rows, version)
        return True
