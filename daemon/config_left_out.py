"""The config file's secrets a restore left out, until they are set again.

A backup made without ``--include-secrets`` empties the config file's secrets (model
keys, DSN and URL passwords, ``?key=`` values) and names them (dotted keys) in its
``meta.json``. A restore that puts that file in place records here which of them are
missing, in ``<state>/config_left_out.json``; status and doctor show them until a start
or reload finds them set in the config file. Blocking helpers: the daemon runs them in
worker threads.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

import orjson

from recalld.daemon.remembered import has_value
from recalld.daemon.services import LiveConfig
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir
from recalld.ipc import paths
from recalld.ipc.errors import RecalldError

__all__ = ["left_out_warning", "note", "refresh"]

log = logging.getLogger(__name__)

VERSION = 1
FILE_NAME = "config_left_out.json"
#: A reload's :func:`refresh` and a restore's :func:`note` (worker threads, the one not
#: waiting for the other) each read, write and publish the whole list.
_LOCK = threading.Lock()


def _missing(config_path: Path, keys: Iterable[str]) -> list[str]:
    """Those of ``keys`` the config file still holds emptied (all of them if it cannot be
    read, none if there is none). One taken out of the file is no longer missing (its
    key comes from the environment now, or is not wanted), nor a ``dsn`` whose table
    names a ``passfile`` or ``password_env``."""
    try:  # read as a start reads it: a byte order mark first, never waiting on a FIFO
        doc = paths.read_config(config_path)  # none left ({}): the defaults apply
    except paths.PathError:
        return list(keys)
    return [k for k in keys if _emptied(doc, k)]


def _emptied(node: object, dotted: str) -> bool:
    """Whether ``node`` holds an emptied value at ``dotted``, whose parts may hold dots
    themselves (``workspaces.writer.v2.remote.dsn``: agent ids may) or index a list."""
    if isinstance(node, list):
        head, _, rest = dotted.partition(".")
        return (head.isdigit() and int(head) < len(node) and rest != ""
                and _emptied(node[int(head)], rest))
    if not isinstance(node, dict):
        return False
    for key, value in node.items():
        if dotted == key:
            last = key.rsplit(".", 1)[-1]
            if last == "dsn" and (node.get("passfile") or node.get("password_env")):
                return False  # its password comes from there
            return not has_value({last: value}, last)
        if dotted.startswith(f"{key}.") and _emptied(value, dotted[len(key) + 1:]):
            return True
    return False


def _load(path: Path) -> list[str]:
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("%s cannot be read (%s): the config file's secrets a restore left out "
                    "are no longer shown", path, exc)
        return []
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if (doc.get("version") != VERSION or not isinstance(keys, list)
            or not all(isinstance(k, str) for k in keys)
            or doc.get("crc32") != f"{zlib.crc32(orjson.dumps(keys)):08x}"):
        log.warning("%s does not verify: the config file's secrets a restore left out are "
                    "no longer shown", path)
        return []
    return keys


def _save(path: Path, keys: list[str]) -> None:
    """Keep ``keys`` for the next start; a failure is logged (they are shown meanwhile,
    and neither a restore nor a start fails for it)."""
    try:
        if not keys:
            path.unlink(missing_ok=True)
            return
        ensure_dir(REAL, path.parent)
        atomic_write(REAL, path, orjson.dumps(
            {"version": VERSION, "crc32": f"{zlib.crc32(orjson.dumps(keys)):08x}",
             "keys": keys}))
    except (OSError, RecalldError) as exc:
        log.error("%s cannot be written (%s): the config file's secrets a restore left "
                  "out (%s) are shown until the daemon stops", path,
                  getattr(exc, "message", exc), ", ".join(keys) or "none now")


def note(live: LiveConfig, keys: Iterable[str]) -> None:
    """A restore put a config file in place that the backup left ``keys`` out of: those
    it does not set are shown from now on (none: what an earlier one left out is over)."""
    with _LOCK:
        cfg = live.current
        missing = _missing(cfg.config_path, keys)
        _save(cfg.state_dir / FILE_NAME, missing)
        live.left_out = missing


def refresh(live: LiveConfig) -> None:
    """At a start or reload: those of the recorded keys the config file sets now are no
    longer shown."""
    with _LOCK:
        cfg = live.current
        path = cfg.state_dir / FILE_NAME
        recorded = _load(path)
        missing = _missing(cfg.config_path, recorded) if recorded else []
        if missing != recorded:
            _save(path, missing)
        live.left_out = missing


def left_out_warning(config_path: Path, keys: list[str]) -> str:
    """What a restore that left ``keys`` out of the config file says, with the fix."""
    return (f"{', '.join(keys)} of {config_path} left out of the backup (made without "
            f"--include-secrets): set {'it' if len(keys) == 1 else 'them'} there (or take "
            "out those the environment provides), then reload the daemon (systemctl --user "
            "reload recalld, or kill -HUP it)")
