"""Which text of a Markdown note is outside code: where its ``[[wikilinks]]`` count.

Pure: text in, numbered lines out (``links.py`` reads links in them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from recalld.daemon.index.chunker import closes_fence, opens_fence

__all__ = ["lines_outside_code"]

# A code span: a run of backticks up to the next run of as many (``a `b` c``); runs of at
# most 16, so that a line of unmatched runs is read a bounded number of times.
_CODE_SPAN_RE: Final = re.compile(r"(?<!`)(`{1,16})(?!`).*?(?<!`)\1(?!`)")
# The markers of a block quote (``> > text``: depth 2), and a list item's marker up to its
# text, whose column the item's own blocks are indented to (``- ``, ``12. ``, ``1. - ``:
# an item's first line may open an item in it).
_QUOTE_RE: Final = re.compile(r"(?: {0,3}> ?)+")
_ITEM_RE: Final = re.compile(r"(?: {0,3}(?:[-*+]|\d{1,9}[.)]) {1,4}(?=\S))+")


def lines_outside_code(text: str) -> Iterator[tuple[int, str]]:
    """(1-based number, line) of each line of ``text`` outside fenced code blocks, its
    code spans removed. A block fenced inside a block quote or a list item (its fence
    indented as the item's text is, or right after the item's marker) is code too, up to
    its closing fence or the end of the quote or item that holds it, as CommonMark reads
    it."""
    fence = ""
    fence_depth = fence_col = 0  # the quote depth and the item's column of the open block
    depth = item_col = 0  # the quote depth of the last line, the column of its list item
    # A byte order mark is no text: the first line may be a heading (``## Related``).
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        quote = _QUOTE_RE.match(line) if ">" in line else None
        level = quote.group(0).count(">") if quote is not None else 0
        body = line[quote.end():] if quote is not None else line
        indent = len(body) - len(body.lstrip(" "))
        if fence:
            if level >= fence_depth and (indent >= fence_col or not body.strip()):
                if closes_fence(body, fence):
                    fence = ""
                continue
            fence = ""  # its quote or list item ended, and the block with it
        if level != depth:
            depth, item_col = level, 0
        item = _ITEM_RE.match(body)
        if item is not None:
            item_col = item.end()
        elif body.strip() and indent < item_col:
            item_col = 0  # the list ended
        col = item_col if item is not None or indent >= item_col else 0
        fence = opens_fence(body[col:])
        if fence:
            fence_depth, fence_col = level, col
            continue
        yield number, _CODE_SPAN_RE.sub("", line) if "`" in line else line
