"""The journal of a dream run going on: what it wrote, as it writes it.

A run's change log and undo record (:mod:`changelog`) are written when the run ends. So
that a daemon killed in the middle of a run does not leave writes nobody can undo, each
write (the file's bytes before and the checksum after) and each action is appended to
``<run_id>.journal`` beside the records (an fsynced append log, :mod:`applog`: linear in
what the run writes, however many files it touches). The run's end publishes the record
and removes the journal; :func:`recover` turns the journal of a run that never ended into
its record (``finished`` empty), which undo and the run list then see. A journal whose
record exists (the daemon stopped before the run's inbox item was pushed) is removed,
and the run returned so that the inbox is told then.

Blocking file I/O: run it in a worker thread.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Final, cast

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import changelog
from recalld.daemon.store.applog import AppendLog, replay
from recalld.daemon.store.errors import StorageError, translate_os_error
from recalld.daemon.store.fsio import REAL, remove_if_there

log = logging.getLogger(__name__)

SUFFIX: Final = ".journal"


def journal_path(directory: Path, run_id: str) -> Path:
    return directory / f"{run_id}{SUFFIX}"


class Journal:
    """The journal of one run (made on its first append)."""

    def __init__(self, directory: Path, run: changelog.RunLog) -> None:
        self._run = run
        self._log = AppendLog(journal_path(directory, run.run_id))
        self._open = False

    def append(self, entries: Sequence[JsonObject]) -> None:
        """Append ``entries`` (``{"file": path, ...}``, ``{"catalog": path, ...}`` or
        ``{"action": ...}``), durably."""
        if not self._open:
            self._log.open()
            self._open = True
            run = self._run
            self._log.append([{"run_id": run.run_id, "started": run.started,
                               "trigger": run.trigger, "notes": run.notes,
                               "left": run.left, "waiting": run.waiting,
                               "seq": run.seq}], sync=False)
        self._log.append(entries)

    def remove(self, *, keep: bool = False) -> None:
        """Close and remove the journal: the run's record is published and the inbox
        told. ``keep``: the inbox could not be told, the next :func:`recover` tells it."""
        self._log.close()
        if self._open and not keep:
            remove_if_there(self._log.fs, self._log.path)


def from_journal(records: Sequence[JsonObject]) -> changelog.RunLog | None:
    """The run a journal's records describe (None if it has no header)."""
    if not records or not isinstance(records[0].get("run_id"), str):
        return None
    head = records[0]
    notes = head.get("notes")
    run = changelog.RunLog(
        str(head["run_id"]), str(head.get("started") or ""), str(head.get("trigger") or ""),
        notes=[str(n) for n in notes] if isinstance(notes, list) else [])
    left, waiting = head.get("left"), head.get("waiting")
    run.left = left if isinstance(left, int) and not isinstance(left, bool) else 0
    run.seq = changelog.run_seq(head)
    if isinstance(waiting, dict):
        run.waiting = {str(n): str(why) for n, why in waiting.items()}
    for rec in records[1:]:
        path, before = rec.get("file"), rec.get("before")
        if isinstance(path, str):
            run.before.setdefault(
                path, base64.b64decode(before) if isinstance(before, str) else None)
            after = rec.get("after_sha256")
            run.after[path] = after if isinstance(after, str) else None
            (run.unread.add if rec.get("unread") is True else run.unread.discard)(path)
        elif isinstance(rec.get("action"), dict):
            run.actions.append(cast(changelog.Action, rec["action"]))
        elif isinstance(rec.get("catalog"), str):
            before, after = rec.get("before"), rec.get("after")
            run.record_catalog(str(rec["catalog"]), before if isinstance(before, dict) else None,
                               after if isinstance(after, dict) else None)
        elif isinstance(rec.get("failed_note"), str):
            run.failed_notes[str(rec["failed_note"])] = str(rec.get("reason") or "")
    return run


def _journals(directory: Path, skip: Collection[str]) -> list[tuple[str, Path]]:
    try:
        names = REAL.listdir(directory)  # below a workspace, never through a link
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise translate_os_error(exc, directory) from exc
    return [(run_id, directory / name) for name in sorted(names)
            if name.endswith(SUFFIX)
            and changelog.RUN_ID_RE.match(run_id := name.removesuffix(SUFFIX))
            and run_id not in skip]


def recover(directory: Path, running: Collection[str]) -> list[tuple[changelog.RunLog, bool]]:
    """Publish the record of every run whose journal is left (but those ``running``);
    returns those runs, each with True if a crash cut it short (its record written now),
    False if it ended but its inbox item could not be pushed (the daemon stopping)."""
    done = []
    for run_id, path in _journals(directory, running):
        cut = not (directory / f"{run_id}.json").exists()
        try:
            run = from_journal(replay(path, repair=False)[0])
        except StorageError as exc:
            log.warning("dream run journal %s unreadable: %s", path, exc)
            if cut:
                continue
            run = None
        if run is not None:
            if cut:
                changelog.write_run(directory, run)
                log.info("dream run %s was cut short; its record is recovered", run_id)
            done.append((run, cut))
        try:
            remove_if_there(REAL, path)
        except OSError as exc:  # a folder of that name: not a journal of ours
            log.warning("leaving %s in place: %s", path, exc)
    return done


def running_runs(directory: Path, running: Collection[str]) -> list[changelog.RunLog]:
    """The runs going on, as their journals have them so far."""
    out = []
    for run_id, path in _journals(directory, ()):
        if run_id in running:
            try:
                run = from_journal(replay(path, repair=False)[0])
            except StorageError:
                continue
            if run is not None:
                out.append(run)
    return out
