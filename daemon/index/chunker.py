"""Markdown notes to chunks, each with its file and 1-based inclusive line range.

Owns the rules that turn a note into the units search returns. Pure and deterministic: the same
(path, text) always gives the same chunks and ids.

Rules:
- Lines are split on ``\\n`` only (a trailing ``\\r`` is dropped), so numbers match editors, ``sed``
  and ``path:start-end`` in search results.
- A frontmatter block is part of the note's first body chunk, which then starts at line 1: its
  raw text is indexed with that chunk (a word found only in ``name:``, ``description:`` or
  ``tags:`` finds the file) and its scalar fields are that chunk's ``frontmatter`` metadata,
  but it is never a hit by itself (a block of ``name: … / session_id: …`` wastes a result
  slot). The first chunk is built under the cap less the block's size, so together they stay
  within the cap, unless the block is larger than half the cap (the first chunk keeps half)
  or the first line alone is longer than what the block leaves (lines are split only when
  longer than the cap): then that chunk is over the cap by at most the block. A block
  larger than half the cap that would make the first chunk exceed the cap (a block of
  megabytes would make a hit of megabytes) is in no chunk's text: its fields are still the
  first chunk's metadata, and its values that chunk's index text. A note that is
  only frontmatter is chunked like a body (one chunk at usual sizes). The block is the one
  ``frontmatter.recall_block`` finds: also a closed block of fields its reader cannot parse
  (with no fields as metadata), a TOML ``+++`` block and a JSON object (a ``{`` line, then
  up to a ``}`` line), of any length.
- A heading is no chunk by itself either (a hit of one line, or of a frontmatter block and a
  heading): before a paragraph too long to join whole, it opens that paragraph's first
  chunk; before an overlong line, the line's first piece, cut shorter by the heading. Only
  before a line within the cap that does not fit with it does a heading stay alone.
- The body is split at headings (not inside fenced code) into sections: ATX ones (``#`` ..
  ``######``) and setext ones, lines of paragraph text (the first not a list item, quote,
  table row, HTML or indented code, none of the others a list item, quote, table row or
  HTML) after a blank line, a heading, a rule, a code block or the body's start,
  underlined with ``=`` (level 1) or ``-`` (level 2), as CommonMark reads them: the lines
  joined by spaces are the heading's text. A
  line inside a comment of the body (``<!-- -->``, Obsidian's ``%% %%``; one never closed
  runs to the end of the note, as ``codelines.visible_lines`` reads them) is no heading,
  nor opens a code block: no renderer shows it. A heading's text in the heading path (a hit's
  ``heading``, and the index text of every chunk of its section) is at most ``max_chars``,
  cut at a space in its second half if there is one; a heading of no text (``## `` alone)
  opens a section but is left out of the path. Then
  sections into paragraphs at blank lines (a fenced code block is one paragraph; it ends at a
  line of its fence's character, at least as many, and nothing else, as in CommonMark). Adjacent
  paragraphs of one section merge while the chunk stays within ``max_chars``; chunks never cross
  a heading. An overlong paragraph is split by lines, an overlong line by characters (all pieces
  keep that line's number; a piece alike to an earlier one of its line is left out, as it
  would be the same chunk again), so no chunk exceeds the cap unless it is part of one line.
- A chunk that continues a table (GFM: a header row, then a delimiter row of as many
  cells, ``|---|:-:|``, then rows while lines hold a ``|``, up to a blank line, a heading, a
  code fence) from its delimiter row on carries the table's header row at the end of its
  heading path (``heading`` only, cut as a heading's text; ``metadata["headings"]`` keeps
  the sections): its index text and its hit name the columns of rows far below the header.
- Every non-blank line lands in exactly one chunk (blank lines between paragraphs of a chunk are
  inside it; blank lines between chunks belong to none); chunk ranges are increasing.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Final, Literal, TypedDict

from recalld.daemon.index.frontmatter import recall_block
from recalld.daemon.index.tablerows import CELL_EDGE, TABLE_DELIMITER, table_row
from recalld.daemon.index.tokenizer import EMOJI
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.slugs import shows_no_word

__all__ = ["CELL_EDGE", "DEFAULT_MAX_CHARS", "TABLE_DELIMITER", "Chunk", "ChunkMeta", "chunk_id",
           "chunk_markdown", "closes_fence", "index_text", "opens_fence", "split_line"]

# Chosen by measurement on LoCoMo dev (tests/bench/quality_lexical.py; sessions written as daily
# notes, one line per turn; our BM25 on our chunks; 1,986 questions with evidence):
#   max_chars  chunks  recall@5  recall@10  MRR    nDCG@10  ctx_chars@5
#     500       1899    0.687     0.755     0.616  0.626    2.0k
#    1000        914    0.776     0.837     0.716  0.723    4.3k
#    2000        497    0.824     0.878     0.763  0.771    8.3k   <- default
#    4000        274    0.853     0.908     0.789  0.801   14.8k
# 2000 characters (about 400 English tokens) keeps most of the recall of whole sessions at a
# little over half the context; 4000 gains 3 points of recall for 1.8x the characters.
DEFAULT_MAX_CHARS: Final = 2000

_HEADING_RE: Final = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
# A setext heading's underline (``===`` level 1, ``---`` level 2), below one line of text.
_UNDERLINE_RE: Final = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# Lines that are no paragraph text, so no setext heading: a list item, a quote, a table
# row, HTML, indented code (a ``---`` below them is a rule; a ``===``, text).
# A thematic break (``***``, ``- - -``): no paragraph text.
_RULE_RE: Final = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_NOT_TEXT_RE: Final = re.compile(r"^(?: {0,3}(?:[>|<]|(?:[-+*]|\d{1,9}[.)])(?:\s|$))| {4}|\t)")
# A code fence: three or more backticks (an info string without backticks may follow) or
# tildes; it is closed by a line of the same character, at least as many, and nothing else
# (CommonMark), so a ```` block can show a ``` one and ```python does not close a block.
_FENCE_RE: Final = re.compile(r"^ {0,3}(`{3,}(?=[^`]*\Z)|~{3,})")
_CLOSING_RE: Final = re.compile(r"^\s*(`{3,}|~{3,})\s*\Z")


class ChunkMeta(TypedDict, total=False):
    """What a chunk carries besides its text (stored with it in the chunk table)."""

    headings: list[str]  # the heading path down to the chunk
    starts_with_heading: bool  # its first line is a heading
    chunker: Literal["reme"]  # cut where ReMe cut it (absent: cut here)
    frontmatter: JsonObject  # the file's frontmatter scalars (first chunk only)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A searchable piece of one file; lines are 1-based, inclusive, in the original file."""

    path: str
    start_line: int
    end_line: int
    text: str
    heading: str
    metadata: ChunkMeta

    @property
    def id(self) -> str:
        return chunk_id(self.path, self.start_line, self.end_line, self.text)

    def __reduce__(self) -> tuple[type[Chunk], tuple[str, int, int, str, str, ChunkMeta]]:
        # Worker processes send chunks to the daemon by the thousand: as the arguments of
        # a call, pickled in C, not through the generic dataclass state functions.
        return Chunk, (self.path, self.start_line, self.end_line, self.text, self.heading,
                       self.metadata)

    @property
    def index_text(self) -> str:
        """What the keyword index should tokenize: the text, plus its heading path when the
        chunk continues a section whose heading line lies in an earlier chunk."""
        return index_text(self.text, self.heading, self.metadata)


