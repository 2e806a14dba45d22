"""The text of an HTML resource as its reader sees it: what auto_resource hands the model.

A saved web page opens with its stylesheets and scripts (tens of kilobytes before the
first word of its body): the head of its source alone, as other text formats are read,
held only those. Here the page is parsed (the standard library's parser, which never
raises on bad markup), in slices, until enough text is found; scripts, styles and other
parts nobody reads are left out, block elements end lines, list items are bullets, a
definition list and a table's rows are written as Markdown writes them (a table's first
row its header) and character references are decoded. Pure functions.
"""

from __future__ import annotations

import codecs
import re
from html.parser import HTMLParser
from typing import Final

#: What a page holds that is not read as text.
_UNREAD: Final = frozenset({"script", "style", "noscript", "template", "svg", "math",
                            "iframe", "object", "canvas"})
#: Elements that stand on lines of their own.
_BLOCKS: Final = frozenset({
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "details", "div",
    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4",
    "h5", "h6", "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary",
    "table", "td", "th", "title", "tr", "ul"})
_HEADINGS: Final = {f"h{n}": "#" * n + " " for n in range(1, 7)}
#: How a line of these elements starts: a list item is a bullet, a definition as a
#: Markdown definition list writes it below its term (``<dt>Password<dd>...``).
_MARKS: Final = {"li": "- ", "dd": ": "}
#: A table's elements, written as a Markdown table's rows and cells.
_ROWS: Final = frozenset({"table", "tr", "td", "th"})
_SPACES: Final = re.compile(r"[ \t\r\f\v\u00a0]+")
#: The markup parsed at once: parsing stops at the slice that completes the text wanted.
_SLICE_CHARS: Final = 1 << 16


#: A page's own word on its encoding: ``<meta charset=...>``, or the ``charset=`` of a
#: ``<meta http-equiv="Content-Type" content="text/html; charset=...">``.
_CHARSET: Final = re.compile(
    rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9._:-]{1,40})", re.IGNORECASE)
#: Where a page declares its encoding: at its start (HTML requires the first 1024 bytes).
_CHARSET_BYTES: Final = 4096


def declared_charset(data: bytes) -> str | None:
    """The Python codec of the encoding the page ``data`` declares near its start, if
    it names one Python knows other than a UTF (None otherwise: a page not read as UTF-8
    that says it is one is wrong about it, and UTF-16/32 go by a byte order mark)."""
    found = _CHARSET.search(data[:_CHARSET_BYTES])
    if found is None:
        return None
    try:
        name = codecs.lookup(found.group(1).decode("ascii")).name
    except LookupError:
        return None
    return None if name.startswith("utf") else name


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.chars = 0
        self._unread = 0  # depth inside elements not read
        #: Per open table: its rows so far and the cells of the row open in it (-1: none).
        self._tables: list[list[int]] = []
        self._inner = 0  # depth of tables inside a cell: read as the cell's text

    def _in_cell(self) -> bool:
        return bool(self._tables) and self._tables[-1][1] > 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _UNREAD:
            self._unread += 1
        elif self._unread:
            return
        elif tag in _ROWS:
            self._row(tag)
        elif tag in _BLOCKS:
            self._block("\n" + _HEADINGS.get(tag, _MARKS.get(tag, "")))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _UNREAD and not self._unread and tag in _BLOCKS and tag not in _ROWS:
            self._block("\n")  # <br/>, <hr/>: a line ends; an empty <svg/> opens nothing

    def handle_endtag(self, tag: str) -> None:
        if tag in _UNREAD:
            self._unread = max(0, self._unread - 1)
        elif self._unread:
            return
        elif tag in _ROWS:
            self._row_end(tag)
        elif tag in _BLOCKS:
            self._block("\n")

    def handle_data(self, data: str) -> None:
        if not self._unread:
            text = _SPACES.sub(" ", data.replace("\n", " "))
            self._add(text.replace("|", "\\|") if self._in_cell() else text)

    def _block(self, text: str) -> None:
        # Inside a table's cell a block (a paragraph, a line break) keeps to the cell's row.
        self._add(" " if self._in_cell() else text)

    def _row(self, tag: str) -> None:
        """A table's rows are written as a Markdown table's, its first row the header
        (readers and the redaction rules read a column under its header so)."""
        if self._inner or (tag == "table" and self._in_cell()):
            self._inner += tag == "table"
            self._add(" ")
            return
        if tag == "table":
            self._tables.append([0, -1])
            self._add("\n")
            return
        if not self._tables:
            self._tables.append([0, -1])  # a row outside any table: one of its own
        table = self._tables[-1]
        if tag == "tr":
            self._row_end("tr")
            table[1] = 0
            self._add("\n|")
        else:  # td, th
            if table[1] < 0:
                table[1] = 0
                self._add("\n|")
            table[1] += 1
            self._add(" ")

    def _row_end(self, tag: str) -> None:
        if self._inner:
            self._inner -= tag == "table"
            self._add(" ")
            return
        if not self._tables:
            return
        table = self._tables[-1]
        if tag in ("td", "th"):
            if table[1] > 0:
                self._add(" |")
            return
        if table[1] > 0:
            table[0] += 1
            self._add("\n")
            if table[0] == 1:
                self._add("|" + "---|" * table[1] + "\n")
        table[1] = -1
        if tag == "table":
            self._tables.pop()
            self._add("\n")

    def _add(self, text: str) -> None:
        self.parts.append(text)
        self.chars += len(text)


def html_text(markup: str, want_chars: int) -> tuple[str, bool]:
    """The readable text of the page ``markup``, at least its first ``want_chars``
    characters where it has them, and whether markup was left unparsed (the page goes on
    past the text returned)."""
    parser = _Text()
    at = 0
    while at < len(markup) and parser.chars <= want_chars:
        parser.feed(markup[at:at + _SLICE_CHARS])
        at += _SLICE_CHARS
    left = at < len(markup)
    if not left:
        parser.close()
    lines = (line.strip() for line in "".join(parser.parts).split("\n"))
    return "\n".join(line for line in lines if line.strip("#-: ")), left
