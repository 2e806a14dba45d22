"""The human form of ``recalld status``: per workspace, is its memory OK, what waits,
what is wrong and the fix; ``--verbose`` adds the queues and counters. No I/O but the
client's calls in :func:`status_command`."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from recalld.ipc import errors, paths
from recalld.ipc.answers import DaemonStatus, JobInfo, WorkspaceInfo
from recalld.ipc.client import Client
from recalld.ipc.health import assess, daemon_problems, not_open
from recalld.ipc.problems import Problem
from recalld.ipc.progress import size
from recalld.ipc.regular_files import blocked_on_way
from recalld.ipc.render import _cell, _uptime, print_json, table
from recalld.ipc.types import visible

EXIT_OK, EXIT_USAGE = 0, 2


def _size(n: object) -> str:
    return size(n) if isinstance(n, int) else "-"


def _header(status: DaemonStatus, socket_path: str) -> list[str]:
    return [f"recalld {status.get('version', '?')} running (pid {status.get('pid', '?')}, "
            f"up {_uptime(status.get('uptime_s'))})",
            f"  socket: {status.get('socket_path', socket_path)}",
            f"  config: {_config_shown(status.get('config_path'))}",
            f"  data:   {status.get('data_dir', '-')}"]


def _config_shown(path: object) -> str:
    """The daemon's config file, or that there is none (its defaults serve)."""
    if not isinstance(path, str) or not path:
        return "-"
    if Path(path).exists() or blocked_on_way(Path(path)) is not None:  # a broken link
        return path
    return f"{path} (no such file: the defaults apply)"


MARKS = {"fail": "FAIL", "warn": "WARN", "info": "note"}


def render_status(status: DaemonStatus, socket_path: str, jobs: Sequence[JobInfo] = (),
                  listed: Sequence[WorkspaceInfo] = (), *,
                  refused: paths.PathError | None = None, config: Path | None = None) -> str:
    """Per workspace first: is its memory OK, what waits, what is wrong and the fix; then
    those of ``listed`` (``workspace.list``) that are not open. ``refused``: why the
    config file on disk (``config``, this shell's) is refused (said unless a failed
    reload already says it)."""
    lines = _header(status, socket_path)
    problems = daemon_problems(status)
    if refused is not None and not any(str(refused) in p.cause for p in problems):
        problems.insert(0, file_refused(status, refused, config))
    for p in problems:
        lines += [f"  [{MARKS[p.severity]}] {p.what}", f"         fix: {p.fix}"]
    for ws in status.get("workspaces") or []:
        a = assess(ws, jobs)
        verdict = _verdict([p.severity for p in a.problems])
        lines += ["", f"{a.agent_id}: {verdict}  ({ws.get('state')}, {ws.get('path')})"]
        width = max((len(label) for label, _ in a.facts), default=0) + 1
        lines += [f"  {(label + ':').ljust(width)} {text}" for label, text in a.facts]
        for p in a.problems:
            lines.append(f"  [{MARKS[p.severity]}] {p.what}")
            if p.fix:
                lines.append(f"         fix: {p.fix}")
    if not status.get("workspaces"):
        lines += ["", "no open workspaces (recalld workspace open AGENT)"]
    # One line each: a path or a name holding a line break or a terminal's control
    # character (a workspace folder named so) is shown escaped, as workspace list shows it.
    return "".join(visible(line) + "\n" for line in lines + not_open(listed, status, jobs))


def _verdict(severities: Sequence[str]) -> str:
    """A workspace's verdict in the words of ``recalld doctor``: a failure is a problem,
    a warning a warning (notes are neither)."""
    failed, warned = severities.count("fail"), severities.count("warn")
    counts = [f"{failed} problem(s)"] if failed else []
    counts += [f"{warned} warning(s)"] if warned else []
    return ", ".join(counts) or "OK"


def file_refused(status: DaemonStatus, refused: paths.PathError,
                 config: Path | None = None) -> Problem:
    """The config file on disk, which the running daemon has not read (or a reload of
    which failed): a reload or restart would refuse it. Unless the file this shell reads
    (``config``) is not the daemon's, or its path is unusable here (None: a relative
    ``RECALLD_CONFIG``, which no daemon starts with): then only the commands run here
    refuse it."""
    running = status.get("config_path")
    if running and (config is None or not paths.same_file(config, Path(running))):
        mend = "fix or unset RECALLD_CONFIG" if config is None else f"fix {config}"
        return Problem(
            "fail", f"config file: {refused} (read by recalld commands here, which exit 2; "
                    f"the daemon reads {running}, which a reload or restart reads again)",
            f"{mend}, or export RECALLD_CONFIG={shlex.quote(running)}", "config")
    return Problem(
        "fail", f"config file: {refused}: a reload or restart would refuse it; the running "
                "daemon keeps the configuration it last read",
        f"mend the file, then: systemctl --user reload recalld (or kill -HUP "
        f"{status.get('pid', '<pid>')})", "config")


