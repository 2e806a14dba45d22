"""ReMe's (QwenPaw's) dream record: which daily notes its auto_dream already consolidated.

ReMe 0.4.2 keeps them in ``<metadata_dir>/file_catalog/dream.jsonl.zst``, one file node
per note (``path``, ``st_mtime``: the note's modification time when the dream read it); a
note whose time differs is new to its next dream. recalld keys its own catalog by content
hash (``dream.py``), so a note ReMe consolidated is recognised when recalld's dream meets
it as ReMe read it: if its modification time is still the one ReMe recorded, the note is
as ReMe read it and its current hash goes into recalld's catalog as processed; if it
changed since, it is dreamed like any new note. A copy that did not keep file times (cp
-r, a download, a checkout) gives every note a new time: then ReMe's index vouches for
the text instead, when its file graph records the note at the time the dream recorded
(ReMe indexed the version its dream read) and its chunk store's chunks of the note still
say what the note says (``reme_chunks.still_says``). That holds for a note recalld's catalog
already has under an older text too (edited while QwenPaw served the workspace, then
consolidated by ReMe's dream): the workspace may go back and forth. A note renamed or
moved since (``mv`` keeps its time) is recognised at its new path when it has the time
the dream recorded for a note that is gone and ReMe's index vouches for its text under
that path; so is a note whose name is the recorded one in another Unicode normal form
(composed by a checkout or an archive of a workspace whose names macOS had decomposed),
whatever its time. ReMe's file is only
read, never written. Blocking: call from worker threads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from recalld.daemon import safepath
from recalld.daemon.index import reme_import
from recalld.daemon.index.reme_chunks import ReMeChunk, still_says
from recalld.daemon.memory.fileops import read_confined
from recalld.daemon.store.errors import StorageError
from recalld.daemon.store.records import read_foreign_records
from recalld.ipc.errors import RecalldError

log = logging.getLogger(__name__)

REME_DREAM_CATALOG: Final = "file_catalog/dream.jsonl.zst"
#: ReMe's file graph: each indexed note with the time it had when indexed.
REME_FILE_GRAPH: Final = "file_graph/default.jsonl.zst"


@dataclass(slots=True)
class ReMeDreamed:
    """The notes ReMe's dream consolidated, as they are now."""

    #: ``(path, text)`` of notes unchanged since ReMe's dream read them.
    unchanged: list[tuple[str, str]] = field(default_factory=list)
    #: Notes ReMe consolidated that changed since (dreamed again) or are gone.
    changed: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    #: Records that are not ReMe file nodes.
    skipped: int = 0
    #: Why part of the file could not be read (the notes in that part are dreamed again).
    damaged: str | None = None


def read_reme_dreamed(root: Path, metadata_dir: str, daily_dir: str,
                      known: Mapping[str, object] | None = None) -> ReMeDreamed | None:
    """The daily notes ReMe's dream catalog records, except those ``known`` (recalld's
    catalog) has processed as they are now; None when the workspace has no ReMe dream
    catalog. A note ``known`` has under another text is recognised only when ReMe's
    dream read it as it is now (it is otherwise left out, neither changed nor gone)."""
    path = root / metadata_dir / REME_DREAM_CATALOG
    if not path.is_file():
        return None
    try:
        found = read_foreign_records(path)
    except (OSError, StorageError) as exc:
        log.warning("cannot read ReMe's dream catalog %s: %s", path, exc)
        return None
    out = ReMeDreamed(damaged=found.damage())
    if out.damaged is not None:
        log.warning("ReMe's dream catalog %s is damaged (%s): the notes it lost count as "
                    "not consolidated", path, out.damaged)
    prefix = daily_dir.rstrip("/") + "/"
    index = _ReMeIndex(root / metadata_dir)
    gone: dict[str, float] = {}  # a note no longer there, and the time ReMe's dream read
    for rec in found.records:
        rel, mtime = rec.get("path"), rec.get("st_mtime")
        if (not isinstance(rel, str) or not isinstance(mtime, int | float)
                or isinstance(mtime, bool) or "digest" in rec):
            out.skipped += 1
            continue
        if not rel.startswith(prefix) or not rel.endswith(".md"):
            continue  # day indexes (``memory/<day>.md``)
        try:
            safepath.split_relative(rel)
        except RecalldError:  # a NUL byte, ``..``, a name too long: no note of this workspace
            out.skipped += 1
            continue
        ours = (known or {}).get(rel)
        try:
            st = os.stat(root / rel, follow_symlinks=False)
            text = read_confined(root, rel)
        except (OSError, RecalldError):
            text = None
        if ours is not None:
            # recalld's catalog has it: ReMe's record counts only for a text recalld has
            # not processed that ReMe's dream read as it is now.
            if (text is not None and not _processed(ours, text)
                    and (st.st_mtime == float(mtime) or index.holds(rel, text, mtime))):
                out.unchanged.append((rel, text))
        elif text is None:
            gone[rel] = float(mtime)
        elif st.st_mtime == float(mtime) or index.holds(rel, text, mtime):
            out.unchanged.append((rel, text))
        else:
            out.changed.append(rel)
    recorded = {r.get("path") for r in found.records} | set(known or {})
    moved = _moved(root, daily_dir, gone, recorded, index) if gone else {}
    out.unchanged += moved.values()
    out.gone = [rel for rel in gone if rel not in moved]
    return out


