"""JSON where it crosses the daemon's boundaries: the one place values are untyped.

A :data:`JsonObject` is a JSON object as it was just parsed (a request's params, a provider's
or a model's answer, a record file read back from disk, user metadata) or as it is about to be
serialised. Code checks what it reads from one and passes typed records (TypedDicts,
dataclasses) inward; it writes records that have a fixed shape as TypedDicts.

The alias is the one the client libraries use (:mod:`recalld.ipc.answers`), so the daemon
and the clients name the same thing the same way.
"""

from __future__ import annotations

from recalld.ipc.answers import JsonObject

__all__ = ["JsonObject"]
