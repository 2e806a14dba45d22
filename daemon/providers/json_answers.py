"""A provider's answer read as JSON (:func:`without_bom`), and what is wrong with one that
does not parse, said so that the user can act on it: a number beyond a 64-bit float or a
name JSON has no number for is named, anything else is quoted (redacted, short) from
where the parse stopped. Shared by the embedding and chat answers; no I/O."""

from __future__ import annotations

import math
import re

import orjson

from recalld.daemon.providers.errors import snippet

#: A number where a parse stopped, or a name some encoders write for one that JSON has
#: no number for (Python's ``NaN``, ``Infinity``; C's ``inf``, ``nan``).
_NUMBER = re.compile(r"[-+]?(?:nan|infinity|inf|[0-9.][0-9.e+-]*)", re.IGNORECASE)
_SHOWN_NUMBER_CHARS = 24
_UTF8_BOM = b"\xef\xbb\xbf"


def without_bom(body: bytes) -> bytes:
    """``body`` without the UTF-8 byte order mark a server may put before it (a .NET or
    Windows gateway's encoder): JSON has none, and RFC 8259 lets a reader ignore it,
    where the parser calls it an error and the whole answer was lost."""
    return body[len(_UTF8_BOM):] if body.startswith(_UTF8_BOM) else body


def not_json(body: bytes, exc: orjson.JSONDecodeError, secret: str) -> str:
    """What is wrong with an answer that does not parse, and where: a number beyond the
    range of a 64-bit float (``1e400``), or a name JSON has no number for (``NaN``,
    ``-Infinity``), is named as such; anything else is quoted from where the parse
    stopped (redacted, short)."""
    text = body.decode("utf-8", "replace")  # the error's position counts characters
    if not text.strip():
        return "the answer is empty, not JSON"
    start = exc.pos
    while start > 0 and text[start - 1] in "+-":  # a sign the parse passed over
        start -= 1
    found = _NUMBER.match(text, start)
    token = "" if found is None else found.group()
    line, column = text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
    shown = (f"{token} (line {line}, column {column})" if len(token) <= _SHOWN_NUMBER_CHARS
             else f"{token[:_SHOWN_NUMBER_CHARS]}... (line {line}, column {column})")
    if token.lstrip("+-").lower() in ("nan", "infinity", "inf"):
        return (f"the answer holds {shown}, which is no JSON number: the provider sent a "
                "value that is not a finite number")
    try:
        out_of_range = bool(token) and math.isinf(float(token))
    except ValueError:  # not a number after all ("1.2.3")
        out_of_range = False
    if out_of_range:
        return f"the answer holds the number {shown}, beyond the range of a 64-bit float"
    near = text[exc.pos:].strip()
    return (f"answer is not valid JSON ({exc.msg}, line {exc.lineno}, column {exc.colno})"
            + (f" at: {snippet(near, 60, secret)}" if near else ""))


__all__ = ["not_json", "without_bom"]
