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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from recalld.daemon.index.chunker import DEFAULT_MAX_CHARS, Chunk, ChunkMeta, chunk_markdown
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
#: ASCII signs that are no Markdown syntax, so ReMe's renderer (mistletoe's Markdown
#: renderer) writes them as they are, and they say something ("$1200" is not "1200").
_ASCII_SIGNS = frozenset("$%")


def _said(text: str) -> str:
    """What of ``text`` rendering Markdown again cannot change: its letters and digits,
    the punctuation of its numbers, and every other sign but ASCII punctuation (emoji,
    currency, arrows, CJK punctuation: ReMe's renderer keeps them as written, and "✅"
    to "❌" or "$" to "€" is an edit). ASCII punctuation is Markdown's syntax, which the
    renderer may write otherwise (a table's rule, an entity, a fence). Character
    references are read as their characters, on either side: the renderer writes
    ``&amp;`` or ``&copy;`` as the character outside code and as written inside it."""
    if "&" in text:
        import html  # with the first character reference: a start reads none

        text = html.unescape(text)
    last = len(text) - 1
    return "".join(
        ch for i, ch in enumerate(text)
        if ch.isalnum() or ch in _ASCII_SIGNS or (ord(ch) > 0x7F and not ch.isspace())
        or (ch in _NUMBER_MARKS and (
            (i > 0 and text[i - 1].isdigit()) or (i < last and text[i + 1].isdigit())))
    ).casefold()


def _reme_block_end(lines: Sequence[str]) -> int:
    """Where the body starts for ReMe: after a ``---`` fenced block at the top, whether or
    not its YAML reads (ReMe leaves out a block it cannot parse; recalld's reader takes
    less YAML than ReMe's, e.g. no anchors or repeated keys); 0 without one."""
    if not lines or lines[0].strip() != "---":
        return 0
    return next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)


def adopt_chunks(path: str, text: str, reme: Sequence[ReMeChunk], *,
                 max_chars: int = DEFAULT_MAX_CHARS) -> list[Chunk] | None:
    """The note's chunks, ReMe's wherever the note still says what they say.

    ReMe's chunks over one line range (a group) are kept where the note holds their lines:
    at their range, or moved by the lines added or removed before them, the lines of the
    range (starting and ending on a line with text, after the frontmatter) say what the
    chunk text says (:func:`_said`: letters, digits, signs), in order. The rest of the
    body (what was edited, added, or never in a ReMe chunk) is chunked by
    :func:`chunk_markdown`, so an edit costs the embedding of the stretch it touched, not
    of the note. Frontmatter (which ReMe does not index, also when its YAML does not read)
    stays searchable: as part of recalld's first chunk when the body starts with one,
    otherwise as the first kept chunk's heading, which the keyword index
    reads and the embedding does not. None: no chunk of ReMe's fits any more.
    """
    if not reme:
        return None
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    fields, body_start = parse_frontmatter(text)
    # A block recalld's reader cannot take (ReMe's can) is frontmatter here all the same.
    reme_start = _reme_block_end(lines)
    unread = 0 if body_start else reme_start
    body_start = body_start or unread
    # A block ReMe did not take for frontmatter (a byte order mark before its fence) is
    # body to ReMe: its first chunk starts on the fence, its text renders the block as a
    # heading of the fence line alone. Its chunks may start there, and say what the
    # lines say from the body on after that heading.
    hidden = body_start if body_start and not reme_start else 0
    groups: dict[tuple[int, int], list[ReMeChunk]] = {}
    for c in reme:
        groups.setdefault((c.start_line, c.end_line), []).append(c)
    anchors: dict[str, list[int]] = {}
    for i in range(body_start, len(lines)):
        if key := _said(lines[i]):
            anchors.setdefault(key, []).append(i)
    first_said: dict[str, int] = {}  # what a line says -> the first line saying it
    for i, line in enumerate(lines):
        first_said.setdefault(_said(line), i)
    kept: list[tuple[int, list[ReMeChunk]]] = []  # (0-based first line, group)
    free_from, shift = body_start - hidden, 0
    for (start, end), group in sorted(groups.items()):
        size = end - start + 1
        joined = _said("\n".join(c.text for c in group))
        at = _place(lines, free_from, size, joined, _lead(group[0].text), start - 1,
                    (start - 1 + shift, *_anchored(group, anchors, size)), hidden,
                    (group[0].text.startswith("\n"), group[-1].text.endswith("\n")))
        if at is None:
            continue
        lines_from = hidden if at < hidden else at  # where the chunk's own lines start
        if _lead_holds(group[0].text, joined, _said("\n".join(lines[lines_from:at + size])),
                       first_said, lines_from):
            kept.append((at, group))
            free_from, shift = at + size, at - (start - 1)
    if not kept:
        return None
    skip = {i for at, group in kept
            for i in range(at, at + group[0].end_line - group[0].start_line + 1)}
    skip.update(range(unread))
    skip.update(_said_before(lines, kept, body_start))
    own = [c for c in chunk_markdown(path, text, max_chars=max_chars, skip=skip)
           if any(ch.isalnum() for ch in c.text)]
    head = "\n".join(lines[:body_start])
    if own and own[0].start_line == 1 and not unread:
        head = ""  # recalld's first chunk holds the frontmatter
    scalars = {k: v for k, v in fields.items() if isinstance(v, str | int | float | bool | list)}
    out = list(own)
    for n, (at, group) in enumerate(kept):
        for i, c in enumerate(group):
            first = n == 0 and i == 0 and bool(head)
            meta: ChunkMeta = {"chunker": "reme"}
            if first:
                meta["frontmatter"] = scalars
            out.append(Chunk(path, at + 1, at + 1 + c.end_line - c.start_line, c.text,
                             head if first else "", meta))
    out.sort(key=lambda c: c.start_line)
    return out


