"""Searching a shared workspace in PostgreSQL: the candidates of one search, from the server.

The server holds every chunk of the workspace with its recalld terms (``chunks.py``), so
both branches run there and hand :func:`recalld.daemon.index.search.search` the same
:class:`~recalld.daemon.index.reads.Candidates` the local index would; fusion, exact
ranking and the result format are the local ones.

- Keyword: BM25 as ``bm25.BM25Index`` computes it (Lucene's IDF over every chunk of the
  workspace, k1 1.2, b 0.75, the same length counting), scored in SQL over the postings
  of the query's terms (``recalld_postings``, read by an index-only scan of its primary
  key); the document frequencies are counts over the same index.
  :class:`ServerKeywords` is that index for ``exact.exact_first``, so identifier and
  rare-term hits rank first as they do locally (the chunks holding every term of a
  lookup read from the postings as there), and it gives the keyword reach the
  blind-keyword guard weighs the branch by (``fusion.keyword_reach``).
- Vectors: the stored embeddings of the workspace's chunk texts (``recalld_embeddings``,
  filled by the hosts' backfill) through a pgvector HNSW index of the vector space
  (built in the background after the first search of the space:
  :func:`build_vector_index`; an exact scan until then), cosine similarity as hnswlib's.

Filters (path prefix, dates, bucket, author) are SQL conditions. Link expansion needs
the link graph, which stays local: server answers carry no ``expanded`` neighbours.
Blocking psycopg calls: run them in worker threads.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import psycopg
from psycopg import sql
from pyroaring import BitMap

from recalld.daemon.arraytypes import F32
from recalld.daemon.index.bm25_search import ALL_HOLDERS
from recalld.daemon.index.chunker import chunk_id
from recalld.daemon.index.exact import exact_first
from recalld.daemon.index.filters import CALENDAR_DAY, Filters, composed
from recalld.daemon.index.fusion import keyword_reach
from recalld.daemon.index.reads import Candidates, places
from recalld.daemon.index.state import StoredChunk
from recalld.daemon.index.ties import exact_by_place, hits_by_place, settled
from recalld.daemon.index.tokenizer import tokenize_query
from recalld.daemon.remote.chunks import from_pg, pg_exact

Conn = psycopg.Connection[tuple[object, ...]]

K1 = 1.2
B = 0.75
# pgvector's HNSW candidate list: at least this, and never below the branch's pool.
EF_SEARCH_MIN = 64

_CHUNK_COLUMNS = "c.path, c.seq, c.start_line, c.end_line, c.heading, c.text"
# filters.note_date's rule in PostgreSQL's regular expressions (ASCII digits: ``\d``
# takes every script's under an ICU locale), with the same calendar days.
_DAILY_DATE = rf"(?:^|/)({CALENDAR_DAY})(?:/|\.md$|$)"


def filter_sql(filters: Filters, *, daily_dir: str, digest_dir: str
               ) -> tuple[sql.Composable, list[object]]:
    """``filters`` as conditions on ``recalld_chunks c`` (each begins with AND), and their
    parameters: what ``IndexState.allowed`` keeps."""
    parts: list[sql.Composable] = []
    params: list[object] = []
    # Paths compared composed (NFC), as IndexState.allowed compares them; only for a
    # name that is not ASCII (an ASCII one is alike in every form, and normalize() needs a
    # UTF8 database).
    prefixes = [composed(p.strip("/")) for p in filters.path_prefixes]
    buckets = [composed(f"{digest_dir}/{b.strip('/')}/") for b in filters.buckets]
    ascii_names = all(name.isascii() for name in (*prefixes, *buckets))
    path = sql.SQL("c.path" if ascii_names else "normalize(c.path, NFC)")
    if prefixes:
        parts.append(sql.SQL(" AND ({path} = ANY(%s) OR EXISTS (SELECT 1 FROM unnest(%s::text[])"
                             " p WHERE starts_with({path}, p || '/')))").format(path=path))
        params += [prefixes, prefixes]
    if filters.buckets:
        parts.append(sql.SQL(" AND EXISTS (SELECT 1 FROM unnest(%s::text[]) p"
                             " WHERE starts_with({path}, p))").format(path=path))
        params.append(buckets)
    if filters.date_from or filters.date_to:
        day = sql.SQL("substring(c.path from {})").format(sql.Literal(_DAILY_DATE))
        parts.append(sql.SQL(" AND starts_with(c.path, %s)"))
        params.append(daily_dir + "/")
        if filters.date_from:
            parts.append(sql.SQL(" AND {} >= %s").format(day))
            params.append(filters.date_from)
        if filters.date_to:
            parts.append(sql.SQL(" AND {} <= %s").format(day))
            params.append(filters.date_to)
    if filters.authors:
        # One author per line of the column (chunks.author_column), each written as a
        # text value can hold it: a name with a NUL (a client's, or a note's YAML "\0")
        # is compared as the column has it, not sent where no text value takes it.
        parts.append(sql.SQL(" AND string_to_array(c.author, E'\\n') && %s::text[]"))
        params.append([pg_exact(a) for a in filters.authors])
    return sql.Composed(parts), params


class ServerKeywords:
    """BM25 over a shared workspace's chunks in PostgreSQL, keyed like a local index: the
    chunks a search meets get small integer keys (``chunks`` holds them), so ``exact.py``
    and fusion work on them unchanged. Statistics are read once, at construction: one
    search sees one state of the workspace."""

    def __init__(self, conn: Conn, workspace_id: int, where: sql.Composable,
                 where_params: Sequence[object]) -> None:
        self._conn = conn
        self._ws = workspace_id
        self._where = where
        self._where_params = list(where_params)
        row = conn.execute("SELECT search_chunks, search_length FROM recalld_workspaces"
                           " WHERE workspace_id = %s", (workspace_id,)).fetchone()
        self._n = 0 if row is None else int(str(row[0]))
        self._total = 0 if row is None else int(str(row[1]))
        self._df: dict[str, int] = {}
        self._keys: dict[tuple[str, int], int] = {}
        self._places: list[tuple[str, int]] = [("", 0)]  # key 0 unused
        self.chunks: dict[int, StoredChunk] = {}

    def __len__(self) -> int:
        return self._n

    def doc_freq(self, term: str) -> int:
        return self._doc_freqs([term])[term]

    def _doc_freqs(self, terms: Sequence[str]) -> dict[str, int]:
        missing = [t for t in dict.fromkeys(terms) if t not in self._df]
        if missing:
            rows = self._conn.execute(
                "SELECT term, count(*) FROM recalld_postings WHERE workspace_id = %s"
                " AND term = ANY(%s::text[]) GROUP BY term", (self._ws, missing)).fetchall()
            self._df.update(dict.fromkeys(missing, 0))
            self._df.update((str(t), int(str(n))) for t, n in rows)
        return {t: self._df[t] for t in terms}

    def key(self, row: Sequence[object]) -> int:
        """The key of the chunk in ``row`` (columns as ``_CHUNK_COLUMNS``), built once."""
        place = (str(row[0]), int(str(row[1])))
        key = self._keys.get(place)
        if key is None:
            key = self._keys[place] = len(self._places)
            self._places.append(place)
            path, start, end = place[0], int(str(row[2])), int(str(row[3]))
            text, heading = from_pg(str(row[5])), from_pg(str(row[4]))
            self.chunks[key] = StoredChunk(key, chunk_id(path, start, end, text), path,
                                           start, end, text, heading, {})
        return key

    def score_keys(self, query_tokens: list[str], keys: Iterable[int]) -> dict[int, float]:
        """The scores :meth:`search` gives ``keys`` for the query (keys that match no
        query term are left out)."""
        wanted = BitMap(keys)
        if not wanted:
            return {}
        return dict(self.search(query_tokens, len(wanted), allowed=wanted))

    def holders_of_all(self, terms: list[str], *,
                       allowed: BitMap | None = None) -> list[int] | None:
        """The keys of every chunk holding all of ``terms`` (in ``allowed`` if given),
        as ``BM25Index.holders_of_all`` gives them: the rarest term's postings, each looked
        up in the others' (by the postings' primary key); None when the rarest has more
        than ``ALL_HOLDERS`` postings (or there are no terms)."""
        df = self._doc_freqs(terms)
        if not df:
            return None
        rarest = min(df, key=df.__getitem__)
        if df[rarest] > ALL_HOLDERS:
            return None
        if df[rarest] == 0:
            return []
        if (kept := self._only(allowed)) is None:
            return []
        only, only_params = kept
        query = sql.SQL(
            "SELECT {cols} FROM recalld_postings p JOIN recalld_chunks c"
            " ON c.workspace_id = p.workspace_id AND c.path = p.path AND c.seq = p.seq"
            " WHERE p.workspace_id = %s AND p.term = %s{where}{only}"
            " AND NOT EXISTS (SELECT 1 FROM unnest(%s::text[]) t(term) WHERE NOT EXISTS"
            " (SELECT 1 FROM recalld_postings o WHERE o.workspace_id = p.workspace_id"
            " AND o.term = t.term AND o.path = p.path AND o.seq = p.seq))"
            " ORDER BY p.path, p.seq"
        ).format(cols=sql.SQL(_CHUNK_COLUMNS), where=self._where, only=only)
        others = [t for t in df if t != rarest]
        rows = self._conn.execute(query, [self._ws, rarest, *self._where_params,
                                          *only_params, others]).fetchall()
        return sorted(self.key(r) for r in rows)

    def _only(self, allowed: BitMap | None) -> tuple[sql.Composable, list[object]] | None:
        """The condition keeping postings ``p`` to the chunks of ``allowed`` (none when
        it is None), and its parameters; None when no key of it is known."""
        if allowed is None:
            return sql.SQL(""), []
        places = [self._places[k] for k in allowed if 0 < k < len(self._places)]
        if not places:
            return None
        return (sql.SQL(" AND (p.path, p.seq) IN (SELECT * FROM unnest(%s::text[], %s::int[]))"),
                [[p for p, _ in places], [s for _, s in places]])

    def search(self, query_tokens: list[str], limit: int, *,
               allowed: BitMap | None = None) -> list[tuple[int, float]]:
        """Top ``limit`` (key, score), best first; only keys in ``allowed`` if given."""
        n = self._n
        if n == 0 or limit <= 0 or not query_tokens:
            return []
        counts = Counter(query_tokens)
        df = self._doc_freqs(list(counts))
        terms: list[str] = []
        factors: list[float] = []
        for term, qf in counts.items():
            if df[term] == 0:
                continue
            idf = math.log(1.0 + (n - df[term] + 0.5) / (df[term] + 0.5)) * qf
            terms.append(term)
            factors.append(idf * (K1 + 1.0))
        if not terms:
            return []
        avgdl = self._total / n if self._total else 1.0
        if (kept := self._only(allowed)) is None:
            return []
        only, only_params = kept
        # Filters name chunk columns (the author): join the chunks only for them.
        chunks = (sql.SQL(" JOIN recalld_chunks c ON c.workspace_id = p.workspace_id"
                          " AND c.path = p.path AND c.seq = p.seq")
                  if self._where_params else sql.SQL(""))
        query = sql.SQL(
            "WITH q(term, factor) AS (SELECT * FROM unnest(%s::text[], %s::float8[]))"
            " SELECT {cols}, s.score FROM ("
            " SELECT p.path, p.seq, sum(p.tf::float8 / (%s * (1 - %s + %s * (p.doc_len / %s))"
            " + p.tf) * q.factor) AS score FROM q JOIN recalld_postings p"
            " ON p.workspace_id = %s AND p.term = q.term{chunks}"
            " WHERE true{where}{only} GROUP BY p.path, p.seq"
            " ORDER BY score DESC, p.path, p.seq LIMIT %s)"
            " s JOIN recalld_chunks c ON c.workspace_id = %s AND c.path = s.path"
            " AND c.seq = s.seq ORDER BY s.score DESC, s.path, s.seq"
        ).format(cols=sql.SQL(_CHUNK_COLUMNS), chunks=chunks, where=self._where, only=only)
        params: list[object] = [terms, factors, K1, B, B, avgdl, self._ws,
                             *self._where_params, *only_params, limit, self._ws]
        rows = self._conn.execute(query, params).fetchall()
        return [(self.key(r), float(str(r[6]))) for r in rows]


def index_name(space: str, dims: int) -> str:
    digest = hashlib.blake2b(space.encode(), digest_size=6).hexdigest()
    return f"recalld_embeddings_hnsw_{dims}_{digest}"


def has_vector_index(conn: Conn, space: str, dims: int) -> bool:
    """Whether the HNSW index of the vector space exists and is usable."""
    row = conn.execute("SELECT x.indisvalid FROM pg_class c JOIN pg_index x"
                       " ON x.indexrelid = c.oid WHERE c.relname = %s",
                       (index_name(space, dims),)).fetchone()
    return row is not None and bool(row[0])


def build_vector_index(conn: Conn, space: str, dims: int) -> None:
    """Build the HNSW index (cosine) of one vector space's embeddings, once for the whole
    server: on the vectors cast to their dimension, partial on the space. Built
    ``CONCURRENTLY`` (writers of embeddings go on meanwhile) without a statement timeout,
    on an autocommit connection of its own: it may take minutes for a large space. A
    build that failed half-way leaves an invalid index, which is dropped and built again."""
    name = index_name(space, dims)
    if has_vector_index(conn, space, dims):
        return
    conn.execute("SET statement_timeout = 0")
    conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON recalld_embeddings USING hnsw"
        " ((embedding::vector({dims})) vector_cosine_ops) WHERE space = {space}"
    ).format(name=sql.Identifier(name), dims=sql.Literal(dims), space=sql.Literal(space)))


def _vector_text(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def vector_search(conn: Conn, workspace_id: int, kw: ServerKeywords, space: str,
                  vector: Sequence[float], limit: int, where: sql.Composable,
                  where_params: Sequence[object]) -> list[tuple[int, float]]:
    """The ``limit`` chunks nearest to ``vector`` (cosine similarity), best first: through
    the space's HNSW index once it is built (:func:`build_vector_index`), by an exact scan
    of the workspace's vectors before."""
    dims = len(vector)
    distance = sql.SQL("(e.embedding::vector({d}) <=> %s::vector({d}))").format(
        d=sql.Literal(dims))
    # The chunk condition sits inside the index scan: with pgvector's iterative scan the
    # HNSW walk goes on until enough embeddings of live (and, filtered, allowed) chunks
    # were found, rather than cutting the list first.
    query = sql.SQL(
        "WITH near AS MATERIALIZED (SELECT e.text_hash, {dist} AS dist"
        " FROM recalld_embeddings e WHERE e.space = {space} AND e.workspace_id = %s"
        " AND e.embedding IS NOT NULL AND EXISTS (SELECT 1 FROM recalld_chunks c"
        " WHERE c.workspace_id = %s AND c.text_hash = e.text_hash{where})"
        " ORDER BY {dist} LIMIT %s)"
        " SELECT {cols}, 1 - near.dist FROM near JOIN recalld_chunks c"
        " ON c.workspace_id = %s AND c.text_hash = near.text_hash{where}"
        " ORDER BY near.dist, c.path, c.seq LIMIT %s"
    ).format(dist=distance, space=sql.Literal(space), cols=sql.SQL(_CHUNK_COLUMNS),
             where=where)
    text = _vector_text(vector)
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(
            sql.Literal(min(1000, max(EF_SEARCH_MIN, 2 * limit)))))
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        rows = conn.execute(query, [text, workspace_id, workspace_id, *where_params, text,
                                    limit, workspace_id, *where_params, limit]).fetchall()
    return [(kw.key(r), float(str(r[6]))) for r in rows]


