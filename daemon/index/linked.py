"""The chunk that stands for a linked note beside a search hit.

Pure and synchronous: reads an :class:`~recalld.daemon.index.state.IndexState` under the
caller's index lock and changes nothing in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from recalld.daemon.index.chunktable import StoredChunk
from recalld.daemon.index.frontmatter import body_of
from recalld.daemon.index.tokenizer import tokenize_query

if TYPE_CHECKING:
    from recalld.daemon.index.state import IndexState

__all__ = ["linked_chunks"]


def linked_chunks(state: IndexState, query: str, paths: Sequence[str], *,
                  tokens: list[str] | None = None) -> dict[str, StoredChunk]:
    """For each of ``paths`` (linked files), the chunk that stands for it beside a hit:
    its best keyword match for ``query``, else its first chunk with body text, shown
    without the note's frontmatter block (its lines start after it). A file whose
    chunks are all bare frontmatter has none (a block of keys tells an agent little).
    ``tokens``: ``tokenize_query(query)`` when the caller has it."""
    # Only a file of several chunks has a best match to look for: a one-chunk file's
    # candidate is that chunk either way, so it costs no search.
    owner: dict[int, str] = {}
    for path in paths:
        info = state.files.get(path)
        if info is not None and len(info.keys) > 1:
            owner.update((key, path) for key in info.keys)
    out: dict[str, StoredChunk] = {}
    if owner:
        scores = state.bm25.score_keys(
            tokenize_query(query) if tokens is None else tokens, owner)
        for key in sorted(scores, key=lambda k: (-scores[k], k)):
            path = owner[key]
            if path not in out:
                chunk = _body_chunk(state.chunks[key])
                if chunk is not None:
                    out[path] = chunk
    for path in paths:
        info = state.files.get(path)
        if path in out or info is None:
            continue
        for key in info.keys:
            chunk = _body_chunk(state.chunks[key])
            if chunk is not None:
                out[path] = chunk
                break
    return {path: out[path] for path in paths if path in out}


@lru_cache(maxsize=4096)
def _body_of(text: str) -> tuple[str, int]:
    """:func:`body_of`, remembered: the same linked notes come back search after search, and
    parsing their frontmatter block is most of what picking their chunk costs."""
    return body_of(text)


def _body_chunk(chunk: StoredChunk) -> StoredChunk | None:
    """``chunk`` without a leading frontmatter block (None when nothing else is in it)."""
    text = chunk.text
    if not text.lstrip("\ufeff").startswith("---"):
        # No fence on the first line: no frontmatter block to strip.
        return chunk if text.strip() else None
    body, skipped = _body_of(text)
    if not body.strip():
        return None
    if not skipped:
        return chunk
    return chunk._replace(text=body, start_line=chunk.start_line + skipped)
