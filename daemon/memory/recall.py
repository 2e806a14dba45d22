"""The recall block: what an agent puts before its reply, built from one search.

Hits come first (without their notes' frontmatter), then the linked context of the hits
(each neighbour's chunk that best matches the query, without its frontmatter), then, when
asked, the long-term memory index. Every item is labelled with its path and 1-based
inclusive lines. The block never exceeds ``budget_chars``: items are added whole while
they fit; the first one that does not fit is cut (with an ellipsis; around the query's
words when its start misses them) when a useful part of it still fits (its label and its
item then give the lines and text shown), and everything
after it is left out (``truncated`` says so). Pure functions; the RPC layer runs the
search and reads the index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Literal

from recalld.daemon.index.frontmatter import body_of
from recalld.daemon.memory.turns import user_texts
from recalld.ipc.answers import Recall, RecallItem
from recalld.ipc.errors import InvalidParams
from recalld.ipc.types import cut_part, shown_lines, visible

if TYPE_CHECKING:
    from recalld.daemon.index.search import SearchAnswer, SearchHit

__all__ = ["DEFAULT_BUDGET_CHARS", "MAX_BUDGET_CHARS", "Recall", "RecallItem", "build_recall",
           "query_of"]

DEFAULT_BUDGET_CHARS: Final = 4000
MAX_BUDGET_CHARS: Final = 200_000
#: An item cut shorter than this many characters of text is left out instead.
MIN_CUT_CHARS: Final = 80
#: The last user messages that make the query when ``messages`` are given.
QUERY_TURNS: Final = 2

HITS_HEADER: Final = "## Relevant memories"
LINKED_HEADER: Final = "## Linked context"
INDEX_HEADER: Final = "## Memory index"
INTERESTS_HEADER: Final = "## Interests"
ELLIPSIS: Final = "…"


def query_of(query: str | None, messages: Sequence[object] | None) -> str:
    """The search query: ``query``, or the text of the last user messages, whole (as
    ``memory.search`` takes it: what matches may be anywhere in a long request)."""
    if (query is None) == (messages is None):
        raise InvalidParams("give exactly one of 'query' and 'messages'")
    if query is not None:
        text = query.strip()
    else:
        assert messages is not None
        # The conversation as add_turns takes it: content blocks, tool calls (null
        # content), tool results; the recall block a reply was given is not searched again.
        text = "\n".join(user_texts(messages)[-QUERY_TURNS:])
    if not text:
        raise InvalidParams("the query is empty (no text, or no user message with text)")
    return text


def _item(kind: Literal["hit", "linked"], raw: SearchHit) -> RecallItem:
    text = raw["text"]
    start = raw["start_line"]
    # Shown by their body: a block of keys (name, session id, source link) tells an agent
    # little and takes its context. A hit whose chunk is all frontmatter keeps it.
    body, skipped = body_of(text)
    if kind == "linked" or body.strip():
        text, start = body, start + skipped
    # Blank lines at either end are not shown (a window's context line may be one), and
    # the lines given are those of the text shown.
    lines = text.split("\n")
    lead, end = shown_lines(lines)
    start += lead
    return {"kind": kind, "path": raw["path"], "start_line": start,
            "end_line": start + max(end - lead - 1, 0), "text": "\n".join(lines[lead:end]),
            "score": raw["score"], "via": raw.get("via")}


def _label(item: RecallItem) -> str:
    # Paths shown escaped (a file name cannot add a line or reorder one), as in search.
    where = f"[{visible(item['path'])}:{item['start_line']}-{item['end_line']}]"
    if item["via"]:
        where += f" (linked from {visible(item['via'])})"
    return where


class _Block:
    """Text under a fixed budget: pieces are added whole, or cut, or refused."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.parts: list[str] = []
        self.full = False

    def size(self) -> int:
        return len(self.render())

    def room(self, text: str) -> int:
        """What is left of the budget once ``text`` is added (negative: it does not fit)."""
        return self.budget - self.size() - len(text) - (2 if self.parts else 0)

    def add(self, text: str) -> bool:
        if self.full or self.room(text) < 0:
            return False
        self.parts.append(text)
        return True

    def add_cut(self, item: RecallItem, query: str) -> tuple[RecallItem | None, bool]:
        """``item`` whole, or as much of its text as fits (at least :data:`MIN_CUT_CHARS`,
        around the line holding ``query``'s words when the start misses it: ``cut_part``):
        (the item as shown, its text and last line those of the part shown, or None when
        left out; whether it went in whole). After a cut or a refusal the block takes
        nothing more."""
        text = item["text"]
        if self.add(f"{_label(item)}\n{text}"):
            return item, True
        # The part shown lies within the item's lines: its label is no longer than one
        # naming the item's last line twice.
        widest: RecallItem = {**item, "start_line": item["end_line"]}
        room = self.room(f"{_label(widest)}\n{ELLIPSIS}")
        fitted = not self.full and room > 0 and room >= min(MIN_CUT_CHARS, len(text))
        self.full = True
        if not fitted:
            return None, False
        shown = item.copy()
        # Around the line that matched the query when the start would miss it.
        part = cut_part(text.split("\n"), item["start_line"], room, query)
        shown["text"], shown["start_line"], shown["end_line"] = part[:3]
        self.parts.append(f"{_label(shown)}\n{part.shown()}")
        return shown, False

    def render(self) -> str:
        return "\n\n".join(self.parts)


def build_recall(
    agent_id: str, query: str, answer: SearchAnswer, *, budget_chars: int,
    index_text: str | None, interests: Sequence[tuple[str, float]] | None = None,
) -> Recall:
    """The recall block from a ``memory.search`` answer (``results`` and ``expanded``)
    and, when given, the rendered memory index and the weighted interest topics."""
    hits = [_item("hit", r) for r in answer["results"]]
    linked = [i for i in (_item("linked", r) for r in answer["expanded"]) if i["text"]]
    block = _Block(budget_chars)
    items: list[RecallItem] = []
    truncated = False
    for header, group in ((HITS_HEADER, hits), (LINKED_HEADER, linked)):
        if not group:
            continue
        if not block.add(header):
            block.full = truncated = True
            continue
        for item in group:
            shown, whole = block.add_cut(item, query)
            if shown is not None:
                items.append(shown)
            if not whole:
                truncated = True
                break
        if block.parts[-1] == header:  # nothing of the group fitted: no bare header
            block.parts.pop()
    index_included = False
    if index_text is not None:
        text = index_text.strip() or "(no long-term notes yet)"
        if not block.full and block.add(f"{INDEX_HEADER}\n{text}"):
            index_included = True
        else:
            # Left out whole: nothing follows it, as nothing follows a cut item.
            block.full = truncated = True
    interests_included = False
    if interests is not None:
        # A topic is one line, shown escaped: a model's or a hand's line breaks and bidi
        # controls in it cannot add a heading or a label to the block, nor reorder one.
        lines = "\n".join(f"- {visible(' '.join(topic.split()))} ({weight:.2f})"
                          for topic, weight in interests)
        if not block.full and block.add(f"{INTERESTS_HEADER}\n{lines or '(none yet)'}"):
            interests_included = True
        else:
            truncated = True
    rendered = block.render()
    assert len(rendered) <= budget_chars
    return {"agent_id": agent_id, "query": query, "items": items,
            "index_included": index_included, "interests_included": interests_included,
            "truncated": truncated,
            "budget_chars": budget_chars, "rendered": rendered}
