"""The ``auto_memory`` job: turn a session's pending turns into its daily note.

Job params: ``{session_id, upto?, date?}`` (``upto``: the last turn sequence number to
cover, default all pending; ``date``: YYYY-MM-DD of the note for all of them, default
the day, in local time, each turn was said). Steps, for the turns of one day, then the
next day's (without ``date``: turns pending over a night are each day's memory):

1. take the session's uncommitted turns up to ``upto`` (already sanitized and redacted
   when they were added; see :mod:`sessions`) said on the first day among them;
   nothing pending -> done, no change;
2. ask the workspace's chat model, in a tool-calling loop, to extract durable facts,
   decisions and preferences into the session's note of the day through ``daily_write``
   (one note per session per day: a second write updates it; the tools refuse touching
   another session's note), with the current note in the prompt so it is merged, not
   duplicated; a note too long to write again in the model's ``max_tokens`` is added to
   with ``daily_append`` instead (a longer one shown only in part, so the prompt does
   not grow with it; a full one goes on in ``<name>-2.md``), and a part whose answer
   was cut at that limit is asked again for the new facts only (:mod:`capture_long`);
   model-written text is redacted again (by the file operations). Turns
   longer than one prompt go in consecutive parts, a turn longer than that in numbered
   pieces (:mod:`capture_parts`), each part with the note as the part before left it;
   the turns a part finished are saved and committed before the next part is sent;
3. append the turns to ``<session_dir>/dialog/<session_id>.jsonl`` (:mod:`dialog_log`:
   turns the log already ends with are not repeated, so a re-run after a crash adds
   nothing twice; turns numbered again from 1, after the pending-turns log was removed,
   are new; a line torn by a kill is cut off);
4. refresh ``<daily_dir>/<date>/index.md`` (written by the daemon: each note of the day
   with its description);
5. push one inbox item if a note changed, then commit the turns.

Steps 3 to 5 (with the change log record) are one step that a stop or a close waits
for (``FINISH_TIMEOUT_S`` at most): cut between the commit and the item, the run again
would find nothing pending and the change would never be told.

A rewrite never loses a fact: a ``daily_write`` or ``edit`` of the note that would drop
one of its bullet points is refused (the model is told which, and may write again
keeping them; if it does not, its last refused version is written with the dropped
bullet points added back, :mod:`session_tools`); each refusal is in the job result
(``refused``), in the inbox item's details, in the daemon's log and in the change log.
Every run that changed or refused to change the note leaves a change log record
(:mod:`capture_log`, ``<metadata_dir>/auto_memory/runs/``), also when the job then fails;
its path is the result's ``log``.

A workspace closed and opened again on the same folder while a job runs (the model
answering meanwhile) gets the job's commit and inbox item: the job's own session store
and inbox closed with it.

Jobs of one session run one at a time. Failures (no chat model, provider errors,
malformed answers, deadline, a note the disk refused to write, or a write the tools
refused: bad arguments, a tool the model may not use, a file not this session's note, an
unreadable frontmatter block; each with no write of the note accepted in that part of the
turns, whatever the model then answered) fail the job with a clear message and leave the
turns pending for the next run. Cancellation leaves no partial
file (every write is atomic); the job kind is resumable, so one interrupted by a restart
runs again. A run stopped after the model changed the note leaves its change log record
and an inbox item saying so (cut short, its turns run again); one killed so is told by
its job resumed (:mod:`capture_running`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import NotRequired, TypedDict

import trio

from recalld.daemon.jobrecords import JobContext
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.memory import capture_log, capture_long, capture_running, dialog_log
from recalld.daemon.memory.capture_parts import conversation_parts
from recalld.daemon.memory.changelog import new_run_id
from recalld.daemon.memory.dayindex import refresh_day_index
from recalld.daemon.memory.fileops import (
    FileOps,
    WritePolicy,
    check_date,
    fileops_for,
)
from recalld.daemon.memory.inbox import push_inbox
from recalld.daemon.memory.llm import ToolBudget
from recalld.daemon.memory.redact import redact
from recalld.daemon.memory.session_tools import SessionTools
from recalld.daemon.memory.turns import check_session_id, joined
from recalld.daemon.providers.chat import ChatMessage
from recalld.daemon.workspaces import Workspace, workspace_of_job
from recalld.ipc.errors import (
    JobFailed,
    RecalldError,
    UnknownWorkspace,
)
from recalld.ipc.textcut import cut_text

log = logging.getLogger(__name__)

MAX_STEPS = 8
#: Tool calls a job may run per part of its turns (a good run makes a few: it writes one
#: note); those past it are refused, and the result counts them (``tool_calls_refused``).
TOOL_CALLS_PER_PART = 64
DEADLINE_S = 600.0
#: How much of the model's last answer a job's result quotes (``model_text``).
MODEL_TEXT_CHARS = 500
#: How long the end of a run (its logs, the day index, the inbox item, the commit) may
#: take once begun: a stop or a close waits for it rather than cut it in two.
FINISH_TIMEOUT_S = 10.0

SYSTEM_PROMPT = """\
You keep the long-term memory of an assistant. From the conversation you are given, \
extract what is worth remembering later: durable facts about the user and their world, \
decisions taken, preferences, commitments, and useful outcomes. Leave out small talk, \
one-off details, anything recalled from memory, tool output, and secrets.

