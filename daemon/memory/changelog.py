"""Change logs of the memory jobs.

Every auto_dream run leaves two files in ``<metadata_dir>/dream/runs/``: ``<run_id>.md``, a
change log for people (what changed, why, from which notes, what was refused), and
``<run_id>.json``, the machine record: the actions and, for every file the run wrote, its
bytes before the run (base64; null when the run created it) and the checksum of the bytes
it left, and the dream catalog records it changed. :func:`dreamundo.undo_run` puts the
previous bytes back, but only if nothing changed those files since (a later run or a
person), unless forced.

The writing, loading, listing and pruning of such record pairs (:func:`write_record`,
:func:`load_record`, :func:`list_records`) serve every job kind that keeps a change log
(``<metadata_dir>/<kind>/runs/``): auto_dream here, auto_memory in :mod:`capture_log`.

Everything here blocks on the file system: run it in a worker thread.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Final, NotRequired, TypedDict, TypeVar

import orjson

from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.store.errors import CorruptState, StorageError, translate_os_error
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir, read_verified, remove_if_there
from recalld.ipc.answers import DreamRun
from recalld.ipc.errors import InvalidParams, NotAllowed, NotFound, RecalldError

log = logging.getLogger(__name__)

RUN_ID_RE: Final = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")
_VERSION: Final = 1


S = TypeVar("S", bound=Mapping[str, object])


class Action(TypedDict):
    """One integration a dream run tried, as its record and change log keep it."""

    action: str
    path: str
    status: str  # "applied" or why not
    detail: str
    reason: str
    sources: list[str]
    note: str


class FileBefore(TypedDict):
    """A file a run wrote: its bytes before (base64; None: the run created it) and the
    checksum of what the run left (None: the run removed it)."""

    before: str | None
    after_sha256: str | None
    #: The run left lines in it no model read (a hand edit carried along): it wrote the
    #: file, not what it says.
    unread: NotRequired[bool]


class CatalogChange(TypedDict):
    """A dream catalog record a run changed: as it was (None: there was none) and as the
    run left it (None: it removed it). Undo puts ``before`` back."""

    before: JsonObject | None
    after: JsonObject | None


class DreamRecord(TypedDict):
    """The machine record ``<run_id>.json`` of a dream run."""

    version: int
    run_id: str
    started: str
    finished: str
    trigger: str
    notes: list[str]
    failed_notes: dict[str, str]
    actions: list[Action]
    files: dict[str, FileBefore]
    catalog: NotRequired[dict[str, CatalogChange]]  # left out by records of before it
    #: The run's place among the workspace's runs (1, 2, ...: see :func:`run_order`);
    #: left out by records of before it, which come first.
    seq: NotRequired[int]
    undo_pending: NotRequired[JsonObject]  # an undo decided, not finished (see dreamundo)
    undone: str | None
    waiting: NotRequired[dict[str, str]]  # notes not read after failed tries: why


class RunSummary(TypedDict):
    """What a dream run did, counted; the result of the auto_dream job."""

    run_id: str | None  # None: there was nothing to dream
    notes: int
    left: NotRequired[int]  # changed notes beyond the run's limit, for the next run
    actions: dict[str, int]  # applied actions by kind, others by status
    failed_notes: NotRequired[int]
    files_changed: NotRequired[list[str]]
    changed: NotRequired[bool]
    recognised_from_reme: NotRequired[int]
    log: NotRequired[str]
    #: The model's tool calls not run: past the calls of one answer or the run's budget.
    tool_calls_refused: NotRequired[int]
    #: The notes not read after failed tries (:mod:`dreamretry`), and why (the first 20).
    waiting_notes: NotRequired[int]
    waiting: NotRequired[dict[str, str]]


#: The waiting notes a run's summary names (all are counted).
WAITING_SHOWN: Final = 20


def add_waiting(summary: RunSummary, waiting: Mapping[str, str]) -> RunSummary:
    """``summary`` naming the notes ``waiting`` (not read after failed tries), and why."""
    if waiting:
        summary["waiting_notes"] = len(waiting)
        summary["waiting"] = dict(sorted(waiting.items())[:WAITING_SHOWN])
    return summary


class UndoConflict(NotAllowed):
    """Files changed since the run; the message lists them (``force`` overrides)."""


class DamagedRecord(NotAllowed):
    """A run's record cannot be read, or holds what no run writes (a hand edit, a file
    restored from elsewhere); the message says how. Nothing is restored from it."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_run_id(now: datetime) -> str:
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def runs_dir(root: Path, metadata_dir: str, kind: str = "dream") -> Path:
    """Where the change log of job ``kind`` (``dream``, ``auto_memory``) lives."""
    return root / metadata_dir / kind / "runs"