def _moved(root: Path, daily_dir: str, gone: Mapping[str, float], recorded: set[object],
           index: _ReMeIndex) -> dict[str, tuple[str, str]]:
    """``{former path: (path, text)}`` of the notes of ``gone`` renamed or moved since
    ReMe's dream read them: a daily note neither catalog has, with the time ReMe's dream
    recorded for one that is gone (a rename keeps a note's time) or with its name in
    another Unicode normal form (a copy that composed or decomposed the names may not have
    kept the times), whose text ReMe's index shows is what that one said as its dream
    read it."""
    at: dict[float, list[str]] = {}
    named: dict[str, list[str]] = {}
    for rel, mtime in gone.items():
        at.setdefault(mtime, []).append(rel)
        named.setdefault(unicodedata.normalize("NFC", rel), []).append(rel)
    out: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root / daily_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if not name.endswith(".md") or name.startswith(".") or rel in recorded:
                continue
            try:
                st = os.stat(root / rel, follow_symlinks=False)
                former = [g for g in dict.fromkeys((
                    *at.get(st.st_mtime, ()),
                    *named.get(unicodedata.normalize("NFC", rel), ()))) if g not in out]
                text = read_confined(root, rel) if former else None
            except (OSError, RecalldError):
                continue
            was = next((g for g in former if text and index.holds(g, text, gone[g])), None)
            if was is not None:
                out[was] = (rel, text or "")
    return out


class _ReMeIndex:
    """ReMe's file graph and chunk store, read the first time a note's time does not
    tell (at most once a call: a note found unchanged is in recalld's catalog after)."""

    def __init__(self, metadata_dir: Path) -> None:
        self._dir = metadata_dir
        self._times: dict[str, float] | None = None
        self._chunks: dict[str, list[ReMeChunk]] = {}

    def holds(self, rel: str, text: str, dreamed_at: float) -> bool:
        """Whether ReMe indexed ``rel`` as its dream read it (at ``dreamed_at``) and its
        chunks of it still say what ``text`` says."""
        if self._times is None:
            self._times = self._load()
        return (self._times.get(rel) == float(dreamed_at)
                and still_says(rel, text, self._chunks.get(rel, [])))

    def _load(self) -> dict[str, float]:
        times: dict[str, float] = {}
        path = self._dir / REME_FILE_GRAPH
        try:
            graph = read_foreign_records(path).records if path.is_file() else []
        except (OSError, StorageError):
            graph = []  # unreadable: the times alone decide
        for rec in graph:
            rel, mtime = rec.get("path"), rec.get("st_mtime")
            if (isinstance(rel, str) and isinstance(mtime, int | float)
                    and not isinstance(mtime, bool)):
                times[rel] = float(mtime)
        store = reme_import.read_store(self._dir) if times else None
        self._chunks = store.chunks if store is not None else {}
        return times


def _processed(record: object, text: str) -> bool:
    """Whether recalld's catalog ``record`` says ``text`` was dreamed as it is."""
    return (isinstance(record, Mapping) and record.get("state") == "processed"
            and record.get("digest") == hashlib.sha256(text.encode("utf-8")).hexdigest())


__all__ = ["REME_DREAM_CATALOG", "ReMeDreamed", "read_reme_dreamed"]
