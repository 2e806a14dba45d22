"""Windows of a chunk for the vector branch: a few sentences or lines each.

One vector for a whole chunk (up to ~2,000 characters of a dozen dialogue turns or an
abstract's several claims) averages its topics; a question about one of them matches the
chunk weakly. So a chunk is embedded as windows of about ``size`` characters and scored by
its best window. A window is made of whole lines; a line longer than ``size`` is cut at
sentence ends (Latin ``. ! ?`` before whitespace, CJK ``。！？；`` anywhere), and a sentence
still too long at whitespace. A last window shorter than a quarter of ``size`` joins the
one before it (a lone "Bye!" would match any short question). Each window records the
lines of the chunk it covers, so a search can hand back the best window's neighbourhood
instead of the whole chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from recalld.daemon.index.chunker import split_line
from recalld.daemon.index.tokenizer import tokenize
from recalld.ipc.textfold import read_places

_SENTENCE_END: Final = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])")


@dataclass(frozen=True, slots=True)
class Window:
    """``text`` covers lines ``first``..``last`` (0-based, inclusive) of the chunk text."""

    first: int
    last: int
    text: str


def _pieces(line: str, size: int) -> list[str]:
    if len(line) <= size:
        return [line]
    out: list[str] = []
    for sentence in _SENTENCE_END.split(line):
        if sentence:
            out.extend(split_line(sentence, size))
    return out


def windows(text: str, size: int) -> list[Window]:
    """``text`` (a chunk) as windows of about ``size`` characters; at least one window."""
    out: list[Window] = []
    parts: list[str] = []
    first = last = -1
    length = 0

    def flush() -> None:
        nonlocal parts, length
        if parts:
            out.append(Window(first, last, "".join(parts).strip()))
        parts, length = [], 0

    for no, line in enumerate(text.split("\n")):
        stripped = line.strip()
        if not stripped:
            continue
        for i, piece in enumerate(_pieces(stripped, size)):
            if parts and length + len(piece) > size:
                flush()
            if not parts:
                first = no
            elif i == 0:
                parts.append("\n")
            elif not piece.startswith(" ") and not parts[-1].endswith(" "):
                parts.append(" ")
            parts.append(piece)
            length += len(piece) + 1
            last = no
    flush()
    if len(out) > 1 and len(out[-1].text) < size // 4:
        tail = out.pop()
        prev = out.pop()
        sep = "\n" if tail.first > prev.last else " "
        out.append(Window(prev.first, tail.last, f"{prev.text}{sep}{tail.text}"))
    return out or [Window(0, max(text.count("\n"), 0), text)]


#: Most windows one chunk may have (the vector index labels a window ``key * SLOTS + i``).
SLOTS: Final = 64


def chunk_windows(text: str, size: int) -> list[Window]:
    """:func:`windows` with at most :data:`SLOTS` windows (larger ones for a huge chunk)."""
    out = windows(text, size)
    while len(out) > SLOTS:
        size *= 2
        out = windows(text, size)
    return out


def embed_units(text: str, size: int) -> list[str]:
    """What the vector branch embeds for a chunk of ``text``: its windows; a chunk of one
    window (or ``size`` 0) as itself, so its vector is the same cache entry as without
    windows and ReMe's vector of that text still applies."""
    if not size:
        return [text]
    wins = chunk_windows(text, size)
    return [text] if len(wins) == 1 else [w.text for w in wins]


def around(text: str, window: Window, neighbours: int) -> tuple[int, int, str]:
    """``window`` widened by ``neighbours`` lines each side, within ``text``: (first, last,
    the lines' text); the part of a chunk a hit hands back when its best window is known."""
    lines = text.split("\n")
    first = max(window.first - neighbours, 0)
    last = min(window.last + neighbours, len(lines) - 1)
    return first, last, "\n".join(lines[first:last + 1])


def holding(text: str, size: int, terms: frozenset[str], best: Window,
            phrases: frozenset[str] = frozenset()) -> Window:
    """The window of ``text`` (a chunk, windows of ``size``) that holds the most of
    ``phrases`` whole (a query's runs found by pairs, read as ``read_places`` reads:
    ``recalld.ipc.textmatch.query_words``), then the most of ``terms`` (query terms as
    the keyword index reads them: ``tokenize``), so a keyword hit shows the lines that
    matched, not those where a common pair of the phrase turns up; ``best`` (the vector
    branch's) when it holds as many as any, or when none holds one (a term only in the
    heading)."""
    def held(window: Window) -> tuple[int, int]:
        read = read_places(window.text)[0] if phrases else ""
        return (sum(phrase in read for phrase in phrases),
                len(terms.intersection(tokenize(window.text))))

    wins = chunk_windows(text, size) if size else []
    counts = [held(w) for w in wins]
    top = max(counts, default=(0, 0))
    if not top[1] or held(best) >= top:
        return best
    return wins[counts.index(top)]


__all__ = ["SLOTS", "Window", "around", "chunk_windows", "embed_units", "holding", "windows"]