@dataclass(slots=True)
class RunLog:
    """What one run did, built up while it runs."""

    run_id: str
    started: str
    trigger: str
    notes: list[str] = field(default_factory=list)
    failed_notes: dict[str, str] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    before: dict[str, bytes | None] = field(default_factory=dict)
    #: The checksum of what the run left in each file (None: it removed the file).
    after: dict[str, str | None] = field(default_factory=dict)
    finished: str = ""
    #: Changed notes beyond the run's limit, left for the next run.
    left: int = 0
    #: The model's tool calls refused for passing a limit (see ``llm.ToolBudget``).
    tool_calls_refused: int = 0
    #: The dream catalog records the run changed, for undo (:meth:`record_catalog`).
    catalog: dict[str, CatalogChange] = field(default_factory=dict)
    #: The files whose last write kept lines no model read (see ``FileBefore.unread``).
    unread: set[str] = field(default_factory=set)
    #: The changed notes not read after failed tries (:mod:`dreamretry`), and why.
    waiting: dict[str, str] = field(default_factory=dict)
    #: The run's place among the runs (:func:`next_seq`); 0: not known (kept out).
    seq: int = 0

    def record_catalog(self, path: str, before: JsonObject | None,
                       after: JsonObject | None) -> None:
        """Remember a change of ``path``'s catalog record; the first ``before`` stays."""
        first = self.catalog.get(path)
        self.catalog[path] = {"before": before if first is None else first["before"],
                              "after": after}

    def record_write(self, path: str, before: bytes | None, after: bytes | None,
                     unread: bool = False) -> FileBefore:
        """Remember a write (``unread``: it kept lines no model read); the first
        ``before`` of a path is what undo restores. Returns the file's entry as the record
        holds it."""
        self.before.setdefault(path, before)
        self.after[path] = None if after is None else sha256(after)
        (self.unread.add if unread else self.unread.discard)(path)
        return self.file_entry(path)

    def file_entry(self, path: str) -> FileBefore:
        before = self.before[path]
        entry: FileBefore = {
            "before": None if before is None else base64.b64encode(before).decode(),
            "after_sha256": self.after.get(path)}
        if path in self.unread:
            entry["unread"] = True
        return entry

    def _differs(self, path: str) -> bool:
        before = self.before[path]
        return (None if before is None else sha256(before)) != self.after.get(path)

    @property
    def changed(self) -> bool:
        return any(self._differs(p) for p in self.before)

    def to_json(self) -> DreamRecord:
        files = {p: self.file_entry(p) for p in sorted(self.before)}
        record: DreamRecord = {
            "version": _VERSION, "run_id": self.run_id, "started": self.started,
            "finished": self.finished, "trigger": self.trigger, "notes": self.notes,
            "failed_notes": self.failed_notes, "actions": self.actions, "files": files,
            "catalog": self.catalog, "undone": None}
        if self.waiting:
            record["waiting"] = self.waiting
        if self.seq:
            record["seq"] = self.seq
        return record

    def summary(self) -> RunSummary:
        counts: dict[str, int] = {}
        for a in self.actions:
            key = a["action"] if a["status"] == "applied" else a["status"]
            counts[key] = counts.get(key, 0) + 1
        return add_waiting({
            "run_id": self.run_id, "notes": len(self.notes), "left": self.left,
            "failed_notes": len(self.failed_notes), "actions": counts,
            "files_changed": sorted(p for p in self.before if self._differs(p)),
            "tool_calls_refused": self.tool_calls_refused}, self.waiting)


def render_markdown(run: RunLog) -> str:
    # A note is read once its catalog record is set (processed, or failed); a run
    # cancelled or cut short before the others did not read them.
    read = [n for n in run.notes if n in run.catalog or n in run.failed_notes]
    unread = [n for n in run.notes if n not in read]
    lines = [f"# Dream run {run.run_id}", "",
             f"- started: {run.started}",
             f"- finished: {run.finished or 'not (running, or the daemon stopped during it)'}",
             f"- trigger: {run.trigger}", f"- notes read: {len(read)}",
             *([f"- notes left for the next run (at most {len(run.notes)} a run): "
                f"{run.left}"] if run.left else []),
             *([f"- tool calls of the model not run (past its limits): "
                f"{run.tool_calls_refused}"] if run.tool_calls_refused else []), ""]
    if read:
        lines += ["## Notes read", ""] + [f"- [[{n}]]" for n in read] + [""]
    if unread:
        lines += ["## Notes not reached (read by the next dream)", ""]
        lines += [f"- [[{n}]]" for n in unread] + [""]
    if run.failed_notes:
        lines += ["## Notes not processed (tried again by later runs, a few times while "
                  "unchanged)", ""]
        lines += [f"- [[{n}]]: {why}" for n, why in sorted(run.failed_notes.items())] + [""]
    if run.waiting:
        lines += ["## Notes not read (the model failed on them as they are)", ""]
        lines += [f"- [[{n}]]: {why}" for n, why in sorted(run.waiting.items())] + [""]
    applied = [a for a in run.actions if a["status"] == "applied"]
    other = [a for a in run.actions if a["status"] != "applied"]
    lines += ["## Changes", ""]
    if not applied:
        lines.append("No node changed; the interest topics were refreshed." if run.changed
                     else "No memory changed.")
    for a in applied:
        # A change no note asked for (links to a renamed or deleted node) names none.
        src = ", ".join(f"[[{s}]]" for s in a.get("sources", []))
        src = f" From {src}." if src else ""
        why = f" Why: {a['reason']}" if a.get("reason") else ""
        lines.append(f"- **{a['action']}** [[{a['path']}]]: {a['detail']}.{src}{why}")
    lines.append("")
    if other:
        lines += ["## Refused or unchanged", ""]
        for a in other:
            lines.append(f"- {a['status']} {a['action']} {a['path']}: {a['detail']}")
        lines.append("")
    lines += [f"Undo with `recalld dream --undo {run.run_id}`.", ""]
    return "\n".join(lines)


