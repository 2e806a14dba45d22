"""Undo of a dream run: its files put back as they were before it (see :mod:`changelog`).

Everything here blocks on the file system: run it in a worker thread.
"""

from __future__ import annotations

import base64
import errno
import logging
import os
import re
import stat
from pathlib import Path
from typing import Final, TypedDict

import orjson

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory.catalog import undo_changes
from recalld.daemon.memory.changelog import (
    DamagedRecord,
    UndoConflict,
    load_run,
    record_ids,
    run_order,
    sha256,
)
from recalld.daemon.memory.fileops import MAX_WRITE_BYTES
from recalld.daemon.safepath import masked
from recalld.daemon.store.errors import translate_os_error
from recalld.daemon.store.fsio import REAL, atomic_write, atomic_writer, ensure_dir, note_mode
from recalld.ipc.answers import DreamUndone
from recalld.ipc.errors import InvalidParams, NotAllowed, NotFound, RecalldError

log = logging.getLogger(__name__)


def _confined(root: Path, rel: str, allowed_prefix: str) -> Path:
    """``root/rel`` for a path a run record names; refuses anything that could leave the
    digest folder (the record is a file on disk and could have been edited)."""
    parts = rel.split("/")
    if (not rel.startswith(allowed_prefix + "/") or any(p in ("", ".", "..") for p in parts)
            or "\x00" in rel):
        raise DamagedRecord(f"run record names a path outside {allowed_prefix}/: "
                            f"{masked(rel)!r}")
    target = root / rel
    real_root = os.path.realpath(root)
    if not os.path.realpath(target.parent).startswith(real_root + os.sep):
        raise DamagedRecord(f"run record path leaves the workspace: {masked(rel)!r}")
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


def _later_runs(directory: Path, run: JsonObject) -> list[JsonObject]:
    """The records of the runs after ``run`` (see :func:`run_order`), not undone, oldest
    first; one that cannot be read is passed by."""
    since = run_order(run)
    found = []
    for other in record_ids(directory):
        try:
            data = load_run(directory, other)
        except RecalldError:
            continue
        if (run_order(data) > since and not data.get("undone")
                and isinstance(data.get("files"), dict)):
            found.append(data)
    return sorted(found, key=run_order)


def _later_writers(later: list[JsonObject], paths: list[str]) -> dict[str, str]:
    """The newest of the ``later`` runs that wrote each of ``paths`` (those written by none
    are left out): what has to be undone before the run can be."""
    return {path: str(data["run_id"]) for data in later for path in paths
            if path in data["files"]}


def _later_notes(later: list[JsonObject], paths: list[str]) -> dict[str, JsonObject]:
    """The notes whose facts the ``later`` runs put in ``paths``, which a forced undo
    takes out with the runs' writes, and the catalog change that makes the next run read
    each again: its record as the newest of those runs left it, removed (see
    :func:`catalog.put_back_plan`: a record changed since is left alone)."""
    found: dict[str, JsonObject] = {}
    for data in later:
        changes, notes = data.get("catalog"), data.get("notes")
        for action in data.get("actions") or []:
            note = action.get("note") if isinstance(action, dict) else None
            if (not isinstance(note, str) or action.get("status") != "applied"
                    or action.get("path") not in paths or not isinstance(notes, list)
                    or note not in notes):
                continue
            change = changes.get(note) if isinstance(changes, dict) else None
            after = change.get("after") if isinstance(change, dict) else None
            if isinstance(after, dict):
                found[note] = {"before": None, "after": after}
    return found


