"""How the command line shows answers to people: tables, file text, job progress.

Kept apart from the argument parsing so both stay short. Rendering is lenient: the daemon's
answers are open objects, and a field added later shows up as a column or a line without
any change here.
"""

from __future__ import annotations

import difflib
import io
import os
import re
import sys
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

import orjson

from recalld.ipc import errors
from recalld.ipc.answers import JOB_TERMINAL_STATES, ReadResult
from recalld.ipc.client import Client
from recalld.ipc.commands import agent_operand
from recalld.ipc.progress import Mode, Progress
from recalld.ipc.types import for_terminal, visible

JOB_TOPICS = ("job.*",)
JOB_POLL_S = 0.5


def print_json(out: TextIO, value: object) -> None:
    out.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    out.write("\n")


def _cell(value: object, key: str = "") -> str:
    if key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        except (OverflowError, OSError, ValueError):  # past any calendar: shown as given
            pass
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value % 1 else str(int(value))
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return str(value)


def columns_of(text: str) -> int:
    """How many terminal columns ``text`` takes: East Asian wide and full-width
    characters two, combining marks none, the rest one."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch)
               else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _padded(text: str, width: int) -> str:
    return text + " " * (width - columns_of(text))


def _as_written(text: str) -> str:
    """``text`` as the standard output writes it: under a locale that cannot encode a
    character of it (an ASCII or Latin-1 one), with the escape written in its place
    (:func:`output_stream`), which takes more columns than the character."""
    encoding = getattr(sys.stdout, "encoding", None)
    if text.isascii() or not encoding:
        return text
    return text.encode(encoding, "backslashreplace").decode(encoding)


def table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """A plain text table with a header line; cells are single-line strings (control
    characters, and those the output's encoding lacks, shown escaped), padded by the
    columns they take on a terminal."""
    cells = [[_as_written(visible(_cell(row.get(c), c))) for c in columns] for row in rows]
    widths = [max([len(c), *(columns_of(r[i]) for r in cells)])
              for i, c in enumerate(columns)]
    lines = ["  ".join(_padded(c.upper(), w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(_padded(v, w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _scalar(value: object) -> bool:
    return not isinstance(value, dict | list)


def _columns(rows: Sequence[Mapping[str, object]], first: Sequence[str]) -> list[str]:
    columns = [c for c in first if any(c in r for r in rows)]
    for row in rows:
        columns += [k for k, v in row.items() if k not in columns and _scalar(v)]
    return columns


def not_applied_lines(agent: str, not_applied: Mapping[str, object], then: str) -> list[str]:
    """The settings given for ``agent``'s workspace that it does not use, being open
    already with others (``not_applied`` of ``workspace.open``): why, how to make it
    take them (close it, ``then``), and one line a setting with the value in use."""
    if not not_applied:
        return []
    return [f"settings not in use: {agent} was open already with other settings, which "
            f"stay until it is opened again (recalld workspace close {agent}, then "
            f"{then}); in use now:",
            *(f"  {k} = {v}" for k, v in sorted(not_applied.items()))]


def render_workspaces(rows: Sequence[Mapping[str, object]]) -> str:
    if not rows:
        return "no workspaces\n"
    return table(rows, _columns(rows, ("agent_id", "name", "state", "path")))


def _uptime(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return _cell(seconds)
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] * bool(days) + [f"{hours}h"] * bool(hours or days)
    return " ".join([*parts, f"{minutes}m", f"{s}s"])


def render_read(result: ReadResult) -> str:
    text = str(result.get("text", ""))
    return text if text.endswith("\n") or not text else text + "\n"


class JobWaiter:
    """Submit a job, then follow it by ``event`` notifications, polling ``jobs.get`` as a
    fallback, with its progress on stderr (:mod:`recalld.ipc.progress`). Ctrl-C stops
    following, not the job: the message says how to follow or cancel it."""

    def __init__(self, client: Client, agent_id: str, *, out: TextIO, as_json: bool,
                 bar: TextIO | None = None) -> None:
        self.client = client
        self.agent_id = agent_id
        self.out = out
        self.as_json = as_json
        self.bar = bar if bar is not None else sys.stderr

    def _mode(self) -> Mode:
        if self.as_json:
            return "json"
        return "bar" if self.bar.isatty() else "lines"

    def submit_and_wait(self, kind: str, *, wait: bool = True,
                        params: Mapping[str, object] | None = None) -> int:
        submitted = self.client.jobs_submit(self.agent_id, kind, params)
        job_id = str(submitted.get("job_id", ""))
        if not wait:
            if self.as_json:
                print_json(self.out, submitted)
            else:
                self.out.write(f"{kind} job {job_id} submitted\n")
            return 0
        progress = Progress(self.bar, kind, job_id, mode=self._mode())
        try:
            job = self._follow(job_id, progress)
        except KeyboardInterrupt:
            progress.close()
            raise KeyboardInterrupt(
                f"interrupted; the {kind} job {job_id} goes on in the daemon. Follow it: "
                f"recalld jobs get {job_id}; stop it: recalld jobs cancel {job_id}") from None
        except errors.ConnectionLost as exc:
            progress.close()
            raise errors.ConnectionLost(
                f"{exc.message} while following the {kind} job {job_id} (the daemon "
                "stopped?); once it runs again, the job is resumed or reported as "
                f"interrupted: recalld jobs get {job_id}") from None
        progress.close()
        return self._report(kind, job_id, job)

    def _follow(self, job_id: str, progress: Progress) -> dict[str, object]:
        try:
            # As the job's agent: its own events are whole (another agent it is shared
            # with sees no result nor error).
            self.client.subscribe(list(JOB_TOPICS), self.agent_id)
        except (errors.MethodNotFound, errors.InvalidParams):
            pass  # polling alone still works
        job: dict[str, object] = dict(self.client.jobs_get(self.agent_id, job_id))
        while job.get("state") not in JOB_TERMINAL_STATES:
            progress.update(str(job.get("state", "?")), job.get("progress"))
            try:
                for event in self.client.events(timeout_s=JOB_POLL_S):
                    if str(event.data.get("job_id", "")) == job_id:
                        job.update(event.data)
                        progress.update(str(job.get("state", "?")), job.get("progress"))
                        if job.get("state") in JOB_TERMINAL_STATES:
                            break
            except errors.ConnectionLost:
                if not self.client.connected:
                    raise
                # A call reconnected meanwhile (the daemon restarted): events were
                # missed, which the jobs_get below makes up for.
            if job.get("state") not in JOB_TERMINAL_STATES:
                job = dict(self.client.jobs_get(self.agent_id, job_id))
        progress.update(str(job.get("state", "?")), job.get("progress"))  # fills the bar
        return job

    def _report(self, kind: str, job_id: str, job: Mapping[str, object]) -> int:
        state = job.get("state")
        if self.as_json:
            print_json(self.out, {"job_id": job_id, **job})
        elif state == "succeeded":
            result = job.get("result")
            suffix = f": {_cell(result)}" if result not in (None, {}) else ""
            self.out.write(f"{kind} job {job_id} succeeded{suffix}\n")
        if state == "failed":
            raise errors.JobFailed(f"{kind} job {job_id} failed: {_cell(job.get('error'))}")
        if state == "cancelled":
            raise errors.JobFailed(f"{kind} job {job_id} was cancelled")
        return 0


_NOT_OPEN = re.compile(r"workspace '([A-Za-z0-9_.-]+)' is not open")


def hint(exc: errors.RecalldError, command: Sequence[str | None] = (),
         listed: Callable[[], Sequence[Mapping[str, object]]] | None = None) -> str:
    """What to do about a daemon's error, when the command line can say it ('' if not).
    ``command``: the command and its action; a workspace that is not open is one to open,
    unless the command closes it. ``listed``: asks for the workspaces the daemon has,
    open or not (``workspace.list``): an id not among them was mistyped more often than
    meant, and opening it would make a new, empty workspace, so the close ones are named
    instead (nothing is suggested when they cannot be had)."""
    if tuple(command) == ("workspace", "close"):
        return ""
    m = _NOT_OPEN.search(exc.message) if isinstance(exc, errors.UnknownWorkspace) else None
    if m is None:
        return ""
    agent = m[1]
    if listed is None:
        return f"; open it with: recalld workspace open {agent_operand(agent)}"
    try:
        ids = sorted({str(ws.get("agent_id")) for ws in listed()})
    except (errors.RecalldError, OSError, TimeoutError):
        return ""
    if agent in ids:
        return f"; open it with: recalld workspace open {agent_operand(agent)}"
    close = difflib.get_close_matches(agent, ids, n=3, cutoff=0.6)
    if close:
        return (f"; no workspace {agent!r} is configured or recorded: did you mean "
                f"{' or '.join(close)}?")
    return (f"; no workspace {agent!r} is configured or recorded (recalld workspace list "
            f"shows them; recalld workspace open {agent_operand(agent)} makes a new one)")


class AnswerLost(OSError):
    """stdout refused a command's answer (a full disk, ``> /dev/full``, an I/O error):
    the daemon had done what it answered (a note written, a job submitted), so the
    command must say so rather than look failed and be run again. A reader gone away
    (BrokenPipeError, ``| head``) is not this: it stopped reading on purpose."""


class _AnswerStream(io.TextIOWrapper):
    """stdout as the commands write to it: a failing write or flush raises AnswerLost."""

    def write(self, s: str) -> int:
        try:
            return super().write(s)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise AnswerLost(exc.errno, exc.strerror) from exc

    def flush(self) -> None:
        try:
            super().flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise AnswerLost(exc.errno, exc.strerror) from exc


class _TerminalStream(_AnswerStream):
    """A text stream whose writes show control characters escaped (:func:`for_terminal`)."""

    def write(self, s: str) -> int:
        super().write(for_terminal(s))
        return len(s)


def output_stream(stream: TextIO, *, as_json: bool) -> TextIO:
    """``stdout`` as a command writes to it: JSON always in UTF-8 (what JSON readers
    expect, whatever the locale); text in the locale's encoding with what it cannot encode
    (a Chinese note under a Latin-1 or ASCII locale) shown as ``\\u7814`` escapes instead
    of a traceback, and on a terminal with its control characters escaped, so a note
    cannot retitle, recolour or clear the terminal (a pipe or a file gets the text as it
    is). A write it refuses raises :class:`AnswerLost`."""
    if not isinstance(stream, io.TextIOWrapper):
        return stream
    if as_json:
        stream.reconfigure(encoding="utf-8", errors="strict")
    else:
        stream.reconfigure(errors="backslashreplace")
    encoding, errors_, lines = stream.encoding, stream.errors, stream.line_buffering
    stream.flush()
    if as_json or not stream.isatty():
        if type(stream) is not io.TextIOWrapper:  # a caller's own (a capture): as it is
            return stream
        return _AnswerStream(stream.detach(), encoding=encoding, errors=errors_,
                             line_buffering=lines)
    return _TerminalStream(stream.detach(), encoding=encoding, errors=errors_,
                           line_buffering=True)


def say(err: TextIO, line: str) -> None:
    """Say what failed, as one line: the control characters of a message (a path, the
    daemon's words) are shown escaped, so it cannot run on or drive the terminal. A
    stderr that refuses the line (its reader gone, a full disk) is passed over: the exit
    status still tells what failed, and later writes to it go to /dev/null."""
    try:
        print(visible(line), file=err, flush=True)
    except OSError:
        _discard(err)


def at_most(count: int, cap: int, err: TextIO, what: str = "results") -> int:
    """``count`` (what an option such as ``-n`` asked for), or ``cap``, the most the
    daemon hands out, said on ``err``: a shorter list with no word would read as all
    there is."""
    if count > cap:
        say(err, f"recalld: note: at most {cap} {what} are given, not {count}")
    return min(count, cap)


def _discard(stream: TextIO) -> None:
    """Send what ``stream`` still holds and what is written to it later (the flush at
    exit too) to /dev/null, so it cannot fail again."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # no descriptor (a capture): nothing fails at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def closed_pipe() -> int:
    """The reader went away (``| head``): stop quietly (exit status 0). Later flushes of
    stdout (at exit) go to /dev/null instead of failing again."""
    _discard(sys.stdout)
    return 0


def answer_lost(err: TextIO, exc: AnswerLost) -> int:
    """Say that stdout refused the answer of a command the daemon carried out (exit
    status 1, not 0: the answer is gone); later flushes of stdout go to /dev/null."""
    say(err, f"recalld: the answer could not be written to standard output ({exc}); the "
             "daemon had carried the command out: what it changed (a note, a job) stays "
             "changed")
    closed_pipe()
    return 1


def open_closed_streams() -> None:
    """stdout or stderr closed from the start (``recalld status >&-``, a service manager
    that gave none) is /dev/null, as a reader gone away is: Python leaves it None. Opened
    first, it also takes the free descriptor 1 or 2, which a socket would otherwise get."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
