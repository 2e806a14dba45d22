"""Every workspace the daemon has served: ``<data>/state/workspaces.json``.

The workspace registry records a workspace here when it opens (its path and the
``workspace.open`` overrides) and drops it on ``workspace.close {forget: true}``; the
supervisor reopens every recorded workspace at start, so each keeps its watcher, its
resource catalog and its dream cron after a restart even if no client connects again.

The file is versioned and carries a CRC32 of its canonical entries; it is written by
atomic publish (temp file, fsync, rename, fsync of the directory). A file that does not
verify is set aside as ``workspaces.json.corrupt`` and the daemon starts with the
workspaces of its config file only (logged). Blocking I/O: call from a worker thread.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

import orjson

from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir

log = logging.getLogger(__name__)

VERSION = 1


class Remembered(TypedDict):
    """One recorded workspace."""

    path: str
    #: The ``config`` overrides it was opened with (null: none).
    config: dict[str, Any] | None
    registered_at: float


def _canonical(entries: Mapping[str, Remembered]) -> bytes:
    return orjson.dumps(dict(entries), option=orjson.OPT_SORT_KEYS)


def load(path: Path) -> dict[str, Remembered]:
    """The recorded workspaces (none if the file is missing or does not verify)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        doc = orjson.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ValueError(f"unknown version {doc.get('version')!r}"
                             if isinstance(doc, dict) else "not an object")
        entries = doc["workspaces"]
        if not isinstance(entries, dict):
            raise ValueError("workspaces is not an object")
        if doc.get("crc32") != f"{zlib.crc32(_canonical(entries)):08x}":
            raise ValueError("checksum mismatch")
        out: dict[str, Remembered] = {}
        for agent_id, rec in entries.items():
            if not isinstance(rec, dict) or not isinstance(rec.get("path"), str):
                raise ValueError(f"bad entry {agent_id!r}")
            config = rec.get("config")
            out[str(agent_id)] = Remembered(
                path=rec["path"], config=config if isinstance(config, dict) else None,
                registered_at=float(rec.get("registered_at") or 0.0))
        return out
    except (ValueError, KeyError, TypeError) as exc:
        aside = path.with_name(path.name + ".corrupt")
        log.error("%s does not verify (%s); set aside as %s, starting with the configured "
                  "workspaces only", path, exc, aside.name)
        os.replace(path, aside)
        return {}


def save(path: Path, entries: Mapping[str, Remembered]) -> None:
    """Publish ``entries`` atomically."""
    ensure_dir(REAL, path.parent)
    doc = {"version": VERSION, "crc32": f"{zlib.crc32(_canonical(entries)):08x}",
           "workspaces": dict(entries)}
    atomic_write(REAL, path, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
