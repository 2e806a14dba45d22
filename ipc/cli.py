"""The ``recalld`` command line: ``serve`` runs the daemon, everything else talks to it.

Exit status: 0 success, 1 failure (one line ``recalld: <message> (code N)`` for an error
answered by the daemon, a refused backup archive among them), 2 bad usage (including
invalid params found by the daemon and a bad config file), 3 the daemon is not running
(one line saying how to start it), 130 interrupted. Output into a closed pipe
(``recalld search q | head -1``), or one closed from the start, ends quietly with 0; a
failure keeps its status when stderr refuses its line.
Nothing here prints a traceback.
Nothing here imports the daemon: ``serve`` replaces this process with
``python -m recalld.daemon.main`` (same pid, as systemd's NotifyAccess=main wants), so
every other command stays light.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import orjson

from recalld.ipc import (
    __version__,
    cli_daemon,
    cli_import,
    cli_memory,
    cli_ops,
    cli_remote,
    cli_search,
    errors,
    paths,
)
from recalld.ipc import mcp as mcp_command
from recalld.ipc.agent_ids import workspace_table
from recalld.ipc.answers import JsonObject
from recalld.ipc.cli_args import Parser, count, refuse_not_taken, whole_number
from recalld.ipc.client import Client
from recalld.ipc.peers import listener_of
from recalld.ipc.protocol import MAX_DREAM_RUNS
from recalld.ipc.render import (
    AnswerLost,
    JobWaiter,
    answer_lost,
    at_most,
    closed_pipe,
    hint,
    not_applied_lines,
    open_closed_streams,
    output_stream,
    print_json,
    render_workspaces,
    say,
    table,
)
from recalld.ipc.types import visible
from recalld.ipc.utf8mode import run_in_utf8_mode

DEFAULT_AGENT = "default"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_RUNNING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

#: The options every command takes (:func:`_common`) that these commands have no use for,
#: and why: refused as usage errors, since passed by they would look taken.
NOT_TAKEN: dict[str, tuple[tuple[str, ...], str]] = {
    "mcp": (("--json", "--timeout"), "the bridge answers its MCP client on stdout, and "
            "waits for the daemon as long as a library client does"),
    "install-service": (("--timeout",), "it asks the daemon nothing; systemctl is waited "
                        "for by itself"),
    "uninstall-service": (("--socket", "--timeout"), "it asks the daemon nothing, and "
                          "removes the units wherever they listen"),
}


def _common(timeout_help: str = "seconds to wait for an answer (default 30)",
            ) -> argparse.ArgumentParser:
    """The options every command takes; ``timeout_help`` says what ``--timeout`` waits
    for (a command that waits for something else, with another default, says so)."""
    # SUPPRESS keeps a subcommand's missing option from hiding the one given before it.
    common = Parser(add_help=False)
    common.add_argument("--socket", default=argparse.SUPPRESS,
                        help="daemon socket (default: $RECALLD_SOCKET, else [daemon] "
                             "socket_path of the config file, else the XDG runtime dir)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable JSON on stdout")
    common.add_argument("--timeout", type=_seconds, default=argparse.SUPPRESS, metavar="S",
                        help=timeout_help)
    return common


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number more than 0, not {value}")
    return seconds


def _lines(value: str) -> tuple[int, int]:
    start, sep, end = value.partition("-")
    try:
        first = int(start)
        last = int(end) if sep else first
    except ValueError:
        raise argparse.ArgumentTypeError("expected N or N-M, e.g. 10-20") from None
    for number in (start, end if sep else start):
        whole_number(number)  # one past 64 bits: refused naming --lines
    if first < 1 or last < first:
        raise argparse.ArgumentTypeError("lines are 1-based and N-M needs N <= M")
    return first, last


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = Parser(
        prog="recalld", parents=[common],
        description="Long-term Markdown memory for AI agents: daemon and client.")
    parser.add_argument("--version", action="version", version=f"recalld {__version__}")
    sub: cli_ops.Subparsers = parser.add_subparsers(dest="command", required=True,
                                                    metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, parents=[common])

    serve = add("serve", "run the daemon in the foreground")
    serve.add_argument("args", nargs=argparse.REMAINDER, help="daemon options (see serve --help)")
    status = add("status", "is memory OK? each workspace's health, pending work and problems")
    status.add_argument("-v", "--verbose", action="store_true",
                        help="also the daemon's queues and counters")
    add("ping", "check that the daemon answers")

    ws = add("workspace", "open, list or close workspaces")
    ws_sub = ws.add_subparsers(dest="ws_command", required=True, metavar="ACTION")
    ws_open = cli_ops.add_command(ws_sub, common, "open", "open (or create) an agent's workspace")
    ws_open.add_argument("agent")
    ws_open.add_argument("--path", help="workspace directory (default: where it is open, else "
                         "its config [workspaces.AGENT] path, its recorded one, <data>/workspaces/"
                         "AGENT)")
    ws_open.add_argument("--config-json", metavar="JSON",
                         help='workspace settings, e.g. \'{"auto_memory_interval": 10}\'')
    cli_ops.add_command(ws_sub, common, "list",
                        "open workspaces, and recorded or configured ones not open")
    ws_close = cli_ops.add_command(ws_sub, common, "close", "stop serving a workspace")
    ws_close.add_argument("agent")
    ws_close.add_argument("--forget", action="store_true",
                          help="also stop reopening it at start (a configured one still opens)")

    read = add("read", "print a workspace file or a range of its lines")
    read.add_argument("path", help="path inside the workspace, e.g. memory/2026-07-23/note.md")
    read.add_argument("--agent", default=DEFAULT_AGENT)
    read.add_argument("--lines", type=_lines, metavar="N-M", help="1-based inclusive range")

    cli_search.add_parser(sub, common)

    reindex = add("reindex", "rebuild an agent's index, showing progress")
    reindex.add_argument("--agent", default=DEFAULT_AGENT)
    reindex.add_argument("--no-wait", action="store_true", help="submit and return the job id")

    dream = add("dream", "run auto_dream (consolidation) now, list its runs, or undo one")
    dream.add_argument("--agent", default=DEFAULT_AGENT)
    dream.add_argument("--no-wait", action="store_true", help="submit and return the job id")
    listed_or_undone = dream.add_mutually_exclusive_group()  # else: a run now
    listed_or_undone.add_argument("--runs", nargs="?", type=count, const=20, metavar="N",
                                  help=f"list the latest N runs (default 20, at most "
                                       f"{MAX_DREAM_RUNS}), newest first")
    listed_or_undone.add_argument("--undo", metavar="RUN", help="restore the files a dream "
                                  "run changed (run id from its log)")
    dream.add_argument("--force", action="store_true",
                       help="with --undo: restore even files changed since that run")
    dream.add_argument("--retry-failed", action="store_true",
                       help="read too the notes the model failed on as they are, which wait "
                            "for a change")

    mcp = add("mcp", "serve an agent's memory to MCP clients over stdio "
                     "(needs recalld[mcp])")
    mcp_command.add_arguments(mcp)

    for name, what in (("install-service", "write and enable"),
                       ("uninstall-service", "disable and remove")):
        svc = add(name, f"{what} the systemd user units")
        svc.add_argument("--write-only", action="store_true",
                         help="only touch the unit files; run no systemctl command")
    cli_memory.add_parsers(sub, common)
    cli_ops.add_parsers(sub, common)
    cli_import.add_parsers(sub, common)
    cli_remote.add_parsers(sub, common)
    cli_daemon.add_parsers(sub, _common(cli_daemon.TIMEOUT_HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the process's entry point
        run_in_utf8_mode()
    open_closed_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    daemon_args = serve_arguments(args)
    if daemon_args is not None:
        return _serve(daemon_args)
    parser = build_parser()
    try:
        ns = parser.parse_args(args)
        options, why = NOT_TAKEN.get(ns.command, ((), ""))
        refuse_not_taken(parser, ns, options, ns.command, why)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if ns.command != "mcp":  # mcp: stdout is its wire
        sys.stdout = output_stream(sys.stdout, as_json=bool(getattr(ns, "json", False)))
    try:
        code = run(ns, out=sys.stdout, err=sys.stderr)
        sys.stdout.flush()
    except BrokenPipeError:
        return closed_pipe()
    except AnswerLost as exc:
        return answer_lost(sys.stderr, exc)
    return code


def serve_arguments(args: list[str]) -> list[str] | None:
    """The daemon's arguments when the command ``args`` is ``serve`` (None otherwise):
    everything but the word "serve", global options included (the daemon has its own
    parser). "serve" is the first word that is not a global option or its value."""
    takes_value = {"--socket", "--timeout"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "serve":
            return args[:i] + args[i + 1:]
        if arg in takes_value:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return None
    return None


def _serve(argv: list[str]) -> int:
    """Become the daemon (``execv`` returns only if it fails)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "recalld.daemon.main", *argv])  # noqa: S606