def index_text(text: str, heading: str, metadata: Mapping[str, object]) -> str:
    """The text to tokenize for a chunk (see ``Chunk.index_text``); also used when a
    keyword index is rebuilt from stored chunks. A chunk that shows no word (only markup,
    rules or punctuation: ``- [x]``, ``<br>``, ``---``) has no term but its pictographs
    (``🎂🎉`` is found by ``🎂``): no query finds it by the letters of its markup or by
    its section's heading (the heading's chunk is found), as it is never a vector hit."""
    if shows_no_word(text):
        return " ".join(re.findall(EMOJI, text))  # (compiled at the first such chunk)
    if heading and not metadata.get("starts_with_heading", False):
        text = heading + "\n" + text
    unwritten = _fields_read_otherwise(text, metadata.get("frontmatter"))
    return "\n".join([text, *unwritten]) if unwritten else text


def _fields_read_otherwise(text: str, fields: object) -> list[str]:
    """The frontmatter values (strings, and the strings of lists) that ``text`` does not
    hold as they read: written with escapes (``name: "\\u5317\\u4eac"``, as PyYAML writes
    every character beyond ASCII unless told otherwise, or ``caf\\xe9``), a quote doubled
    in single quotes. A word of them finds the note as a word written plainly does; a value
    written plainly, also wrapped over lines, is not counted twice."""
    if not isinstance(fields, dict) or not fields:
        return []
    flat = ""
    out: list[str] = []
    for value in fields.values():
        for item in value if isinstance(value, list) else (value,):
            if not isinstance(item, str) or not item.strip() or item in text:
                continue
            flat = flat or " ".join(text.split())
            if " ".join(item.split()) not in flat:
                out.append(item)
    return out


