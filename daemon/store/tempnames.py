"""The names of temp files: what an atomic publish writes before its rename, and how a
cleanup knows them (``.<name>.tmp-<hex>``). Owns nothing and starts nothing."""

from __future__ import annotations

import os
import re
import secrets

from recalld.daemon.safepath import MAX_NAME_BYTES

#: A temp file left by an interrupted publish: ``.<name>.tmp-<hex>``.
TEMP_RE = re.compile(r"^\..+\.tmp-[0-9a-f]{8,}$")


def temp_name(name: str) -> str:
    """A fresh temp name for publishing ``name`` (matches ``TEMP_RE``); ``name`` is cut
    short where the whole would pass ``MAX_NAME_BYTES``."""
    suffix = f".tmp-{secrets.token_hex(6)}"
    return "." + fit_name(name, MAX_NAME_BYTES - 1 - len(suffix)) + suffix


def fit_name(text: str, limit: int) -> str:
    """``text`` cut at a character boundary to at most ``limit`` bytes as a file name."""
    n = min(len(text), limit)  # a character takes at least one byte
    while n and len(os.fsencode(text[:n])) > limit:
        n -= 1
    return text[:n]


def temp_prefix(name: str) -> str:
    """What every ``temp_name(name)`` starts with: the temp files of ``name`` alone."""
    return temp_name(name).rsplit(".tmp-", 1)[0] + ".tmp-"
