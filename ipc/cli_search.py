"""The ``search`` command of the ``recalld`` CLI: its parser and its handler.

:func:`add_parser` adds the subcommand to the main parser; :data:`HANDLERS` maps it to its
handler (client, namespace, out, as_json) -> exit status, as in ``cli_ops``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Mapping
from typing import TextIO

from recalld.ipc import errors
from recalld.ipc.cli_args import count
from recalld.ipc.cli_ops import (
    DEFAULT_AGENT,
    EXIT_OK,
    Handler,
    Subparsers,
    add_command,
)
from recalld.ipc.client import Client
from recalld.ipc.progress import IndexingNotice
from recalld.ipc.protocol import MAX_RESULTS
from recalld.ipc.render import at_most, print_json, say
from recalld.ipc.types import SearchResult, visible


def add_parser(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``search`` to ``sub`` (the main parser's subparsers)."""
    search = add_command(sub, common, "search", "search an agent's memory")
    search.add_argument("query")
    search.add_argument("--agent", default=DEFAULT_AGENT,
                        help="the agent searching (its workspace unless --agents)")
    search.add_argument("--agents", type=_agent_list, metavar="A,B",
                        help="search these agents' workspaces instead, as --agent (each must "
                             "be shared with it); those not open are named, not searched")
    search.add_argument("-n", "--max-results", type=count, default=5,
                        help=f"how many hits to show (default 5, at most {MAX_RESULTS})")
    search.add_argument("--min-score", type=_score)
    search.add_argument("--sync", action="store_true",
                        help="wait until every earlier file change is indexed")


def _score(value: str) -> float:
    try:
        score = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not math.isfinite(score):  # JSON has no nan or inf: it would go as no minimum
        raise argparse.ArgumentTypeError(f"must be a finite number, not {value}")
    return score


def _agent_list(value: str) -> list[str]:
    agents = [a.strip() for a in value.split(",")]
    if not all(agents):
        raise argparse.ArgumentTypeError(f"a comma-separated list of agents, not {value!r}")
    return list(dict.fromkeys(agents))


def _search(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    ns.max_results = at_most(ns.max_results, MAX_RESULTS, sys.stderr)
    with contextlib.ExitStack() as stack:
        if ns.sync and not as_json:  # say what a long wait (a first build) waits for
            stack.enter_context(IndexingNotice(client.socket_path, ns.agent, sys.stderr))
        answer = client.search(ns.agent, ns.query, max_results=ns.max_results,
                               min_score=ns.min_score, sync=ns.sync, agents=ns.agents)
    searched = answer.extra.get("agents") if ns.agents else [ns.agent]
    for agent in searched if not ns.sync and isinstance(searched, list) else ():
        note = _index_incomplete_note(client, str(agent))
        if note is not None:
            say(sys.stderr, note)
    if as_json:
        print_json(out, answer.to_dict())
        return EXIT_OK
    if answer.extra.get("vector_error"):
        print(f"note: keyword results only: the query could not be embedded "
              f"({answer.extra['vector_error']})", file=sys.stderr)
    if not answer.results:
        out.write("no results\n")
    for r in answer.results:
        out.write(_rendered(r) + "\n\n")
    if answer.expanded:
        out.write("linked:\n\n")
        for r in answer.expanded:
            out.write(_rendered(r) + "\n\n")
    # Workspaces of --agents that are not open were passed by: said, not taken for empty.
    skipped = answer.extra.get("skipped")
    if isinstance(skipped, Mapping) and skipped:
        out.write("not searched:\n")
        out.writelines(f"  {visible(str(agent))}: {visible(str(why))}\n"
                       for agent, why in skipped.items())
    return EXIT_OK


#: Health reasons that mean files on disk are not all in the index yet (a first build,
#: a rebuild, changes still to apply); lagging vectors or captures are not.
_INDEX_INCOMPLETE = ("disk scan", "change(s) waiting", "differ from the index", "rebuilding",
                     "watcher starting", "watcher rescanning", "to read again")


def _index_incomplete_note(client: Client, agent: str) -> str | None:
    """A note for stderr when the searched workspace's index is still being built (its
    health is ``pending`` for that), read from ``workspace.list``, an answer from memory;
    None when complete or when the check itself fails (it is only a note)."""
    try:
        listed = client.workspace_list()
    except (errors.RecalldError, OSError, TimeoutError):
        return None
    ws = next((w for w in listed if w.get("agent_id") == agent), None)
    health = ws.get("health") if ws is not None else None
    if not isinstance(health, Mapping) or health.get("state") != "pending":
        return None
    reasons = [str(r) for r in health.get("reasons") or []
               if any(mark in str(r) for mark in _INDEX_INCOMPLETE)]
    if not reasons:
        return None
    return (f"recalld: note: the index of {agent} is still being built ({'; '.join(reasons)}); "
            "results may be incomplete (search --sync waits for it)")


def _rendered(r: SearchResult) -> str:
    text = r.rendered or (
        f"========== {visible(r.path)}:{r.start_line}-{r.end_line} ==========\n{r.text}")
    return text.rstrip("\n")


HANDLERS: dict[str, Handler] = {"search": _search}