def candidates(conn: Conn, workspace_id: int, query: str, limit: int, filters: Filters,
               query_vector: tuple[str, F32] | None, *, daily_dir: str, digest_dir: str,
               keep: int | None = None) -> Candidates:
    """What :func:`recalld.daemon.index.search.search` needs of one search, from the
    server: keyword hits (exact ones first), vector hits, their chunks."""
    where, params = filter_sql(filters, daily_dir=daily_dir, digest_dir=digest_dir)
    kw = ServerKeywords(conn, workspace_id, where, params)
    tokens = tokenize_query(query)
    place = places(kw.chunks)
    hits, exact = exact_first(query, kw, settled(lambda n: kw.search(tokens, n), limit, place,
                                                      keep=keep),
                              kw.chunks, limit=limit, tokens=tokens)
    if exact:
        hits = exact_by_place(hits, exact, place)
    chunks = {key: kw.chunks[key] for key, _ in (hits if keep is None else hits[:keep])}
    vec_hits: list[tuple[int, float]] = []
    reach = 1.0
    if query_vector is not None:
        space, vector = query_vector
        vec_hits = vector_search(conn, workspace_id, kw, space, [float(x) for x in vector],
                                 limit, where, params)
        vec_hits = hits_by_place(vec_hits, place)
        chunks.update((key, kw.chunks[key]) for key, _ in vec_hits)
        # The blind-keyword guard's measure, as the local index takes it (the terms'
        # document frequencies are those the scoring read).
        reach = keyword_reach(tokens, hits[0][1] if hits else 0.0, kw.doc_freq, len(kw))
    return Candidates(hits, vec_hits, exact, chunks, {}, {}, reach)