def run(ns: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    """Run a parsed command; map every failure to one line on ``err`` and an exit code."""
    as_json = bool(getattr(ns, "json", False))
    command: str = ns.command
    client: Client | None = None
    try:
        if command in ("install-service", "uninstall-service"):
            import subprocess  # here, like the install module: only these commands run systemctl

            try:
                return _service(command, ns, out, as_json)
            # install.ServiceError is a RuntimeError: one line saying what to do instead.
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired,
                    RuntimeError) as exc:
                say(err, f"recalld: {exc}")
                return EXIT_ERROR
        if command == "mcp":
            return mcp_command.run(ns, err)
        socket = getattr(ns, "socket", None)
        if command in ("status", "doctor"):
            # A config file that is refused is one of their findings: the daemon runs on
            # what it read, at the socket the file still names (or the default one).
            socket, ns.config_refused = paths.socket_despite_file(socket)
        client = Client(paths.socket_path(socket), timeout_s=getattr(ns, "timeout", 30.0))
        with client:
            handler = _HANDLERS[command]
            try:
                return handler(client, ns, out, as_json)
            except (KeyError, IndexError, TypeError, AttributeError) as exc:
                raise _unexpected_answer(exc) from None
    except paths.PathError as exc:
        say(err, f"recalld: configuration error: {exc}")
        return EXIT_USAGE
    except errors.DaemonNotRunning as exc:
        say(err, f"recalld: {exc.message}")
        return EXIT_NOT_RUNNING
    except (errors.ConnectionLost, cli_ops.Declined) as exc:
        say(err, f"recalld: {exc.message}")
        return EXIT_ERROR
    except errors.PathOutsideWorkspace as exc:  # the request refused, not the usage
        say(err, f"recalld: {exc.message} (code {exc.code})")
        return EXIT_ERROR
    except errors.InvalidParams as exc:  # a usage error, found by the daemon or by us
        say(err, f"recalld: {exc.message} (code {exc.code})")
        return EXIT_USAGE
    except errors.RecalldError as exc:
        said = hint(exc, (command, getattr(ns, "ws_command", None)),
                    listed=None if client is None else client.workspace_list)
        say(err, f"recalld: {exc.message} (code {exc.code}){said}")
        return EXIT_ERROR
    except TimeoutError as exc:
        say(err, f"recalld: {exc}{'' if client is None else _who_is_silent(client.socket_path)}")
        return EXIT_ERROR
    except KeyboardInterrupt as exc:  # a followed job says it goes on, and its id
        say(err, f"recalld: {str(exc) or 'interrupted'}")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return closed_pipe()
    except AnswerLost as exc:
        return answer_lost(err, exc)
    except OSError as exc:
        say(err, f"recalld: {exc}")
        return EXIT_ERROR


