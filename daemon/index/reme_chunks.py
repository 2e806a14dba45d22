"""Chunk boundaries for notes ReMe (QwenPaw's memory) has already chunked and embedded.

ReMe 0.4.2's chunk texts are Markdown rendered again by its own chunker (heading
breadcrumb, ``[Part X/N]``), so recalld's chunker never produces the same texts, and no
vector ReMe paid for could be reused by text. For a note ReMe chunked, recalld keeps
ReMe's boundaries and texts (decision and measurement: docs/adr/0015-reme-chunk-boundaries.md)
as long as the note still says what those chunks say, checked on content (file times
change with copies and checkouts); once the note changes it is chunked by
:mod:`chunker` like any other. Pure functions on plain data, so they run in the indexing
worker processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recalld.daemon.index.chunker import Chunk, ChunkMeta
from recalld.daemon.index.frontmatter import parse_frontmatter


@dataclass(frozen=True, slots=True)
class ReMeChunk:
    """One chunk of ReMe's store (lines 1-based, inclusive)."""

    start_line: int
    end_line: int
    text: str
    embedding: str | None = None


# ------------------------------------------------------------------- chunk boundaries


#: Punctuation that belongs to a number, date, time or version when it touches a digit
#: (2.5, -3, 10:30, 2026-06-13, v2.3.1, 1,000): rendering Markdown again keeps it, and an
#: edit may change nothing else ("v2.3.1" to "v23.1", "-200" to "200").
_NUMBER_MARKS = frozenset(".,:/+-")


def _alnum(text: str) -> str:
    """The letters and digits of ``text``, with the punctuation of its numbers: what
    rendering Markdown again cannot change."""
    last = len(text) - 1
    return "".join(
        ch for i, ch in enumerate(text)
        if ch.isalnum() or (ch in _NUMBER_MARKS and (
            (i > 0 and text[i - 1].isdigit()) or (i < last and text[i + 1].isdigit())))
    ).casefold()


def _reme_block_end(lines: Sequence[str]) -> int:
    """Where the body starts for ReMe: after a ``---`` fenced block at the top, whether or
    not its YAML reads (ReMe leaves out a block it cannot parse; recalld's reader takes
    less YAML than ReMe's, e.g. no anchors or repeated keys); 0 without one."""
    if not lines or lines[0].strip() != "---":
        return 0
    return next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)


def adopt_chunks(path: str, text: str, reme: Sequence[ReMeChunk]) -> list[Chunk] | None:
    """ReMe's chunks of ``path`` as recalld chunks, if the note still says what they say.

    The note matches when every group of chunks over one line range starts and ends on a
    line with text and contains the letters and digits of its lines in order (with the
    punctuation inside their numbers), and every
    line of the body with a letter or digit lies in some range. Frontmatter (which ReMe
    does not index, also when its YAML does not read) is kept searchable by making its
    lines the first chunk's heading,
    which the keyword index reads and the embedding does not. None: the note changed
    since ReMe chunked it.
    """
    if not reme:
        return None
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    fields, body_start = parse_frontmatter(text)
    if not body_start:
        body_start = _reme_block_end(lines)
    groups: dict[tuple[int, int], list[ReMeChunk]] = {}
    for c in reme:
        if (c.start_line <= body_start or c.end_line > len(lines)
                or not lines[c.start_line - 1].strip() or not lines[c.end_line - 1].strip()):
            return None
        groups.setdefault((c.start_line, c.end_line), []).append(c)
    covered = [False] * len(lines)
    for (start, end), group in groups.items():
        span = _alnum("\n".join(lines[start - 1:end]))
        if span not in _alnum("\n".join(c.text for c in group)):
            return None
        for i in range(start - 1, end):
            covered[i] = True
    if any(not covered[i] and _alnum(lines[i]) for i in range(body_start, len(lines))):
        return None
    head = "\n".join(lines[:body_start]) if body_start else ""
    scalars = {k: v for k, v in fields.items() if isinstance(v, str | int | float | bool | list)}
    out: list[Chunk] = []
    for i, c in enumerate(reme):
        meta: ChunkMeta = {"chunker": "reme"}
        if i == 0 and head:
            meta["frontmatter"] = scalars
        out.append(Chunk(path, c.start_line, c.end_line, c.text, head if i == 0 else "",
                         meta))
    return out


__all__ = ["ReMeChunk", "adopt_chunks"]
