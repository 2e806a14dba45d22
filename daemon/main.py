"""``recalld serve``: parse the daemon's options, set up logging, run the supervisor.

Exit status: 0 clean stop, 1 any other failure (a full disk, an I/O error: a restart may
succeed), 2 configuration error (the file; a socket systemd passed that is not a
listening Unix stream socket at a UTF-8 path, or a LISTEN_FDS naming descriptors not
passed; a socket or data directory recalld refuses to use as it is: open to other users,
someone else's, a symlink, a foreign file at the socket path; one the file system
refuses for good: a file where a folder goes, no permission, a read-only file system
(``lock.PLACE_ERRNOS``): a restart cannot mend them, and systemd's
RestartPreventExitStatus does not retry), 3 another daemon already owns the data
directory or the socket. Failures print one line on stderr (the traceback goes to the
log only for unexpected errors).

The daemon is imported inside ``main``, not at the top: the worker processes of
``index/procpool.py`` are spawned, and a spawned child imports the parent's main module
again (``python -m recalld.daemon.main``, as the systemd unit runs it), which must not
load the whole daemon into every worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable, MutableMapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from recalld.daemon import logfile
from recalld.ipc.paths import PathError
from recalld.ipc.utf8mode import run_in_utf8_mode

if TYPE_CHECKING:
    from recalld.daemon.config import DaemonConfig
    from recalld.daemon.supervisor import Supervisor

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_ALREADY_RUNNING = 0, 1, 2, 3
SWITCH_INTERVAL_S = 0.001
# malloc arenas of the daemon process: the event loop's and one for the worker threads.
MALLOC_ARENAS = 2
# Blocks from this size on get a mapping of their own (numpy's huge-page arrays among
# them), returned to the system when freed: memtrim.map_large.
MALLOC_MMAP_MIN_BYTES = 4 << 20
# What OpenBLAS reads for its thread count, in its order.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
# The signals the supervisor receives while the loop runs. Before its receiver opens,
# SIGTERM and SIGINT act as they did when the process started (the default action ends
# it, SIGINT raises KeyboardInterrupt, which main() ends as a clean stop; ignored ones,
# as under nohup, stay ignored), and a
# SIGHUP (a reload) is held for the supervisor, which reloads once it can; once the
# receiver has been open they are passed by.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The most open descriptors the daemon asks for. Every open workspace keeps a few for as
# long as it is open (its lock, its logs, its mapped index files), so a few hundred agents
# pass the soft limit of 1024 most sessions start with; the daemon waits with epoll, never
# select(), so a higher soft limit costs it nothing.
MAX_OPEN_FILES = 1 << 20

log = logging.getLogger("recalld")


def build_parser() -> argparse.ArgumentParser:
    # An empty --config, --socket, ... is refused, and one that is not UTF-8.
    from recalld.ipc.cli_args import Parser, local_file

    parser = Parser(
        prog="recalld serve", description="Run the recalld daemon in the foreground."
    )
    parser.add_argument("--config", help="configuration file (TOML; default "
                        "$RECALLD_CONFIG or $XDG_CONFIG_HOME/recalld/config.toml)")
    parser.add_argument("--socket", help="socket path (default $RECALLD_SOCKET, else "
                        "[daemon] socket_path of the config file, else "
                        "$XDG_RUNTIME_DIR/recalld/recalld.sock)")
    parser.add_argument("--foreground", action="store_true",
                        help="accepted for clarity; the daemon never forks")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        help="overrides [daemon] log_level")
    parser.add_argument("--log-file", type=local_file, help="log to this file, rotated at "
                        f"{logfile.LOG_FILE_BYTES >> 20} MiB "
                        f"({logfile.LOG_FILE_BACKUPS} old files kept), "
                        "instead of stderr")
    parser.add_argument("--check-config", action="store_true",
                        help="only read the configuration as a start would: exit 0 if it "
                        "is valid, else 2 with the error")
    # Options of the client commands, which may ride along from `recalld --json serve`:
    # refused after parsing (CLIENT_ONLY), not read as a daemon option or a typo.
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    parser.add_argument("--timeout", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


#: The client commands' options serve does not take: it prints no answer, and waits for none.
CLIENT_ONLY = ("--json", "--timeout")


def _check_workspace_places(cfg: DaemonConfig) -> int:
    """``--check-config``'s last step: each ``[workspaces.X] path`` checked as opening the
    workspace checks its place (a system folder, another user's, one that holds the
    daemon's own folders or its config file, as ``~`` does; another table's, or one in
    or around another table's not shared with it), which the start would only show as
    a failed workspace. EXIT_CONFIG with one line naming the first refused."""
    from recalld.daemon.workspace_places import (
        check_daemon_folders,
        check_root,
        check_tables_apart,
        resolved,
        unnamed_places,
    )
    from recalld.ipc.agent_ids import workspace_table
    from recalld.ipc.errors import RecalldError

    roots = unnamed_places(cfg)
    for agent_id, path in sorted(cfg.workspace_paths.items()):
        try:
            root = resolved(path)
            check_root(root)
            check_daemon_folders(root, cfg)
            check_tables_apart(agent_id, root, roots, cfg)
        except (OSError, RuntimeError) as exc:  # a link loop, a folder we may not enter
            why = str(exc)
        except RecalldError as exc:
            why = exc.message
        else:
            roots[agent_id] = root
            continue
        print(f"recalld: configuration error: {cfg.config_path}: {workspace_table(agent_id)} "
              f"path = {str(path)!r}: {why}", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_OK


def limit_blas_threads(threads: int, environ: MutableMapping[str, str] = os.environ) -> None:
    """Give numpy's BLAS ``threads`` threads (``[daemon] backfill_threads``; 0 keeps
    OpenBLAS's default, a thread per core) unless the environment chose a count.

    OpenBLAS starts its thread pool when numpy is imported, which costs start-up CPU
    time; the daemon's own BLAS work (vector scoring, the numpy embedding backend) runs
    in its bounded worker threads, and ``backfill_threads`` is already how many threads
    one embedding call may use.
    """
    if threads > 0 and not any(environ.get(k) for k in BLAS_THREAD_VARIABLES):
        environ["OPENBLAS_NUM_THREADS"] = str(threads)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft limit on open descriptors to the hard one (at most
    :data:`MAX_OPEN_FILES`); ``(before, after)``, equal when it stays."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError):  # above the kernel's nr_open: the limit stays
        return soft, soft
    return soft, want


def prepare_to_serve(backfill_threads: int) -> None:
    """Set the process up for serving and import the daemon, before any library can start
    a thread: no cyclic collection while the daemon is imported (its modules, classes and
    functions live as long as the process, and the collector would walk the growing set
    of them on every full collection it sets off meanwhile); the malloc limits (numpy's
    BLAS starts its threads on import, and a build's worker threads would otherwise each
    keep an arena resident) and the BLAS thread count; then the imported objects frozen
    out of the collector's reach (a warm start's load allocates enough to run several
    full collections, each walking them all)."""
    gc.disable()
    from recalld.daemon import memtrim

    memtrim.limit_arenas(MALLOC_ARENAS)
    memtrim.map_large(MALLOC_MMAP_MIN_BYTES)
    limit_blas_threads(backfill_threads)

    import trio  # noqa: F401

    from recalld.daemon import app, lock, supervisor, systemd  # noqa: F401
    from recalld.daemon.rpc import listener  # noqa: F401

    gc.freeze()
    gc.enable()


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon to its end and return the exit status. A process's entry point:
    once the daemon has started, it keeps SIGTERM, SIGHUP and SIGINT for good (ignored
    after it returns), so that no signal cuts a stop short."""
    if argv is None:  # the process's entry point
        run_in_utf8_mode()
    hangup = HeldHangup.install()
    try:
        return _main(argv, hangup)
    except KeyboardInterrupt:
        # SIGINT before the event loop runs (the configuration read, the modules
        # imported, the supervisor built): a stop like one a moment later, which the
        # loop ends cleanly; nothing was served yet, nothing is left to save.
        print("recalld: stopped while it started (interrupted)", file=sys.stderr)
        return EXIT_OK
    finally:
        if hangup is not None and not hangup.passed_on:  # the daemon never ran
            hangup.uninstall()


