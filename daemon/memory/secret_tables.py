"""The context rule for credentials in a Markdown table (:mod:`secret_rules` applies it):
the cell after a cell naming a credential (``| DB_PASSWORD | Zq8mN2pL4x |``), and the
cells under a header naming one (``| user | password |``, then ``| admin | Zq8mN2pL4x
|``). A value there is judged as one alone on the line below its label
(:func:`secret_config.set_apart`): a plain word, a version or a date stays.

A table is a header row, its delimiter row (``|---|:--:|``) and the rows after it, each
line holding a ``|``. The lines of a text are read once, whatever the number of anchors
in it (a table of thousands of ``password_...`` rows).

:func:`find_in_delimited` does the same for the cells under a header naming a credential
in delimiter-separated rows (CSV, TSV, semicolon-separated: ``user,password`` then
``admin,Zq8mN2pL4x``): a header line first in its block, and the lines after it holding as
many of its delimiter; and in such a block of two fields a row, the field after one
naming a credential (``key,value`` then ``password,Zq8mN2pL4x``).
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from recalld.daemon.index.chunker import CELL_EDGE, TABLE_DELIMITER
from recalld.daemon.memory.secret_anchors import KEY_WORDS, OTHER_WORDS, ZH_WORDS
from recalld.daemon.memory.secret_config import set_apart
from recalld.daemon.memory.secret_context import name_kind

if TYPE_CHECKING:
    from recalld.daemon.memory.secret_rules import Span

#: What decorates a cell's text (bold, italics, code): not part of a name or a value.
_DECORATION = " \t*_`"


def _cells(text: str, start: int, end: int) -> list[Span]:
    """The spans of a table row's cells (``text[start:end]``), without their decoration."""
    bounds = [start - 1, *(m.start() for m in CELL_EDGE.finditer(text, start, end)), end]
    cells = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        a += 1
        if i in (0, len(bounds) - 2) and not text[a:b].strip():
            continue  # before the leading pipe, after the trailing one
        while a < b and text[a] in _DECORATION:
            a += 1
        while b > a and text[b - 1] in _DECORATION + "\r":
            b -= 1
        cells.append((a, b))
    return cells


#: A credential's name in Chinese, a password's or a key's and token's (``ZH_WORDS``).
_ZH_KEYS: Final = frozenset({"密钥", "秘钥", "密匙", "令牌", "密鑰", "秘鑰", "祕鑰"})
#: What may stand around such a name in a header's cell: ``API``, spaces, ``-``, ``_``.
_AROUND: Final = re.compile(r"(?i)\A(?:api)?[ \-_]*|[ \-_]*\Z")


def _column_kind(name: str) -> str | None:
    """:func:`name_kind`, or the kind of a credential named in another language, the
    cell holding its name alone (``密码``, ``Passwort``, ``API密钥``, ``Zugangstoken``):
    ``password``, or ``key`` (a value there is one where it looks machine-made)."""
    kind = name_kind(name)
    if kind is not None:
        return kind
    word = _AROUND.sub("", name.strip(" \t*_`\"'")).lower()
    if word in _ZH_KEYS or word in KEY_WORDS:
        return "key"
    return "password" if word in ZH_WORDS or word in OTHER_WORDS else None