Each turn starts with who said it: `user` or `assistant`, followed by the speaker's name \
in parentheses when the conversation names its speakers (`user (Alice): ...`). Several \
people or agents may share one conversation: write each fact with the name of the person \
it is about or who said it (`Alice lives in Oslo`, not `The user lives in Oslo`), and never \
take one speaker's claim for another's.

Write them as this conversation's note for the day: a short \
`name` (a few words, lowercase, dashes), a one-line `description`, and a Markdown body of \
concise bullet points. {rules} If nothing is worth remembering, do not call any tool and \
answer "nothing to save"."""


class CaptureResult(TypedDict):
    """The result of an auto_memory job (only the first five keys when nothing was
    pending)."""

    session_id: str
    turns: int
    changed: list[str]
    note: str | None
    message: NotRequired[str]
    upto: NotRequired[int]
    date: NotRequired[str]
    dates: NotRequired[list[str]]
    dialog: NotRequired[str]
    steps: NotRequired[int]
    tool_calls: NotRequired[list[str]]
    finished: NotRequired[bool]
    model_text: NotRequired[str]
    inbox_item: NotRequired[str | None]
    refused: NotRequired[list[capture_log.Refusal]]
    tool_calls_refused: NotRequired[int]
    log: NotRequired[str | None]


def _prompt(session_id: str, date: str, note_path: str | None, note_text: str | None,
            conversation: str, rules: str = capture_long.WRITE_RULES) -> list[ChatMessage]:
    if note_path is not None and note_text is not None:
        current = f"The note of this conversation for {date} ({note_path}):\n\n{note_text}"
    else:
        current = f"This conversation has no note for {date} yet."
    user = (f"Date: {date}\nConversation id: {session_id}\n\n{current}\n\n"
            f"New turns of the conversation:\n\n{conversation}")
    return [{"role": "system", "content": SYSTEM_PROMPT.format(rules=rules)},
            {"role": "user", "content": user}]


async def _append_dialog(ws: Workspace, session_id: str, turns: list[JsonObject]) -> str:
    """Add ``turns`` to the session's dialog log (:mod:`dialog_log`); its path."""
    rel = f"{ws.settings.session_dir}/dialog/{session_id}.jsonl"
    await trio.to_thread.run_sync(dialog_log.append, ws.root, rel, turns)
    return rel


def _day_said(turns: list[JsonObject], today: Callable[[], dt.date]) -> str | None:
    """The day the last of ``turns`` was said (local time, never after today): a
    conversation held before midnight is filed under that day, however late it is
    captured. None when the turns were kept without their time."""
    said = [t["at"] for t in turns
            if isinstance(t.get("at"), int | float) and not isinstance(t.get("at"), bool)]
    if not said:
        return None
    try:
        day = dt.datetime.fromtimestamp(max(said)).date()
    except (OverflowError, OSError, ValueError):  # a hand-edited log's odd number
        return None
    return min(day, today()).isoformat()


def _first_day(turns: list[JsonObject], today: Callable[[], dt.date]) -> list[JsonObject]:
    """The first of ``turns`` up to the last said on the same day as the first (local
    time): one day's note's turns. A turn kept without its time goes with those before
    it (with the first day's when it leads)."""
    days = [_day_said([t], today) for t in turns]
    first = next((day for day in days if day is not None), None)
    end = next((i for i, day in enumerate(days) if day not in (None, first)), len(turns))
    return turns[:end]


