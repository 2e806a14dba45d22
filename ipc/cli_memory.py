"""Memory and job commands of the ``recalld`` CLI: ``jobs``, ``inbox``, ``note``,
``changes``, and the handler of ``read``.

:func:`add_parsers` adds the subcommands to the main parser; :data:`HANDLERS` maps each to
its handler (client, namespace, out, as_json) -> exit status, as in ``cli_ops``. Errors
raise :mod:`recalld.ipc.errors` exceptions, which the main ``run`` turns into one line and
an exit code.
"""

from __future__ import annotations

import argparse
import codecs
import re
import sys
import time
from datetime import datetime
from typing import TextIO

from recalld.ipc import errors
from recalld.ipc.agent_ids import note_session_key
from recalld.ipc.answers import ChangeRecord, JobInfo, ReadResult
from recalld.ipc.cli_args import count
from recalld.ipc.cli_ops import (
    DEFAULT_AGENT,
    EXIT_ERROR,
    EXIT_OK,
    Handler,
    Subparsers,
    add_command,
)
from recalld.ipc.client import Client
from recalld.ipc.protocol import MAX_LISTED_CHANGES
from recalld.ipc.render import at_most, print_json, render_read, say, table
from recalld.ipc.request_parts import note_parts, notes_written
from recalld.ipc.shown import names_nothing
from recalld.ipc.types import visible

