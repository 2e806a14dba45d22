"""Values the client builds from what the daemon sends, shared by every client flavour:
search results and answers, events, and the text form of a hit.

Frozen dataclasses, because the client owns these values (the plain answers are
TypedDicts, :mod:`recalld.ipc.answers`). Parsing is lenient about extra keys (kept in
``extra``) so that a newer daemon never breaks an older client.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple, overload

from recalld.ipc.answers import JsonObject
from recalld.ipc.textcut import cluster_start, cut_text
from recalld.ipc.textmatch import match_span, matched_line

# C0 and C1 controls, DEL and the Unicode line and paragraph separators: anything that
# could start a new line (or redraw one) where a name is shown inside text; and the bidi
# marks, embeddings, overrides and isolates, with which a name is shown in another order
# than it is ("invoice\u202egpj.md" shown as "invoicedm.jpg").
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    char = m.group(0)
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


# What a terminal acts on in text shown whole (a note, a report): C0 controls but for
# newline and tab, a carriage return that does not end a line, DEL and C1 controls.
_TERMINAL = re.compile("\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def for_terminal(text: str) -> str:
    """``text`` with what would drive a terminal (escape sequences, bells, a carriage
    return that overwrites its line) shown escaped as :func:`visible` does; its lines
    and tabs stay as they are."""
    return _TERMINAL.sub(_escape, text)


def visible(text: str) -> str:
    """``text`` with control characters and bidi controls shown as escapes (``\\n``,
    ``\\x1b``, ``\\u2028``, ``\\u202e``), so a file name shown in a header or a line of
    text cannot break it, nor show itself in another order."""
    # Every character _CONTROL matches is one ``isprintable`` refuses (categories Cc, Cf,
    # Zl, Zp): a printable name, nearly every one, skips the substitution.
    return text if text.isprintable() else _CONTROL.sub(_escape, text)


def render_result(hit: Mapping[str, object], *, hybrid: bool, agent_id: str | None = None) -> str:
    """The text form of one search hit, as QwenPaw documents it: a header, then the text.

    ``========== memory/2026-07-23/commute.md:1-6 [score=3.1842] ==========`` (with
    ``vector=`` and ``keyword=`` in hybrid mode, ``-`` for a missed branch, and the
    workspace in brackets before the path when ``agent_id`` is given). Control characters
    in the path are shown escaped (:func:`visible`): a file name cannot forge a header.
    """
    where = f"{visible(str(hit['path']))}:{hit['start_line']}-{hit['end_line']}"
    if agent_id is not None:
        where = f"[{visible(agent_id)}] {where}"
    if not hybrid:  # (one string built, not two: every keyword-only search renders each hit)
        return f"========== {where} [score={hit['score']:.4f}] ==========\n{hit['text']}"
    scores = (f"score={hit['score']:.4f} vector={_fmt(hit['vector'])} "
              f"keyword={_fmt(hit['keyword'])}")
    return f"========== {where} [{scores}] ==========\n{hit['text']}"


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.4f}"


@dataclass(frozen=True, slots=True)
class SearchResult:
    """One hit of ``memory.search``; ``vector``/``keyword`` are None where a branch missed.

    ``rendered`` is the hit's text form (:func:`render_result`): sent by the daemon for
    hits of several workspaces, built here for the hits of one (the daemon sends that
    text once, as the answer's ``rendered``). Neighbours from link expansion have none.
    """

    path: str
    start_line: int
    end_line: int
    text: str
    score: float
    vector: float | None = None
    keyword: float | None = None
    rendered: str = ""
    extra: JsonObject = field(default_factory=dict)

    @classmethod
    def from_wire(cls, obj: object, *, hybrid: bool | None = None) -> SearchResult:
        """``hybrid``: render the hit in that mode when the daemon sent no ``rendered``
        (None: leave it empty)."""
        if not isinstance(obj, dict):
            raise TypeError(f"search result must be an object, got {type(obj).__name__}")
        known = {"path", "start_line", "end_line", "text", "score", "vector", "keyword",
                 "rendered"}
        hit = cls(
            path=str(obj.get("path", "")),
            start_line=int(obj.get("start_line", 0)),
            end_line=int(obj.get("end_line", 0)),
            text=str(obj.get("text", "")),
            score=float(obj.get("score", 0.0)),
            vector=_opt_float(obj.get("vector")),
            keyword=_opt_float(obj.get("keyword")),
            rendered=str(obj.get("rendered", "")),
            extra={k: v for k, v in obj.items() if k not in known},
        )
        if "rendered" in obj or hybrid is None:
            return hit
        return replace(hit, rendered=render_result(hit.to_dict(), hybrid=hybrid))

    def to_dict(self) -> JsonObject:
        return {
            "path": self.path, "start_line": self.start_line, "end_line": self.end_line,
            "text": self.text, "score": self.score, "vector": self.vector,
            "keyword": self.keyword, "rendered": self.rendered, **self.extra,
        }


@dataclass(frozen=True, slots=True)
class SearchResponse:
    """``memory.search``: the ranked ``results`` (iterate, index or ``len()`` this object
    directly), neighbours found by link expansion, and how the search went."""

    results: tuple[SearchResult, ...]
    expanded: tuple[SearchResult, ...] = ()
    rendered: str = ""
    mode: str = ""
    vector_hits: int | None = None
    keyword_hits: int | None = None
    took_ms: float | None = None
    extra: JsonObject = field(default_factory=dict)

    @classmethod
    def from_wire(cls, obj: object) -> SearchResponse:
        if isinstance(obj, list):  # a bare list of results is accepted too
            return cls(results=tuple(SearchResult.from_wire(r) for r in obj))
        if not isinstance(obj, dict) or not isinstance(obj.get("results"), list):
            raise TypeError("search answer must hold a list of results")
        raw_expanded = obj.get("expanded")
        expanded: list[object] = raw_expanded if isinstance(raw_expanded, list) else []
        known = {"results", "expanded", "rendered", "mode", "vector_hits", "keyword_hits",
                 "took_ms"}
        hybrid = obj.get("mode") == "hybrid"
        return cls(
            results=tuple(SearchResult.from_wire(r, hybrid=hybrid) for r in obj["results"]),
            expanded=tuple(SearchResult.from_wire(r) for r in expanded),
            rendered=str(obj.get("rendered") or ""),
            mode=str(obj.get("mode") or ""),
            vector_hits=_opt_int(obj.get("vector_hits")),
            keyword_hits=_opt_int(obj.get("keyword_hits")),
            took_ms=_opt_float(obj.get("took_ms")),
            extra={k: v for k, v in obj.items() if k not in known},
        )

    def to_dict(self) -> JsonObject:
        return {
            "results": [r.to_dict() for r in self.results],
            "expanded": [r.to_dict() for r in self.expanded],
            "rendered": self.rendered, "mode": self.mode, "vector_hits": self.vector_hits,
            "keyword_hits": self.keyword_hits, "took_ms": self.took_ms, **self.extra,
        }

    def __iter__(self) -> Iterator[SearchResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @overload
    def __getitem__(self, index: int) -> SearchResult: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[SearchResult, ...]: ...

    def __getitem__(self, index: int | slice) -> SearchResult | tuple[SearchResult, ...]:
        return self.results[index]


@dataclass(frozen=True, slots=True)
class Event:
    """An ``event`` notification: its ``topic``, the rest of its params, and its place in
    the daemon's event stream (``stream``, ``seq``; None in a ``call.progress`` event, or
    from a daemon that does not number its events)."""

    topic: str
    data: JsonObject
    stream: str | None = None
    seq: int | None = None

    @classmethod
    def from_params(cls, params: object) -> Event:
        if not isinstance(params, dict):
            return cls(topic="", data={"value": params})
        stream, seq = params.get("stream"), params.get("seq")
        if not isinstance(stream, str) or not isinstance(seq, int) or isinstance(seq, bool):
            stream = seq = None
        own = ("topic", "stream", "seq") if stream is not None else ("topic",)
        rest = {k: v for k, v in params.items() if k not in own}
        return cls(topic=str(params.get("topic", "")), data=rest, stream=stream, seq=seq)


def _opt_float(value: object) -> float | None:
    # The daemon may send "-" (as the rendered form does) or null for a missed branch.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def without_frontmatter(text: str, start_line: int) -> tuple[str, int]:
    """The text of a hit starting at ``start_line`` without the note's frontmatter block
    (a note's first chunk carries it: ``name:``, ``session_id:``... tell a model little),
    and the line its body starts at. A hit that is all frontmatter is kept as it is."""
    lines = text.split("\n")
    if start_line != 1 or lines[0].rstrip() != "---":
        return text, start_line
    for i in range(1, len(lines)):
        if lines[i].rstrip() in ("---", "..."):
            body = "\n".join(lines[i + 1:])
            return (body, start_line + i + 1) if body.strip() else (text, start_line)
    return text, start_line


def shown_lines(lines: list[str]) -> tuple[int, int]:
    """Where ``lines`` start and end without their blank lines at either end: the index
    of the first line shown and one past the last (equal when every line is blank)."""
    lead, end = 0, len(lines)
    while lead < end and not lines[lead].strip():
        lead += 1
    while end > lead and not lines[end - 1].strip():
        end -= 1
    return lead, end


def shown_part(text: str, start_line: int, end_line: int, max_chars: int, query: str = ""
               ) -> tuple[str, int, int]:
    """``text`` (lines ``start_line``-``end_line`` of its note) as a model is shown it:
    without blank lines at either end, cut to ``max_chars`` between whole characters with
    ``…``; and the first and last line of what is shown, so that a label names only
    lines whose text follows it. Cut from its start, unless the start misses the line
    that holds the most of ``query``'s words (``matched_line``): then cut around that
    line, with ``…`` where lines are left out before or after."""
    lines = text.split("\n")
    lead, end = shown_lines(lines)
    body = "\n".join(lines[lead:end]).strip()
    first, last = start_line + lead, end_line - (len(lines) - end)
    if len(body) > max_chars:
        part = cut_part(body.split("\n"), first, max_chars, query)
        return part.shown(), part.first, part.last
    return body, first, max(last, first)


class Part(NamedTuple):
    """A part of a hit's lines: its ``text``, its first and last line, and whether text
    is left out before it and after it."""

    text: str
    first: int
    last: int
    before: bool
    after: bool

    def shown(self) -> str:
        """The text with ``…`` where text is left out."""
        return ("…" if self.before else "") + self.text + ("…" if self.after else "")


def cut_part(lines: list[str], first: int, max_chars: int, query: str = "") -> Part:
    """``lines`` (the first is line ``first`` of its note; more than ``max_chars`` in all)
    cut to ``max_chars`` between whole characters (shown with its ``…``: one more). From
    the start, unless the start misses the line that holds ``query`` best
    (``matched_line``): then around it, and around the place in it the query matches best
    (``match_span``) when that line is too long alone."""
    at = matched_line(lines, query)
    if at is not None:
        # The start cut misses the match when the text up to its end is longer.
        begin, end = match_span(lines[at], query, max(max_chars * 2 // 3 - 8, 1))
        if sum(map(len, lines[:at])) + at + end > max_chars:
            return _cut_around(lines, at, first, begin, max_chars - 1)  # and a leading …
    body = cut_text("\n".join(lines), max_chars).rstrip()
    return Part(body, first, first + body.count("\n"), False, True)


def _cut_around(lines: list[str], at: int, first: int, match: int, max_chars: int) -> Part:
    """Lines around ``lines[at]`` (line ``first`` is ``lines[0]``) within ``max_chars``:
    up to a third of them before it, as many after as fit, then more before; a line
    ``at`` too long alone is cut around index ``match`` in it (where the query matches
    best: a third of the part before it)."""
    line = lines[at]
    if len(line) >= max_chars:
        begin = cluster_start(line, match - max_chars // 3)
        cut = cut_text(line[begin:], max_chars).rstrip()  # its end: where the part ends
        return Part(cut.lstrip(), first + at, first + at, begin > 0 or at > 0,
                    begin + len(cut) < len(line.rstrip()) or at < len(lines) - 1)
    a = b = at
    size = len(line)
    while a > 0 and size + len(lines[a - 1]) + 1 <= max_chars // 3:
        a -= 1
        size += len(lines[a]) + 1
    while b < len(lines) - 1 and size + len(lines[b + 1]) + 1 <= max_chars:
        b += 1
        size += len(lines[b]) + 1
    while a > 0 and size + len(lines[a - 1]) + 1 <= max_chars:
        a -= 1
        size += len(lines[a]) + 1
    return Part("\n".join(lines[a:b + 1]).strip(), first + a, first + b, a > 0,
                b < len(lines) - 1)


def render_linked(response: SearchResponse, max_chars: int = 1200, query: str = "") -> str:
    """The neighbours of a search answer (``expanded``) as text for a model: a header, then
    ``[path:start-end] (linked from <hit>)`` and the text of each, cut to ``max_chars``
    (around ``query``'s words: :func:`shown_part`; the label naming the lines shown);
    empty when there are none."""
    parts = []
    for item in response.expanded:
        text, first, last = shown_part(item.text, item.start_line, item.end_line, max_chars,
                                       query)
        if not text:
            continue
        via = item.extra.get("via")
        origin = f" (linked from {visible(via)})" if isinstance(via, str) else ""
        parts.append(f"[{visible(item.path)}:{first}-{last}]{origin}\n{text}")
    return "## Linked context\n\n" + "\n\n".join(parts) if parts else ""


def render_skipped(response: SearchResponse) -> str:
    """The workspaces a search of several (``agents``) passed by because they were not
    open, each with the daemon's reason, as text for a model; empty when none was."""
    skipped = response.extra.get("skipped")
    if not isinstance(skipped, dict) or not skipped:
        return ""
    lines = [f"- {agent}: {why}" for agent, why in skipped.items()]
    return "## Not searched\n\n" + "\n".join(lines)
