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
import re
import time
import unicodedata
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import NotRequired, TypedDict

import orjson

from recalld.daemon.config_rules import (
    AGENT_ID_RULE,
    SECRET_SETTING,
    URL_QUERY_SECRET,
    url_without_secrets,
    valid_agent_id,
)
from recalld.daemon.dsn import dsn_without_password
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.errors import CorruptState
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir, read_verified
from recalld.ipc.agent_ids import same_id_refusal
from recalld.ipc.errors import InvalidParams

log = logging.getLogger(__name__)

VERSION = 1


class Remembered(TypedDict):
    """One recorded workspace."""

    path: str
    #: The ``config`` overrides it was opened with (null: none).
    config: JsonObject | None
    registered_at: float
    #: Secrets of ``config`` a restore could not put back (left out of the backup), as
    #: dotted keys (``chat_model_config.api_key``); cleared when a client hands them over.
    left_out: NotRequired[list[str]]
    #: The agent's name its id was made of (``workspace.open``'s ``name``): the one agent
    #: whose workspace it is, when names of several agents make the same id.
    name: NotRequired[str]


_EMPTIED_PASSWORD = re.compile(r"(?i)^[a-z][a-z0-9+.-]*://[^/:\s]*:@")


def strip_secrets(config: Mapping[str, object], prefix: str = "",
                  ) -> tuple[JsonObject, list[str]]:
    """``config`` without its secrets: every non-empty string under a secret-named key
    (``api_key``, ``token``, ``password`` ...) left out, every URL password and URL
    parameter named like a credential emptied; and the dotted keys of what was taken
    out."""
    out: JsonObject = {}
    taken: list[str] = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out[key], inner = strip_secrets(value, name + ".")
            taken += inner
        elif isinstance(value, str) and value and SECRET_SETTING.search(str(key)):
            taken.append(name)
        elif key == "dsn" and isinstance(value, str):
            out[key] = dsn_without_password(value)
            if out[key] != value:
                taken.append(name)
        elif isinstance(value, str) and url_without_secrets(value) != value:
            out[key] = url_without_secrets(value)
            taken.append(name)
        else:
            out[key] = value
    return out, taken


def has_value(config: Mapping[str, object] | None, dotted: str) -> bool:
    """True if ``config`` holds a non-empty value at ``dotted`` (``a.b.c``)."""
    node: object = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    if isinstance(node, str) and (_EMPTIED_PASSWORD.match(node) or any(
            m.end() == m.end(1) for m in URL_QUERY_SECRET.finditer(node))):
        return False  # a URL whose password or key was left out
    if dotted.rsplit(".", 1)[-1] == "dsn" and isinstance(node, str):
        return dsn_without_password(node) != node  # it names its password again
    return node not in (None, "")


def check_owner(record: Remembered | None, agent_id: str, name: str | None) -> None:
    """InvalidParams if the workspace of ``agent_id`` (``record``) was recorded for
    another agent's name than ``name``: two agents ("Sales Bot" and "Sales_Bot") whose
    names make one agent id would read and write one memory."""
    owner = record.get("name") if record is not None else None
    if name is None or owner is None or _nfc(owner) == _nfc(name):
        return  # "Café" typed and "Café" decomposed are one name
    raise InvalidParams(same_id_refusal(agent_id, name, owner))


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def _canonical(entries: Mapping[str, Remembered]) -> bytes:
    return orjson.dumps(dict(entries), option=orjson.OPT_SORT_KEYS)


def load(path: Path) -> dict[str, Remembered]:
    """The recorded workspaces (none if the file is missing or does not verify)."""
    try:
        data = read_verified(path, None)  # refuses a directory or device in its place
    except CorruptState as exc:
        return {} if exc.reason == "missing" else _set_aside(path, exc.reason)
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
            if not valid_agent_id(agent_id):
                # No method can name it (each checks the id), and it broke those that list
                # every workspace's jobs (recalld status): the others are served.
                log.error("%s: the record of %r is passed by: not an agent id (%s)", path,
                          agent_id, AGENT_ID_RULE)
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("path"), str):
                raise ValueError(f"bad entry {agent_id!r}")
            config = rec.get("config")
            out[str(agent_id)] = Remembered(
                path=rec["path"], config=config if isinstance(config, dict) else None,
                registered_at=float(rec.get("registered_at") or 0.0))
            if isinstance(rec.get("name"), str) and rec["name"]:
                out[str(agent_id)]["name"] = rec["name"]
            left_out = rec.get("left_out")
            if isinstance(left_out, list) and left_out:
                out[str(agent_id)]["left_out"] = [str(k) for k in left_out]
        return out
    except (ValueError, KeyError, TypeError) as exc:
        return _set_aside(path, str(exc))


def _aside(path: Path) -> Path:
    return path.with_name(path.name + ".corrupt")


def set_aside_copy(path: Path) -> str | None:
    """The copy of the record at ``path`` that was set aside because it did not verify,
    if it is still there (blocking)."""
    return str(_aside(path)) if _aside(path).exists() else None


def _set_aside(path: Path, reason: str) -> dict[str, Remembered]:
    aside = _aside(path)
    log.error("%s does not verify (%s); set aside as %s, starting with the configured "
              "workspaces only", path, reason, aside.name)
    if aside.is_dir() and not aside.is_symlink():
        aside = path.with_name(f"{aside.name}-{time.time_ns()}")  # a directory set aside before
    os.replace(path, aside)
    return {}


def dump(entries: Mapping[str, Remembered]) -> bytes:
    """The file's bytes for ``entries``."""
    doc = {"version": VERSION, "crc32": f"{zlib.crc32(_canonical(entries)):08x}",
           "workspaces": dict(entries)}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def without_secrets(data: bytes) -> tuple[bytes, dict[str, list[str]]]:
    """A record file's bytes with the secrets of every workspace's ``config`` taken out
    (:func:`strip_secrets`), and what was taken out by agent id. Bytes that are not a
    record are returned as they are."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data, {}
    entries = doc.get("workspaces") if isinstance(doc, dict) else None
    if not isinstance(entries, dict):
        return data, {}
    taken: dict[str, list[str]] = {}
    for agent_id, rec in entries.items():
        if isinstance(rec, dict) and isinstance(rec.get("config"), dict):
            rec["config"], keys = strip_secrets(rec["config"])
            if keys:
                taken[str(agent_id)] = keys
    return dump(entries), taken


def save(path: Path, entries: Mapping[str, Remembered]) -> None:
    """Publish ``entries`` atomically."""
    ensure_dir(REAL, path.parent)
    atomic_write(REAL, path, dump(entries))
