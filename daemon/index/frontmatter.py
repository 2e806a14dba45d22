"""Frontmatter of Markdown notes: a leading ``---`` block of simple YAML, without a YAML library.

Owns parsing (for indexing: ``name``, ``description`` and tags become searchable) and where
a note's body starts; writing blocks and minimal edits are :mod:`frontmatter_edit`'s. Pure
functions; nothing here raises on bad notes: a block that does not parse is treated as no
frontmatter, and its lines stay ordinary body text.

Supported: ``key: value`` scalars (plain, 'single' or "double" quoted, also wrapped over
indented lines as PyYAML writes long values; ``true``/``false``, ``null``/``~`` and numbers
typed as YAML does), flow lists ``[a, "b, c"]`` and mappings ``{k: v}``, block lists of
``- item`` lines, one level of nested ``key: value`` mappings, ``|``/``>`` block scalars and
``#`` comments. Anything else (anchors, multi-document streams, deeper nesting) is malformed.
"""

from __future__ import annotations

import re
from typing import Final

from recalld.daemon.index.frontmatter_json import json_block
from recalld.daemon.index.frontmatter_toml import toml_block
from recalld.daemon.index.marks import MARKS
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.slugs import names_nothing

__all__ = ["block_problem", "body_of", "has_body", "open_fields", "parse_frontmatter",
           "recall_block"]

_FENCE: Final = "---"
# A key is a word in any script (`标签`, `नाम`, `2026`), as YAML takes it plain: letters,
# digits, combining marks, `_`, `.`, `-` and spaces. The key's run is taken whole (a
# lookahead and its backreference: a possessive repeat, which Python before 3.11.5 could
# get wrong) and the value to the end, both stripped after (:func:`_key_value`): a lazy
# key or value before `\s*` tried the run of spaces after each of its characters again,
# so a line holding a long run of spaces took time by the square of its length (16,000
# spaces: 4 s).
_KEY_RE: Final = re.compile(rf"^(\w(?=([\w.\- {MARKS}]*))\2)\s*:(?:\s+(.*))?$")
_INT_RE: Final = re.compile(r"^[-+]?[0-9]+$")
_FLOAT_RE: Final = re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")
# How far the closing fence of a block is looked for: a longer "block" is read as text,
# chunked as any text is, since a block is part of its note's first chunk and no chunk
# may grow without bound (200,000 lines of fields made one chunk of 2.4 MB, a search
# hit's text and an embedding request of that size).
_MAX_LINES: Final = 2000

class _Malformed(ValueError):
    pass


def _key_value(line: str) -> tuple[str, str | None] | None:
    """The key of a ``key: value`` line and its value (None after a bare ``key:``),
    without the spaces around them; None when the line is no such line."""
    m = _KEY_RE.match(line)
    if m is None:
        return None
    value = m.group(3)
    return m.group(1).rstrip(" "), None if value is None else value.rstrip()


def _lines(text: str) -> list[str]:
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]


def _block_end(lines: list[str]) -> int:
    """Index of the closing fence, or -1 when the text has no frontmatter block."""
    if not lines or lines[0].lstrip("\ufeff").rstrip() != _FENCE:
        return -1
    for i in range(1, min(len(lines), _MAX_LINES)):
        if lines[i].rstrip() in (_FENCE, "..."):
            return i
    return -1


def _strip_comment(value: str) -> str:
    cut = value.find(" #")
    return value[:cut].rstrip() if cut >= 0 else value


def _quoted_end(value: str) -> int:
    """The index just past the quoted scalar that opens ``value`` (its length if the
    quote is never closed)."""
    quote, i = value[0], 1
    while i < len(value):
        if quote == '"' and value[i] == "\\":
            i += 2
        elif value[i] != quote:
            i += 1
        elif quote == "'" and value[i + 1:i + 2] == "'":
            i += 2  # '' is a quote inside a single-quoted scalar
        else:
            return i + 1
    return len(value)


