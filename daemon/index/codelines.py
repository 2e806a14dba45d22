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


def lines_outside_code(text: str) -> Iterator[tuple[int, str]]:
    """(1-based number, line) of each line of ``text`` outside fenced code blocks, its
    code spans removed."""
    fence = ""
    # A byte order mark is no text: the first line may be a heading (``## Related``).
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        if fence:
            if closes_fence(line, fence):
                fence = ""
            continue
        fence = opens_fence(line)
        if fence:
            continue
        yield number, _CODE_SPAN_RE.sub("", line) if "`" in line else line