def _merged(days: list[CaptureResult]) -> CaptureResult:
    """One job's result from its days' results: the last day's, with the turns, files,
    steps, tool calls and refusals of them all, and every day written (``dates``)."""
    days = [d for d in days if d["turns"]] or days[-1:]  # a later day another job took
    merged = days[-1]
    if len(days) > 1:
        merged = {**merged, "turns": sum(d["turns"] for d in days),
                  "changed": sorted({p for d in days for p in d["changed"]}),
                  "dates": [date for d in days for date in d.get("dates", [])],
                  "steps": sum(d.get("steps", 0) for d in days),
                  "tool_calls": [c for d in days for c in d.get("tool_calls", [])],
                  "finished": all(d.get("finished", True) for d in days),
                  "refused": [r for d in days for r in d.get("refused", [])],
                  "tool_calls_refused": sum(d.get("tool_calls_refused", 0) for d in days)}
    return merged


def _reopened(get_workspace: Callable[[str], Workspace], ws: Workspace) -> Workspace:
    """``ws``, or the workspace opened again on its folder since the job started (closed
    and opened while the model answered): the job's turns are that one's to commit, and
    ``ws``'s session store and inbox are closed."""
    try:
        now = get_workspace(ws.agent_id)
    except UnknownWorkspace:
        return ws
    if now.root == ws.root and now.settings.metadata_dir == ws.settings.metadata_dir:
        return now
    return ws


async def _write_log(ws: Workspace, ops: FileOps, run: capture_log.CaptureRun) -> str | None:
    """Write ``run``'s change log record if it changed or refused to change the note;
    its workspace-relative path (None: nothing to record, or the write failed)."""
    first: dict[str, str | None] = {}
    last: dict[str, str | None] = {}
    for change in ops.changes:
        first.setdefault(change.path, change.before)
        last[change.path] = change.after
    for path in sorted(last):
        run.note = path
        run.record_change(path, first[path], last[path])
    if not run.worth_keeping:
        return None
    run.finished = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    written: str | None = None
    try:
        with trio.CancelScope(shield=True):
            written = await trio.to_thread.run_sync(
                capture_log.write, ws.root, ws.settings.metadata_dir, run)
    except (OSError, RecalldError) as exc:  # the note is written; only its log is lost
        log.warning("auto_memory of %s: writing the change log failed: %s", ws.agent_id, exc)
    return written


async def _tell_cut_short(get_workspace: Callable[[str], Workspace], ws: Workspace,
                          ops: FileOps, run: capture_log.CaptureRun, job_id: str,
                          date: str) -> None:
    """A run stopped before its end: its change log record and, if the model changed the
    note, the day index and an inbox item saying so (the turns stay pending)."""
    run.error = "cut short before its end (a stop, or its workspace closed); its turns run again"
    log_rel = await _write_log(ws, ops, run)
    notes = sorted({c.path for c in ops.changes})
    if not notes:
        return
    try:
        await refresh_day_index(ws, date, ops)
    except (OSError, RecalldError) as exc:
        log.warning("auto_memory of %s: the day index was not refreshed: %s", ws.agent_id, exc)
    await push_inbox(_reopened(get_workspace, ws), "auto_memory",
                     f"auto_memory updated {', '.join(notes)}, then was cut short; its turns "
                     "run again", sorted({c.path for c in ops.changes}), job_id=job_id,
                     details={"session_id": run.session_id, "date": date, "note": run.note,
                              "log": log_rel, "cut_short": True})


async def _ended(ws: Workspace, job_id: str) -> None:
    """The run of ``job_id`` ended: :func:`capture_running.end`."""
    try:
        await trio.to_thread.run_sync(
            capture_running.end, ws.root, ws.settings.metadata_dir, job_id)
    except OSError as exc:  # left behind, it tells of nothing a next run does not change
        log.warning("auto_memory of %s: %s", ws.agent_id, exc)


