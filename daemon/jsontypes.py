"""JSON where it crosses the daemon's boundaries: the one place values are untyped.

A :data:`JsonObject` is a JSON object as it was just parsed (a request's params, a provider's
or a model's answer, a record file read back from disk, user metadata) or as it is about to be
serialised. Code checks what it reads from one and passes typed records (TypedDicts,
dataclasses) inward; it writes records that have a fixed shape as TypedDicts.

The alias is the one the client libraries use (:mod:`recalld.ipc.answers`), so the daemon
and the clients name the same thing the same way.
"""

from __future__ import annotations

from typing import TypeVar, cast

import orjson

from recalld.ipc.answers import JsonObject

__all__ = ["JsonObject", "integer_range", "json_safe"]

T = TypeVar("T")


def json_safe(value: T) -> T:
    """``value`` as JSON can hold it: itself when orjson encodes it, else a copy whose
    text has its lone surrogates (a file name that was not UTF-8, decoded by Python)
    replaced by U+FFFD and whose other values orjson refuses (integers past 64 bits,
    foreign objects) are their ``str()``. For records made from what handlers and
    files give: one that cannot be encoded must not stop the write, or the daemon."""
    try:
        orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return cast(T, _mend(value))
    return value


def _mend(value: object) -> object:
    if isinstance(value, str):
        try:  # the bytes Python decoded it from, when it did: one U+FFFD for each
            raw = value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # other lone surrogates: one U+FFFD for each byte
            raw = value.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_mend(str(k)): _mend(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mend(v) for v in value]
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 64) else str(value)
    return _mend(str(value))


def integer_range(value: object) -> str:
    """What to add to "must be an integer" when ``value`` was written as one past the
    range JSON integers are read in (orjson reads those as floats): the range, so the
    caller knows why; "" for anything else."""
    # Past the range, an integer is read as a float of magnitude 2**63 or more (the
    # nearest float to -2**63 - 1 is -2**63 itself).
    if isinstance(value, float) and value.is_integer() and abs(value) >= (1 << 63):
        return " from -2**63 to 2**64-1 (JSON integers past it are read as floating-point numbers)"
    return ""