Handler = Callable[[Client, argparse.Namespace, TextIO, bool], int]


def _who_is_silent(socket_path: Path) -> str:
    """For a call not answered in time: the process listening on ``socket_path`` (another
    program, a stuck daemon, or systemd's socket unit whose service does not start), as
    ``recalld doctor`` names it, and what to do."""
    who = listener_of(socket_path)
    if not who:
        return ""
    return (f" ({who} listens on {socket_path}: a busy daemon answers with a longer "
            "--timeout; anything else there, stop it; recalld doctor says more)")


def _unexpected_answer(exc: Exception) -> errors.InternalError:
    """The one-line error for an answer whose shape the command cannot show (a key
    missing, a list where an object is due): the client checks no answer's shape, and a
    daemon of another version may answer in another one."""
    return errors.InternalError(
        f"unexpected answer from the daemon ({type(exc).__name__}: {exc}); is it of "
        f"another version than this recalld {__version__}? recalld status shows its "
        "version; restart it after an upgrade")


def _ping(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    result = client.ping()
    if as_json:
        print_json(out, result)
    else:
        out.write(f"pong from {visible(str(client.socket_path))}\n")
    return EXIT_OK


def _workspace(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    if ns.ws_command == "open":
        config: JsonObject | None = None
        if ns.config_json:
            try:
                config = orjson.loads(ns.config_json)
            except orjson.JSONDecodeError as exc:
                raise errors.InvalidParams(f"--config-json is not valid JSON: {exc}") from None
            if not isinstance(config, dict):
                raise errors.InvalidParams("--config-json must be a JSON object")
        # The daemon wants an absolute path; a relative one means "from here".
        path = str(paths.local_path(ns.path, "--path")) if ns.path is not None else None
        info = client.workspace_open(ns.agent, path=path, config=config)
        if as_json:
            print_json(out, info)
        else:
            out.write(render_workspaces([dict(info)]))
            out.writelines(f"{line}\n" for line in not_applied_lines(
                ns.agent, info.get("not_applied") or {}, "open it again"))
        # Its services started, then it failed (a link met at once): not opened.
        return EXIT_ERROR if info.get("state") == "failed" else EXIT_OK
    elif ns.ws_command == "list":
        items = client.workspace_list()
        if as_json:
            print_json(out, items)
        else:
            out.write(render_workspaces([dict(i) for i in items]))
    else:
        result = client.workspace_close(ns.agent, forget=ns.forget)
        if as_json:
            print_json(out, result)
        elif result.get("configured"):
            where = "default" if ns.agent == DEFAULT_AGENT else workspace_table(ns.agent)
            out.write(f"closed workspace {ns.agent}; it opens again at the next start or "
                      f"reload (the config names it: {where})\n")
        elif result.get("forgotten"):
            out.write(f"closed workspace {ns.agent}; the daemon no longer reopens it at start\n")
        else:
            out.write(f"closed workspace {ns.agent}\n")
    return EXIT_OK


def _job(kind: str) -> Handler:
    def handler(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
        waiter = JobWaiter(client, ns.agent, out=out, as_json=as_json)
        return waiter.submit_and_wait(kind, wait=not ns.no_wait)

    return handler


def _dream(client: Client, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    _refuse_misplaced_dream_options(ns)
    if ns.runs is not None:
        runs = client.dream_runs(ns.agent, limit=at_most(ns.runs, MAX_DREAM_RUNS, sys.stderr,
                                                          "runs"))
        if as_json:
            print_json(out, runs)
        elif not runs:
            out.write("no dream runs yet\n")
        else:
            rows = [{**r, "files": len(r.get("files") or ())} for r in runs]
            out.write(table(rows, ("run_id", "started", "trigger", "notes", "files", "undone")))
        return EXIT_OK
    if not ns.undo:
        waiter = JobWaiter(client, ns.agent, out=out, as_json=as_json)
        return waiter.submit_and_wait("auto_dream", wait=not ns.no_wait, params={
            "retry_failed": True} if ns.retry_failed else None)
    result = client.dream_undo(ns.agent, ns.undo, force=bool(ns.force))
    if as_json:
        print_json(out, result)
    else:
        again = result.get("dreamed_again") or []
        out.write(f"undid dream run {ns.undo}: restored {len(result['restored'])}, "
                  f"removed {len(result['removed'])} file(s)"
                  + (f"; the next dream reads {len(again)} note(s) again" if again else "")
                  + "\n")
        kept = result.get("hand_edits_kept") or []
        if kept:
            out.write(f"the hand edits it wrote over in {', '.join(kept)} are kept in "
                      f"{result.get('log')}\n")
    return EXIT_OK


def _refuse_misplaced_dream_options(ns: argparse.Namespace) -> None:
    """An option of one form of ``dream`` given to another is a usage error, not passed
    by: ``dream --force`` with its ``--undo RUN`` left out ran a dream, which changes
    notes, instead of undoing one."""
    form = "--runs" if ns.runs is not None else "--undo" if ns.undo else None
    for option, given, belongs in (("--force", ns.force, "--undo"),
                                   ("--retry-failed", ns.retry_failed, None),
                                   ("--no-wait", ns.no_wait, None)):
        if given and form != belongs:
            goes_with = f"with {belongs} RUN" if belongs else "with a dream run now"
            raise errors.InvalidParams(
                f"dream {option} goes only {goes_with}, not "
                + (f"with {form}" if form else "alone (that would run a dream now)"))


def _service(command: str, ns: argparse.Namespace, out: TextIO, as_json: bool) -> int:
    from recalld.ipc import install

    if command == "install-service":
        # The socket clients would look for (--socket, RECALLD_SOCKET, the config file).
        explicit = getattr(ns, "socket", None)
        sock = install.listen_path(paths.socket_path(explicit, running=False),
                                   chosen=paths.socket_chosen(explicit))
        written = install.install_service(write_only=ns.write_only, socket_path=sock)
        if as_json:
            print_json(out, {"written": written, "enabled": not ns.write_only})
        else:
            out.writelines(f"wrote {visible(str(path))}\n" for path in written)
            if ns.write_only:
                out.write("to enable and start them: " + "; ".join(install.ENABLE_COMMANDS)
                          + "\n")
            else:
                out.write("enabled and started recalld.socket and recalld.service\n")
    else:
        removed = install.uninstall_service(write_only=ns.write_only)
        if as_json:
            print_json(out, {"removed": removed})
        elif removed:
            out.writelines(f"removed {visible(str(path))}\n" for path in removed)
            out.write("(your Markdown memory is kept)\n")
        else:
            out.write(f"no recalld units were installed in {visible(str(install.unit_dir()))}\n")
    return EXIT_OK


_HANDLERS: dict[str, Handler] = {
    "ping": _ping,
    "workspace": _workspace,
    **cli_search.HANDLERS,  # search
    "reindex": _job("reindex"),
    "dream": _dream,
    **cli_memory.HANDLERS,  # jobs, inbox, note
    **cli_ops.HANDLERS,  # backup, verify, compact, metrics, doctor, and status's human form
    **cli_import.HANDLERS,  # import-qwenpaw
    **cli_remote.HANDLERS,  # remote release
    **cli_daemon.HANDLERS,  # stop
}


def entry() -> None:  # pragma: no cover - console-script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