def _hand_edited(files: JsonObject, later: list[JsonObject],
                 changed: dict[str, bytes]) -> dict[str, bytes]:
    """Of the files ``changed`` since a run (its ``files``; their bytes now), those holding
    edits no run wrote, which a forced undo would drop: a file changed between one run's
    write and the next run's (the ``later`` runs that wrote it), or since the last, or
    carried along unread by one of them (``FileBefore.unread``)."""
    found = {}
    for rel, current in changed.items():
        chain = [files[rel], *(data["files"][rel] for data in later if rel in data["files"])]
        if not all(isinstance(e, dict) for e in chain):
            found[rel] = current
            continue
        befores = [None if e.get("before") is None else sha256(base64.b64decode(e["before"]))
                   for e in chain[1:]]
        afters = [e.get("after_sha256") for e in chain]
        if (any(e.get("unread") for e in chain[1:]) or afters[-1] != sha256(current)
                or any(b != a for b, a in zip(befores, afters, strict=False))):
            found[rel] = current
    return found


def _why_changed(later_run: str | None, by_hand: bool) -> str:
    """What the refusal of an undo says of a file changed since the run."""
    why = [f"written again by run {later_run}: undo it first"] if later_run else []
    if by_hand:
        why.append("edited by hand since: --force drops those edits, keeping them in the "
                   "run's change log")
    return f" ({'; '.join(why)})" if why else ""


#: The bytes of one file edited by hand that a forced undo keeps in the run's change log;
#: more are cut (the log says so). A dream writes no node bigger.
KEPT_MAX: Final = MAX_WRITE_BYTES


def _kept_text(kept: object) -> bytes:
    """The change log's account of the hand edits a forced undo wrote over (``kept``:
    base64 bytes by path), each file's text as it was in a fence it cannot close."""
    if not isinstance(kept, dict) or not kept:
        return b""
    out = [b"The forced undo wrote over edits made by hand since the run; the files "
           b"held this then:\n"]
    for rel in sorted(kept):
        text = base64.b64decode(kept[rel])
        cut = text[:KEPT_MAX]
        longest = max((len(m) for m in re.findall(rb"`+", cut)), default=0)
        fence = b"`" * max(3, longest + 1)
        note = (f" (the first {KEPT_MAX} of {len(text)} bytes)" if len(text) > KEPT_MAX
                else "")
        out.append(f"\n### {masked(rel)}{note}\n\n".encode() + fence + b"\n" + cut
                   + (b"" if cut.endswith(b"\n") else b"\n") + fence + b"\n")
    return b"".join(out)


#: Beside ``<run_id>.json`` while an undo of the run is decided but not finished (a kill
#: cut it short): :func:`finish_pending` finishes it, so the folder need not be read whole.
PENDING_SUFFIX: Final = ".undoing"


class UndoPending(TypedDict):
    """An undo decided (the record says ``undone``) and not finished yet: the files it puts
    back and removes, those it restores over later changes, whether it was forced."""

    restored: list[str]
    removed: list[str]
    forced_over: list[str]
    forced: bool
    #: The catalog records of the notes whose facts later runs put in ``forced_over``
    #: (:func:`_later_notes`): removed with the run's own, the next run reads them again.
    later_catalog: dict[str, JsonObject]
    #: The files edited by hand since the run (:func:`_hand_edited`) as the forced undo
    #: found them (base64): told in the run's change log, where they can be got back.
    kept: dict[str, str]
    shared: bool  # the catalog of a shared workspace's hosts is put back too (see close)