def auto_memory_job(get_workspace: Callable[[str], Workspace],
                    wait_changed: Callable[[], Awaitable[None]],
                    today: Callable[[], dt.date] = dt.date.today,
                    ) -> Callable[[JobContext], Awaitable[CaptureResult]]:
    """The job handler (register it with ``resumable=True``); ``wait_changed``: until
    the workspaces change (:func:`workspace_of_job`)."""

    async def run(job: JobContext) -> CaptureResult:
        # One day's turns at a time, each day's into that day's note, committed before
        # the next day's are sent: a failure on a later day leaves the earlier ones written.
        days: list[CaptureResult] = []
        more = True
        while more:
            result, more = await run_day(job)
            days.append(result)
        return _merged(days)

    async def run_day(job: JobContext) -> tuple[CaptureResult, bool]:
        """The turns said on the first day of those pending, as that day's memory; True
        if turns said on a later day are left."""
        params = job.params
        session_id = check_session_id(params.get("session_id"))
        date = check_date(params.get("date"), today)
        ws = await workspace_of_job(get_workspace, job.agent_id, wait_changed)
        store = ws.services.sessions
        async with store.job_lock(session_id):
            upto = params.get("upto")
            last = store.info(session_id).upto
            if not isinstance(upto, int) or isinstance(upto, bool):
                upto = last
            # Never past the session's last turn: committing seqs no turn has yet would
            # pass over the turns that get them (a client's jobs.submit names any upto).
            upto = min(upto, last)
            if store.info(session_id).pending_messages == 0:
                await store.commit(session_id, upto)
                await _ended(ws, job.job_id)  # one killed after its commit left its record
                return {"session_id": session_id, "turns": 0, "changed": [],
                        "note": None, "message": "nothing pending"}, False
            chat = ws.services.chat.client()  # before reading the turns back from disk
            # A message sent in pieces (too large for one request) is one turn again.
            turns = joined(await store.pending(session_id, upto))
            if not turns:
                await store.commit(session_id, upto)
                await _ended(ws, job.job_id)  # one killed after its commit left its record
                return {"session_id": session_id, "turns": 0, "changed": [],
                        "note": None, "message": "nothing pending"}, False
            more = False
            if params.get("date") is None:
                day = _first_day(turns, today)
                if len(day) < len(turns) and isinstance(day[-1]["seq"], int):
                    turns, upto, more = day, day[-1]["seq"], True
                date = _day_said(turns, today) or date
            job.set_progress(0, 4, f"{len(turns)} turns")
            ops = fileops_for(ws, policy=WritePolicy((ws.settings.daily_dir,), (".md",)),
                              session_id=session_id, today=today)
            tools = SessionTools(ops, session_id, date, ws.services.note_lock)
            note_path = await tools.current_note()
            # A run of this job the daemon was killed in changed the note: told at the end.
            try:
                untold = await trio.to_thread.run_sync(
                    capture_running.begin, ws.root, ws.settings.metadata_dir, job.job_id,
                    note_path)
            except (OSError, RecalldError) as exc:  # only a kill's item is at stake
                log.warning("auto_memory of %s: %s", ws.agent_id, exc)
                untold = False
            started = dt.datetime.now(dt.UTC)
            trigger = params.get("trigger")
            run_log = capture_log.CaptureRun(
                new_run_id(started), started.isoformat(), ws.agent_id,
                session_id, job.job_id, date, len(turns),
                trigger=trigger if isinstance(trigger, str) else None, note=note_path,
                refused=tools.refused)
            parts = conversation_parts(turns)
            budget = ToolBudget(TOOL_CALLS_PER_PART * len(parts))
            steps, calls, finished, final_text = 0, list[str](), True, ""
            try:
                for i, part in enumerate(parts):
                    where = f"part {i + 1} of {len(parts)}, " if len(parts) > 1 else ""
                    changes_before = len(ops.changes)
                    failures_before = len(tools.write_failures)
                    writes_before = tools.writes_made

                    def on_step(step: int, msg: str, where: str = where) -> None:
                        job.set_progress(1, 4, f"{where}model step {step}: {msg}")

                    def prompt(rules: str, path: str | None, text: str | None,
                               said: str = part.text) -> list[ChatMessage]:
                        return _prompt(session_id, date, path, text, said, rules)

                    # With the note as the part before left it; a long note is added
                    # to, not written again, and shown in part (:mod:`capture_long`).
                    result = await capture_long.run_part(
                        chat, prompt, ops, tools, max_steps=MAX_STEPS,
                        deadline_s=DEADLINE_S, on_step=on_step, budget=budget)
                    steps += result.steps
                    calls += result.tool_calls_made
                    finished = finished and result.finished
                    final_text = result.final_text
                    if not result.finished and len(ops.changes) == changes_before:
                        raise JobFailed(result.unfinished(MAX_STEPS))
                    await tools.keep_refused()
                    if (len(tools.write_failures) > failures_before
                            and tools.writes_made == writes_before
                            and len(ops.changes) == changes_before):
                        # The model heard its write failed (the disk, arguments it got
                        # wrong, a tool or a file it may not use), yet may answer
                        # "saved": committed, these turns would be in no note. They
                        # stay pending for the next run.
                        raise JobFailed(f"the note could not be written: "
                                        f"{tools.write_failures[-1]}")
                    if i < len(parts) - 1 and part.done is not None:
                        # The turns the model has seen are memory now: a later part's
                        # failure does not send them again.
                        await _append_dialog(ws, session_id, [
                            t for t in turns if isinstance(t["seq"], int)
                            and t["seq"] <= part.done])
                        await _reopened(get_workspace, ws).services.sessions.commit(
                            session_id, part.done)
                notes = sorted({c.path for c in ops.changes})
            except RecalldError as exc:
                run_log.error = exc.message
                await _write_log(ws, ops, run_log)
                await _ended(ws, job.job_id)
                raise
            except trio.Cancelled:
                # Stopped (the daemon stops, the workspace closes) after the model may
                # have written the note: what it wrote is told; its turns run again.
                with trio.CancelScope(shield=True), trio.move_on_after(FINISH_TIMEOUT_S):
                    await _tell_cut_short(get_workspace, ws, ops, run_log, job.job_id, date)
                    await _ended(ws, job.job_id)
                raise
            # The end in one step a stop waits for: cut between committing the turns
            # and telling the inbox, the run again would find nothing pending to tell.
            job.set_progress(2, 4, "saving the conversation")
            with trio.CancelScope(shield=True), \
                    trio.move_on_after(FINISH_TIMEOUT_S) as finishing:
                log_rel = await _write_log(ws, ops, run_log)
                dialog = await _append_dialog(ws, session_id, turns)
                if notes or untold:
                    await refresh_day_index(ws, date, ops)
                services = _reopened(get_workspace, ws).services
                changed = sorted({c.path for c in ops.changes})
                note = await tools.current_note()
                told = notes or ([note] if untold and note else [])
                item = None
                if told:
                    summary = (f"auto_memory updated {', '.join(told)} from {len(turns)} "
                               "turns")
                    if budget.refused:
                        summary += (f"; {budget.refused} tool call(s) past the limits were "
                                    "not run")
                    # Told before the turns are committed: a cut in between runs them
                    # again (told twice at worst), never leaves the change untold.
                    try:
                        item = await services.inbox.push(
                            "auto_memory", summary, sorted({*changed, *told}), job_id=job.job_id,
                            details={"session_id": session_id, "date": date, "note": note,
                                     "refused": tools.refused, "log": log_rel,
                                     "tool_calls_refused": budget.refused,
                                     **({} if notes else {"cut_short": True})})
                    except RecalldError as exc:  # a notification lost, never the turns
                        log.warning("auto_memory of %s: the inbox was not told: %s",
                                    ws.agent_id, exc.message)
                await services.sessions.commit(session_id, upto)
                await _ended(ws, job.job_id)
            if finishing.cancelled_caught:
                raise JobFailed(f"saving the run took over {FINISH_TIMEOUT_S:g} s; its "
                                "turns stay pending for the next run")
            job.set_progress(4, 4, "done")
            # Masked before it is cut: a key the cut fell inside would no longer be
            # recognised. (A bounded stretch: no secret the start shows is that long.)
            model_text = cut_text(redact(cut_text(final_text, 4 * MODEL_TEXT_CHARS)),
                                  MODEL_TEXT_CHARS)
            return {
                "session_id": session_id, "turns": len(turns), "upto": upto, "date": date,
                "dates": [date],
                "note": note, "changed": changed, "dialog": dialog,
                "steps": steps, "tool_calls": calls,
                "finished": finished, "model_text": model_text,
                "inbox_item": item["id"] if item else None,
                "refused": tools.refused, "log": log_rel,
                "tool_calls_refused": budget.refused,
            }, more

    return run
