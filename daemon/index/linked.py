"""The chunk that stands for a linked note beside a search hit.

Synchronous: reads an :class:`~recalld.daemon.index.state.IndexState` under the caller's
index lock and changes nothing in it but its memo of the chunk standing for each note
(:attr:`~recalld.daemon.index.state.IndexState.standing`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Final

from recalld.daemon.index.chunktable import StoredChunk
from recalld.daemon.index.frontmatter import body_of
from recalld.daemon.index.links import Link
from recalld.daemon.index.tokenizer import tokenize_query

if TYPE_CHECKING:
    from recalld.daemon.index.state import IndexState

__all__ = ["Target", "body_part", "heading_key", "in_section", "linked_chunks",
           "linked_sections", "stands"]

_HEADING_RE: Final = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")

#: Most notes whose standing chunk :attr:`IndexState.standing` keeps (then it starts anew).
STANDING_MEMO_MAX: Final = 4096


#: A linked note and the section its link names (``[[Node#Part]]``: ``"Part"``; ``""``
#: for the whole note, and for a link found the other way, from the note to the hit).
Target = tuple[str, str]

# Characters a heading may hold that a link to it cannot (they end its name or start
# another part): Obsidian writes a space in their place in the links it makes.
_UNLINKABLE: Final = str.maketrans(dict.fromkeys("#^[]|", " "))


def heading_key(heading: str) -> str:
    """``heading`` as a link names it, for comparing: any case, Unicode form and run of
    spaces, and a space for a character no link holds (``## C# tips``: ``[[n#c tips]]``)."""
    text = heading.translate(_UNLINKABLE)
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    return " ".join(text.casefold().split())


def in_section(headings: Sequence[str], section: str) -> bool:
    """Whether a chunk under ``headings`` (its heading path, outermost first) lies in the
    section a link names: ``Part``, or nested as Obsidian writes it, ``Part#Inner``
    (each heading under the one before it, not necessarily right under it); a section
    holds the sections under its heading."""
    parts = [key for key in map(heading_key, section.split("#")) if key]
    if not parts:
        return False
    keys = [heading_key(h) for h in headings]
    at = 0
    for part in parts:
        while at < len(keys) and keys[at] != part:
            at += 1
        if at == len(keys):
            return False
        at += 1
    return True


def linked_sections(src: str, links: Iterable[Link]) -> Iterator[tuple[tuple[str, str], str]]:
    """((``src``, a note linked), the section the first of ``links`` to it naming one
    names) for the notes whose links name a section."""
    seen: set[str] = set()
    for lk in links:
        if lk.heading and lk.dst not in seen:
            seen.add(lk.dst)
            yield (src, lk.dst), lk.heading


def linked_chunks(state: IndexState, query: str, targets: Sequence[Target], *,
                  tokens: list[str] | None = None) -> dict[Target, StoredChunk]:
    """For each of ``targets`` (linked files, each with the section its link names), the
    chunk that stands for it beside a hit: its best keyword match for ``query``, else its
    first chunk that says more than headings (else its first with any text), shown without
    the note's frontmatter block (its lines start after it): a note that opens with its
    title and a subheading has a chunk of those headings alone, which tells an agent
    nothing. Where a link names a section, the chunks of that section stand, picked alike;
    a section gone from the note (renamed, removed, a block reference) names none, and the
    whole note's stand. A file
    whose chunks are all bare frontmatter has none (a block of keys tells an agent little).
    ``tokens``: ``tokenize_query(query)`` when the caller has it."""
    candidates: dict[Target, list[int]] = {}
    for target in targets:
        path, section = target
        info = state.files.get(path)
        if info is None or target in candidates:
            continue
        inside = _section_keys(state, info.keys, section) if section else []
        candidates[target] = inside or list(info.keys)
    # Only several candidates have a best match to look for: one chunk stands either way,
    # so it costs no search.
    searched = {key for keys in candidates.values() if len(keys) > 1 for key in keys}
    scores = state.bm25.score_keys(
        tokenize_query(query) if tokens is None else tokens, searched) if searched else {}
    out: dict[Target, StoredChunk] = {}
    for target, keys in candidates.items():
        best = sorted((k for k in keys if k in scores), key=lambda k: (-scores[k], k))
        chunk = None
        for key in best:
            chunk = _body_chunk(state.chunks[key])
            if chunk is not None:
                break
        else:
            said = _standing(state, target, keys)
            chunk = None if said is None else _body_chunk(state.chunks[said])
        if chunk is not None:
            out[target] = chunk
    return out


def stands(state: IndexState, path: str) -> bool:
    """Whether the note at ``path`` has a chunk that can stand for it beside a hit (one
    :func:`linked_chunks` would pick: not blank, not a bare frontmatter block). A note
    without one (empty, as a click on a link to a missing note creates it, or nothing but
    keys) is no neighbour to show, and takes no place among those shown."""
    info = state.files.get(path)
    return info is not None and _standing(state, (path, ""), info.keys) is not None


def _standing(state: IndexState, target: Target, keys: Sequence[int]) -> int | None:
    """The key of :func:`_said_first` of ``keys`` (the chunks of ``target``), remembered in
    ``state.standing``: the same linked notes come back search after search, and a note
    without a keyword match reads its chunks' texts in order until one says more than
    headings."""
    memo = state.standing
    if target in memo:
        return memo[target]
    chunk = _said_first(state, keys)
    if len(memo) >= STANDING_MEMO_MAX:
        memo.clear()
    key = memo[target] = None if chunk is None else chunk.key
    return key


def _section_keys(state: IndexState, keys: Iterable[int], section: str) -> list[int]:
    """The keys among ``keys`` of chunks in the section ``section`` names."""
    found = []
    for key in keys:
        chunk = state.chunks[key]
        headings = chunk.metadata.get("headings")
        if not isinstance(headings, list):
            # A chunk kept from ReMe's records: its heading path joined.
            headings = chunk.heading.split(" > ") if chunk.heading else []
        if in_section([str(h) for h in headings], section):
            found.append(key)
    return found


def _said_first(state: IndexState, keys: Iterable[int]) -> StoredChunk | None:
    """The first of the chunks of ``keys`` that says more than its headings, else the first
    with any text, each without a leading frontmatter block (None when none has text).
    Read in order, and only as far as needed: a long note's chunks are not all read."""
    first = None
    for key in keys:
        chunk = _body_chunk(state.chunks[key])
        if chunk is None:
            continue
        if any(line.strip() and not _HEADING_RE.match(line)
               for line in chunk.text.splitlines()):
            return chunk
        if first is None:
            first = chunk
    return first


@lru_cache(maxsize=4096)
def _body_of(text: str) -> tuple[str, int]:
    """:func:`body_of`, remembered: the same linked notes come back search after search, and
    parsing their frontmatter block is most of what picking their chunk costs."""
    return body_of(text)


def body_part(text: str) -> tuple[str, int] | None:
    """``text`` (a chunk's, from the note's first line) without a leading frontmatter
    block, and the lines that block took; None when nothing else is in it."""
    if not text.lstrip("\ufeff").startswith(("---", "+++", "{")):
        # No fence (nor a JSON object's brace) on the first line: no block to strip.
        return (text, 0) if text.strip() else None
    body, skipped = _body_of(text)
    return (body, skipped) if body.strip() else None


def _body_chunk(chunk: StoredChunk) -> StoredChunk | None:
    """``chunk`` without a leading frontmatter block (None when nothing else is in it)."""
    part = body_part(chunk.text)
    if part is None:
        return None
    body, skipped = part
    if not skipped:
        return chunk
    return chunk._replace(text=body, start_line=chunk.start_line + skipped)
