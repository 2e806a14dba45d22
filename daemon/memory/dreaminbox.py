"""What a dream run tells the workspace's inbox: one item per run that changed memory,
whether it ended, failed, was cancelled or was cut short by a crash (its record then
recovered from its journal), naming the files it changed and what it left to the next
dream; and one per undo of a run that put files back, so an agent told of a run's changes
is told they were undone."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import trio

from recalld.daemon.memory import changelog, runjournal
from recalld.daemon.memory.inbox import push_inbox
from recalld.daemon.workspaces import Workspace
from recalld.ipc.answers import DreamUndone

if TYPE_CHECKING:
    from pathlib import Path

KIND = "auto_dream"


def summary_line(summary: changelog.RunSummary, *, ended: bool) -> str:
    """What the run did, in one line: its actions (or, with none, the interest topics it
    refreshed), the notes it could not process and, if it stopped before its end
    (cancelled, or an error), that the notes it did not reach are read by the next dream."""
    parts = [f"{n} {a.lower()}" for a, n in sorted(summary["actions"].items())]
    text = f"dream {summary['run_id']}: {', '.join(parts) or 'interest topics refreshed'}"
    if failed := summary.get("failed_notes"):
        text += (f"; {failed} of {summary['notes']} note(s) not processed, read again by "
                 f"a later dream (a few times while unchanged)")
    if refused := summary.get("tool_calls_refused"):
        text += f"; {refused} tool call(s) of the model past its limits not run"
    if not ended:
        text += "; stopped before its end: the notes it did not reach are read by the next dream"
    return f"{text} (see {summary.get('log')})" if failed or not ended else text


def run_summary(run: changelog.RunLog, metadata_dir: str) -> changelog.RunSummary:
    """``run``'s summary with its change log's path, as its job's result has them."""
    summary = run.summary()
    summary["changed"] = run.changed
    summary["log"] = f"{metadata_dir}/dream/runs/{run.run_id}.md"
    return summary


async def push_run(ws: Workspace, summary: changelog.RunSummary, run: changelog.RunLog, *,
                   job_id: str | None, ended: bool) -> bool:
    """The item of a run that changed memory (none for one that did not); False if the
    workspace's inbox could not be told (it closed: the daemon is stopping)."""
    if not run.changed:
        return True
    return await push_inbox(ws, KIND, summary_line(summary, ended=ended),
                            summary.get("files_changed") or [], job_id=job_id, details={
                                "run_id": run.run_id, "actions": summary["actions"],
                                "failed_notes": sorted(run.failed_notes),
                                "log": summary.get("log"), "ended": ended,
                                "tool_calls_refused": summary.get("tool_calls_refused", 0)})


async def recover_journals(ws: Workspace, directory: Path, running: Collection[str]) -> None:
    """Publish the record of each run a crash cut short (:func:`runjournal.recover`;
    ``running``: the runs going on, left alone), with an inbox item naming the files it
    changed, as a run that ended has; and push the item of each run that ended while the
    inbox could not be told."""
    for run, cut in await trio.to_thread.run_sync(runjournal.recover, directory, set(running)):
        if not cut:
            summary = run_summary(run, ws.settings.metadata_dir)
            await push_run(ws, summary, run, job_id=None, ended=True)
            continue
        await push_inbox(ws, KIND, f"dream {run.run_id}: cut short by a restart; what it "
                         "wrote stays, and can be undone", sorted(run.before), job_id=None,
                         details={"run_id": run.run_id, "cut_short": True})


async def push_undone(ws: Workspace, undone: DreamUndone) -> bool:
    """The item of an undo that put files back (none for one that changed no file): the
    files it restored or removed, and the notes the next dream reads again."""
    changes = sorted({*undone["restored"], *undone["removed"]})
    parts = [f"{len(undone[k])} file(s) {k}" for k in ("restored", "removed") if undone[k]]
    again = undone["dreamed_again"]
    text = f"dream {undone['run_id']} undone: {', '.join(parts)}" + (
        f"; {len(again)} note(s) read again by the next dream" if again else "")
    return await push_inbox(ws, KIND, text, changes, job_id=None, details={
        "run_id": undone["run_id"], "undone": True, "restored": undone["restored"],
        "removed": undone["removed"], "forced_over": undone["forced_over"],
        "dreamed_again": again})
