"""The catalogs of the memory jobs: which files a job has processed, as what.

``<metadata_dir>/catalog/<job>.jsonl.zst`` holds one record per file (its ``path``, the
``digest`` of what was read, its ``state``), sorted by path. ReMe's ``file_catalog/``
beside it stays as ReMe wrote it; a catalog an older recalld kept there is read from
there until the next save moves it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.errors import CorruptState
from recalld.daemon.store.fsio import REAL, ensure_dir
from recalld.daemon.store.records import read_records, write_records

log = logging.getLogger(__name__)


def catalog_path(root: Path, metadata_dir: str, job: str) -> Path:
    """recalld's catalog of ``job``: beside ReMe's ``file_catalog/``, which stays ReMe's."""
    return root / metadata_dir / "catalog" / f"{job}.jsonl.zst"


def _legacy_path(path: Path) -> Path:
    """Where recalld kept the catalog before: in ReMe's ``file_catalog/`` folder."""
    return path.parent.parent / "file_catalog" / path.name


def catalog_exists(path: Path) -> bool:
    """Whether the catalog of ``path`` is kept: there, or where an older recalld kept it
    (:func:`load_catalog` reads it from there)."""
    return path.is_file() or _legacy_path(path).is_file()


def _ours(records: list[JsonObject]) -> bool:
    """Records recalld wrote (a ``digest`` and a ``state``), not ReMe's file nodes."""
    return bool(records) and all("digest" in r and "state" in r for r in records)


def load_catalog(path: Path) -> dict[str, JsonObject]:
    """Catalog records by path, as read from disk (each with a ``state``); a damaged
    catalog is treated as empty (logged): the worst case is re-reading notes, which the
    integration rules make harmless. A catalog recalld kept in ReMe's folder before is
    read from there until the next save moves it."""
    source = path
    if not path.exists():
        source = _legacy_path(path)
        if not source.exists():
            return {}
    try:
        records = list(read_records(source))
    except CorruptState as exc:
        log.warning("catalog %s is damaged (%s); starting it afresh", source, exc)
        return {}
    if source != path and not _ours(records):
        return {}  # ReMe's own catalog: not ours to read here
    # A record without a path or a state (a catalog written by hand, or by another tool)
    # says nothing of a file: left out, its file is processed as a new one.
    whole = [r for r in records
             if isinstance(r.get("path"), str) and isinstance(r.get("state"), str)]
    if len(whole) < len(records):
        log.warning("catalog %s: %d record(s) without a path or a state left out", source,
                    len(records) - len(whole))
    return {str(r["path"]): r for r in whole}


def save_catalog(path: Path, records: Mapping[str, Mapping[str, object]]) -> None:
    ensure_dir(REAL, path.parent)
    write_records(REAL, path, [records[k] for k in sorted(records)])
    legacy = _legacy_path(path)
    if legacy.exists():
        # recalld's old copy in ReMe's folder goes, so ReMe finds nothing it cannot read.
        try:
            if _ours(list(read_records(legacy))):
                REAL.unlink(legacy)
        except (CorruptState, OSError) as exc:
            log.warning("leaving %s in place: %s", legacy, exc)


def put_back_plan(current: Mapping[str, Mapping[str, object]],
                  changes: Mapping[str, object],
                  ) -> tuple[dict[str, Mapping[str, object]], list[str]]:
    """What undoing a run does to a catalog now ``current``: of ``changes`` (each key's
    record ``before`` and ``after`` the run), the records to put back as they were before
    it, and the keys to remove (the run added them); a key whose record is no longer the
    run's ``after`` is left alone (what a later run did stands). The local catalog and a
    shared workspace's on the server are undone by it alike."""
    put: dict[str, Mapping[str, object]] = {}
    dropped: list[str] = []
    for key, change in changes.items():
        if not isinstance(change, Mapping) or current.get(key) != change.get("after"):
            continue
        before = change.get("before")
        if isinstance(before, Mapping):
            put[key] = before
        else:
            dropped.append(key)
    return put, dropped


def forced_changes(run: Mapping[str, object]) -> dict[str, Mapping[str, object]]:
    """The catalog changes a forced undo of the dream run whose record is ``run`` puts
    back beside the run's own: those of the notes whose facts later runs put in the files
    it restores (``undo_pending.later_catalog``; none once the undo is finished)."""
    pending = run.get("undo_pending")
    later = pending.get("later_catalog") if isinstance(pending, Mapping) else None
    if not isinstance(later, Mapping):
        return {}
    return {str(k): v for k, v in later.items() if isinstance(v, Mapping)}


def undo_changes(path: Path, run: Mapping[str, object], *, save: bool = True) -> list[str]:
    """Put back the records of the catalog at ``path`` that the dream run whose record is
    ``run`` changed (:func:`put_back_plan`), and those a forced undo of it takes back
    (:func:`forced_changes`: for a note both changed, the later record is the one it
    finds); the notes whose records went back, which the next run
    reads again. A record of before runs kept their catalog changes: the records of its
    notes that still name it are removed. With ``save`` false, only what it would put
    back (the catalog is left as it is)."""
    catalog = load_catalog(path)
    changes = run.get("catalog")
    if not isinstance(changes, Mapping):
        notes = run.get("notes")
        changes = {n: {"before": None, "after": catalog[n]}
                   for n in (notes if isinstance(notes, list) else [])
                   if n in catalog and catalog[n].get("run_id") == run.get("run_id")}
    later = forced_changes(run)
    put, dropped = put_back_plan(catalog, {**changes, **later})
    if (put or dropped) and save:
        catalog.update((key, dict(record)) for key, record in put.items())
        for key in dropped:
            catalog.pop(key, None)
        save_catalog(path, catalog)
    notes = run.get("notes")
    return sorted(str(r) for r in [*put, *dropped]
                  if (isinstance(notes, list) and r in notes) or r in later)
