"""``recalld remote release AGENT --upload|--restore``: end the hold of a shared
workspace's deletions that the replica's deletion guard held back (``remote.release``).
``recalld remote forget NAME --dsn DSN``: remove a shared workspace from its server for
good (``remote.forget``).

``--upload`` sends the deletions (the notes go on every host); ``--restore`` writes the
notes back into the workspace folder (from the server, or this host's edit not yet
uploaded). ``recalld status`` shows what is held and why.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from recalld.ipc import paths
from recalld.ipc.cli_ops import Subparsers, add_command, confirm
from recalld.ipc.client import Client
from recalld.ipc.render import print_json

EXIT_OK = 0


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    remote = add_command(sub, common, "remote", "a shared workspace's replica")
    remote_sub = remote.add_subparsers(dest="remote_command", required=True)
    release = add_command(remote_sub, common, "release",
                          "end the hold of deletions held back (status shows them)")
    release.add_argument("agent", help="the agent whose shared workspace it is")
    how = release.add_mutually_exclusive_group(required=True)
    how.add_argument("--upload", dest="action", action="store_const", const="upload",
                     help="send the deletions: the notes are deleted on every host")
    how.add_argument("--restore", dest="action", action="store_const", const="restore",
                     help="write the notes back here (the server's version)")
    forget = add_command(remote_sub, common, "forget",
                         "remove a shared workspace from its server for good (the hosts' "
                         "files stay)")
    forget.add_argument("name", help="the shared workspace's name (the `name` of `remote`)")
    forget.add_argument("--dsn", required=True,
                        help="the server, as the `dsn` of `remote` (read by the daemon)")
    forget.add_argument("--passfile",
                        help="a libpq password file (a relative path is taken from the "
                             "current directory)")
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _remote(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    if ns.remote_command == "forget":
        return _forget(client, ns, out, as_json)
    result = client.call("remote.release", {"agent_id": ns.agent, "action": ns.action})
    if as_json:
        print_json(out, result)
    else:
        done = "sent as deletions" if ns.action == "upload" else "written back"
        out.write(f"{ns.agent}: {result.get('released')} held note(s) {done}\n")
    return EXIT_OK


def _forget(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    # Read by the daemon, whose working directory is not the caller's: sent absolute.
    params = {"name": ns.name, "dsn": ns.dsn} | (
        {"passfile": str(paths.local_path(ns.passfile, "--passfile"))}
        if ns.passfile is not None else {})
    confirm(f"Remove shared workspace {ns.name} and all its notes from the server for "
            "good? Hosts sharing it must have dropped `remote` from their settings first.",
            ns.yes)
    result = client.call("remote.forget", params)
    if as_json:
        print_json(out, result)
    else:
        rows = result.get("rows")
        count = sum(n for n in rows.values() if isinstance(n, int)) \
            if isinstance(rows, dict) else 0
        out.write(f"{ns.name}: removed from the server ({count} row(s))\n")
    return EXIT_OK


HANDLERS = {"remote": _remote}
