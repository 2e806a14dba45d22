"""``recalld remote release AGENT --upload|--restore``: end the hold of a shared
workspace's deletions that the replica's deletion guard held back (``remote.release``).

``--upload`` sends the deletions (the notes go on every host); ``--restore`` writes the
notes back into the workspace folder (from the server, or this host's edit not yet
uploaded). ``recalld status`` shows what is held and why.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from recalld.ipc.cli_ops import Subparsers, add_command
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


def _remote(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    result = client.call("remote.release", {"agent_id": ns.agent, "action": ns.action})
    if as_json:
        print_json(out, result)
    else:
        done = "sent as deletions" if ns.action == "upload" else "written back"
        out.write(f"{ns.agent}: {result.get('released')} held note(s) {done}\n")
    return EXIT_OK


HANDLERS = {"remote": _remote}
