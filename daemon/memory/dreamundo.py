"""Undo of a dream run: its files put back as they were before it (see :mod:`changelog`).

Everything here blocks on the file system: run it in a worker thread.
"""

from __future__ import annotations

import base64
import errno
import os
import stat
from pathlib import Path

import orjson

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.changelog import (
    DamagedRecord,
    UndoConflict,
    load_run,
    record_ids,
    sha256,
)
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir
from recalld.ipc.answers import DreamUndone
from recalld.ipc.errors import InvalidParams, NotAllowed, RecalldError


def _confined(root: Path, rel: str, allowed_prefix: str) -> Path:
    """``root/rel`` for a path a run record names; refuses anything that could leave the
    digest folder (the record is a file on disk and could have been edited)."""
    parts = rel.split("/")
    if (not rel.startswith(allowed_prefix + "/") or any(p in ("", ".", "..") for p in parts)
            or "\x00" in rel):
        raise DamagedRecord(f"run record names a path outside {allowed_prefix}/: {rel!r}")
    target = root / rel
    real_root = os.path.realpath(root)
    if not os.path.realpath(target.parent).startswith(real_root + os.sep):
        raise DamagedRecord(f"run record path leaves the workspace: {rel!r}")
    return target


def _current(path: Path) -> bytes | None:
    """The bytes of the file at ``path`` (None: there is none). OSError if what is there
    is not a regular file: a FIFO's open would wait for a writer (with the workspace's
    writes held), a link is not the file the run wrote."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, not a file") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return fh.read()


def _later_writers(directory: Path, run: JsonObject, paths: list[str]) -> dict[str, str]:
    """The newest run after ``run`` (by start), not undone, that wrote each of ``paths``
    (those written by none are left out): what has to be undone before ``run`` can be."""
    found: dict[str, tuple[str, str]] = {}
    since = (str(run.get("started")), str(run.get("run_id")))
    for other in record_ids(directory):
        try:
            data = load_run(directory, other)
        except RecalldError:
            continue
        when, files = (str(data.get("started")), other), data.get("files")
        if when > since and not data.get("undone") and isinstance(files, dict):
            for path in (p for p in paths if p in files and when > found.get(p, since)):
                found[path] = when
    return {path: when[1] for path, when in found.items()}


def undo_run(root: Path, directory: Path, run_id: str, *, digest_dir: str,
             force: bool = False, now: str, derived: frozenset[str] = frozenset()) -> DreamUndone:
    """Restore every file the run wrote to its bytes before the run.

    ``derived`` files (``interests.yaml``: every run rewrites it from all it saw) are
    restored only if nothing changed them since; a later version is newer, not a conflict.
    Raises NotFound (no such run), InvalidParams (already undone), UndoConflict (a file
    changed since the run and ``force`` is false), DamagedRecord (the record cannot be
    read or is damaged), NotAllowed (a file it names, or its change log, cannot be read);
    nothing is restored then.
    """
    data = load_run(directory, run_id)
    if data.get("undone"):
        raise InvalidParams(f"dream run {run_id} was already undone at {data['undone']}")
    files: JsonObject = data.get("files") or {}
    plan: list[tuple[str, Path, bytes | None]] = []
    conflicts = []
    for rel, rec in sorted(files.items()):
        target = _confined(root, rel, digest_dir)
        before = None if rec.get("before") is None else base64.b64decode(rec["before"])
        try:
            current = _current(target)
        except OSError as exc:  # a folder in its place, a file made unreadable
            raise NotAllowed(f"{rel} cannot be read ({exc.strerror}): nothing was "
                             "restored") from None
        expected = rec.get("after_sha256")
        now_sha = None if current is None else sha256(current)
        if now_sha != expected:
            if rel in derived:
                continue
            conflicts.append(rel)
        if current != before:
            plan.append((rel, target, before))
    md = directory / f"{run_id}.md"
    try:  # read first: the undo is told in it, and nothing is restored if it cannot be
        log_text = _current(md) or b""
    except OSError as exc:  # a link, a folder or a FIFO in its place
        raise NotAllowed(f"the change log {md.name} of the run cannot be read "
                         f"({exc.strerror}): nothing was restored") from None
    if conflicts and not force:
        later = _later_writers(directory, data, conflicts)
        shown = [f"{p} (written again by run {later[p]}: undo it first)" if p in later else p
                 for p in conflicts]
        raise UndoConflict(
            f"changed since run {run_id}: {', '.join(shown)} (use --force to restore "
            "the previous versions anyway)", {"conflicts": conflicts, "later_runs": later})
    restored, removed = [], []
    for rel, target, before in plan:
        if before is None:
            target.unlink(missing_ok=True)
            removed.append(rel)
        else:
            ensure_dir(REAL, target.parent)
            atomic_write(REAL, target, before)
            restored.append(rel)
    data["undone"] = now
    atomic_write(REAL, directory / f"{run_id}.json",
                 orjson.dumps(data, option=orjson.OPT_INDENT_2))
    atomic_write(REAL, md, log_text + f"\nUndone at {now}: restored {len(restored)}, removed "
                 f"{len(removed)} file(s){' (forced)' if conflicts else ''}.\n".encode())
    return {"run_id": run_id, "restored": restored, "removed": removed,
            "forced_over": conflicts if force else [], "dreamed_again": []}
