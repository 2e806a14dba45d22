"""The ``recalld`` command line: ``serve`` runs the daemon, everything else talks to it.

Exit status: 0 success, 1 an error answered by the daemon (one line ``recalld: <message>
(code N)``), 2 bad usage, 3 the daemon is not running (one line saying how to start it).
Nothing here prints a traceback. ``serve``, ``install-service`` and ``uninstall-service``
import the daemon lazily, so every other command stays light.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from recalld.ipc import cli_memory, cli_ops, errors
from recalld.ipc.client import Client
from recalld.ipc.render import (
    JobWaiter,
    print_json,
    render_read,
    render_workspaces,
    table,
)
from recalld.ipc.types import SearchResult, visible

DEFAULT_AGENT = "default"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_RUNNING = 0, 1, 2, 3


def _common() -> argparse.ArgumentParser:
    # SUPPRESS keeps a subcommand's missing option from hiding the one given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", default=argparse.SUPPRESS,
                        help="daemon socket (default: $RECALLD_SOCKET or the XDG runtime dir)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable JSON on stdout")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, metavar="S",
                        help="seconds to wait for an answer (default 30)")
    return common


def _lines(value: str) -> tuple[int, int]:
    start, sep, end = value.partition("-")
    try:
        first = int(start)
        last = int(end) if sep else first
    except ValueError:
        raise argparse.ArgumentTypeError("expected N or N-M, e.g. 10-20") from None
    if first < 1 or last < first:
        raise argparse.ArgumentTypeError("lines are 1-based and N-M needs N <= M")
    return first, last


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="recalld", parents=[common],
        description="Long-term Markdown memory for AI agents: daemon and client.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, parents=[common])

    serve = add("serve", "run the daemon in the foreground")
    serve.add_argument("args", nargs=argparse.REMAINDER, help="daemon options (see serve --help)")
    add("status", "show the daemon and its workspaces")
    add("ping", "check that the daemon answers")

    ws = add("workspace", "open, list or close workspaces")
    ws_sub = ws.add_subparsers(dest="ws_command", required=True, metavar="ACTION")
    ws_open = ws_sub.add_parser("open", help="open (or create) an agent's workspace",
                                parents=[common])
    ws_open.add_argument("agent")
    ws_open.add_argument("--path", help="workspace directory (default: <data>/workspaces/AGENT)")
    ws_open.add_argument("--config-json", metavar="JSON",
                         help='workspace settings, e.g. \'{"auto_memory_interval": 10}\'')
    ws_sub.add_parser("list", help="list open workspaces", parents=[common])
    ws_close = ws_sub.add_parser("close", help="stop serving a workspace", parents=[common])
    ws_close.add_argument("agent")

    read = add("read", "print a workspace file or a range of its lines")
    read.add_argument("path", help="path inside the workspace, e.g. memory/2026-07-23/note.md")
    read.add_argument("--agent", default=DEFAULT_AGENT)
    read.add_argument("--lines", type=_lines, metavar="N-M", help="1-based inclusive range")

    search = add("search", "search an agent's memory")
    search.add_argument("query")
    search.add_argument("--agent", default=DEFAULT_AGENT)
    search.add_argument("-n", "--max-results", type=int, default=5)
    search.add_argument("--min-score", type=float)
    search.add_argument("--sync", action="store_true",
                        help="wait until every earlier file change is indexed")

    reindex = add("reindex", "rebuild an agent's index, showing progress")
    reindex.add_argument("--agent", default=DEFAULT_AGENT)
    reindex.add_argument("--no-wait", action="store_true", help="submit and return the job id")

    dream = add("dream", "run auto_dream (consolidation) now, list its runs, or undo one")
    dream.add_argument("--agent", default=DEFAULT_AGENT)
    dream.add_argument("--no-wait", action="store_true", help="submit and return the job id")
    dream.add_argument("--runs", nargs="?", type=int, const=20, metavar="N",
                       help="list the latest N runs (default 20), newest first")
    dream.add_argument("--undo", metavar="RUN",
                       help="restore the files a dream run changed (run id from its log)")
    dream.add_argument("--force", action="store_true",
                       help="with --undo: restore even files changed since that run")

    mcp = add("mcp", "serve an agent's memory to MCP clients over stdio "
                     "(needs recalld[mcp])")
    mcp.add_argument("--agent", default=DEFAULT_AGENT)
    mcp.add_argument("--autostart", action="store_true",
                     help="start a daemon in the background if none answers")

    for name, what in (("install-service", "write and enable"),
                       ("uninstall-service", "disable and remove")):
        svc = add(name, f"{what} the systemd user units")
        svc.add_argument("--write-only", action="store_true",
                         help="only touch the unit files; run no systemctl command")
    cli_memory.add_parsers(sub, common)
    cli_ops.add_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    serve_at = _serve_index(args)
    if serve_at is not None:
        # Everything but the word "serve" goes to the daemon, global options included.
        return _serve(args[:serve_at] + args[serve_at + 1:])
    parser = build_parser()
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return run(ns, out=sys.stdout, err=sys.stderr)


def _serve_index(args: list[str]) -> int | None:
    # The daemon has its own parser; find "serve" as the first word that is not a
    # global option or its value.
    takes_value = {"--socket", "--timeout"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "serve":
            return i
        if arg in takes_value:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return None
    return None


def _serve(argv: list[str]) -> int:
    # Imported only here so that client commands never load the daemon.
    daemon_main = importlib.import_module("recalld.daemon.main")
    return int(daemon_main.main(argv))


def run(ns: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    """Run a parsed command; map every failure to one line on ``err`` and an exit code."""
    as_json = bool(getattr(ns, "json", False))
    command: str = ns.command
    try:
        if command in ("install-service", "uninstall-service"):
            try:
                return _service(command, ns, out, as_json)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                print(f"recalld: {exc}", file=err)
                return EXIT_ERROR
        if command == "mcp":
            return _mcp(ns, err)
        client = Client(getattr(ns, "socket", None), timeout_s=getattr(ns, "timeout", 30.0))
        with client:
            handler = _HANDLERS[command]
            return handler(client, ns, out, as_json)
    except errors.DaemonNotRunning as exc:
        print(f"recalld: {exc.message}", file=err)
        return EXIT_NOT_RUNNING
    except errors.ConnectionLost as exc:
        print(f"recalld: {exc.message}", file=err)
        return EXIT_ERROR
    except errors.RecalldError as exc:
        print(f"recalld: {exc.message} (code {exc.code})", file=err)
        return EXIT_ERROR
    except TimeoutError as exc:
        print(f"recalld: {exc}", file=err)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("recalld: interrupted", file=err)
        return 130
    except OSError as exc:
        print(f"recalld: {exc}", file=err)
        return EXIT_ERROR


Handler = Callable[[Client, argparse.Namespace, TextIO, bool], int]


def _ping(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    result = client.ping()
    if as_json:
        print_json(out, result)
    else:
        out.write(f"pong from {client.socket_path}\n")
    return EXIT_OK


def _workspace(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    if ns.ws_command == "open":
        config: Any = None
        if ns.config_json:
            try:
                config = orjson.loads(ns.config_json)
            except orjson.JSONDecodeError as exc:
                raise errors.InvalidParams(f"--config-json is not valid JSON: {exc}") from None
            if not isinstance(config, dict):
                raise errors.InvalidParams("--config-json must be a JSON object")
        # The daemon wants an absolute path; a relative one means "from here".
        path = str(Path(ns.path).expanduser().absolute()) if ns.path else None
        info = client.workspace_open(ns.agent, path=path, config=config)
        if as_json:
            print_json(out, info)
        else:
            out.write(render_workspaces([dict(info)]))
    elif ns.ws_command == "list":
        items = client.workspace_list()
        if as_json:
            print_json(out, items)
        else:
            out.write(render_workspaces([dict(i) for i in items]))
    else:
        result = client.workspace_close(ns.agent)
        if as_json:
            print_json(out, result)
        else:
            out.write(f"closed workspace {ns.agent}\n")
    return EXIT_OK


def _read(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    start, end = ns.lines if ns.lines else (None, None)
    result = client.read(ns.agent, ns.path, start_line=start, end_line=end)
    if as_json:
        print_json(out, result)
    else:
        out.write(render_read(dict(result)))
    return EXIT_OK


def _search(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    answer = client.search(ns.agent, ns.query, max_results=ns.max_results,
                           min_score=ns.min_score, sync=ns.sync)
    if as_json:
        print_json(out, answer.to_dict())
        return EXIT_OK
    if not answer.results:
        out.write("no results\n")
    for r in answer.results:
        out.write(_rendered(r) + "\n\n")
    if answer.expanded:
        out.write("linked:\n\n")
        for r in answer.expanded:
            out.write(_rendered(r) + "\n\n")
    return EXIT_OK


def _rendered(r: SearchResult) -> str:
    text = r.rendered or (
        f"========== {visible(r.path)}:{r.start_line}-{r.end_line} ==========\n{r.text}")
    return text.rstrip("\n")


def _job(kind: str) -> Handler:
    def handler(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
        waiter = JobWaiter(client, ns.agent, out=out, as_json=as_json)
        return waiter.submit_and_wait(kind, wait=not ns.no_wait)

    return handler


def _dream(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    if ns.runs is not None:
        runs = client.dream_runs(ns.agent, limit=ns.runs)
        if as_json:
            print_json(out, runs)
        elif not runs:
            out.write("no dream runs yet\n")
        else:
            rows = [{**r, "files": len(r.get("files") or ())} for r in runs]
            out.write(table(rows, ("run_id", "started", "trigger", "notes", "files", "undone")))
        return EXIT_OK
    if not ns.undo:
        return _job("auto_dream")(client, ns, out, as_json)
    result = client.dream_undo(ns.agent, ns.undo, force=bool(ns.force))
    if as_json:
        print_json(out, result)
    else:
        out.write(f"undid dream run {ns.undo}: restored {len(result['restored'])}, "
                  f"removed {len(result['removed'])} file(s)\n")
    return EXIT_OK


def _service(command: str, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    install = importlib.import_module("recalld.daemon.install")  # lazily, as for serve
    if command == "install-service":
        written = install.install_service(write_only=ns.write_only)
        if as_json:
            print_json(out, {"written": written})
        else:
            out.writelines(f"wrote {path}\n" for path in written)
    else:
        install.uninstall_service(write_only=ns.write_only)
        if as_json:
            print_json(out, {"removed": True})
        else:
            out.write("removed the recalld user units (your Markdown memory is kept)\n")
    return EXIT_OK


def _mcp(ns: argparse.Namespace, err: TextIO) -> int:
    # Imported only here: the MCP SDK is an optional extra and heavy to import.
    try:
        bridge = importlib.import_module("recalld.ipc.mcp")
    except ImportError as exc:
        print(f"recalld: the MCP bridge needs the mcp package ({exc}); "
              "install it with: pip install 'recalld[mcp]'", file=err)
        return EXIT_ERROR
    import asyncio  # only this command runs an event loop

    asyncio.run(bridge.serve(ns.agent, getattr(ns, "socket", None), autostart=ns.autostart))
    return EXIT_OK


_HANDLERS: dict[str, Handler] = {
    "ping": _ping,
    "workspace": _workspace,
    "read": _read,
    "search": _search,
    "reindex": _job("reindex"),
    "dream": _dream,
    **cli_memory.HANDLERS,  # jobs, inbox, note
    **cli_ops.HANDLERS,  # backup, verify, compact, metrics, doctor, and status's human form
}


def entry() -> None:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