def write_record(directory: Path, run_id: str, record: Mapping[str, object], markdown: str,
                 *, keep: int | None = None) -> None:
    """Publish one run's machine record and its Markdown log (each atomically); with
    ``keep``, remove the oldest record pairs beyond that many."""
    ensure_dir(REAL, directory)
    atomic_write(REAL, directory / f"{run_id}.json",
                 orjson.dumps(dict(record), option=orjson.OPT_INDENT_2))
    atomic_write(REAL, directory / f"{run_id}.md", markdown.encode())
    if keep is not None:
        prune_records(directory, keep)


def write_run(directory: Path, run: RunLog) -> None:
    write_record(directory, run.run_id, run.to_json(), render_markdown(run))


def _check_run_id(run_id: object) -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise InvalidParams("run_id must look like 20261129T230012Z-a1b2c3")
    return run_id


def load_record(directory: Path, run_id: str, what: str = "dream run") -> JsonObject:
    """The machine record of run ``run_id`` as read (only its version is checked);
    NotFound, or DamagedRecord when unreadable."""
    path = directory / f"{_check_run_id(run_id)}.json"
    try:
        data = orjson.loads(read_verified(path, None))  # not a FIFO's open, nor a device
    except CorruptState as exc:
        if exc.reason == "missing":
            raise NotFound(f"no {what} {run_id!r}") from None
        raise DamagedRecord(f"{what} {run_id} is unreadable: {exc.reason}") from None
    except (StorageError, orjson.JSONDecodeError) as exc:
        raise DamagedRecord(f"{what} {run_id} is unreadable: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        raise DamagedRecord(f"{what} {run_id} has an unknown format")
    return data


_SHA256_RE: Final = re.compile(r"[0-9a-f]{64}\Z")


def _base64(value: object) -> bool:
    """Whether ``value`` is base64 text (a lenient decode would drop what is not, and
    undo would write the rest)."""
    try:
        base64.b64decode(value if isinstance(value, str) else "-", validate=True)
    except ValueError:
        return False
    return True


def _damage(data: JsonObject) -> str | None:
    """What is wrong with the fields of a dream run record that undo and the run list
    read (a hand edit, a file restored from elsewhere); None if nothing is."""
    if not isinstance(data.get("run_id"), str) or not isinstance(data.get("started"), str):
        return "run_id and started must be text"
    notes, files = data.get("notes", []), data.get("files")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        return "notes must be a list of paths"
    if data.get("undone") is not None and not isinstance(data.get("undone"), str):
        return "undone must be a time or null"
    pending = data.get("undo_pending", {})
    if not isinstance(pending, dict) or not all(
            isinstance(v, list) and all(isinstance(p, str) for p in v)
            for k, v in pending.items()
            if k not in ("forced", "shared", "later_catalog", "kept")):
        return "undo_pending must list paths"
    kept = pending.get("kept", {})
    if not isinstance(kept, dict) or not all(_base64(v) for v in kept.values()):
        return "undo_pending's kept must map paths to base64 text"
    if not _catalog_changes(pending.get("later_catalog", {})):
        return "undo_pending's later_catalog must map paths to records before and after"
    if not isinstance(files, dict):
        return "files must map paths to their versions"
    for rel, rec in files.items():
        if not isinstance(rec, dict):
            return f"the entry of {rel!r} in files is not an object"
        before, after = rec.get("before"), rec.get("after_sha256")
        if before is not None and not _base64(before):
            return f"the previous version of {rel!r} is not base64 text"
        if after is not None and not (isinstance(after, str) and _SHA256_RE.match(after)):
            return f"the checksum of {rel!r} is not a SHA-256"
    if not _catalog_changes(data.get("catalog", {})):
        return "catalog must map paths to their records before and after"
    return None


def _catalog_changes(catalog: object) -> bool:
    """Whether ``catalog`` maps paths to their catalog records before and after."""
    return isinstance(catalog, dict) and all(
        isinstance(c, dict) and all(isinstance(c.get(k), dict | None) for k in
                                    ("before", "after")) for c in catalog.values())


def load_run(directory: Path, run_id: str) -> JsonObject:
    """The record of dream run ``run_id``; NotFound, or DamagedRecord when unreadable or
    damaged (its message says how)."""
    data = load_record(directory, run_id, "dream run")
    why = _damage(data)
    if why is not None:
        raise DamagedRecord(f"dream run {run_id} has a damaged record ({why}); it cannot "
                           "be undone")
    return data


def record_ids(directory: Path) -> list[str]:
    """The run ids of the records in ``directory`` (listed as the storage layer lists a
    folder: below a workspace, never through a link; StorageError)."""
    try:
        names = REAL.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise translate_os_error(exc, directory) from exc
    return [n.removesuffix(".json") for n in names
            if n.endswith(".json") and RUN_ID_RE.match(n.removesuffix(".json"))]


def list_records(directory: Path, summarize: Callable[[JsonObject], S],
                 limit: int = 50, what: str = "run") -> list[S]:
    """``summarize`` of each readable record, newest first (unreadable or damaged ones
    skipped)."""
    out = []
    for run_id in record_ids(directory):
        try:
            out.append(summarize(load_record(directory, run_id, what)))
        except RecalldError:
            continue
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # JSON of the right version with fields missing or of other types (a hand
            # edit, a file restored from elsewhere): the other runs are still listed.
            log.warning("%s %s in %s is damaged, not listed: %r", what, run_id, directory, exc)
    out.sort(key=run_order, reverse=True)
    return out[:limit]


def run_seq(record: Mapping[str, object]) -> int:
    """The ``seq`` of a run's record (0: it has none, or not a whole number above 0)."""
    seq = record.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else 0


def run_order(record: Mapping[str, object]) -> tuple[int, str, str]:
    """Where a run's record (or summary) sorts among the runs, oldest first: by its
    ``seq``, then its start and id. The wall clock alone misorders runs once it is set
    back between them (an NTP step, a hand change), and ids of runs started in the same
    second do not sort by time; records of before ``seq`` (0) come first, by start."""
    return (run_seq(record), str(record.get("started")), str(record.get("run_id")))


def next_seq(directory: Path) -> int:
    """The ``seq`` of a run starting now: one past every record's in ``directory``
    (blocking; StorageError when the folder cannot be listed)."""
    newest = list_records(directory, lambda data: data, limit=1)
    return 1 + (run_seq(newest[0]) if newest else 0)


def last_writes(directory: Path) -> dict[str, str | None]:
    """Per file, the SHA-256 of what the newest run that wrote it (and was not undone)
    left in it, over the run records kept; None if that run kept lines in it no model
    read (``FileBefore.unread``) (blocking)."""
    out: dict[str, str | None] = {}
    for data in list_records(directory, lambda data: data, limit=sys.maxsize):
        files = data.get("files")
        if data.get("undone") or not isinstance(files, Mapping):
            continue
        for path, entry in files.items():
            after = entry.get("after_sha256") if isinstance(entry, Mapping) else None
            if isinstance(after, str):
                out.setdefault(str(path), None if entry.get("unread") is True else after)
    return out


def prune_records(directory: Path, keep: int) -> int:
    """Remove the oldest record pairs (by run id, which starts with the UTC time) beyond
    ``keep``; the number removed."""
    ids = sorted(record_ids(directory))
    old = ids[: max(0, len(ids) - keep)]
    for run_id in old:
        remove_if_there(REAL, directory / f"{run_id}.json")
        remove_if_there(REAL, directory / f"{run_id}.md")
    return len(old)


def dream_summary(data: JsonObject) -> DreamRun:
    return {"run_id": data["run_id"], "started": data.get("started"), "seq": run_seq(data),
            "trigger": data.get("trigger"), "notes": len(data.get("notes", [])),
            "files": sorted(data.get("files", {})), "undone": data.get("undone")}


def list_runs(directory: Path, limit: int = 50) -> list[DreamRun]:
    """The readable, undamaged runs, newest first."""
    def checked(data: JsonObject) -> DreamRun:
        why = _damage(data)
        if why is not None:
            raise ValueError(why)  # logged and left out, as a record unreadable
        return dream_summary(data)

    return list_records(directory, checked, limit, "dream run")