# The escapes of a double-quoted YAML scalar: JSON's and YAML's own (PyYAML writes
# ``\U0001F680`` for an emoji, ``\e``, ``\_`` or ``\L`` for some controls and spaces).
_ESCAPES: Final = {
    "0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
    "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85",
    "_": "\xa0", "L": "\u2028", "P": "\u2029",
}
_ESCAPE_RE: Final = re.compile(
    r"\\(?:x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.S)


def _double_quoted(body: str) -> str:
    """The text of a double-quoted scalar's ``body`` (between its quotes)."""
    rest = _ESCAPE_RE.sub("", body)
    if '"' in rest or "\\" in rest:
        raise _Malformed("a double-quoted value holds a quote not escaped or a backslash "
                         "that escapes nothing")

    def one(m: re.Match[str]) -> str:
        digits = m.group(1) or m.group(2) or m.group(3)
        if digits:
            if int(digits, 16) > 0x10FFFF:
                raise _Malformed(f"the escape {m.group(0)} names no character")
            return chr(int(digits, 16))
        char = _ESCAPES.get(m.group(4))
        if char is None:
            raise _Malformed(f"the escape {m.group(0)} names no character")
        return char

    try:
        # A pair of \u surrogates (as JSON writes characters beyond the BMP) is one
        # character; a lone surrogate is no text.
        return _ESCAPE_RE.sub(one, body).encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeError as exc:
        raise _Malformed("a double-quoted value holds a lone surrogate escape") from exc


def _unquote(value: str) -> str:
    # After the closing quote only a comment may follow (a ``#`` after a space), as after
    # a plain scalar or a flow list: ``name: "Quince"  # from the wiki``.
    end = _quoted_end(value)
    rest = value[end:]
    if rest and rest[0].isspace() and rest.lstrip().startswith("#"):
        value = value[:end]
    if value[0] == '"':
        if len(value) < 2 or not value.endswith('"'):
            raise _Malformed("a quote not closed, or text after the closing quote")
        return _double_quoted(value[1:-1])
    if len(value) < 2 or not value.endswith("'"):
        raise _Malformed("a quote not closed, or text after the closing quote")
    return value[1:-1].replace("''", "'")


#: What one frontmatter value reads as (a block or flow list holds these).
_Scalar = str | int | float | bool | None


def _scalar(raw: str) -> _Scalar:
    value = raw.strip()
    if not value:
        return None
    if value[0] in "\"'":
        return _unquote(value)
    value = _strip_comment(value)
    if value[0] in "&*!|>{%@`":
        raise _Malformed(f"a value opening with {value[0]} (an anchor, alias, tag or "
                         "another form of YAML this reader does not take)")
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~"):
        return None
    if _INT_RE.match(value):
        return int(value)
    if _FLOAT_RE.match(value):
        return float(value)
    return value


def _split_flow(text: str, close: str = "]") -> tuple[list[str], str]:
    """The items of a flow list whose ``[`` came just before ``text`` (or of a flow
    mapping, ``close`` ``}``), and what follows its ``]``. Quotes open only at the start
    of an item (or of a mapping's value), as in YAML; outside them, a ``#`` after a space
    (a comment) or a nested bracket makes the list malformed."""
    items: list[str] = []
    buf: list[str] = []
    quote = ""
    escaped = False
    for i, ch in enumerate(text):
        if quote:
            buf.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'" and (not "".join(buf).strip()
                              or (close == "}" and "".join(buf).rstrip().endswith(":"))):
            quote = ch
            buf.append(ch)
        elif ch == ",":
            items.append("".join(buf))
            buf = []
        elif ch == close:
            items.append("".join(buf))
            if not items[-1].strip():
                items.pop()  # an empty list, or a trailing comma
            return items, text[i + 1:]
        elif ch in "[]{}":
            raise _Malformed(f"a {ch} inside a flow list or mapping (nested lists and "
                             "mappings are not read)")
        elif ch == "#" and i > 0 and text[i - 1].isspace():
            raise _Malformed("a comment inside a flow list or mapping")
        else:
            buf.append(ch)
    raise _Malformed("a bracket not closed, or a quote left open")


def _value(raw: str) -> _Scalar | list[_Scalar] | dict[str, _Scalar]:
    value = raw.strip()
    if value[:1] in ("[", "{"):
        items, rest = _split_flow(value[1:], "]" if value[0] == "[" else "}")
        # After the list only a comment may follow (a `#` after a space), as for scalars.
        if rest and not (rest[0].isspace() and rest.lstrip().startswith("#")):
            raise _Malformed("text after the closing bracket")
        if value[0] == "[":
            return [_scalar(item) for item in items]
        # A flow mapping, as PyYAML writes an empty one (``{}``) or, before 5.1, any.
        pairs = [_key_value(item.strip()) for item in items]
        if not all(pairs):
            raise _Malformed("an entry of a flow mapping that is no key: value")
        return {kv[0]: _scalar(kv[1] or "") for kv in pairs if kv}
    return _scalar(value)


