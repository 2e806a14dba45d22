"""Operations commands of the ``recalld`` CLI: backup, verify, compact, metrics, doctor,
and ``status`` (its human form: :mod:`recalld.ipc.cli_status`).

:func:`add_parsers` adds the subcommands to the main parser; :data:`HANDLERS` maps each
to its handler with the same signature as the other commands (client, namespace, out,
as_json) -> exit status. Errors raise :mod:`recalld.ipc.errors` exceptions, which the main
``run`` turns into one line and an exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TextIO, TypeAlias

from recalld.ipc import errors, paths
from recalld.ipc.answers import (
    BackupList,
    BackupSummary,
    JsonObject,
)
from recalld.ipc.cli_status import status_command
from recalld.ipc.client import Client
from recalld.ipc.progress import following
from recalld.ipc.prometheus import labels_text, number, prometheus_text
from recalld.ipc.render import _cell, print_json, table
from recalld.ipc.types import visible

DEFAULT_AGENT = "default"
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
Handler = Callable[[Client, argparse.Namespace, TextIO, bool], int]
#: What ``add_subparsers`` returns (a private class of argparse, hence the string).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_command(parent: Subparsers, common: argparse.ArgumentParser, name: str,
                help_: str) -> argparse.ArgumentParser:
    """A subcommand of ``parent`` (a subparsers object) taking the ``common`` options."""
    return parent.add_parser(name, help=help_, description=help_, parents=[common])


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add the operations subcommands to ``sub`` (the main parser's subparsers)."""

    def add(parent: Subparsers, name: str, help_: str) -> argparse.ArgumentParser:
        return add_command(parent, common, name, help_)

    bk = add(sub, "backup", "back up, verify, restore or roll back workspaces")
    bk_sub = bk.add_subparsers(dest="backup_command", required=True, metavar="ACTION")
    create = add(bk_sub, "create", "write a zip of the agents' Markdown, sessions, resources")
    create.add_argument("--agent", action="append", dest="agents", metavar="A",
                        help="only this agent (repeatable; default: every workspace, open or "
                             "closed, that the next start opens)")
    create.add_argument("--out", metavar="FILE", help="zip to write (default: data dir)")
    create.add_argument("--include-derived", action="store_true",
                        help="also store the derived index state (it can be rebuilt)")
    create.add_argument("--include-secrets", action="store_true",
                        help="keep the secrets of the daemon's config file (masked otherwise)")
    add(bk_sub, "list", "list the backups in the data dir")
    verify = add(bk_sub, "verify", "check a backup completely (structure, sizes, checksums)")
    verify.add_argument("file")
    restore = add(bk_sub, "restore", "restore a backup (a snapshot is taken first)")
    restore.add_argument("file", nargs="?", help="zip path, or a name from `backup list`")
    restore.add_argument("--agent", action="append", dest="agents", metavar="A",
                         help="only this agent (repeatable; default: all in the backup)")
    restore.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    restore.add_argument("--no-snapshot", action="store_true",
                         help="skip the pre-restore snapshot (no rollback possible)")
    restore.add_argument("--rollback", action="store_true",
                         help="undo the last restore from its pre-restore snapshot")
    restore.add_argument("--dry-run", action="store_true",
                         help="say what would be written and removed; change nothing")
    rollback = add(bk_sub, "rollback", "undo the last restore from its pre-restore snapshot")
    rollback.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    rollback.add_argument("--dry-run", action="store_true",
                          help="say what would be written and removed; change nothing")
    for p in (restore, rollback):
        p.add_argument("--overwrite-shared", action="store_true",
                       help="also restore a workspace shared with other hosts: the notes "
                       "written since the backup are deleted, and edits replaced, on every host")

    for name, help_ in (("verify", "check an agent's derived index against its Markdown"),
                        ("compact", "merge an agent's keyword index now and save it")):
        p = add(sub, name, help_)
        p.add_argument("--agent", default=DEFAULT_AGENT)

    metrics = add(sub, "metrics", "show counters and latency histograms")
    metrics.add_argument("--prometheus", action="store_true",
                         help="Prometheus text exposition format (not with --json)")
    add(sub, "doctor", "check the environment (socket, limits, disk, service) and advise")


# ------------------------------------------------------------------------------ backup


class Declined(errors.RecalldError):
    """The person answered no to a confirmation (client side only; exit status 1)."""


