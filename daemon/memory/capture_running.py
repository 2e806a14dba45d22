"""The note an auto_memory job found before it asked the model, kept while it runs.

A job tells the inbox of the note it changed at its end (or, stopped, as it stops). One
the daemon was killed in is resumed: it asks the model again about the same turns, whose
note already holds them, so it changes nothing and would tell nothing; the change the
killed run made would never be told. So each run records, before it asks the model, the
session's note and a digest of its text in ``<metadata_dir>/auto_memory/running/
<job_id>.json``; a resumed run that finds its job's record with a note since changed tells
of that note. The record goes when the run ends, whatever its end. Blocking file I/O:
call from a worker thread.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson

from recalld.daemon.memory.confined import read_confined
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir, remove_if_there
from recalld.ipc.errors import RecalldError

KIND_DIR = "auto_memory"


def _path(root: Path, metadata_dir: str, job_id: str) -> Path:
    return root / metadata_dir / KIND_DIR / "running" / f"{job_id}.json"


def _state(root: Path, note: str | None) -> list[str | None]:
    try:
        text = read_confined(root, note) if note is not None else None
    except (OSError, RecalldError):
        text = None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest() if text is not None else None
    return [note, digest]


def begin(root: Path, metadata_dir: str, job_id: str, note: str | None) -> bool:
    """Record the run of ``job_id`` about to ask the model, with the session's ``note``
    (None: none yet) as it is now. True if a run of the same job (killed) recorded
    another state of the note: it changed the note and was never told."""
    path = _path(root, metadata_dir, job_id)
    now = _state(root, note)
    try:
        before = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        before = None
    ensure_dir(REAL, path.parent)
    atomic_write(REAL, path, orjson.dumps(now))
    return before is not None and before != now


def end(root: Path, metadata_dir: str, job_id: str) -> None:
    """The run of ``job_id`` ended (told, failed or stopped): its record goes."""
    remove_if_there(REAL, _path(root, metadata_dir, job_id))
