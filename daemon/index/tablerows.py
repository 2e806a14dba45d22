"""GFM tables as the chunker reads them: which lines are a table's delimiter and body rows,
and the header row each belongs to (a chunk that continues a table names its columns)."""

from __future__ import annotations

import re
from collections.abc import Set as AbstractSet
from typing import Final, Protocol

__all__ = ["CELL_EDGE", "TABLE_DELIMITER", "Rows", "table_row"]

# A table's delimiter row (GFM), for ``fullmatch``: cells of dashes, colons for alignment,
# parted by ``|`` (one at least); a ``\r`` may end it.
TABLE_DELIMITER: Final = re.compile(
    r"[ \t]*\|?(?:[ \t]*:?-+:?[ \t]*\|)+(?:[ \t]*:?-+:?[ \t]*)?\r?"
    r"|[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)+\r?")
# A table cell's border: a ``|`` not escaped.
CELL_EDGE: Final = re.compile(r"(?<!\\)\|")


class Rows(Protocol):
    """What :func:`table_row` reads and fills (the chunker's builder)."""

    lines: list[str]
    table_rows: dict[int, int]
    hidden: AbstractSet[int]

    def heading(self, i: int) -> bool: ...


def table_row(builder: Rows, i: int, text_above: bool) -> None:
    """Note line ``i``, one holding a ``|`` in a paragraph (``text_above``: not its first
    line), in ``builder.table_rows`` if it is a table's delimiter or body row. A table
    opens with a header row and a delimiter row of as many cells (GFM); it goes on through
    the lines holding a ``|`` up to a blank line, a heading, a code fence or a line
    without one."""
    if i in builder.hidden:
        return
    head = builder.table_rows.get(i - 1, -1)
    if head >= 0:
        builder.table_rows[i] = head
        return
    if not text_above or (i - 1) in builder.hidden or builder.heading(i - 1):
        return
    line = builder.lines[i]
    if TABLE_DELIMITER.fullmatch(line) and _cells(builder.lines[i - 1]) == _cells(line):
        builder.table_rows[i] = i - 1


def _cells(row: str) -> int:
    """How many cells a table row holds (its outer ``|`` are optional)."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return len(CELL_EDGE.split(row))