#: A commit that waited this long to start is named in ``status --verbose``.
COMMIT_WAIT_SHOWN_S = 1.0


def _pairs(value: Mapping[str, object], prefix: str = "") -> str:
    """``k=v, ...`` of a status object, nested objects as ``outer.k=v`` (lists left out)."""
    return ", ".join(_pairs(v, f"{prefix}{k}.") if isinstance(v, dict)
                     else f"{prefix}{k}={_cell(v, k)}" for k, v in value.items()
                     if not isinstance(v, list) and v != {})


def render_internals(status: DaemonStatus) -> str:
    """``status --verbose``: queues and counters, and the per-workspace table."""
    lines = ["", "internals:"]
    for name, value in (status.get("queues") or {}).items():
        if value and all(isinstance(v, dict) for v in value.values()):
            # One entry each (vector_spaces: per space), not a blank line.
            lines += [f"  {name} {key}: {_pairs(entry)}" for key, entry in value.items()
                      if isinstance(entry, dict)]
        elif isinstance(value, dict):
            lines.append(f"  {name}: {_pairs(value) or '-'}")
    rows, notes = [], []
    for ws in status.get("workspaces") or []:
        agent = ws.get("agent_id", "?")
        h = ws.get("health") or {}
        idx = ws.get("index") or {}
        watcher = idx.get("watcher") or {}
        rows.append({
            "agent": agent,
            "state": ws.get("state"),
            "health": h.get("state", "-"),
            "files": f"{_cell(h.get('files_on_disk'))}/{_cell(idx.get('files'))}",
            "chunks": idx.get("chunks"),
            "pending": idx.get("pending_changes"),
            "watcher": watcher.get("state"),
            "derived": _size(h.get("derived_bytes")),
        })
        if h.get("scanned_at"):
            notes.append(f"  {agent}: files on disk and derived size as of the disk scan at "
                         f"{_cell(h['scanned_at'], 'scanned_at')}")
        if h.get("unindexed_paths"):
            notes.append(f"  {agent}: not indexed: {', '.join(h['unindexed_paths'])}")
        if h.get("unreadable_paths"):
            notes.append(f"  {agent}: could not be read: {', '.join(h['unreadable_paths'])}")
        waiting = idx.get("commit_waiting_s")
        if isinstance(waiting, int | float) and waiting >= COMMIT_WAIT_SHOWN_S:
            notes.append(f"  {agent}: {_cell(idx.get('uncommitted_changes'))} change(s) not "
                         f"saved yet: their commit has waited {waiting:.0f} s behind other work")
        for err in h.get("last_errors") or []:
            notes.append(f"  {agent} error {_cell(err.get('time'), 'time_at')}: "
                         f"{err.get('what')}: {err.get('error')}")
    text = "".join(visible(line) + "\n" for line in lines)
    if rows:
        text += table(rows, ["agent", "state", "health", "files", "chunks", "pending",
                             "watcher", "derived"])
        text += "  (files: on disk/indexed)\n"
    return text + "".join(visible(n) + "\n" for n in notes)


def _shell_config() -> Path | None:
    """The config file this shell's commands read, None when its path is unusable."""
    try:
        return paths.config_path(None)
    except paths.PathError:
        return None


def _jobs_or_none(client: Client) -> list[JobInfo]:
    try:
        return client.jobs_of_every_workspace()
    except errors.MethodNotFound:
        return []  # a daemon without jobs: the rest of the status still shows


def _refused_json(status: DaemonStatus, refused: paths.PathError | None,
                  ) -> dict[str, str | None] | None:
    if refused is None:
        return None
    config = _shell_config()
    problem = file_refused(status, refused, config)
    return {"path": None if config is None else str(config), "error": str(refused),
            "what": problem.what, "fix": problem.fix}


def status_command(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    """``recalld status``. ``ns.config_refused``: why the config file this shell reads is
    refused (:func:`paths.socket_despite_file`); the daemon still answers on the settings
    it read, so its state shows, with that error, and the exit status is 2."""
    refused: paths.PathError | None = getattr(ns, "config_refused", None)
    try:
        status = client.status()
    except errors.DaemonNotRunning:
        if refused is not None:
            raise refused from None  # no daemon to show: the file is what to mend
        raise
    if as_json:
        # Said in the JSON too (a script reading stdout sees why the exit status is 2):
        # null when the file is read, else the file, why it is refused and what to do.
        print_json(out, {**status, "config_refused": _refused_json(status, refused)})
        if refused is not None:
            sys.stderr.write(f"recalld: configuration error: {refused}\n")
    else:
        out.write(render_status(status, str(client.socket_path), _jobs_or_none(client),
                                client.workspace_list(), refused=refused,
                                config=_shell_config()))
        if getattr(ns, "verbose", False):
            out.write(render_internals(status))
    return EXIT_OK if refused is None else EXIT_USAGE
