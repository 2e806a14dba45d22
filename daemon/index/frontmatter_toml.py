"""TOML frontmatter, as Hugo and Zola write it: a leading ``+++`` block, read with
:mod:`tomllib`. Only recall reads it (the block is part of its note's first chunk and its
fields are that chunk's metadata, as for a YAML block); recalld writes YAML blocks only.
Pure functions; nothing here raises on bad notes."""

from __future__ import annotations

import datetime
import math
import tomllib
from typing import Final

from recalld.daemon.jsontypes import JsonObject

__all__ = ["toml_block"]

_FENCE: Final = "+++"


def toml_block(text: str, max_lines: int) -> tuple[JsonObject, int]:
    """The fields of the ``+++`` block ``text`` opens with and the 0-based line after its
    closing fence; ({}, 0) without a block closed within its first ``max_lines`` lines.
    A closed block whose TOML does not parse (a key twice) is a block all the same, of no
    fields: a ``+++`` line is no Markdown, so what lies between two of them at the top is
    no body."""
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    if not lines or lines[0].lstrip("\ufeff").rstrip() != _FENCE:
        return {}, 0
    end = next((i for i in range(1, min(len(lines), max_lines))
                if lines[i].rstrip() == _FENCE), -1)
    if end < 0:
        return {}, 0
    try:
        data = tomllib.loads("\n".join(lines[1:end]))
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return {}, end + 1
    return {key: _json(value) for key, value in data.items()}, end + 1


def _json(value: object) -> object:
    """A TOML value as JSON holds it: dates and times as ISO 8601 text (as a YAML block's
    dates are read, unparsed), infinities and NaN as their TOML spelling."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value