def undo_run(root: Path, directory: Path, run_id: str, *, digest_dir: str,
             force: bool = False, now: str, derived: frozenset[str] = frozenset(),
             catalog: Path | None = None, shared: bool = False) -> DreamUndone:
    """Restore every file the run wrote to its bytes before the run, and the records of the
    dream ``catalog`` it changed (:func:`catalog.undo_changes`).

    ``derived`` files (``interests.yaml``: every run rewrites it from all it saw) are
    restored only if nothing changed them since; a later version is newer, not a conflict.
    Raises NotFound (no such run), InvalidParams (already undone), UndoConflict (a file
    changed since the run and ``force`` is false), DamagedRecord (the record cannot be
    read or is damaged), NotAllowed (a file it names, or its change log, cannot be read);
    nothing is restored then. Once decided, the undo is written in the run's record first:
    an undo a kill cut short is finished by the next undo of the run or
    :func:`finish_pending`, never left half done. With ``shared``, the record says so until
    :func:`close` once the shared catalog's records are put back too.
    """
    data = load_run(directory, run_id)
    if isinstance(data.get("undo_pending"), dict):
        return _finish(root, directory, data, digest_dir=digest_dir, catalog=catalog)
    if data.get("undone"):
        raise InvalidParams(f"dream run {run_id} was already undone at {data['undone']}")
    files: JsonObject = data.get("files") or {}
    plan: list[tuple[str, bytes | None]] = []
    conflicts = []
    dropped: dict[str, bytes] = {}  # what a forced undo would write over, by path
    for rel, rec in sorted(files.items()):
        target = _confined(root, rel, digest_dir)
        before = None if rec.get("before") is None else base64.b64decode(rec["before"])
        try:
            current = _current(target)
        except OSError as exc:  # a folder in its place, a file made unreadable
            raise NotAllowed(f"{masked(rel)} cannot be read ({exc.strerror}): nothing was "
                             "restored") from None
        expected = rec.get("after_sha256")
        now_sha = None if current is None else sha256(current)
        if now_sha != expected:
            if rel in derived:
                continue
            conflicts.append(rel)
            if current is not None and current != before:
                dropped[rel] = current
        if current != before:
            plan.append((rel, before))
    md = directory / f"{run_id}.md"
    try:  # read first: the undo is told in it, and nothing is restored if it cannot be
        _current(md)
    except OSError as exc:  # a link, a folder or a FIFO in its place
        raise NotAllowed(f"the change log {md.name} of the run cannot be read "
                         f"({exc.strerror}): nothing was restored") from None
    later_runs = _later_runs(directory, data) if conflicts else []
    hand = _hand_edited(files, later_runs, dropped)
    if conflicts and not force:
        later = _later_writers(later_runs, conflicts)
        shown = [masked(p) + _why_changed(later.get(p), p in hand) for p in conflicts]
        raise UndoConflict(
            f"changed since run {run_id}: {', '.join(shown)} (use --force to restore "
            "the previous versions anyway)",
            {"conflicts": conflicts, "later_runs": later, "hand_edited": sorted(hand)})
    pending: UndoPending = {
        "restored": [rel for rel, before in plan if before is not None],
        "removed": [rel for rel, before in plan if before is None],
        "forced_over": conflicts if force else [], "forced": bool(conflicts),
        "shared": shared, "later_catalog": _later_notes(later_runs, conflicts),
        "kept": {rel: base64.b64encode(hand[rel]).decode() for rel in sorted(hand)}}
    # The marker first: a kill before the record names the undo leaves a marker that
    # finish_pending drops; after it, the undo is decided and is finished from the record.
    atomic_write(REAL, directory / f"{run_id}{PENDING_SUFFIX}", b"")
    data["undone"] = now
    data["undo_pending"] = dict(pending)
    _save(directory, data)
    return _finish(root, directory, data, digest_dir=digest_dir, catalog=catalog)


def _save(directory: Path, data: JsonObject) -> None:
    atomic_write(REAL, directory / f"{data['run_id']}.json",
                 orjson.dumps(data, option=orjson.OPT_INDENT_2))


