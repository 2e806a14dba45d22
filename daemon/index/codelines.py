"""Which text of a Markdown note is outside code and comments: where its ``[[wikilinks]]``
count (no renderer shows what is in code as a link, nor shows a comment at all).

Pure: text in, numbered lines out (``links.py`` reads links in them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from recalld.daemon.index.chunker import closes_fence, opens_fence
from recalld.daemon.index.frontmatter import recall_block

__all__ = ["visible_lines"]

# A code span: a run of backticks up to the next run of as many (``a `b` c``); runs of at
# most 16, so that a line of unmatched runs is read a bounded number of times.
_CODE_SPAN_RE: Final = re.compile(r"(?<!`)(`{1,16})(?!`).*?(?<!`)\1(?!`)")
# What a line's text is read through from left to right: a code span, or the opening of
# an HTML comment (``<!-- ... -->``) or an Obsidian one (``%% ... %%``); a comment may run
# over lines, and one never closed runs to the end of the note; but an HTML one opened
# after a line's start with no ``-->`` after it is text, as CommonMark reads it.
_HIDDEN_RE: Final = re.compile(_CODE_SPAN_RE.pattern + r"|<!--|%%")
_CLOSES: Final = {"<!--": "-->", "%%": "%%"}
# The markers of a block quote (``> > text``: depth 2), and a list item's marker up to its
# text, whose column the item's own blocks are indented to (``- ``, ``12. ``, ``1. - ``:
# an item's first line may open an item in it).
_QUOTE_RE: Final = re.compile(r"(?: {0,3}> ?)+")
_ITEM_RE: Final = re.compile(r"(?: {0,3}(?:[-*+]|\d{1,9}[.)]) {1,4}(?=\S))+")


def visible_lines(text: str, body_start: int | None = None) -> Iterator[tuple[int, str]]:
    """:func:`_visible_lines` of a note's body, after the lines of its frontmatter block as
    they are: the block is fields, not Markdown, so a comment sign or a backtick in a
    value (``sep: "%%"``) hides no line of the block or the body. ``body_start``: the
    line the body starts at, as ``frontmatter.recall_block`` gives it for ``text``
    (found here when not given)."""
    text = text.removeprefix("\ufeff")
    start = recall_block(text)[1] if body_start is None else body_start
    if not start:
        yield from _visible_lines(text)
        return
    lines = text.split("\n")
    yield from enumerate(lines[:start], start=1)
    for number, line in _visible_lines("\n".join(lines[start:])):
        yield start + number, line


def _visible_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based number, line) of each line of ``text`` outside fenced code blocks and
    comments, its code spans removed and its comments' parts blanked (a space each, so
    that the text either side does not join into a link). A block fenced inside a block
    quote or a list item (its fence indented as the item's text is, or right after the
    item's marker) is code too, up to its closing fence or the end of the quote or item
    that holds it, as CommonMark reads it; a fence in a comment opens no block, nor does
    a comment open in a code block."""
    comment = ""  # the close of the comment open at the end of the last line read
    # A byte order mark is no text: the first line may be a heading (``## Related``).
    text = text.removeprefix("\ufeff")
    last_close = text.rfind("-->")
    offset = 0  # where the line starts in ``text``
    fence = ""
    fence_depth = fence_col = 0  # the quote depth and the item's column of the open block
    depth = item_col = 0  # the quote depth of the last line, the column of its list item
    for number, line in enumerate(text.split("\n"), start=1):
        start, offset = offset, offset + len(line) + 1
        if comment:
            line, comment = _visible_part(line, last_close - start, comment)
            if comment:
                continue  # the whole line is in the comment
            yield number, line
            continue
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
        if "`" in line or "<!--" in line or "%%" in line:
            line, comment = _visible_part(line, last_close - start)
        yield number, line


def _visible_part(line: str, last_close: int, comment: str = "") -> tuple[str, str]:
    """``line`` without its code spans and comments, and the close of the comment left
    open at its end ("" for none). ``last_close``: where the note's last ``-->`` is, from
    the line's start; ``comment``: the close of the comment the line starts in."""
    out: list[str] = []
    pos = 0
    while True:
        if comment:
            # ``<!-->`` and ``<!--->`` are whole comments, as CommonMark reads them.
            end = line.find(comment, max(pos - 2, 0) if comment == "-->" else pos)
            if end < 0:
                return "".join(out), comment
            pos, comment = end + len(comment), ""
            out.append(" ")
        m = _HIDDEN_RE.search(line, pos)
        if m is None:
            out.append(line[pos:])
            return "".join(out), ""
        opener = m.group(0)
        if (opener == "<!--" and last_close < m.start() + 2
                and (m.start() > 3 or line[:m.start()].strip(" "))):
            out.append(line[pos:m.end()])  # never closed, and no HTML block: text
            pos = m.end()
            continue
        out.append(line[pos:m.start()])
        pos = m.end()
        if m.group(1) is None:
            comment = _CLOSES[opener]