def chunk_id(path: str, start_line: int, end_line: int, text: str) -> str:
    """A stable 16-hex-digit id of a chunk's place and content."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{path}\0{start_line}\0{end_line}\0".encode())
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def opens_fence(line: str) -> str:
    """The fence ``line`` opens a fenced code block with (its backticks or tildes), or ""."""
    m = _FENCE_RE.match(line)
    return "" if m is None else m.group(1)


def closes_fence(line: str, fence: str) -> bool:
    """Does ``line`` close the code block that ``fence`` (``opens_fence``'s) opened?"""
    m = _CLOSING_RE.match(line)
    return m is not None and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)


def split_line(line: str, max_chars: int) -> list[str]:
    """Pieces of one overlong line, each at most ``max_chars``, cut at whitespace if possible."""
    # Cut by positions in ``line``, never by slicing off the rest: that copies the rest
    # at every piece, quadratic in the line (seconds for a pasted line of megabytes).
    pieces: list[str] = []
    start, n = 0, len(line)
    while n - start > max_chars:
        cut = line.rfind(" ", start + max_chars // 2, start + max_chars)
        cut = cut + 1 if cut > start else start + max_chars
        pieces.append(line[start:cut])
        start = cut
    if start < n:
        pieces.append(line[start:])
    return pieces


class _Builder:
    def __init__(self, path: str, lines: list[str], max_chars: int) -> None:
        self.path = path
        self.lines = lines
        self.max_chars = max_chars
        self.chunks: list[Chunk] = []
        # 0-based first lines of setext headings' text -> their underline's line.
        self.setext: dict[int, int] = {}
        # 0-based lines of tables' delimiter and body rows -> their table's header row.
        self.table_rows: dict[int, int] = {}
        # 0-based lines inside a comment (``<!-- -->``, ``%% %%``): none is a heading.
        self.hidden: AbstractSet[int] = frozenset()
        # Characters the first chunk leaves for a frontmatter block joined to it.
        self.reserve = 0
        # Characters before each line, its newline counted: a range's size in O(1) as a
        # section's chunk grows paragraph by paragraph.
        self._before = [0, *itertools.accumulate(len(line) + 1 for line in lines)]

    @property
    def cap(self) -> int:
        return self.max_chars - self.reserve if not self.chunks else self.max_chars

    def emit(self, start: int, end: int, headings: list[str], text: str | None = None,
             *, headed: bool = False) -> None:
        """Emit 0-based inclusive line range [start, end] (``text``: a piece of its last
        line, after the whole lines before it; ``headed``: those open with a heading)."""
        body = "\n".join(self.lines[start : end + 1]) if text is None else text
        # A heading of no text (``## `` alone) opens a section but names none.
        headings = [h for h in headings if h]
        meta: ChunkMeta = {"headings": list(headings)}
        head = self.table_rows.get(start, -1)
        if head >= 0:
            # A chunk that continues a table names its columns: its heading (the heading
            # path and the index text) ends with the header row (metadata's headings not).
            headings = [*headings, _title(self.lines[head], self.max_chars)]
        # (A piece of a line is no heading unless ``headed``: the line, perhaps megabytes
        # long, is not matched again for each of its pieces.)
        if (text is None or headed) and self.heading(start):
            meta["starts_with_heading"] = True
        self.chunks.append(
            Chunk(self.path, start + 1, end + 1, body, " > ".join(headings), meta)
        )

    def section(self, paragraphs: list[tuple[int, int]], headings: list[str]) -> None:
        """Merge a section's paragraphs (0-based inclusive ranges) into chunks under the cap."""
        cur: tuple[int, int] | None = None
        for start, end in paragraphs:
            size = self.size(start, end)
            if cur is not None and self.size(cur[0], end) <= self.cap:
                cur = (cur[0], end)
                continue
            if (cur is not None and cur[1] == self.heading_end(cur[0])
                    and self.lone_heading(cur[0], start - 1)):
                # A heading is no chunk by itself (a hit of one line, or of a frontmatter
                # block and one line): it opens the paragraph, split after it if need be.
                self.long_paragraph(cur[0], end, headings)
                cur = None
                continue
            if cur is not None:
                self.emit(cur[0], cur[1], headings)
                cur = None
            if size <= self.cap:
                cur = (start, end)
            else:
                self.long_paragraph(start, end, headings)
        if cur is not None:
            self.emit(cur[0], cur[1], headings)

    def long_paragraph(self, start: int, end: int, headings: list[str]) -> None:
        cur_start, cur_size = -1, 0
        for i in range(start, end + 1):
            n = len(self.lines[i])
            if cur_start >= 0 and cur_size + 1 + n <= self.cap:
                cur_size += 1 + n
                continue
            rest = ""
            if cur_start >= 0 and self.lone_heading(cur_start, i - 1):
                # A heading is no chunk by itself: it takes the next line whole if the cap
                # allows (the first chunk's, before a frontmatter block is joined to it, is
                # then over by at most the block, as for a first line without a heading),
                # else, when the line is split anyway, its first piece, cut shorter.
                head = self.size(cur_start, i - 1)
                if head + 1 + n <= self.max_chars:
                    cur_size = head + 1 + n
                    continue
                if n > self.max_chars and head + 1 < self.max_chars:
                    line = self.lines[i]
                    first = split_line(line, self.max_chars - head - 1)[0]
                    text = "\n".join(self.lines[cur_start:i]) + "\n" + first
                    self.emit(cur_start, i, headings, text, headed=True)
                    cur_start, rest = -1, line[len(first):]
                else:
                    # Not the blank lines after it.
                    self.emit(cur_start, self.heading_end(cur_start), headings)
                    cur_start = -1
            if cur_start >= 0:
                self.emit(cur_start, i - 1, headings)
                cur_start = -1
            if rest:
                for piece in dict.fromkeys(split_line(rest, self.max_chars)):
                    self.emit(i, i, headings, piece)
            elif n <= self.max_chars:
                cur_start, cur_size = i, n
            else:
                # Pieces alike (a line repeating one run of text) would be one chunk
                # several times, the same place, text and id: each is emitted once.
                for piece in dict.fromkeys(split_line(self.lines[i], self.max_chars)):
                    self.emit(i, i, headings, piece)
        if cur_start >= 0:
            self.emit(cur_start, end, headings)

    def heading(self, i: int) -> bool:
        """Whether line ``i`` is a heading (ATX, or a setext heading's text line)."""
        return i in self.setext or (i not in self.hidden
                                    and _HEADING_RE.match(self.lines[i]) is not None)

    def heading_end(self, i: int) -> int:
        """The last line of a heading starting at line ``i`` (a setext one: its underline)."""
        return self.setext.get(i, i)

    def lone_heading(self, start: int, end: int) -> bool:
        """Whether lines ``start..end`` are a heading (all its lines) and blank lines only."""
        last = self.heading_end(start)
        return (self.heading(start) and last <= end
                and not any(self.lines[j].strip() for j in range(last + 1, end + 1)))

    def size(self, start: int, end: int) -> int:
        """Characters of lines ``start..end`` joined by newlines."""
        return self._before[end + 1] - self._before[start] - 1


def chunk_markdown(path: str, text: str, *, max_chars: int = DEFAULT_MAX_CHARS,
                   skip: AbstractSet[int] = frozenset(),
                   block: tuple[JsonObject, int] | None = None) -> list[Chunk]:
    """Split one Markdown file into chunks (see the module docstring for the rules).

    ``skip``: 0-based lines chunked elsewhere (the stretches of a note that keep ReMe's
    chunks, ``reme_chunks.py``). They count as blank lines, except that a heading among
    them still names the sections after it. The frontmatter then joins the first chunk
    only if that chunk starts the body; otherwise no chunk carries it. ``block``: what
    ``frontmatter.recall_block`` gives for ``text`` (found here when not given)."""
    if max_chars < 1:
        raise ValueError("max_chars must be positive")
    # A byte order mark (a Windows editor's) is no text: the first line may be a heading.
    text = text.removeprefix("\ufeff")
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()  # the final newline does not open a line
    builder = _Builder(path, lines, max_chars)
    fields, body_start = recall_block(text) if block is None else block
    if "<!--" in text or "%%" in text:
        # (Imported here: codelines reads fences with this module's functions.) It reads
        # the frontmatter block apart: a comment sign in a value of it hides no heading.
        from recalld.daemon.index.codelines import visible_lines

        shown = {number - 1 for number, _ in visible_lines(text, body_start)}
        builder.hidden = frozenset(i for i in range(body_start, len(lines)) if i not in shown)
    first_body = next((i for i in range(body_start, len(lines)) if lines[i].strip()), -1)
    joins = first_body not in skip
    if body_start > 0 and first_body >= 0 and joins:
        # The block and the blank lines after it, plus the newline that joins them.
        builder.reserve = min(builder.size(0, first_body - 1) + 1, max_chars // 2)
    _body(builder, lines, body_start, skip)
    if body_start > 0 and joins:
        scalars = {
            k: v for k, v in fields.items() if isinstance(v, str | int | float | bool | list)
        }
        if not builder.chunks:
            builder.section([(0, body_start - 1)], [])
        first = builder.chunks[0]
        joined, start = first.text, first.start_line
        if start > 1 and (builder.size(0, start - 2) <= max_chars // 2
                          or builder.size(0, first.end_line - 1) <= max_chars):
            joined, start = "\n".join(lines[: start - 1]) + "\n" + joined, 1
        meta: ChunkMeta = {**first.metadata, "frontmatter": scalars}
        builder.chunks[0] = Chunk(first.path, start, first.end_line, joined, first.heading,
                                  meta)
    return builder.chunks


def _run(builder: _Builder, i: int, run: int, fence: str) -> int:
    """The first line of the paragraph text that line ``i`` ends (``run``: the one the
    line above ends; -1: none, -2: none until a blank line, as a line of other markup
    ends a paragraph of text that an underline would make a heading)."""
    line = builder.lines[i]
    if (fence or i in builder.hidden or not line.strip() or _RULE_RE.match(line)
            or _HEADING_RE.match(line)):
        return -1
    if run == -1:
        return -2 if _NOT_TEXT_RE.match(line) else i
    # (A line indented four spaces continues a paragraph: it is no code block.)
    return -2 if run == -2 or _NOT_TEXT_RE.match(line.lstrip(" \t")) else run


def _title(heading: str, max_chars: int) -> str:
    """A heading's text as the heading path holds it: at most ``max_chars``, cut at a space
    if one is in its second half (the path goes with every chunk of the section)."""
    heading = heading.strip()
    if len(heading) <= max_chars:
        return heading
    cut = heading.rfind(" ", max_chars // 2, max_chars)
    return heading[: cut if cut > 0 else max_chars].rstrip()


def _body(builder: _Builder, lines: list[str], body_start: int,
          skip: AbstractSet[int]) -> None:
    """Chunk the lines from ``body_start`` on: sections at headings, paragraphs at blanks
    (``skip``: lines that are blanks, or headings that open no paragraph)."""
    headings: list[str] = []
    levels: list[int] = []
    paragraphs: list[tuple[int, int]] = []
    para_start = -1
    # The first of the lines of paragraph text just above (a setext heading's text), -1
    # after a blank line, a heading or a code block, -2 after a line of other markup.
    run = -1
    fence = ""
    skipping = False
    for i in range(body_start, len(lines)):
        line = lines[i]
        if (i in skip) != skipping:
            # A stretch chunked elsewhere ends any paragraph, and a code block left open
            # on either side of its edge (kept stretches are whole blocks).
            skipping = not skipping
            fence = ""
            if para_start >= 0:
                paragraphs.append((para_start, i - 1))
                para_start = -1
        if fence:
            if closes_fence(line, fence):
                fence = ""
            run = -1
            continue
        fence = opens_fence(line) if i not in builder.hidden else ""
        above, run = run, _run(builder, i, run, fence)
        if fence:
            if para_start < 0 and not skipping:
                para_start = i
            continue
        hm = _HEADING_RE.match(line) if i not in builder.hidden else None
        # (In a stretch chunked elsewhere no paragraph is followed: its text line is one
        # after a blank line or the body's start.)
        above = -1 if skipping or i - 1 in builder.hidden else above
        if (skipping and i - 1 >= body_start and i - 1 in skip and lines[i - 1].strip()
                and (i - 1 == body_start or not lines[i - 2].strip())
                and i - 1 not in builder.hidden and not _NOT_TEXT_RE.match(lines[i - 1])
                and _HEADING_RE.match(lines[i - 1]) is None):
            above = i - 1
        um = _UNDERLINE_RE.match(line) if hm is None and above >= 0 else None
        if um is not None:
            # A setext heading: the lines of text just above open its section.
            if 0 <= para_start < above:
                paragraphs.append((para_start, above - 1))
            para_start = run = -1
            builder.setext[above] = i
            title = " ".join(ln.strip() for ln in lines[above:i])
            level, start = (1 if um.group(1)[0] == "=" else 2), above
        elif hm is not None:
            level, title, start = len(hm.group(1)), hm.group(2) or "", i
        elif skipping:
            continue
        else:
            level = 0
        if level:
            if para_start >= 0:
                paragraphs.append((para_start, i - 1))
                para_start = -1
            builder.section(paragraphs, headings)
            paragraphs = []
            while levels and levels[-1] >= level:
                levels.pop()
                headings.pop()
            levels.append(level)
            headings.append(_title(title, builder.max_chars))
            # The heading opens the section's first paragraph (unless chunked elsewhere).
            para_start = -1 if skipping else start
            continue
        if "|" in line:
            table_row(builder, i, 0 <= para_start < i)
        if not line.strip():
            if para_start >= 0:
                paragraphs.append((para_start, i - 1))
                para_start = -1
        elif para_start < 0:
            para_start = i
    if para_start >= 0:
        end = len(lines) - 1
        while end > para_start and not lines[end].strip():
            end -= 1
        paragraphs.append((para_start, end))
    builder.section(paragraphs, headings)

