"""``recalld mcp`` and ``python -m recalld.ipc.mcp``: the command line of the MCP bridge.

Its arguments are parsed here, before :mod:`recalld.ipc.mcp_bridge` imports the MCP SDK
(more than a second): a usage error or ``--help`` answers at once, and a missing SDK is
one line saying what to install. The bridge itself is described in that module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import TextIO

from recalld.ipc import paths
from recalld.ipc.cli_args import Parser, agent_name

DEFAULT_AGENT = "default"
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bridge's own options (``recalld mcp`` adds the shared ``--socket``)."""
    parser.add_argument("--agent", default=DEFAULT_AGENT, type=agent_name,
                        help="the agent whose workspace this bridge serves (default: default)")
    parser.add_argument("--autostart", action="store_true",
                        help="start a daemon in the background if none answers")


def run(ns: argparse.Namespace, err: TextIO) -> int:
    """Serve MCP on stdio for the parsed arguments ``ns`` until stdin closes. An unusable
    socket (``--socket``, ``RECALLD_SOCKET``) is one line naming it, exit status 2."""
    try:
        # Found here, not by the bridge's client: its errors name the library's argument.
        socket = paths.socket_path(getattr(ns, "socket", None), lenient=True)
    except paths.PathError as exc:
        print(f"recalld: configuration error: {exc}", file=err)
        return EXIT_USAGE
    try:
        bridge = importlib.import_module("recalld.ipc.mcp_bridge")
    except ImportError as exc:
        print(f"recalld: the MCP bridge needs the mcp package ({exc}); "
              "install it with: pip install 'recalld[mcp]'", file=err)
        return EXIT_ERROR
    import asyncio  # only this command runs an event loop

    asyncio.run(bridge.serve(ns.agent, socket, autostart=ns.autostart))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="recalld mcp", description="MCP server (stdio) for recalld memory")
    parser.add_argument("--socket", help="daemon socket")
    add_arguments(parser)
    return run(parser.parse_args(argv), sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