_AFTER_RESTORE = "recalld status shows the workspaces; recalld backup list the rollback point"


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if sys.stdin is None or not sys.stdin.isatty():  # None: closed from the start
        raise errors.InvalidParams(f"{question} Pass --yes to confirm (stdin is not a terminal)")
    try:
        answer = input(f"{visible(question)} [y/N] ").strip().lower()
    except EOFError:  # Ctrl-D, or the terminal went away: no answer is a no
        print(file=sys.stdout)  # (ends the prompt's line)
        answer = ""
    except KeyboardInterrupt:  # Ctrl-C: the error line starts a line of its own
        print(file=sys.stdout)
        raise KeyboardInterrupt("interrupted; nothing was changed") from None
    if answer not in ("y", "yes"):
        raise Declined("cancelled; nothing was changed")


#: What ``backup.create`` leaves out, by key of its answer, and why.
_LEFT_OUT = (("passed_by", "names not UTF-8 or with a backslash: no archive can hold them"),
             ("symlinks", "symlinks: what they lead to is not the workspace's"),
             ("hidden", "hidden: names starting with a dot"),
             ("special", "FIFOs, sockets and devices: no file content to copy"),
             ("too_large", "larger than a restore takes, 4 GiB"))


def _some(names: list[str], shown: int = 10) -> str:
    more = len(names) - shown
    return ", ".join(map(visible, names[:shown])) + (f" and {more} more" if more > 0 else "")


def _local_or_name(file: str) -> str:
    # A path that exists here is sent absolute; a bare name means the daemon's backups dir
    # (from a current directory since deleted too, where no file is).
    if file and "/" not in file and file != "-" and not file.startswith("~") and not (
            os.path.exists(file)):  # (never raises: a name too long is not here)
        return file
    return str(paths.local_path(file, "FILE"))