def _finish(root: Path, directory: Path, data: JsonObject, *, digest_dir: str,
            catalog: Path | None) -> DreamUndone:
    """Do (again) what the decided undo in ``data`` puts back: each step leaves alone what
    a step cut short before already did, so a kill anywhere is finished by a next call."""
    run_id = str(data["run_id"])
    pending: JsonObject = data["undo_pending"]
    files: JsonObject = data.get("files") or {}
    restored, removed = list(pending.get("restored") or []), list(pending.get("removed") or [])
    for rel in restored + removed:
        rec = files.get(rel)
        if not isinstance(rec, dict):
            raise DamagedRecord(f"dream run {run_id}'s undo names {masked(rel)!r}, a file "
                                "the run did not write")
        target = _confined(root, rel, digest_dir)
        before = None if rec.get("before") is None else base64.b64decode(rec["before"])
        try:
            if _current(target) == before:
                continue
            if before is None:
                REAL.unlink(target)
            else:
                ensure_dir(REAL, target.parent)
                with atomic_writer(REAL, target, mode=note_mode(target)) as out:
                    out.write(before)
        except FileNotFoundError:
            continue
        except OSError as exc:  # a folder in its place since: the undo is finished later
            raise NotAllowed(f"{masked(rel)} cannot be restored ({exc.strerror}): the undo "
                             f"of run {run_id} is finished once it can be") from None
    md = directory / f"{run_id}.md"
    told = (f"\nUndone at {data['undone']}: restored {len(restored)}, removed "
            f"{len(removed)} file(s){' (forced)' if pending.get('forced') else ''}.\n").encode()
    told += _kept_text(pending.get("kept"))
    try:
        log_text = _current(md) or b""
    except OSError as exc:
        raise NotAllowed(f"the change log {md.name} of the run cannot be read "
                         f"({exc.strerror}): the undo of run {run_id} is finished once it "
                         "can be") from None
    if not log_text.endswith(told):
        atomic_write(REAL, md, log_text + told)
    if catalog is not None:
        if not isinstance(pending.get("dreamed_again"), list):
            # Kept before the catalog is saved: finished again, the answer is the same.
            pending["dreamed_again"] = undo_changes(catalog, data, save=False)
            _save(directory, data)
        undo_changes(catalog, data)
    again = [str(n) for n in pending.get("dreamed_again") or []]
    if not pending.get("shared"):
        close(directory, data)
    return {"run_id": run_id, "restored": restored, "removed": removed,
            "forced_over": list(pending.get("forced_over") or []), "dreamed_again": again,
            "hand_edits_kept": sorted(kept) if isinstance(kept := pending.get("kept"), dict)
            else [], "log": md.relative_to(root).as_posix()}


def close(directory: Path, data: JsonObject) -> None:
    """The undo of the run whose record is ``data`` is finished: its record says so."""
    data.pop("undo_pending", None)
    _save(directory, data)
    _drop_marker(directory / f"{data['run_id']}{PENDING_SUFFIX}")


def _drop_marker(path: Path) -> None:
    """Remove an undo's marker; one that cannot be (a folder made in its place) is left,
    told: the record says what is done."""
    try:
        REAL.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("%s stays: %s", masked(str(path)), exc.strerror)


def finish_pending(root: Path, directory: Path, *, digest_dir: str,
                   catalog: Path) -> list[JsonObject]:
    """Finish each undo of a run in ``directory`` that a kill cut short (see
    :func:`undo_run`); a marker left by a kill before the undo was decided goes. The
    records of those finished here (``undo_pending`` left in those whose shared catalog is
    still to be put back). StorageError when the folder cannot be listed (a link in
    place of a folder on its way)."""
    try:  # as the storage layer lists a folder: below a workspace, never through a link
        names = [n for n in REAL.listdir(directory) if n.endswith(PENDING_SUFFIX)]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise translate_os_error(exc, directory) from exc
    done = []
    for name in sorted(names):
        run_id = name.removesuffix(PENDING_SUFFIX)
        try:
            data = load_run(directory, run_id)
            if isinstance(data.get("undo_pending"), dict):
                _finish(root, directory, data, digest_dir=digest_dir, catalog=catalog)
                done.append(data)
                continue
        except DamagedRecord as exc:  # told each time until the record is fixed
            log.warning("the undo of dream run %s is not finished: %s", run_id, exc.message)
            continue
        except (NotFound, InvalidParams):  # no such run: nothing to finish
            pass
        _drop_marker(directory / name)
    return done
