"""The auto_memory change log: a record of every run that changed or refused to change a note.

Each such run leaves ``<metadata_dir>/auto_memory/runs/<run_id>.md``, for people (which
note, the facts added, every rewrite refused with the bullet points it would have
dropped, the agent, session, job, trigger and time), and ``<run_id>.json``, the same as
data with the note's SHA-256 before and after. A run that found nothing to save leaves
no record. Both are written with :mod:`changelog`'s helpers, like the dream's run logs;
the newest :data:`KEEP_RECORDS` of a workspace are kept (auto_memory runs every few user
turns, so its log is bounded where the dream's nightly one need not be).

Everything here blocks on the file system: run it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypedDict

from recalld.daemon import safepath
from recalld.daemon.index.frontmatter import parse_frontmatter
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import changelog
from recalld.daemon.memory.textlines import dropped_bullets

KIND: Final = "auto_memory"
KEEP_RECORDS: Final = 2000
MAX_LISTED_LINES: Final = 200


def body(text: str | None) -> str:
    """A note's text without its frontmatter ("" for no note)."""
    if not text:
        return ""
    return "\n".join(text.split("\n")[parse_frontmatter(text)[1]:])


def added_facts(before: str | None, after: str | None) -> list[str]:
    """What ``after`` says that ``before`` did not: its bullet points no line of
    ``before`` holds, else (a note without bullets) its new non-empty lines."""
    old, new = body(before), body(after)
    facts = dropped_bullets(new, old)
    if not facts:
        seen = {ln.strip() for ln in old.splitlines()}
        facts = [ln.strip() for ln in new.splitlines()
                 if ln.strip() and ln.strip() not in seen and not ln.startswith("#")]
    return facts[:MAX_LISTED_LINES]


class Refusal(TypedDict):
    """A rewrite of a note refused because it would have dropped bullet points."""

    tool: str
    path: str
    dropped: list[str]


class FileChecksums(TypedDict):
    before_sha256: str | None  # None: no file
    after_sha256: str | None


class CaptureRecord(TypedDict):
    """The machine record ``<run_id>.json`` of an auto_memory run."""

    version: int
    kind: Literal["auto_memory"]
    run_id: str
    started: str
    finished: str
    agent_id: str
    session_id: str
    job_id: str
    trigger: str | None
    date: str
    turns: int
    note: str | None
    outcome: str
    files: dict[str, FileChecksums]
    added: list[str]
    refused: list[Refusal]
    error: str | None


class ListedCapture(TypedDict):
    """An auto_memory run as a list of runs shows it."""

    kind: str
    run_id: str
    started: str | None
    outcome: str | None
    agent_id: str | None
    session_id: str | None
    job_id: str | None
    trigger: str | None
    note: str | None
    added: int
    refused: int
    files: list[str]
    log: str


@dataclass(slots=True)
class CaptureRun:
    """What one auto_memory run did to its session's note, built up while it runs."""

    run_id: str
    started: str
    agent_id: str
    session_id: str
    job_id: str
    date: str
    turns: int
    trigger: str | None = None
    finished: str = ""
    note: str | None = None
    files: dict[str, FileChecksums] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    error: str | None = None

    def record_change(self, path: str, before: str | None, after: str | None) -> None:
        self.files[path] = {
            "before_sha256": None if before is None else changelog.sha256(before.encode()),
            "after_sha256": None if after is None else changelog.sha256(after.encode())}
        self.added += added_facts(before, after)

    @property
    def worth_keeping(self) -> bool:
        return bool(self.files or self.refused)

    @property
    def outcome(self) -> str:
        if self.error is not None:
            return "failed"
        if self.files:
            return "changed, some rewrites refused" if self.refused else "changed"
        return "refused"

    def to_json(self) -> CaptureRecord:
        return {"version": 1, "kind": KIND, "run_id": self.run_id, "started": self.started,
                "finished": self.finished, "agent_id": self.agent_id,
                "session_id": self.session_id, "job_id": self.job_id,
                "trigger": self.trigger, "date": self.date, "turns": self.turns,
                "note": self.note, "outcome": self.outcome, "files": self.files,
                "added": self.added, "refused": self.refused, "error": self.error}


def log_path(metadata_dir: str, run_id: str) -> str:
    """The workspace-relative path of a run's Markdown log."""
    return f"{metadata_dir}/{KIND}/runs/{run_id}.md"


def render_markdown(run: CaptureRun) -> str:
    lines = [f"# auto_memory run {run.run_id}", "",
             f"- outcome: {run.outcome}", f"- agent: {run.agent_id}",
             f"- session: {run.session_id}", f"- job: {run.job_id}",
             f"- trigger: {run.trigger or '-'}", f"- started: {run.started}",
             f"- finished: {run.finished}", f"- turns read: {run.turns}",
             f"- note: [[{run.note}]]" if run.note else "- note: none", ""]
    if run.error is not None:
        lines += ["## Error", "", run.error, ""]
    lines += ["## Facts added", ""]
    lines += [f"- {fact.lstrip('-*+ ').strip() or fact}" for fact in run.added] or [
        "No note changed."]
    lines.append("")
    if run.refused:
        lines += ["## Rewrites refused", "",
                  "Each would have dropped lines the note already held; the note "
                  "kept them.", ""]
        for refusal in run.refused:
            dropped = refusal.get("dropped") or []
            lines.append(f"- `{refusal.get('tool')}` of [[{refusal.get('path')}]] would have "
                         f"dropped {len(dropped)} line(s):")
            lines += [f"  - {str(d).lstrip('-*+ ').strip() or d}" for d in dropped]
        lines.append("")
    return "\n".join(lines)


def write(root: Path, metadata_dir: str, run: CaptureRun) -> str:
    """Publish ``run``'s record; the workspace-relative path of its Markdown log.
    PathOutsideWorkspace (nothing written) once the folder ``root`` leads elsewhere."""
    safepath.check_in_place(root)
    changelog.write_record(changelog.runs_dir(root, metadata_dir, KIND), run.run_id,
                           run.to_json(), render_markdown(run), keep=KEEP_RECORDS)
    return log_path(metadata_dir, run.run_id)


def _summary(metadata_dir: str) -> Callable[[JsonObject], ListedCapture]:
    def summarize(data: JsonObject) -> ListedCapture:
        refused = data.get("refused") or []
        return {"kind": KIND, "run_id": data["run_id"], "started": data.get("started"),
                "outcome": data.get("outcome"), "agent_id": data.get("agent_id"),
                "session_id": data.get("session_id"), "job_id": data.get("job_id"),
                "trigger": data.get("trigger"), "note": data.get("note"),
                "added": len(data.get("added") or []),
                "refused": sum(len(r.get("dropped") or []) for r in refused
                               if isinstance(r, dict)),
                "files": sorted(data.get("files") or {}),
                "log": log_path(metadata_dir, str(data["run_id"]))}
    return summarize


def list_runs(root: Path, metadata_dir: str, limit: int = 50) -> list[ListedCapture]:
    """The latest runs' summaries, newest first."""
    return changelog.list_records(changelog.runs_dir(root, metadata_dir, KIND),
                                  _summary(metadata_dir), limit, "auto_memory run")


def load(root: Path, metadata_dir: str, run_id: str) -> JsonObject:
    """One run's full record as read (a :class:`CaptureRecord`; NotFound if there is
    none)."""
    return changelog.load_record(changelog.runs_dir(root, metadata_dir, KIND), run_id,
                                 "auto_memory run")
