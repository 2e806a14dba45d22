"""Search over one workspace: keyword branch, optional vector branch, fusion, links.

Results follow QwenPaw's documented shape and text form. With only the keyword branch,
``score`` is the BM25 score; with both, it is the fused score and ``vector`` / ``keyword``
show each branch's own score (``None`` on the wire, ``-`` in the text, where a branch
missed). Link expansion adds, after the hits, one chunk of each file a hit links to or is
linked from (``via`` names the hit): the file's best keyword match for the query, else its
first chunk saying more than headings, never a bare frontmatter block; so an agent sees the
neighbourhood.

The vector branch embeds the query through the workspace's backfill (LRU-cached, a short
deadline). When the provider fails, the answer is keyword-only with ``vector_error`` set:
a search never fails because of the embedding provider. Keyword hits that contain every
identifier-like or very rare query term are ``exact`` and rank first in either mode
(``exact.py``, ``fusion.py``, docs/adr/0010-hybrid-fusion.md). Hits of equal score
rank by place, path then line (``ties.py``).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import posixpath
import time
from collections.abc import Mapping
from typing import NotRequired, Protocol, TypedDict

from recalld.daemon import metrics
from recalld.daemon.arraytypes import F32
from recalld.daemon.config import SearchConfig
from recalld.daemon.index.filters import Filters, author_names, composed
from recalld.daemon.index.fusion import Fused, fuse, fuse_scores, guarded_weight, keep_within
from recalld.daemon.index.linked import body_part
from recalld.daemon.index.reads import Candidates, places
from recalld.daemon.index.service import WorkspaceIndex
from recalld.daemon.index.state import StoredChunk
from recalld.daemon.index.ties import Place, by_place
from recalld.daemon.index.tokenizer import tokenize_query
from recalld.daemon.index.windows import Window, around, holding
from recalld.daemon.memory.slugs import shows_no_word
from recalld.daemon.providers.errors import ProviderError
from recalld.ipc.errors import InvalidParams, PathOutsideWorkspace
from recalld.ipc.protocol import MAX_RESULTS
from recalld.ipc.textmatch import query_words
from recalld.ipc.types import render_result

log = logging.getLogger(__name__)

MAX_RESULTS_CAP = MAX_RESULTS
_DATE = "YYYY-MM-DD"


class CandidateSource(Protocol):
    """Where a search's candidates come from: ``WorkspaceIndex.candidates``, or the
    server of a shared workspace searched there (``remote/hook.py``)."""

    async def __call__(self, query: str, limit: int, filters: Filters,
                       query_vector: tuple[str, F32] | None, *, link_limit: int = 0,
                       keep: int | None = None) -> Candidates: ...




class SearchHit(TypedDict):
    """One result of ``memory.search`` (or a neighbour from link expansion)."""

    path: str
    start_line: int
    end_line: int
    text: str
    heading: str
    chunk_id: str
    score: float  # BM25 (keyword only) or fused; 0.0 for a neighbour
    vector: float | None  # each branch's own score, None where it missed
    keyword: float | None
    exact: NotRequired[bool]  # holds every special query term (exact.py)
    links: NotRequired[list[str]]  # paths this hit's file links to or is linked from
    via: NotRequired[str]  # a neighbour: the hit's path that links it
    agent_id: NotRequired[str]  # answers over several workspaces: whose hit
    rendered: NotRequired[str]  # idem: the hit's text form


class SearchAnswer(TypedDict):
    """The answer of ``memory.search``."""

    results: list[SearchHit]
    expanded: list[SearchHit]
    rendered: str  # the text form of every result, once
    vector_hits: int
    keyword_hits: int
    mode: str  # keyword | hybrid (| mixed over several workspaces)
    took_ms: float
    vector_error: NotRequired[str]  # why the vector branch was skipped
    keyword_weight: NotRequired[float]  # hybrid: the keyword weight used (blind-keyword guard)
    agents: NotRequired[list[str]]  # the workspaces searched, when several were
    skipped: NotRequired[dict[str, str]]  # those of ``agents`` not open, and why
    search_mode: NotRequired[str]  # a shared workspace: server | local (who answered)
    server_error: NotRequired[str]  # why the server did not answer (local answered)


def parse_filters(raw: Mapping[str, object] | None, *, root: str | None = None) -> Filters:
    """``{path_prefix, date_from, date_to, bucket, author}`` (strings or lists) to
    :class:`Filters`; a ``path_prefix`` naming ``root`` (the workspace folder) or a path
    in it by its absolute path is taken relative to it, any other from ``/`` from the
    workspace root (``/etc``: ``etc``, no error: a search of several workspaces takes
    each one's absolute paths, which name nothing in the others)."""
    if not raw:
        return Filters()
    known = {"path_prefix", "date_from", "date_to", "bucket", "author"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidParams(f"unknown filter(s): {', '.join(unknown)}")

    def strings(name: str) -> tuple[str, ...]:
        value = raw.get(name)
        if value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        # An empty list names nothing, as an empty string does: refused rather than
        # taken as no filter at all.
        if (not isinstance(items, list) or not items
                or not all(isinstance(v, str) and v for v in items)):
            raise InvalidParams(f"filter {name!r} must be a non-empty string or a non-empty "
                                "list of them")
        if name != "author" and any("\x00" in v for v in items):
            # A path no file can have: refused as a path named by a client is (not
            # taken as a filter that quietly matches nothing).
            raise PathOutsideWorkspace(f"filter {name!r} contains a NUL byte")
        return tuple(items)

    def day(name: str) -> str | None:
        value = raw.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not _is_date(value):
            raise InvalidParams(f"filter {name!r} must be a date {_DATE}, not {value!r}")
        return value

    date_from, date_to = day("date_from"), day("date_to")
    if date_from and date_to and date_from > date_to:
        raise InvalidParams(f"filter 'date_from' ({date_from}) is after 'date_to' ({date_to})")
    buckets = strings("bucket")
    for bucket in buckets:
        if "/" in bucket.strip("/") or bucket in (".", ".."):
            raise InvalidParams(f"filter 'bucket' must name a digest folder, not {bucket!r}")
    # Written as a shell would (./memory, memory//2026-07-23/): the same folder; "."
    # is the whole workspace, so no path filter at all.
    prefixes = tuple(posixpath.normpath(_inside(p, root).strip("/"))
                     for p in strings("path_prefix"))
    outside = [p for p in prefixes if p == ".." or p.startswith("../")]
    if outside:
        raise InvalidParams(f"filter 'path_prefix' must be inside the workspace, not "
                            f"{outside[0]!r}")
    if "." in prefixes:
        prefixes = ()
    return Filters(path_prefixes=prefixes, date_from=date_from,
                   date_to=date_to, buckets=buckets,
                   authors=author_names(strings("author")))


def _inside(path: str, root: str | None) -> str:
    """``path`` relative to ``root`` when it is ``root`` or below it (else as it is).
    Names alike but for Unicode normalisation are one name, as in the filters (a folder
    the disk spells decomposed, typed composed)."""
    if root is None or not path.startswith("/"):
        return path
    path, root = composed(posixpath.normpath(path)), composed(root)
    if path == root:
        return "."
    return path[len(root):] if path.startswith(root.rstrip("/") + "/") else path


def _is_date(value: str) -> bool:
    """Is ``value`` a calendar date written ``YYYY-MM-DD`` (ASCII digits)?"""
    if len(value) != len(_DATE) or value[4] != "-" or value[7] != "-":
        return False
    digits = value[:4] + value[5:7] + value[8:]
    if not (digits.isascii() and digits.isdigit()):
        return False
    try:
        datetime.date(int(value[:4]), int(value[5:7]), int(value[8:]))
    except ValueError:
        return False
    return True


def _result(chunk: StoredChunk, score: float, keyword: float | None,
            vector: float | None, window: Window | None = None,
            context_lines: int = -1) -> SearchHit:
    start, end, text = chunk.start_line, chunk.end_line, chunk.text
    if window is not None and context_lines >= 0:
        first, last, text = around(chunk.text, window, context_lines)
        start, end = chunk.start_line + first, chunk.start_line + last
    return {
        "path": chunk.path, "start_line": start, "end_line": end,
        "text": text, "heading": chunk.heading, "chunk_id": chunk.id,
        "score": score, "vector": vector, "keyword": keyword,
    }


def as_neighbour(hit: SearchHit, via: str) -> SearchHit | None:
    """``hit`` shown as a neighbour of the hit at ``via`` instead (a search of several
    workspaces cut it, while a hit kept links its note): its text without the note's
    frontmatter block, no score; None when nothing else is in it."""
    start = hit["start_line"]
    part = body_part(hit["text"]) if start == 1 else (hit["text"], 0)
    if part is None or not part[0].strip():
        return None
    text, skipped = part
    start += skipped
    return {
        "path": hit["path"], "start_line": start, "end_line": hit["end_line"],
        "text": text, "heading": hit["heading"], "chunk_id": hit["chunk_id"],
        "score": 0.0, "vector": None, "keyword": None, "via": via,
    }


def _mask_paths(hits: list[SearchHit], named: frozenset[str]) -> None:
    """Show the paths of ``hits`` (their own, their links', the hit they are linked
    from) that are named by a secret masked (``secret_names.py``)."""
    from recalld.daemon.memory.secret_names import shown_path

    for hit in hits:
        hit["path"] = shown_path(hit["path"], named)
        if "links" in hit:
            hit["links"] = [shown_path(p, named) for p in hit["links"]]
        if "via" in hit:
            hit["via"] = shown_path(hit["via"], named)


def fuse_branches(keyword: list[tuple[int, float]], vector: list[tuple[int, float]],
                  exact: set[int], config: SearchConfig,
                  chunks: Mapping[int, StoredChunk], *,
                  keyword_weight: float | None = None) -> list[Fused]:
    """The two branches fused as ``config`` says (``fusion.py``), the keyword branch's best
    hit within the first ``config.keyword_best_within``; ``keyword_weight`` stands in for
    the configured one (the blind-keyword guard's)."""
    if keyword_weight is None:
        keyword_weight = config.keyword_weight
    if config.fusion == "score":
        fused = fuse_scores(keyword, vector, keyword_weight=keyword_weight,
                            vector_weight=config.vector_weight, exact=exact,
                            lengths={key: len(c.text) for key, c in chunks.items()},
                            length_penalty=config.length_penalty)
    else:
        fused = fuse(keyword, vector, keyword_weight=keyword_weight,
                     vector_weight=config.vector_weight, k=config.rrf_k, exact=exact)
    # Ties in the order of their places, as in each branch (ties.py).
    place = places(chunks)

    def score(f: Fused) -> float:
        return f.score

    def where(f: Fused) -> Place:
        return place(f.key)

    fused = (by_place([f for f in fused if f.exact], score, where)
             + by_place([f for f in fused if not f.exact], score, where))
    # The keyword branch's best hit keeps a place among the first few (fusion.keep_within).
    return keep_within(fused, keyword[0][0] if keyword else None, config.keyword_best_within)


async def search(
    index: WorkspaceIndex,
    query: str,
    *,
    max_results: int,
    min_score: float | None,
    filters: Filters,
    config: SearchConfig,
    agent_id: str,
    source: CandidateSource | None = None,
) -> SearchAnswer:
    """Search ``index``; ``source`` stands in for ``index.candidates`` when another
    index holds the workspace (a shared workspace searched in the server)."""
    started = time.perf_counter()
    if filters.path_prefixes and index.state.secret_named:
        # A folder or note shown masked (as hits and memory.list show it) is filtered by.
        from recalld.daemon.memory.secret_names import real_prefixes

        filters = dataclasses.replace(filters, path_prefixes=real_prefixes(
            filters.path_prefixes, index.state.secret_named))
    pool = min(max_results * max(config.candidate_multiplier, 1), config.max_candidates)
    query_vector = None
    vector_error: str | None = None
    worker = index.vectors
    # A blank query means nothing to either branch (an embedding of it ranks every chunk),
    # nor does one that shows no word (zero-width spaces, a byte order mark, a lone
    # combining mark, only punctuation or markup: ``#``, ``---``): the provider is not
    # asked, as no chunk of the kind is embedded (``VectorFill``).
    # Without vectors serving, the query goes to no provider: nothing to mask, and a
    # keyword search (a warm start's first answer among them) does not wait for the
    # redaction rules to be imported. Nor does a query whose filters pass no chunk: it
    # has no result, whatever its vector (a paid call for nothing).
    if (worker is not None and query.strip() and worker.embeds_queries()
            and not shows_no_word(query)
            and (source is not None or await index.allows_any(filters, query))):
        # Masked, as the chunks it is compared with were: a key pasted into a message
        # that a recall searches with never reaches the embedding provider.
        from recalld.daemon.memory.redact import redact_async

        try:
            query_vector = await worker.query_vector(await redact_async(query))
        except ProviderError as exc:
            vector_error = str(exc)
            log.warning("search agent=%s: vector branch skipped: %s", agent_id, exc)
    link_limit = ((max_results if query_vector is None else 2 * max_results)
                  if config.link_expansion else 0)
    keep = max_results if query_vector is None else None
    if source is None:
        found = await index.candidates(
            query, max(pool, max_results), filters, query_vector, link_limit=link_limit,
            keep=keep, windows=config.context_lines >= 0)
    else:
        found = await source(query, max(pool, max_results), filters, query_vector,
                             link_limit=link_limit, keep=keep)
    keyword_hits, vector_hits, exact, chunks = (
        found.keyword, found.vector, found.exact, found.chunks)
    hybrid = query_vector is not None
    results: list[SearchHit] = []
    keyword_weight = config.keyword_weight
    if hybrid:
        # A keyword branch that sees little of the query (no exact hit, a low reach) weighs
        # less, so its chance matches do not bury the vector branch's hits.
        if not exact:
            keyword_weight = guarded_weight(keyword_weight, found.reach,
                                            full_at=config.keyword_guard)
        terms = frozenset(tokenize_query(query)) if found.windows else frozenset()
        phrases = query_words(query).phrases if found.windows else frozenset()
        for f in fuse_branches(keyword_hits, vector_hits, exact, config, chunks,
                               keyword_weight=keyword_weight):
            hit, window = chunks[f.key], found.windows.get(f.key)
            if window is not None and f.keyword is not None:
                # A keyword hit shows the lines holding the query's terms, not the vector
                # branch's best window (which may lack them).
                window = holding(hit.text, config.vector_window_chars, terms, window,
                                 phrases)
            item = _result(hit, f.score, f.keyword, f.vector, window,
                           config.context_lines)
            if f.exact:
                item["exact"] = True
            results.append(item)
    else:
        for key, score in keyword_hits[:max_results]:
            item = _result(chunks[key], score, score, None)
            if key in exact:
                item["exact"] = True
            results.append(item)
    if min_score is not None:
        results = [r for r in results if r["score"] >= min_score]
    results = results[:max_results]

    expanded: list[SearchHit] = []
    if config.link_expansion and results:
        hit_paths = [r["path"] for r in results]
        links = found.links
        for r in results:
            r["links"] = links.get(r["path"], [])
        seen = set(hit_paths)
        extra: dict[str, str] = {}
        for path in hit_paths:
            for other in links.get(path, []):
                if other not in seen and other not in extra:
                    extra[other] = path
        firsts = found.firsts
        queue = list(extra)
        # The first ``max_results`` neighbours with a chunk to show: one without (an empty
        # note, a bare frontmatter block) leaves its place to the next.
        while queue and len(expanded) < max_results:
            picked, queue = queue[:max_results], queue[max_results:]
            # The chunk of the section the hit's link names, if it names one.
            wanted = {path: (path, found.sections.get((extra[path], path), ""))
                      for path in picked}
            missing = [target for target in wanted.values() if target not in firsts]
            if hybrid and missing and source is None:
                # The candidates' neighbours were read before fusion ranked them: a result
                # ranked up from deep in the pool may link files not read then.
                firsts = {**firsts, **await index.linked_chunks(query, missing)}
            for path in picked:
                chunk = firsts.get(wanted[path])
                if chunk is None or len(expanded) == max_results:
                    continue
                item = _result(chunk, 0.0, None, None)
                item["via"] = extra[path]
                expanded.append(item)
    named = index.state.secret_named
    if named:
        _mask_paths([*results, *expanded], named)
    took_ms = (time.perf_counter() - started) * 1000
    metrics.observe("recalld_search_seconds", took_ms / 1000)
    log.info("search agent=%s vector_hits=%d keyword_hits=%d results=%d took_ms=%.2f",
             agent_id, len(vector_hits), len(keyword_hits), len(results), took_ms)
    answer: SearchAnswer = {
        "results": results,
        "expanded": expanded,
        # The text form once, for all results (not per result: it would send each text
        # twice more; clients render a single hit from its fields).
        "rendered": "\n\n".join(render_result(r, hybrid=hybrid) for r in results),
        "vector_hits": len(vector_hits),
        "keyword_hits": len(keyword_hits),
        "mode": "hybrid" if hybrid else "keyword",
        "took_ms": round(took_ms, 3),
    }
    if hybrid:
        answer["keyword_weight"] = round(keyword_weight, 4)
    if vector_error is not None:
        answer["vector_error"] = vector_error
    return answer