def adopt_moved(path: str, text: str, moved: Mapping[str, Sequence[ReMeChunk]], *,
                max_chars: int = DEFAULT_MAX_CHARS) -> list[Chunk] | None:
    """The chunks of a note ReMe's store knows no chunks of, by ReMe's chunks of one of
    the ``moved`` notes (gone from where ReMe indexed them) wherever it still says what
    they say: a note renamed or moved since ReMe indexed it costs what it did then, not
    its embedding again. The one of which most chunks are kept; None: none fits. Only
    those with a chunk whose last line with text is one of the note's are tried."""
    said = {k for ln in text.split("\n") if (k := _said(ln))}
    best: list[Chunk] | None = None
    kept = 0
    for reme in moved.values():
        if not any(_last_key(c) in said for c in reme):
            continue
        got = adopt_chunks(path, text, reme, max_chars=max_chars)
        n = sum(1 for c in got or () if c.metadata.get("chunker") == "reme")
        if n > kept:
            best, kept = got, n
    return best


def _last_key(chunk: ReMeChunk) -> str:
    return next((k for ln in reversed(chunk.text.split("\n")) if (k := _said(ln))), "")


def still_says(path: str, text: str, reme: Sequence[ReMeChunk]) -> bool:
    """Whether the note still says what every chunk of ReMe's says, on the lines ReMe
    recorded, and nothing more: it is as ReMe read it."""
    got = adopt_chunks(path, text, reme)
    return got is not None and sorted((c.start_line, c.end_line) for c in got) == sorted(
        (c.start_line, c.end_line) for c in reme)


def _said_before(lines: Sequence[str], kept: Sequence[tuple[int, Sequence[ReMeChunk]]],
                 body_start: int) -> set[int]:
    """The lines just before a kept group (after the one before it) whose words its text
    already says before its own lines: the header rows of a table ReMe split (each part
    repeats them, none holds their lines), not to be chunked and paid for once more."""
    out: set[int] = set()
    floor = body_start
    for at, group in kept:
        size = group[0].end_line - group[0].start_line + 1
        joined = _said("\n".join(c.text for c in group))
        span = _said("\n".join(lines[at:at + size]))
        if at > floor and joined.endswith(span):
            lead = joined[:len(joined) - len(span)]
            k = at
            while k > floor and lead.endswith(_said("\n".join(lines[k - 1:at]))):
                k -= 1
            out.update(range(k, at))
        floor = at + size
    return out


def _anchored(group: Sequence[ReMeChunk], anchors: Mapping[str, list[int]],
              size: int) -> list[int]:
    """Where the group's range would start if its last line with text is one of the
    note's lines that say the same (a range moved by lines added or removed before it)."""
    return [i - size + 1 for i in anchors.get(_last_key(group[-1]), ())]


#: What ReMe puts before a chunk's own lines: its ancestors' headings, a ``[Part X/N]``
#: marker, a split table's header rows.
_LEAD = re.compile(r"^\s*(?:#|\[Part \d+/\d+\]|\||$)")


_PART = re.compile(r"^\s*\[Part \d+/\d+\]\s*$")


def _lead_holds(text: str, joined: str, span: str, first_said: Mapping[str, int],
                at: int) -> bool:
    """Whether the note still holds, before line ``at``, each line of what ReMe put
    before the chunk's own lines (its ancestors' headings, a split table's header
    rows): a heading renamed or a header row edited since is an edit of the chunk."""
    prefix = joined[:len(joined) - len(span)] if joined.endswith(span) else ""
    seen = ""
    for line in text.split("\n"):
        if seen == prefix or not _LEAD.match(line):
            break
        key = _said(line)
        seen += key
        if key and not _PART.match(line) and first_said.get(key, at) >= at:
            return False
    return True


def _lead(text: str) -> frozenset[str]:
    """What may precede a chunk's own lines in its text (what they say): nothing, or
    any run of its first lines that are headings, part markers or table rows."""
    out = {""}
    seen = ""
    for line in text.split("\n"):
        if not _LEAD.match(line):
            break
        seen += _said(line)
        out.add(seen)
    return frozenset(out)


def _place(lines: Sequence[str], free_from: int, size: int, joined: str,
           lead: frozenset[str], recorded: int, candidates: Sequence[int],
           hidden: int = 0, blank: tuple[bool, bool] = (False, False)) -> int | None:
    """The first of ``candidates`` (then ``recorded``) where ``size`` lines from
    ``free_from`` on say all that ``joined`` (what a group says) says after
    one of ``lead``: a word cut at either end of the range is an edit too. A range
    over the first ``hidden`` lines (a block ReMe read as body) says what its lines
    say from there on, after its lead. It starts and ends on a line with text, unless
    ``blank`` says the group's text starts or ends with a line break (ReMe cut the
    note by bytes where it has more than 100 sections: a range may end on blank lines)."""
    for at in (*candidates, recorded):
        if (at < free_from or at + size > len(lines)
                or (not lines[at].strip() and not blank[0])
                or (not lines[at + size - 1].strip() and not blank[1])):
            continue
        for first in (at, hidden) if at < hidden else (at,):
            span = _said("\n".join(lines[first:at + size]))
            if joined.endswith(span) and joined[:len(joined) - len(span)] in lead:
                return at
    return None


__all__ = ["ReMeChunk", "adopt_chunks", "adopt_moved", "still_says"]