def _main(argv: Sequence[str] | None, hangup: HeldHangup | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        args = args[1:]
    from recalld.ipc.cli_args import refuse_not_taken

    parser = build_parser()
    try:
        ns = parser.parse_args(args)
        refuse_not_taken(parser, ns, CLIENT_ONLY, "serve",
                         "an option of the client commands; the daemon writes only its log")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_CONFIG

    # The configuration first: a bad one is refused before the daemon is imported or the
    # process's allocator and collector are tuned for serving.
    from recalld.daemon import config as config_mod
    from recalld.daemon.config_warnings import config_warnings

    try:
        cfg = config_mod.load(config=ns.config, socket=ns.socket)
        level = (ns.log_level or cfg.log_level).upper()
        if level not in LOG_LEVELS:
            raise config_mod.ConfigError(f"[daemon] log_level must be one of {LOG_LEVELS}")
        if ns.log_level:  # the running level, which a reload compares the file's with
            cfg = dataclasses.replace(cfg, log_level=ns.log_level)
        if ns.log_file:
            ns.log_file = os.fsdecode(logfile.log_path(ns.log_file))
    except (config_mod.ConfigError, PathError) as exc:
        print(f"recalld: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if ns.check_config:
        unusable = logfile.check_log_file(ns.log_file)
        if unusable is not None:
            print(f"recalld: {unusable}", file=sys.stderr)
        checked = EXIT_CONFIG if unusable else _check_workspace_places(cfg)
        for w in config_warnings(cfg) if checked == EXIT_OK else ():
            print(f"recalld: warning: {w['what']}: {w['fix']}", file=sys.stderr)
        return checked
    if not os.environ.get("LISTEN_FDS"):  # not socket-activated: we bind the socket
        from recalld.daemon.rpc.listener import claim_socket

        try:  # before the long imports: clients see a daemon starting, not none
            claim_socket(cfg.socket_path)
        except Exception as exc:
            status = _refused(exc, cfg)
            if status is None:
                raise
            return status

    prepare_to_serve(cfg.backfill_threads)
    import trio

    from recalld.daemon import systemd
    from recalld.daemon.app import build_supervisor
    from recalld.daemon.supervisor import reloader_for

    # Before anything can spawn a thread or a child: take systemd's variables out of
    # the environment so that nothing we start inherits them.
    try:
        sd_env = systemd.take_environment()
    except systemd.PassedSocketError as exc:
        print(f"recalld: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if ns.log_file:
        try:
            handler = logfile.rotating_log(ns.log_file)
        except OSError as exc:
            from recalld.daemon.safepath import why_failed

            print(f"recalld: cannot open the log file {ns.log_file}: {why_failed(exc)}",
                  file=sys.stderr)
            return EXIT_CONFIG
    from recalld.daemon.logformat import LineFormatter

    handler.setFormatter(LineFormatter(LOG_FORMAT))
    logging.basicConfig(handlers=[handler], level=ns.log_level or "INFO")
    logging.getLogger().setLevel(level)
    for w in config_warnings(cfg):
        log.warning("%s: %s", w["what"], w["fix"])
    if sd_env.ignored_listen:
        log.warning("%s: the sockets it names are not used (a program that starts "
                    "recalld serve for systemd must exec it, keeping the pid systemd "
                    "passed them to)", sd_env.ignored_listen)
    before, after = raise_open_files_limit()
    if after != before:
        log.info("open files limit raised from %d to %d", before, after)

    reload = reloader_for(ns.config, ns.socket, ns.log_level)
    supervisor = build_supervisor(cfg, systemd=sd_env, reload=reload)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _outside_the_receiver(supervisor, signal.getsignal(signum)))
    if hangup is not None:
        hangup.pass_on(supervisor)
    try:
        # Searches answer on the event loop while rebuilds and backfills run in worker
        # threads; a 1 ms GIL switch interval (Python's default is 5 ms) bounds how long a
        # search waits behind a CPU-bound thread.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        trio.run(_serve, supervisor)
    except BaseException as exc:
        status = _refused(exc, cfg)
        if status is not None:
            return status
        if isinstance(exc, KeyboardInterrupt):
            # SIGINT before the supervisor's receiver opened: a stop like any other.
            log.info("recalld stopped")
            return EXIT_OK
        if not isinstance(exc, Exception):
            raise
        log.exception("recalld stopped on an unexpected error")
        print(f"recalld: stopped on an unexpected error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        # Nothing is left to stop, up to the process's very end (the interpreter's own
        # finalisation gives Python handlers back the default action).
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
    log.info("recalld stopped")
    return EXIT_OK


def _refused(exc: BaseException, cfg: DaemonConfig) -> int | None:
    """The exit status for a start refused by what it found (``exc``, or one in its
    group), after one line on stderr saying why; None for any other error."""
    from recalld.daemon import systemd
    from recalld.daemon.datadirs import DataDirUnusable, NotPrivate
    from recalld.daemon.lock import AlreadyServing
    from recalld.daemon.rpc.listener import SocketPlaceRefused, SocketSetupError, socket_answers
    from recalld.ipc._core import starting_elsewhere

    taken = _find(exc, AlreadyServing)
    if taken is not None:
        # Clients that find no daemon on the socket say to start one: say why that
        # cannot work.
        if socket_answers(cfg.socket_path):
            hint = ""
        elif starting_elsewhere(cfg.socket_path):
            # Several started at once: the one that claimed the socket first is loading.
            hint = (f", which is starting and answers on {cfg.socket_path} in a moment "
                    "(no second start is needed)")
        else:
            hint = (f", but no daemon answers on {cfg.socket_path}: it is stopping, listens "
                    "on another socket, or its socket file was removed (stop it, then start "
                    "again)")
        print(f"{taken}{hint}", file=sys.stderr)
        return EXIT_ALREADY_RUNNING
    unusable = _find(exc, DataDirUnusable)
    if unusable is not None:
        print(f"recalld: cannot use the data directory {cfg.data_dir}: {unusable}",
              file=sys.stderr)
        permanent = isinstance(unusable, DataDirUnusable) and unusable.permanent
        return EXIT_CONFIG if permanent else EXIT_FAILURE
    private = _find(exc, NotPrivate)
    if private is not None:
        print(f"recalld: configuration error: cannot keep data private: {private}",
              file=sys.stderr)
        return EXIT_CONFIG
    passed = _find(exc, systemd.PassedSocketError)
    if passed is not None:
        print(f"recalld: configuration error: {passed}", file=sys.stderr)
        return EXIT_CONFIG
    refused = _find(exc, SocketPlaceRefused)
    if refused is not None:
        print(f"recalld: configuration error: cannot create the socket: {refused}",
              file=sys.stderr)
        return EXIT_CONFIG
    setup = _find(exc, SocketSetupError)
    if setup is not None:
        print(f"recalld: cannot create the socket: {setup}", file=sys.stderr)
        permanent = isinstance(setup, SocketSetupError) and setup.permanent
        return EXIT_CONFIG if permanent else EXIT_FAILURE
    return None


async def _serve(supervisor: Supervisor) -> None:
    # trio's own SIGINT handler (KeyboardInterrupt into the run) stays in charge until the
    # supervisor's receiver opens; after that, a SIGINT must not cut the exit short.
    signal.signal(signal.SIGINT, _outside_the_receiver(supervisor, signal.getsignal(signal.SIGINT)))
    await supervisor.run()


class HeldHangup:
    """SIGHUP from the process's start until the supervisor's signal receiver opens: the
    default action would end a daemon that was asked to reload while it imported its
    modules. Held instead, and handed to the supervisor, which reloads once it can."""

    def __init__(self) -> None:
        self.came = False
        self.passed_on = False

    @classmethod
    def install(cls) -> HeldHangup | None:
        """The holder, now SIGHUP's handler; None when SIGHUP is ignored (nohup) or has a
        handler of the caller's: that stays."""
        if signal.getsignal(signal.SIGHUP) != signal.SIG_DFL:
            return None
        held = cls()
        signal.signal(signal.SIGHUP, held)
        return held

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.came = True

    def pass_on(self, supervisor: Supervisor) -> None:
        """From now on SIGHUP's handler is the supervisor's (already installed): a SIGHUP
        held so far asks it for a reload."""
        self.passed_on = True
        if self.came:
            supervisor.reload_asked = True

    def uninstall(self) -> None:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _outside_the_receiver(
        supervisor: Supervisor, before: object,
) -> Callable[[int, FrameType | None], None]:
    """The handler of a stop signal while the supervisor's signal receiver is not open.
    Before it opens: ``before`` (a handler, ignored, or the default action), as if the
    daemon had not started. Once it has been open the daemon is stopping: a repeated
    signal, or one the receiver held unread and raises again as it closes, lets the stop
    go on; the default action would cut it off (a clean stop ending with -15, or a
    KeyboardInterrupt in the middle of the last save). Installed before the receiver
    opens, the receiver puts it back when it closes; once the loop has ended the signals
    are ignored, so from the receiver's opening on, only SIGKILL ends the process before
    its exit is done."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if supervisor.signals_taken or before == signal.SIG_IGN:
            return
        if isinstance(before, HeldHangup):  # a reload asked for while the daemon starts
            supervisor.reload_asked = True
            return
        if callable(before):
            before(signum, frame)
        else:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    return handler


if __name__ == "__main__":
    sys.exit(main())
