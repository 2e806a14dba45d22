"""JSON frontmatter, as Hugo reads it: a JSON object at the top of a note, its ``{`` the
note's first line and its ``}`` at the start of a line of its own. Only recall reads it (the
block is part of its note's first chunk and its fields are that chunk's metadata, as for a
YAML block); recalld writes YAML blocks only. Pure functions; nothing here raises on bad
notes."""

from __future__ import annotations

import json
from typing import Final

from recalld.daemon.jsontypes import JsonObject

__all__ = ["json_block"]

_OPEN: Final = "{"
_CLOSE: Final = "}"


def json_block(text: str, max_lines: int) -> tuple[JsonObject, int]:
    """The fields of the JSON object ``text`` opens with (a ``{`` line first) and the
    0-based line after its closing ``}`` line, the first one at the margin; ({}, 0)
    without one within its first ``max_lines`` lines, when what lies between them is no
    JSON object (code, a template), or when no text follows it: that is body (a note
    that is only a JSON object, as a model or a tool may write one, is its text)."""
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    if not lines or lines[0].lstrip("\ufeff").rstrip() != _OPEN:
        return {}, 0
    end = next((i for i in range(1, min(len(lines), max_lines))
                if lines[i].rstrip() == _CLOSE), -1)
    if end < 0 or not any(ln.strip() for ln in lines[end + 1:]):
        return {}, 0
    try:
        data = json.loads("\n".join([_OPEN, *lines[1 : end + 1]]),
                          parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return {}, 0
    return (data, end + 1) if isinstance(data, dict) else ({}, 0)


def _no_constant(name: str) -> object:
    """``NaN`` and the infinities are no JSON (Python's reader takes them): no block."""
    raise ValueError(name)