#: A change record's run id (``20261129T230012Z-a1b2c3``).
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}")


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``jobs``, ``inbox`` and ``note`` to ``sub`` (the main parser's subparsers)."""

    def add(parent: Subparsers, name: str, help_: str) -> argparse.ArgumentParser:
        return add_command(parent, common, name, help_)

    jobs = add(sub, "jobs", "list, show or cancel jobs (reindex, auto_dream, ...)")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    listing = add(jobs_sub, "list", "jobs of one agent, or of all (oldest first)")
    listing.add_argument("--agent", help="only this agent's jobs (default: all)")
    for name, help_ in (("get", "one job: state, progress, result, error"),
                        ("cancel", "stop a queued or running job")):
        p = add(jobs_sub, name, help_)
        p.add_argument("job_id")
        p.add_argument("--agent", help="the job's agent (default: found by its id)")

    inbox = add(sub, "inbox", "memory changes made for an agent, and marking them seen")
    inbox_sub = inbox.add_subparsers(dest="inbox_command", required=True, metavar="ACTION")
    show = add(inbox_sub, "list", "items not yet marked seen (oldest first)")
    show.add_argument("--agent", default=DEFAULT_AGENT)
    show.add_argument("--all", action="store_true", help="seen items too")
    show.add_argument("--since", metavar="ID|TIME",
                      help="after an item id or ISO-8601 time (without an offset: local time)")
    ack = add(inbox_sub, "ack", "mark items as seen")
    ack.add_argument("ids", nargs="*", metavar="ID")
    ack.add_argument("--agent", default=DEFAULT_AGENT)
    ack.add_argument("--all", action="store_true", help="every item not yet seen")

    changes = add(sub, "changes", "what the memory jobs changed or refused to change "
                                  "(auto_memory and auto_dream change logs), newest first")
    changes.add_argument("--agent", default=DEFAULT_AGENT)
    changes.add_argument("--kind", choices=("auto_memory", "auto_dream"),
                         help="only this job's records (default: both)")
    changes.add_argument("-n", "--limit", type=count, default=20, metavar="N",
                         help=f"at most N records (default 20, at most "
                              f"{MAX_LISTED_CHANGES})")
    changes.add_argument("--show", metavar="RUN",
                         help="print one record's log in full (run id from the list)")

    note = add(sub, "note", "append to an agent's note of the day (text, or stdin with -)")
    note.add_argument("content", help="Markdown text; - reads it from stdin")
    note.add_argument("--agent", default=DEFAULT_AGENT)
    note.add_argument("--name", help="the note's file name (default agent-notes)")
    note.add_argument("--session", dest="session_id",
                      help="session id (default agent-notes); one the daemon does not take "
                           "(\"chat 42\") is mapped as the MCP bridge maps it")


# -------------------------------------------------------------------------------- jobs


def _progress(job: JobInfo) -> str:
    p = job["progress"]
    if p.get("total"):
        return f"{p.get('done', 0)}/{p['total']}"
    return str(p.get("message") or "-")


def _state(job: JobInfo) -> str:
    """Its state; "queued (held)" while it waits for its workspace to open."""
    return f"{job['state']} (held)" if job.get("held") else str(job["state"])


def _jobs(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    action = ns.jobs_command
    if action == "list":
        # The agent's own: jobs.list adds those of the workspaces shared with it.
        jobs = ([j for j in client.jobs_list(ns.agent) if j["agent_id"] == ns.agent]
                if ns.agent is not None else client.jobs_of_every_workspace())
        if as_json:
            print_json(out, jobs)
        elif not jobs:
            out.write("no jobs\n")
        else:
            rows = [{**j, "progress": _progress(j), "state": _state(j)} for j in jobs]
            out.write(table(rows, ("job_id", "agent_id", "kind", "state", "progress",
                                   "submitted_at", "finished_at")))
        return EXIT_OK
    agent = ns.agent or _agent_of(client, ns.job_id)
    job = client.jobs_get(agent, ns.job_id)
    before = str(job["state"])
    if action == "cancel" and before in _ACTIVE:
        job = client.jobs_cancel(agent, ns.job_id)
    if as_json:
        print_json(out, job)
        return EXIT_OK
    if action == "cancel":
        out.write(_what_cancel_did(before, str(job["state"])) + "\n")
    out.write(f"{job['job_id']}  {job.get('kind')}  {_state(job)}  "
              f"progress {_progress(job)}\n")
    if job.get("error"):
        out.write(f"error: {job['error']}\n")
    if job.get("result") is not None:
        print_json(out, job["result"])
    return EXIT_OK


_ACTIVE = ("queued", "running")


def _what_cancel_did(before: str, after: str) -> str:
    """What ``jobs cancel`` did to a job in state ``before``, now in state ``after``: a job
    that had already ended is not cancelled, and its state alone did not say so."""
    if before not in _ACTIVE:
        return f"nothing cancelled: the job had already ended ({before})"
    if after == "cancelled":
        return "cancelled"
    if after in _ACTIVE:
        return f"asked to stop; it has not stopped yet ({after})"
    return f"nothing cancelled: the job ended ({after}) before it could be"


def _agent_of(client: Client, job_id: str) -> str:
    """The agent of job ``job_id`` (job ids are unique across agents)."""
    for job in client.jobs_of_every_workspace():
        if job.get("job_id") == job_id:
            return str(job["agent_id"])
    raise errors.NotFound(f"no job {job_id} (recalld jobs list shows the jobs)")


# ------------------------------------------------------------------------------- inbox


def _local_since(since: str | None) -> str | None:
    """``--since`` as sent: a time written without its offset is this terminal's local
    time, as the list shows times (the daemon would read it in its own zone)."""
    if since is None or (since.isascii() and since.isdigit()):
        return since  # none, or an item id
    try:
        when = datetime.fromisoformat(since)
    except ValueError:
        return since  # the daemon says what is wrong with it
    return when.astimezone().isoformat() if when.tzinfo is None else since


def _inbox(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    if ns.inbox_command == "list":
        items = client.inbox_list(ns.agent, since=_local_since(ns.since),
                                  include_acked=ns.all)
        if as_json:
            print_json(out, items)
        elif not items:
            out.write("inbox empty\n")
        else:
            for item in items:
                seen = "  (seen)" if item.get("acked") else ""
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(item["time"])))
                # A path (in the summary too) may hold a line break or an escape
                # sequence: shown escaped, it cannot pass for another item or line.
                out.write(f"{visible(str(item['id']))}  {when}  "
                          f"{visible(str(item.get('kind')))}{seen}\n"
                          f"  {visible(str(item.get('summary') or ''))}\n")
                out.writelines(f"  - {visible(str(path))}\n"
                               for path in item.get("changes") or ())
        return EXIT_OK
    ids = list(ns.ids)
    if not ids and not ns.all:
        raise errors.InvalidParams("name the items to mark seen, or pass --all")
    if ns.all:
        ids += [item["id"] for item in client.inbox_list(ns.agent)]
    # --all with nothing unseen: already done
    result = client.inbox_ack(ns.agent, ids) if ids else None
    acked, unknown = (result["acked"], result["unknown"]) if result is not None else ([], [])
    if as_json:
        print_json(out, result if result is not None else {"acked": acked, "unknown": unknown})
    else:
        out.write(f"marked {len(acked)} item(s) seen\n")
    if unknown:
        raise errors.NotFound(f"no inbox item(s) {', '.join(unknown)} for agent {ns.agent}")
    return EXIT_OK


# ----------------------------------------------------------------------------- changes


def _what(change: ChangeRecord) -> str:
    if change.get("kind") == "auto_dream":
        return f"{change.get('notes', 0)} note(s) read, {len(change.get('files') or ())} " \
               "file(s) changed" + (" (undone)" if change.get("undone") else "")
    parts = [f"{change.get('added', 0)} fact(s) added"]
    if change.get("refused"):
        parts.append(f"{change['refused']} bullet(s) a refused rewrite would have dropped")
    return ", ".join(parts)

#: The folder of each kind's records in the metadata directory.
_RUNS_FOLDERS = {"auto_memory": "auto_memory/runs", "auto_dream": "dream/runs"}


def _older_record(client: Client, ns: argparse.Namespace, listed: list[ChangeRecord],
                  ) -> tuple[ChangeRecord, tuple[ReadResult, list[int]]]:
    """The log of record ``ns.show`` older than the newest ones the daemon lists, read
    where the listed ones lie; NotFound if there is none."""
    missing = errors.NotFound(f"no change record {ns.show} for agent {ns.agent} "
                              "(recalld changes lists them)")
    if len(listed) < MAX_LISTED_CHANGES or not RUN_ID.fullmatch(ns.show):
        raise missing
    # <metadata_dir>/<kind folder>/runs/<run id>.md
    metas = dict.fromkeys(str(c["log"]).rsplit("/", 3)[0] for c in listed if c.get("log"))
    for meta in metas:
        for kind, folder in _RUNS_FOLDERS.items():
            if ns.kind in (None, kind):
                path = f"{meta}/{folder}/{ns.show}.md"
                try:
                    read = read_whole(client, ns.agent, path)
                except errors.NotFound:
                    continue
                return {"kind": kind, "run_id": ns.show, "started": None, "log": path,
                        "trigger": None, "files": []}, read
    raise missing


def _changes(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    if ns.show:
        listed = client.memory_changes(ns.agent, kind=ns.kind, limit=MAX_LISTED_CHANGES)
        found: ChangeRecord | None = next(
            (c for c in listed if c.get("run_id") == ns.show), None)
        # The whole log, however long: read in as many slices as the daemon hands out.
        if found is not None:
            log, cut = read_whole(client, ns.agent, str(found["log"]))
        else:
            found, (log, cut) = _older_record(client, ns, listed)
        text = log["text"]
        if as_json:
            print_json(out, {**found, "text": text})
        else:
            out.write(text if text.endswith("\n") else text + "\n")
        return _say_cut(str(found["log"]), cut) if cut else EXIT_OK
    limit = at_most(ns.limit, MAX_LISTED_CHANGES, sys.stderr, "records")
    changes = client.memory_changes(ns.agent, kind=ns.kind, limit=limit)
    if as_json:
        print_json(out, changes)
    elif not changes:
        out.write("no change records yet\n")
    else:
        rows = [{"run_id": c.get("run_id"), "kind": c.get("kind"), "started": c.get("started"),
                 "outcome": c.get("outcome") or c.get("trigger"),
                 "session": c.get("session_id") or "-", "note": c.get("note") or "-",
                 "what": _what(c)} for c in changes]
        out.write(table(rows, ("run_id", "kind", "started", "outcome", "session", "note",
                               "what")))
        out.write("full record: recalld changes --show RUN\n")
    return EXIT_OK


# -------------------------------------------------------------------------------- note


def _note(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    content = _stdin_text() if ns.content == "-" else ns.content
    if names_nothing(content):  # blank, or only what shows nothing (a zero-width space)
        raise errors.InvalidParams("the note is empty")
    # A note longer than one call takes goes in parts, as the bridge and the middlewares
    # send it; the answer is the last part's, created if the first part created it.
    # A session id the daemon would refuse ("chat 42") is mapped as the MCP bridge maps it.
    session = note_session_key(ns.session_id)
    result = notes_written([
        client.add_note(ns.agent, part, session_id=session, name=ns.name, request_id=part_id)
        for part, part_id in note_parts(content, client.request_limit, name=ns.name)])
    paths = result["paths"]  # a full note is continued
    if as_json:
        print_json(out, result)
    elif len(paths) > 1:
        out.write(f"wrote {', '.join(map(visible, paths))} (searchable now)\n")
    else:
        verb = "created" if result["created"] else "appended to"
        out.write(f"{verb} {visible(str(result['path']))} (searchable now)\n")
    return EXIT_OK


#: Byte order marks and the codec that reads past them (UTF-32 LE's begins as UTF-16 LE's).
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF32_LE, "utf-32"),
         (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))


def _stdin_text() -> str:
    """The note piped in, as notes are: UTF-8 (whatever the locale, so a file piped in
    keeps its characters) or the UTF its byte order mark names, else text in the
    locale's encoding (typed in a Latin-1 terminal)."""
    if sys.stdin is None:  # closed from the start (<&-)
        raise errors.InvalidParams("note -: stdin is closed; pipe the text in or give it as TEXT")
    data = sys.stdin.buffer.read()
    # A file an editor saved with a byte order mark (Windows Notepad): in its encoding,
    # without the mark, which would stand in the note before its first line's Markdown.
    codec = next((codec for bom, codec in _BOMS if data.startswith(bom)), None)
    if codec is not None:
        try:
            return data.decode(codec)
        except UnicodeDecodeError as exc:
            raise errors.InvalidParams(f"note -: stdin is not {codec[:6].upper()} text "
                                       f"after its byte order mark ({exc.reason} at offset "
                                       f"{exc.start})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        try:
            return data.decode(sys.stdin.encoding)
        except (UnicodeDecodeError, LookupError):
            raise errors.InvalidParams(
                f"note -: stdin is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start}); convert it first, e.g. iconv -f latin1 -t utf-8") from None


def read_whole(client: Client, agent: str, path: str, start: int = 1,
               end: int | None = None) -> tuple[ReadResult, list[int]]:
    """Lines ``start`` to ``end`` (the last if None) of ``path``, whole: the daemon answers
    at most a bounded slice per call (512 KiB), so the rest is asked for until the range
    is complete. Also the lines longer than one slice, of which only the head is given."""
    first = client.read(agent, path, start_line=start, end_line=end)
    pieces, piece = [first], first
    texts = [first.get("text", "")]
    cut: list[int] = []
    while piece.get("truncated"):
        if not texts[-1].endswith("\n"):
            cut.append(piece["end_line"])  # one line longer than a slice: its head only
            texts[-1] += "\n"  # which the next line does not continue
        if piece["end_line"] >= (end if end is not None else piece.get("total_lines", 0)):
            break
        piece = client.read(agent, path, start_line=piece["end_line"] + 1, end_line=end)
        pieces.append(piece)
        texts.append(piece.get("text", ""))
    whole: ReadResult = {**first, "text": "".join(texts),
                         "end_line": pieces[-1]["end_line"], "truncated": bool(cut)}
    return whole, cut


def _say_cut(path: str, cut: list[int]) -> int:
    say(sys.stderr, f"recalld: line(s) {', '.join(map(str, cut))} of {path} are "
         "longer than the daemon hands out in one answer; only their first part is shown")
    return EXIT_ERROR


def _read(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    """The whole file (or range), :func:`read_whole`."""
    start, end = ns.lines if ns.lines else (1, None)
    whole, cut = read_whole(client, ns.agent, ns.path, start, end)
    if ns.lines and not whole.get("text") and start > whole.get("total_lines", 0):
        say(sys.stderr, f"recalld: {ns.path} has {whole.get('total_lines', 0)} line(s): "
            f"none from line {start} on")
        return EXIT_ERROR
    if as_json:
        print_json(out, whole)
    else:
        out.write(render_read(whole))
    return _say_cut(ns.path, cut) if cut else EXIT_OK


HANDLERS: dict[str, Handler] = {"jobs": _jobs, "inbox": _inbox, "note": _note,
                                "changes": _changes, "read": _read}
