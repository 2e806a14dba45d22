"""ReMe's (QwenPaw's) auto_resource record: which resource files it already turned into notes.

ReMe 0.4.2 keeps one file node per resource file it read in
``<metadata_dir>/file_catalog/resource.jsonl.zst`` (``path``, ``st_mtime``: the file's
modification time when it was read) and writes each summary as a daily note whose
frontmatter names its source, ``source_resource: "[[resource/...]]"``, as recalld's notes
do. A resource file new to recalld's catalog that has such a note is that note's source:
recalld rewrites that note, not a second one, when it interprets the file; and when
ReMe's record still has the file's modification time, the note is of the file as it is
and nothing is interpreted again (recalld's own notes, found the same way when its
catalog is gone, carry the file's digest instead). Names are compared in one Unicode
normal form (:func:`same_name`): a file ReMe read under a decomposed name (as macOS
wrote it) that came over composed is the same file. ReMe's file is only read, never
written. Blocking: call from worker threads.
"""

from __future__ import annotations

import logging
import os
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.resource_files import iso_date, resource_date
from recalld.daemon.store.errors import StorageError
from recalld.daemon.store.records import ForeignRecords, read_foreign_records
from recalld.ipc.errors import PathOutsideWorkspace

log = logging.getLogger(__name__)

REME_RESOURCE_CATALOG: Final = "file_catalog/resource.jsonl.zst"
# A note's frontmatter lies in its first lines: no need to read a long note whole.
_HEAD_BYTES: Final = 8192


def same_name(name: str) -> str:
    """``name`` (a path, a ``[[link]]``) as names are compared: in NFC."""
    return unicodedata.normalize("NFC", name)


def read_reme_resources(root: Path, metadata_dir: str) -> dict[str, float]:
    """``{resource path (its :func:`same_name`): modification time ReMe read it at}`` from
    ReMe's record (empty when the workspace has none or it cannot be read)."""
    found, damage = _read_catalog(root / metadata_dir / REME_RESOURCE_CATALOG)
    if damage is not None:
        log.warning("ReMe's resource catalog %s/%s: %s: the resources it lost are "
                    "interpreted again", metadata_dir, REME_RESOURCE_CATALOG, damage)
    out: dict[str, float] = {}
    for rec in found.records:
        rel, mtime = rec.get("path"), rec.get("st_mtime")
        if isinstance(rel, str) and isinstance(mtime, int | float) and not isinstance(
                mtime, bool):
            out[same_name(rel)] = float(mtime)
    return out


def reme_resources_damage(root: Path, metadata_dir: str) -> str | None:
    """Why part of ReMe's resource catalog cannot be read (its resources are interpreted
    again), or None when it is whole or absent."""
    return _read_catalog(root / metadata_dir / REME_RESOURCE_CATALOG)[1]


def _read_catalog(path: Path) -> tuple[ForeignRecords, str | None]:
    if not path.is_file():
        return ForeignRecords(), None
    try:
        found = read_foreign_records(path)
    except (OSError, StorageError) as exc:
        return ForeignRecords(), f"cannot be read: {exc}"
    return found, found.damage()


def unchanged_since(root: Path, rel: str, mtime: float) -> bool:
    """Whether ``root/rel`` still has the modification time ReMe recorded."""
    try:
        return os.stat(root / rel, follow_symlinks=False).st_mtime == mtime
    except OSError:
        return False


def resource_notes(root: Path, daily_dir: str) -> dict[str, str]:
    """``{"[[resource/...]]" (its :func:`same_name`): daily note}``: the notes that name a
    resource file as their ``source_resource`` (the first by path when several do)."""
    out: dict[str, str] = {}
    top = root / daily_dir
    real = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(".md") or name.startswith("."):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            source = note_fields(root, rel, real).get("source_resource")
            if isinstance(source, str) and source.strip():
                out.setdefault(same_name(source.strip()), rel)
    return out


def note_fields(root: Path, rel: str, real: str | None = None) -> JsonObject:
    """The frontmatter of the note ``root/rel`` (empty when it cannot be read)."""
    try:
        with os.fdopen(safepath.open_inside(root, rel, real), "rb") as fh:
            head = fh.read(_HEAD_BYTES).decode("utf-8", "replace")
    except (OSError, PathOutsideWorkspace):
        return {}
    return parse_frontmatter(head)[0]


def take_note(root: Path, rel: str, inside: str, new: JsonObject, read_at: float | None,
              notes_by_source: Mapping[str, str]) -> None:
    """Of ``new`` (the record of ``rel``, ``inside`` resource/, new to the catalog), the
    note that names it as its source (``notes_by_source``: :func:`resource_notes`): one
    ReMe wrote, or recalld before its catalog was lost (damaged, or a workspace copied
    without its metadata_dir). That note is the file's, and the file is not interpreted
    again while it is as the note read it: ReMe's record has the file's modification time
    (``read_at``), recalld's note the file's digest (blocking)."""
    note = notes_by_source.get(named := same_name(f"[[{rel}]]"))
    if note is None:
        return
    new["note"] = note
    if read_at is not None:
        if unchanged_since(root, rel, read_at):
            new.update(state="processed", reason="interpreted by ReMe", source="reme")
        return
    fields = note_fields(root, note)
    if same_name(str(fields.get("source_resource"))) != named:
        new["note"] = None  # no longer that file's note (renamed, rewritten, gone)
        return
    seen = iso_date(fields.get("date"))
    if seen is not None:  # the day it was first seen, which the catalog knew
        new.update(first_seen=seen, date=resource_date(inside, seen))
    if fields.get("resource_digest") == new["digest"]:
        new["state"] = "processed"


__all__ = ["REME_RESOURCE_CATALOG", "note_fields", "read_reme_resources", "reme_resources_damage",
           "resource_notes", "same_name", "take_note", "unchanged_since"]