class _Tables:
    """The tables of a text: for each line, whether it is a header row or a row after
    one, and the rows below each header."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts: list[int] = []
        self.ends: list[int] = []
        #: Per line: the index of its table's header line, or -1 (no table row).
        self.header: list[int] = []
        #: Per header line: the index of its table's last row.
        self.last: dict[int, int] = {}
        header = -1
        start = 0
        before = ""
        for i, line in enumerate(text.split("\n")):
            self.starts.append(start)
            self.ends.append(start + len(line))
            start += len(line) + 1
            row = "|" in line
            if row and header < 0 and "|" in before and TABLE_DELIMITER.fullmatch(line):
                header = i - 1
                self.header[header] = header
            self.header.append(header if row else -1)
            if not row:
                header = -1
            elif header >= 0:
                self.last[header] = i
            before = line

    def spans(self, a: int, seen: set[int]) -> Iterable[Span]:
        line = bisect.bisect_right(self.starts, a) - 1
        header = self.header[line]
        if header < 0 or line == header + 1:
            return
        text = self.text
        cells = _cells(text, self.starts[line], self.ends[line])
        if (named := _named_column(text, cells, a, seen)) is None:
            return
        column, kind = named
        if line == header:
            for row in range(header + 2, self.last[header] + 1):
                row_cells = _cells(text, self.starts[row], self.ends[row])
                if column < len(row_cells):
                    yield from _value(kind, text, row_cells[column])
        # A table of names and values may have its first pair as its header.
        if column + 1 < len(cells):
            yield from _value(kind, text, cells[column + 1])


def _named_column(text: str, cells: list[Span], a: int,
                  seen: set[int]) -> tuple[int, str] | None:
    """The column of ``cells`` holding ``a`` and the kind of credential its name says it
    holds; None when no cell holds ``a``, its cell was looked at before (``seen``, which
    this adds it to) or its name names no credential."""
    column = next((i for i, (s, e) in enumerate(cells) if s <= a < e), None)
    if column is None or cells[column][0] in seen:
        return None
    seen.add(cells[column][0])
    kind = _column_kind(text[slice(*cells[column])])
    return None if kind is None else (column, kind)


def _value(kind: str, text: str, cell: Span) -> Iterable[Span]:
    value = text[cell[0]:cell[1]]
    if value and not any(c.isspace() for c in value):  # words in a cell: prose
        span = set_apart(kind, text, value, cell[0], headed=True)
        if span is not None:
            yield span


def find_in_tables(text: str, starts: Sequence[int]) -> Iterable[Span]:
    if "|" not in text or not starts:
        return
    tables = _Tables(text)
    if not tables.last:
        return
    seen: set[int] = set()
    for a in starts:
        yield from tables.spans(a, seen)


#: The delimiters of delimiter-separated rows, the most telling first.
_DELIMITERS = ("\t", ";", ",")
#: A header's cells are names: longer is prose.
_HEADER_CELL_CHARS = 64
#: Around a delimited cell's text: spaces and the quotes CSV puts around a field.
_FIELD_EDGE = " \t\r\"'"


def _line(text: str, a: int) -> Span:
    end = text.find("\n", a)
    return text.rfind("\n", 0, a) + 1, len(text) if end < 0 else end


def _fields(text: str, start: int, end: int, delimiter: str) -> list[Span]:
    """The spans of a delimited row's fields, without their spaces and quotes."""
    fields = []
    a = start
    while True:
        b = text.find(delimiter, a, end)
        b = end if b < 0 else b
        s, e = a, b
        while s < e and text[s] in _FIELD_EDGE:
            s += 1
        while e > s and text[e - 1] in _FIELD_EDGE:
            e -= 1
        fields.append((s, e))
        if b == end:
            return fields
        a = b + 1


#: A delimiter by which a line is a row of a block: the delimiter, how many of it the
#: line holds, whether the line is the block's first (its header), and its cells.
_Row = tuple[str, int, bool, list["Span"]]


def _rows(text: str, start: int, end: int) -> list[_Row]:
    """The delimiters (:data:`_DELIMITERS`, in order) by which the line
    ``text[start:end]`` is a row of a block of rows (its header, or a row of one of two
    fields a row) whose cells are short enough to be a header's."""
    # Lines are counted in place, not copied (a paragraph of prose is one long line),
    # the lines before and after only for a delimiter this one holds.
    before = text.rfind("\n", 0, start - 1) + 1 if start else 0
    after = (end + 1, _line(text, end + 1)[1]) if end < len(text) else (end, end)
    rows: list[_Row] = []
    for delimiter in _DELIMITERS:
        count = text.count(delimiter, start, end)
        if count == 0:
            continue
        first = not (start and text.count(delimiter, before, start - 1) == count)
        if not (text.count(delimiter, *after) == count if first else count == 1):
            # No block of rows here, or a row of one below its header: only a header's
            # column, or a name's field in a block of two fields a row, says what a
            # field holds.
            continue
        cells = _fields(text, start, end, delimiter)
        if any(e - s > _HEADER_CELL_CHARS for s, e in cells):
            continue
        rows.append((delimiter, count, first, cells))
    return rows


def _delimited_column(text: str, a: int, end: int, rows: list[_Row],
                      seen: set[int]) -> Iterable[Span]:
    """The values in the column of ``a``, on a line ending at ``end`` that is ``rows``."""
    for delimiter, count, first, cells in rows:
        if (named := _named_column(text, cells, a, seen)) is None:
            return
        column, kind = named
        # A block of names and values (two fields a row): the field after the name.
        if count == 1 and column == 0:
            yield from _value(kind, text, cells[column + 1])
        if not first:
            return  # a row, not the header: a block's header is its first line
        row_start = end + 1
        while row_start < len(text):
            row_end = _line(text, row_start)[1]
            if text.count(delimiter, row_start, row_end) != count:
                break
            yield from _value(kind, text, _fields(text, row_start, row_end, delimiter)[column])
            row_start = row_end + 1
        return


def find_in_delimited(text: str, starts: Sequence[int]) -> Iterable[Span]:
    if not starts or not any(d in text for d in _DELIMITERS):
        return
    seen: set[int] = set()
    start = end = -1
    rows: list[_Row] = []
    for a in starts:
        # The anchors come in order, several on a line: a line is read once for them
        # all (an anchor in ``[start, end)`` has no line break before it on its line,
        # so its line is this one).
        if not start <= a < end:
            start, end = _line(text, a)
            rows = _rows(text, start, end)
        yield from _delimited_column(text, a, end, rows, seen)