def _folded(first: str, more: list[str]) -> str:
    """A scalar that goes on over indented lines (PyYAML wraps long values at 80 columns)
    as one line: a line break folds into a space and each empty line into a line break; in
    double quotes a line ending in an odd ``\\`` goes on without a space (and the next
    one's leading ``\\ `` is a space)."""
    while more and not more[-1].strip():
        more = more[:-1]  # blank lines before the next entry are no part of it
    double = first.lstrip().startswith('"')
    out = first.strip()
    gap = False
    for line in more:
        if line.strip() and not line[0].isspace():
            raise _Malformed("a line at the margin inside a value that goes on over lines")
        part = line.strip()
        if not part:
            out += "\\n" if double else "\n"
            gap = True
        elif double and (len(out) - len(out.rstrip("\\"))) % 2:
            out = out[:-1] + (part[1:] if part.startswith("\\ ") else part)
        else:
            out += part if gap else " " + part
            gap = False
    return out


def _entries(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The indented lines under a key as entries (list items, keys): each entry's first
    line, and the lines after it, blank or indented deeper, that it goes on over."""
    out: list[tuple[str, list[str]]] = []
    indent = 0
    for line in lines:
        depth = len(line) - len(line.lstrip())
        if out and (not line.strip() or depth > indent):
            out[-1][1].append(line)
        elif line.strip():
            out.append((line, []))
            indent = depth
    return out


def _field_value(raw: str, nested: list[str]) -> object:
    """The value of a key whose line holds ``raw`` after the colon, with the ``nested``
    lines under it."""
    if raw.strip() in ("|", ">", "|-", ">-"):
        body = [ln.strip() for ln in nested]
        text = ("\n" if raw.strip()[0] == "|" else " ").join(body)
        return text if raw.strip().endswith("-") else text + "\n"
    if raw.strip() and not raw.strip().startswith("#"):
        return _value(_folded(raw, nested) if nested else raw)
    if not nested:
        return None
    if all(ln.strip().startswith("- ") or ln.strip() == "-" for ln, _ in _entries(nested)):
        return [_value(_folded(ln.strip()[1:], more)) for ln, more in _entries(nested)]
    sub: JsonObject = {}
    for ln, more in _entries(nested):
        if ln.lstrip().startswith("#"):
            continue
        skv = _key_value(ln.strip())
        if skv is None or not ln[0].isspace() or (more and not skv[1]):
            raise _Malformed(f"a nested line that is no key: value ({ln.strip()[:40]!r}; "
                             "deeper nesting is not read)")
        sub[skv[0]] = _value(_folded(skv[1] or "", more))
    return sub


def _parse_block(lines: list[str]) -> tuple[JsonObject, list[tuple[str, int, int]]]:
    """Parse the lines between the fences; also returns each key's line span (end exclusive)."""
    out: JsonObject = {}
    spans: list[tuple[str, int, int]] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        if line[0].isspace():
            raise _Malformed(f"an indented line where a key must start: {line.strip()[:40]!r}")
        kv = _key_value(line)
        if kv is None:
            raise _Malformed(f"a line that is no key: value: {line.strip()[:40]!r}")
        key, raw = kv[0], kv[1] or ""
        start = i
        i += 1
        nested: list[str] = []
        while i < n and (not lines[i].strip() or lines[i][0].isspace() or lines[i][0] == "-"):
            nested.append(lines[i])
            i += 1
        while nested and not nested[-1].strip():
            nested.pop()
            i -= 1
        if key in out:
            raise _Malformed(f"the key {key} twice")
        try:
            out[key] = _field_value(raw, nested)
        except _Malformed as exc:
            raise _Malformed(f"{key}: {exc}") from None
        spans.append((key, start, i))
    return out, spans


def parse_frontmatter(text: str) -> tuple[JsonObject, int]:
    """Return (fields, body_start_line): the 0-based index of the first body line.

    ``body_start_line`` equals the number of lines the block occupies including both fences,
    so ``text.split("\\n")[body_start_line:]`` is the body; ({}, 0) when there is no valid block.
    """
    try:
        lines = _lines(text)
        end = _block_end(lines)
        if end < 0:
            return {}, 0
        fields, _ = _parse_block(lines[1:end])
        return fields, end + 1
    except (_Malformed, ValueError, IndexError, RecursionError):
        return {}, 0


def unreadable_block(text: str) -> bool:
    """Whether ``text`` opens with a frontmatter block (fences) that does not parse (a
    duplicate key, an unclosed quote or bracket): its fields cannot be read."""
    return bool(block_problem(text))


def block_problem(text: str) -> str:
    """What makes the frontmatter block ``text`` opens with unreadable (``"tags: a
    bracket not closed, or a quote left open"``); "" if it parses or there is none."""
    lines = _lines(text)
    end = _block_end(lines)
    if end < 0:
        return ""
    try:
        _parse_block(lines[1:end])
    except _Malformed as exc:
        return str(exc)
    except (ValueError, IndexError, RecursionError):
        return "a form of YAML this reader does not take"
    return ""


def recall_block(text: str) -> tuple[JsonObject, int]:
    """The fields of the frontmatter block ``text`` opens with and the 0-based line where
    its body starts, as search and recall take them: a block this reader parses; a closed
    block of field lines it cannot parse (YAML it does not take: deeper nesting, anchors,
    a key written twice), of no fields, as its keys are no body either; a TOML ``+++``
    block (Hugo, Zola); a JSON object (Hugo); ({}, 0) without one."""
    fields, start = parse_frontmatter(text)
    if start:
        return fields, start
    start = _fields_block_end(text)
    if start:
        return {}, start
    fields, start = toml_block(text, _MAX_LINES)
    return (fields, start) if start else json_block(text, _MAX_LINES)


def body_of(text: str) -> tuple[str, int]:
    """``text`` without its frontmatter block (:func:`recall_block`'s), and the 0-based
    line where that body starts."""
    _, start = recall_block(text)
    if not start:
        return text, 0
    return "\n".join(text.split("\n")[start:]), start


def _fields_block_end(text: str) -> int:
    """The line after the closing fence of a block whose lines read as fields (0: none):
    keys at the margin, not capitalized (prose after a Markdown rule is), then list items,
    comments and indented lines. Anything else makes it a Markdown rule and its text."""
    lines = _lines(text)
    end = _block_end(lines)
    inner = [ln for ln in lines[1:end] if ln.strip()]
    if end < 0 or not inner or inner[0][0].isupper() or not _FIELD_RE.match(inner[0]):
        return 0
    fields = all(ln[0].isspace() or ln[0] in "#-" or (
        not ln[0].isupper() and _FIELD_RE.match(ln)) for ln in inner)
    return end + 1 if fields else 0


# A key as frontmatter writes it (``session_id``, ``source-conversation``, ``标签``): one
# word, not capitalized. A line of prose after a Markdown rule (``TODO: call Ana``,
# ``The plan: ship``) is capitalized or has words before its colon.
_FIELD_RE: Final = re.compile(r"^[^\W\d][\w.-]*\s*:(?:\s|$)")


def _unclosed_block(text: str) -> bool:
    """Whether ``text`` is a frontmatter block whose closing fence is not written (yet): a
    ``---`` line and then only fields (``_FIELD_RE``) of a block that parses, or nothing
    at all. What else follows an opening ``---`` is a Markdown rule and its text."""
    lines = _lines(text)
    if not lines or lines[0].lstrip("\ufeff").rstrip() != _FENCE or _block_end(lines) >= 0:
        return False
    rest = [ln for ln in lines[1:_MAX_LINES] if ln.strip()]
    if not rest:
        return True
    if len(lines) > _MAX_LINES or any(
            not ln[0].isspace() and not ln.startswith("#")
            and (ln[0].isupper() or not _FIELD_RE.match(ln)) for ln in rest):
        return False
    try:
        fields, _ = _parse_block(lines[1:])
    except (_Malformed, ValueError, IndexError, RecursionError):
        return False
    return bool(fields)


def open_fields(text: str) -> bool:
    """Whether ``text`` is a frontmatter block not closed (yet) that holds fields (see
    ``_unclosed_block``): a note being written, or prose of ``key: value`` lines after a
    Markdown rule (``---`` then ``note: buy milk``); only time tells them apart."""
    return _unclosed_block(text) and any(ln.strip() for ln in _lines(text)[1:])


def has_body(text: str) -> bool:
    """Whether ``text`` says anything beyond a frontmatter block (a block not closed yet,
    as a note being written has, is not a body: its fields are no text to read)."""
    # A body of only what shows nothing (a zero-width space, a byte order mark) is none.
    return not names_nothing(body_of(text)[0]) and not _unclosed_block(text)