def _backup(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    action = ns.backup_command
    result: JsonObject | BackupList | BackupSummary
    if action == "create":
        if ns.out == "-":  # read as standard output elsewhere: a file named "-" surprises
            raise errors.InvalidParams("--out -: the archive is written to a file, not to "
                                       "standard output; name the file (./- for one named -)")
        outfile = str(paths.local_path(ns.out, "--out")) if ns.out is not None else None
        # `backup list` shows the data dir's backups only, not an --out elsewhere.
        where = (f"the archive appears as {outfile} once it is written" if outfile
                 else "recalld backup list shows the archive once it is written")
        with following(client, "backup create", as_json=as_json, after=where) as token:
            result = made = client.backup_create(ns.agents, outfile, ns.include_derived,
                                                  ns.include_secrets, progress_token=token)
        if not as_json:
            out.write(f"wrote {visible(str(made['file']))}: {made['members']} file(s) of "
                      f"{', '.join(sorted(made.get('agents', {})))}, {made.get('size')} bytes\n")
            for key, why in _LEFT_OUT:
                left: dict[str, list[str]] = made.get(key) or {}  # type: ignore[assignment]
                for agent, names in sorted(left.items()):
                    out.write(f"left out of {agent} ({why}): {_some(names)}\n")
            secrets = [(f"workspace {a}'s record", keys) for a, keys in
                       sorted((made.get("secrets_left_out") or {}).items())]
            secrets.append(("the config file", made.get("config_secrets_left_out") or []))
            for whose, keys in secrets:
                if keys:  # a restore names them again, until they are put back
                    out.write(f"secrets left out of {whose}: {_some(keys)}\n")
            if made.get("not_open"):
                out.write("not backed up (failed, still opening, or no folder): "
                          f"{', '.join(made['not_open'])}\n")
    elif action == "list":
        result = listing = client.backup_list()
        if not as_json:
            rows = [{"name": b["name"], "created_at": b.get("created"),
                     "agents": ",".join(b.get("agents", [])), "files": b.get("members"),
                     "size": b["size"], "note": b.get("note") or b.get("error", "")}
                    for b in listing["backups"]]
            out.write(f"backups in {visible(str(listing['dir']))}:\n")
            out.write(table(rows, ["name", "created_at", "agents", "files", "size", "note"])
                      if rows else "none\n")
            if listing["rollback"]:
                out.write("rollback available: "
                          f"{visible(str(listing['rollback']['snapshot']))}\n")
    elif action == "verify":
        file = _local_or_name(ns.file)  # a usage error before the daemon is asked
        with following(client, "backup verify", as_json=as_json, after=None) as token:
            result = checked = client.backup_verify(file, progress_token=token)
        if not as_json:
            held = ", ".join(sorted(checked.get("agents", {})))
            out.write(f"ok: {visible(str(checked['file']))}: {checked['members']} file(s), "
                      + (f"agents {held}\n" if held else
                         "no workspace (nothing to restore)\n"))
    elif action == "rollback" or (action == "restore" and ns.rollback):
        if action == "restore" and (ns.file or ns.agents or ns.no_snapshot):
            raise errors.InvalidParams("backup restore --rollback undoes the last restore: "
                                       "it takes no FILE, --agent or --no-snapshot")
        listed = client.backup_list()
        record = listed["rollback"]
        if not record:
            raise errors.NotFound("no restore to roll back (no pre-restore snapshot recorded)")
        with following(client, "backup rollback", as_json=as_json, after=None) as token:
            plan = client.backup_restore(record["snapshot"], record["agents"], dry_run=True,
                                         progress_token=token)
        if getattr(ns, "dry_run", False):
            return _dry_run(out, plan, as_json)
        if not as_json:
            out.write(_plan_text(plan))
        _check_shared(plan, ns.overwrite_shared, "rolled back")
        confirm(f"Roll agent(s) {', '.join(record['agents'])} back to {record['snapshot']}?",
                 ns.yes)
        with following(client, "backup rollback", as_json=as_json,
                       after=_AFTER_RESTORE) as token:
            result = client.backup_rollback(progress_token=token,
                                            overwrite_shared=ns.overwrite_shared)
        if not as_json:
            out.write(_restored_text(result, "rolled back"))
    else:
        if not ns.file:
            raise errors.InvalidParams("backup restore needs FILE (or --rollback)")
        name = _local_or_name(ns.file)
        with following(client, "backup restore", as_json=as_json, after=None) as token:
            plan = client.backup_restore(name, ns.agents, dry_run=True,  # checks it all
                                         progress_token=token)
        if ns.dry_run:
            return _dry_run(out, plan, as_json)
        if not as_json:
            out.write(_plan_text(plan))
        _check_shared(plan, ns.overwrite_shared, "restored")
        agents = [p["agent_id"] for p in plan.get("plans", [])]
        confirm(f"Restore {name} over agent(s) {', '.join(agents)}?", ns.yes)
        with following(client, "backup restore", as_json=as_json,
                       after=_AFTER_RESTORE) as token:
            result = client.backup_restore(name, ns.agents, snapshot=not ns.no_snapshot,
                                           progress_token=token,
                                           overwrite_shared=ns.overwrite_shared)
        if not as_json:
            out.write(_restored_text(result, "restored"))
    if as_json:
        print_json(out, result)
    return EXIT_OK


def _plan_text(plan: JsonObject) -> str:
    """What a restore will write and remove, per agent (from a dry run)."""
    lines = []
    for p in plan.get("plans", []):
        lines.append(f"{p['agent_id']}: will write {p['write']} file(s) into "
                     f"{visible(str(p['root']))} "
                     f"({p['overwrite']} replace existing ones) and remove {p['remove']} "
                     "file(s) the backup lacks"
                     + (f"; {p['unchanged']} hold the backup's bytes already and stay as "
                        "they are" if p.get("unchanged") else ""))
        # A name with a line break would show as two, neither of them the file removed.
        lines += [f"  remove {visible(str(rel))}" for rel in p.get("removes", [])]
        if p["remove"] > len(p.get("removes", [])):
            lines.append(f"  ... and {p['remove'] - len(p['removes'])} more")
    if plan.get("shared_warning"):
        lines.append(f"warning: {visible(str(plan['shared_warning']))}")
    return "\n".join(lines) + "\n"


def _check_shared(plan: JsonObject, overwrite_shared: bool, done: str) -> None:
    """Refuse before asking, as the daemon would after: the plan covers a workspace shared
    with other hosts and ``--overwrite-shared`` was not given."""
    if plan.get("shared") and not overwrite_shared:
        raise errors.NotAllowed(f"{plan['shared_warning']}: nothing was {done}. Pass "
                                "--overwrite-shared to do so anyway")


def _dry_run(out: TextIO, plan: JsonObject, as_json: bool) -> int:
    if as_json:
        print_json(out, plan)
    else:
        out.write(_plan_text(plan) + "dry run: nothing was changed\n")
    return EXIT_OK


def _restored_text(result: JsonObject, verb: str) -> str:
    lines = []
    for r in result.get("restored", []):
        lines.append(f"{verb} {r['agent_id']}: {r['written']} written, "
                     f"{r.get('unchanged', 0)} unchanged, {r['removed']} removed")
        if r.get("warning"):  # secrets of its record the backup left out
            lines.append(f"  warning: {visible(str(r['warning']))}")
    if result.get("config_kept"):
        lines.append("config file of the backup not put in place: "
                     f"{visible(str(result['config_kept']))}")
    elif result.get("config_error"):
        lines.append("config file of the backup not put in place: "
                     f"{visible(str(result['config_error']))}")
    elif result.get("config_restored"):
        lines.append(f"config file {verb} (workspace settings apply now, the daemon's own "
                     "at the next reload or start)")
        if result.get("config_warning"):
            lines.append(f"  warning: {visible(str(result['config_warning']))}")
    if result.get("snapshot"):
        lines.append(f"snapshot of the previous state: {visible(str(result['snapshot']))} "
                     "(undo with: recalld backup rollback)")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- maintenance


def _verify(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    result = client.index_verify(ns.agent)
    if as_json:
        print_json(out, result)
    else:
        out.write(f"{ns.agent}: {'ok' if result['ok'] else 'DIFFERENCES FOUND'} "
                  f"({result['files_on_disk']} files on disk, {result['files_indexed']} "
                  f"indexed, {result['chunks']['chunks']} chunks)\n")
        said = verify_lines(result)
        if not result.get("ok") and not said:  # a check this client does not know yet
            said = ["  details: recalld --json verify"]
        out.write("".join(f"{line}\n" for line in said))
    return EXIT_OK if result.get("ok") else EXIT_ERROR


#: The listed differences of index.verify, and what each means.
VERIFY_LISTS = (("not_indexed", "not indexed"), ("indexed_but_gone", "indexed but gone"),
                ("stat_differs", "stat differs"), ("content_differs", "content differs"),
                ("read_again", "left to read again under this version's rules (the saved "
                               "index was made under older ones)"),
                ("partly_indexed", "partly indexed (too large: only the beginning of each is "
                                   "searchable; split them)"),
                ("misnamed", "not indexed: their name is not valid UTF-8 (rename them to "
                             "UTF-8: convmv -f latin1 -t utf8 --notest FILE)"),
                ("links_differ", "links in the index differ from the text (recalld reindex "
                                 "reads them again)"))


def verify_lines(result: JsonObject) -> list[str]:
    """A line for every check of ``result`` (an index.verify answer) that failed."""
    lines = []
    for key, what in VERIFY_LISTS:
        item = result.get(key) or {}
        if item.get("count"):
            more = ", ..." if item["count"] > len(item.get("paths") or []) else ""
            shown = ", ".join(visible(str(path)) for path in item.get("paths") or [])
            lines.append(f"  {what}: {item['count']}: {shown}{more}")
    if not result.get("chunks_consistent", True):
        lines.append(f"  chunk bookkeeping inconsistent: {_cell(result['chunks'])}")
    gen = result.get("generation") or {}
    if not gen.get("ok"):
        lines.append(f"  committed state: {_cell(gen)}")
    elif result.get("committed_matches_index") is False:
        lines.append(f"  the committed state holds {gen.get('records', {}).get('catalog')} "
                     f"file(s), the index {result.get('files_indexed')} (recalld compact "
                     "saves it again)")
    live = result.get("live") or {}
    if live.get("ok") is False:
        lines.append(f"  the index in memory is damaged: {_cell(live.get('damaged'))} "
                     "(recalld reindex rebuilds it)")
    return lines


def _compact(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    result = client.index_compact(ns.agent)
    if as_json:
        print_json(out, result)
    else:
        before, after = result.get("keyword_before", {}), result.get("keyword_after", {})
        out.write(f"{ns.agent}: compacted keyword index (dead rows {before.get('dead_rows')} -> "
                  f"{after.get('dead_rows')}, delta docs {before.get('delta_docs')} -> "
                  f"{after.get('delta_docs')}), generation {result.get('generation')}\n")
    return EXIT_OK


# ----------------------------------------------------------------------------- metrics


def _metrics(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    if ns.prometheus and as_json:  # one format or the other: neither is quietly dropped
        raise errors.InvalidParams("metrics --prometheus and --json are two formats of the "
                                   "same answer: give one of them")
    result = client.metrics()
    families = result["families"]
    if ns.prometheus:
        out.write(prometheus_text(families))
    elif as_json:
        print_json(out, result)
    else:
        for fam in families:
            for s in fam.get("samples", []):
                labels = labels_text(s.get("labels") or {})
                if fam["type"] == "histogram":
                    n = s["count"]
                    mean = s["sum"] / n * 1000 if n else 0.0
                    out.write(f"{fam['name']}{labels}: {n} calls, mean {mean:.3f} ms\n")
                else:
                    out.write(f"{fam['name']}{labels}: {number(float(s['value']))}\n")
    return EXIT_OK


# ------------------------------------------------------------------------ doctor, status


def _doctor(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    from recalld.ipc.doctor import Doctor  # here: the checks need what no other command does
    from recalld.ipc.doctor_report import render as render_doctor

    doctor = Doctor(client.socket_path, timeout_s=client.timeout_s)
    checks = doctor.checks()
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        print_json(out, {"ok": not failed, "checks": [c.as_dict() for c in checks]})
    else:
        out.write(render_doctor(checks))
    return EXIT_ERROR if failed else EXIT_OK


HANDLERS: dict[str, Handler] = {
    "backup": _backup,
    "verify": _verify,
    "compact": _compact,
    "metrics": _metrics,
    "doctor": _doctor,
    "status": status_command,
}
