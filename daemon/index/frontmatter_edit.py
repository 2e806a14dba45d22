"""Frontmatter blocks written and edited: a block that parses back to its fields, and minimal
edits that keep every key the editor did not touch, in its order and spelling (for the file
operations that update frontmatter). Pure functions; the reading side is
:mod:`recalld.daemon.index.frontmatter`.
"""

from __future__ import annotations

import json
import re
from typing import Final

from recalld.daemon.index.filters import authors_of
from recalld.daemon.index.frontmatter import (
    _FENCE,
    _block_end,
    _lines,
    _Malformed,
    _parse_block,
    _scalar,
)
from recalld.daemon.jsontypes import JsonObject

__all__ = ["DELETE", "render_frontmatter", "update_frontmatter"]

DELETE: Final = object()
"""A value for ``update_frontmatter`` changes that removes the key."""

_PLAIN_RE: Final = re.compile(r"^[^\s\"'\[\]{}#&*!|>%@`,:-][^\n#:]*(?<!\s)$")


def _render_scalar(value: object, *, in_flow: bool = False) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    plain = (
        _PLAIN_RE.match(text) is not None
        and _scalar(text) == text
        and ": " not in text
        and not text.endswith(":")
        and not (in_flow and any(c in text for c in ",[]{}\"'"))
    )
    return text if plain else json.dumps(text, ensure_ascii=False)


def _render_item(key: str, value: object) -> list[str]:
    if isinstance(value, list | tuple):
        items = [_render_scalar(v, in_flow=True) for v in value]
        flow = "[" + ", ".join(items) + "]"
        if len(key) + len(flow) <= 78:
            return [f"{key}: {flow}"]
        return [f"{key}:"] + [f"  - {it}" for it in items]
    if isinstance(value, dict):
        if not value:
            return [f"{key}: {{}}"]  # read back as an empty mapping, not as null
        return [f"{key}:"] + [f"  {k}: {_render_scalar(v)}" for k, v in value.items()]
    return [f"{key}: {_render_scalar(value)}"]


def render_frontmatter(fields: JsonObject) -> str:
    """A frontmatter block (fences and trailing newline included) that parses back to ``fields``."""
    lines = [_FENCE]
    for key, value in fields.items():
        lines.extend(_render_item(str(key), value))
    lines.append(_FENCE)
    return "\n".join(lines) + "\n"


def update_frontmatter(text: str, changes: JsonObject) -> str:
    """Apply ``changes`` (``DELETE`` removes a key) to the note's frontmatter.

    Untouched keys keep their original lines, comments and order; changed keys are rewritten in
    place; new keys go last. A note without a valid block gets one in front of its text.
    """
    lines = _lines(text)
    end = _block_end(lines)
    spans: list[tuple[str, int, int]] = []
    if end >= 0:
        try:
            _, spans = _parse_block(lines[1:end])
        except (_Malformed, ValueError, IndexError):
            end = -1
    if end < 0:
        fields = {k: v for k, v in changes.items() if v is not DELETE}
        return render_frontmatter(fields) + text if fields else text
    inner = lines[1:end]
    out: list[str] = []
    pos = 0
    done: set[str] = set()
    for key, start, stop in spans:
        out.extend(inner[pos:start])
        pos = stop
        if key not in changes:
            out.extend(inner[start:stop])
        elif changes[key] is not DELETE:
            out.extend(_render_item(key, changes[key]))
        done.add(key)
    out.extend(inner[pos:])
    for key, value in changes.items():
        if key not in done and value is not DELETE:
            out.extend(_render_item(key, value))
    newline = "\r\n" if text.split("\n", 1)[0].endswith("\r") else "\n"
    return newline.join([lines[0], *out, *lines[end:]])


def keep_fields(fields: JsonObject, old_fields: JsonObject) -> None:
    """Make ``fields`` (a note's new frontmatter) keep what its earlier text
    (``old_fields``) had that the write does not set (``tags`` a person added, say), and
    name every author the earlier text named, then its own: agents appending to one
    note each stay found by the ``author`` filter. One author stays a name, several
    become a list."""
    for key, value in old_fields.items():
        fields.setdefault(key, value)
    authors = list(dict.fromkeys((*authors_of(old_fields), *authors_of(fields))))
    if authors:
        fields["author"] = authors[0] if len(authors) == 1 else list(authors)
