"""Daemons for the suite, forked from an interpreter that has already imported the daemon.

Most tests start one or more daemons, and a daemon's start is mostly its imports (about
400 modules, ~0.5 s of CPU each time). A fork server, started once per pytest worker,
runs ``recalld.daemon.main.prepare_to_serve`` as ``main`` does before it serves (the
allocator and BLAS limits, then the imports, then ``gc.freeze``) and then forks one
child per daemon. The child takes the test's environment, working directory, session
and log file, and runs ``main`` itself: from there on it is the daemon as
``python -m recalld.daemon.main serve`` runs it, on a real socket with its real files,
ending with the interpreter's exit steps (non-daemon threads joined, ``atexit``
handlers).

What a fork cannot give, the factory keeps to a real ``exec`` (``conftest.DaemonFactory``):
a launcher or inherited descriptors, and a ``backfill_threads`` setting (OpenBLAS sizes
its pool when numpy is imported). The variables read when an interpreter starts
(``PYTHON*``, allocator, BLAS or loader ones) choose the server: a daemon whose values
differ from the first server's is forked from a server started with them, kept for the
rest of the session (:class:`ForkServers`). A ``PYTHONPATH`` folder that holds only a
``sitecustomize.py`` (a test's hook) is no such difference: the server starts without it and
the child runs the hook as ``site`` would (:func:`_run_site_hooks`), with ``PYTHONPATH``
left whole for the processes the daemon spawns. The server preloads what a daemon imports
before it serves and the pure modules it imports at their first use (``_preload``), but
not the libraries a test looks for in a daemon's maps (hnswlib, the database driver):
those stay the daemon's own choice. A daemon whose configuration names a PostgreSQL
remote would import the driver at its start anyway (~0.2 s of CPU each time): it is forked
from a server that has imported psycopg too (``driver=True``), nothing of recalld's remote
package, whose modules a test's hook may set values in before they read them. What a
daemon imports when is checked on a real ``exec`` (test_first_use_imports).

The server also forks the ``recalld`` command for tests/clirun.py: the command's modules
are loaded with the daemon's, and a child runs ``recalld.ipc.cli.main`` on the request's
descriptors as the console script runs it (:func:`_cli_child`); ``recalld serve``, which
execs the daemon, runs the daemon's ``main`` in place of the exec (the exec itself is
tested on the real script, tests/test_config_values.py).

The protocol, on a ``SOCK_SEQPACKET`` socket pair: a request is one message, JSON
``{"argv", "env", "cwd"}`` (and ``"cli": true`` for a command) with its descriptors (a
daemon's log file, or a command's stdin, stdout and stderr) and last the write end of a
status pipe; the answer is the child's pid. When the child ends, the server writes its wait
status to the status pipe and closes it. The worker side is :class:`ForkedProcess`, which
signals through a pidfd (no pid-reuse race) and answers ``poll``/``wait`` like ``Popen``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

MAX_REQUEST_BYTES = 1 << 20
#: In a server's environment (never a daemon's): the server imports the database driver.
DRIVER_MARKER = "RECALLD_TESTS_FORK_DRIVER"
#: Read by the interpreter, the C allocator, the dynamic loader or OpenBLAS when the
#: process starts or numpy loads: a fork inherits the server's.
_STARTUP_PREFIXES = ("PYTHON", "MALLOC_", "LD_", "OPENBLAS_", "GOTO_", "OMP_")


def pidfds_work() -> bool:
    """Whether this kernel gives pidfds (Linux 5.3 and later), which the server needs."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return hasattr(signal, "pidfd_send_signal")


def _hook_folder(entry: str) -> bool:
    """Whether the ``PYTHONPATH`` folder ``entry`` holds only a ``sitecustomize.py`` (and
    its bytecode): a test's hook, which a forked child runs (:func:`_run_site_hooks`)."""
    try:
        names = set(os.listdir(entry))
    except OSError:
        return False
    return "sitecustomize.py" in names and names <= {"sitecustomize.py", "__pycache__"}


def _hook_folders(env: Mapping[str, str]) -> list[str]:
    return [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e and _hook_folder(e)]


def server_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a fork server: without the hook folders of its ``PYTHONPATH``, which
    the server must not run (they are a daemon's own) and which choose no server."""
    hooks = _hook_folders(env)
    if not hooks:
        return dict(env)
    out = dict(env)
    rest = [e for e in env["PYTHONPATH"].split(os.pathsep) if e not in hooks]
    if rest:
        out["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        del out["PYTHONPATH"]
    return out


def startup_environment(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of ``env`` a forked daemon cannot change: the server is chosen by it."""
    return tuple(sorted((k, v) for k, v in server_environment(env).items()
                        if k.startswith(_STARTUP_PREFIXES) and k != "PYTHONUNBUFFERED"))


class ForkedProcess:
    """A forked daemon, seen from the test: the part of ``subprocess.Popen`` tests use."""

    def __init__(self, pid: int, pidfd: int, status_fd: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._status_fd = status_fd
        self._pidfd: int | None = pidfd

    def _read_status(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        ready, _, _ = select.select([self._status_fd], [], [], timeout)
        if not ready:
            return False
        data = b""
        while chunk := os.read(self._status_fd, 64):
            data += chunk
        os.close(self._status_fd)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        # An empty pipe means the server itself died: report it as a failure.
        self.returncode = os.waitstatus_to_exitcode(int(data)) if data else 255
        return True

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One server process and the worker's end of its socket."""

    def __init__(self, env: Mapping[str, str], *, script: str = __file__) -> None:
        """``script``: the server's program (it runs ``_serve``), this module by default."""
        self._lock = threading.Lock()  # one request in flight: answers come in order
        self.env = dict(env)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", script, str(theirs.fileno())],
                env=dict(env), stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
            )

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ForkedProcess:
        """A daemon, its output (stdout and stderr) appended to ``log_path``."""
        with open(log_path, "ab") as log:
            return self._request({"argv": list(argv), "env": dict(env), "cwd": os.getcwd()},
                                 [log.fileno()], argv)

    def spawn_cli(self, argv: Sequence[str], env: Mapping[str, str],
                  stdio: Sequence[int]) -> ForkedProcess:
        """The ``recalld`` command with ``argv`` (its arguments), on the descriptors
        ``stdio`` (stdin, stdout, stderr)."""
        request = {"cli": True, "argv": list(argv), "env": dict(env), "cwd": os.getcwd()}
        return self._request(request, list(stdio), ["recalld", *argv])

    def _request(self, request: dict[str, Any], fds: list[int],
                 args: Sequence[str]) -> ForkedProcess:
        status_r, status_w = os.pipe()
        with self._lock:
            try:
                socket.send_fds(self._sock, [orjson.dumps(request)], [*fds, status_w])
            finally:
                os.close(status_w)
            answer, pidfds, _, _ = socket.recv_fds(self._sock, 64, 1)
        if not answer:
            os.close(status_r)
            raise RuntimeError(f"the fork server exited with {self.proc.wait()}")
        return ForkedProcess(int(answer), pidfds[0], status_r, args)

    def close(self) -> None:
        self._sock.close()  # the server ends when it reads the end of its socket
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkServers:
    """A worker's fork servers, one per startup environment (and with or without the
    driver), each started at its first daemon (a server that died is started again)."""

    def __init__(self) -> None:
        self._servers: dict[tuple[tuple[tuple[str, str], ...], bool], ForkServer] = {}

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *,
              driver: bool = False) -> ForkedProcess:
        """A daemon forked from the server for ``env``; ``driver``: one that has imported
        the database driver (see the module docstring)."""
        key = (startup_environment(env), driver)
        server = self._servers.get(key)
        if server is None or server.proc.poll() is not None:
            server_env = server_environment(env)
            if driver:
                server_env[DRIVER_MARKER] = "1"
            server = self._servers[key] = ForkServer(server_env)
        return server.spawn(argv, env, log_path)

    def running(self, env: Mapping[str, str]) -> ForkServer | None:
        """The server already running for ``env``'s startup environment, if any (a
        command is not worth starting one for), one without the driver first."""
        startup = startup_environment(env)
        for driver in (False, True):
            server = self._servers.get((startup, driver))
            if server is not None and server.proc.poll() is None:
                return server
        return None

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()


# --- the server process -----------------------------------------------------------------

#: Loaded by a daemon at its first use of them, which nearly every test daemon reaches:
#: the method handlers, redaction (its rules compile ~130 patterns), dream and capture,
#: the providers' HTTP client, the schedule's cron parser. Importing them in each child
#: cost it ~0.15 s of CPU again; here they are imported once. Left to the daemon's own
#: choice: the database driver (``recalld.daemon.remote``) and hnswlib, which tests look
#: for in its maps.
_FIRST_USE_SKIPPED = ("recalld.daemon.remote",)
#: The command's modules are loaded for the commands forked from the server
#: (:meth:`ForkServer.spawn_cli`), but not the bridges to the MCP and AgentScope SDKs nor
#: ``__main__`` (which runs the command).
_CLI_SKIPPED = ("recalld.ipc.mcp", "recalld.ipc.agentscope", "recalld.ipc.__main__")


def _preload() -> Any:
    """What ``main`` does before it serves, on the defaults, then the modules of first
    use (``_FIRST_USE_SKIPPED`` aside); returns the main module."""
    import dataclasses
    import gc
    import importlib
    import pkgutil

    import recalld.daemon
    from recalld.daemon import config as config_mod
    from recalld.daemon import main as main_mod

    defaults = {f.name: f.default for f in dataclasses.fields(config_mod.DaemonConfig)}
    main_mod.prepare_to_serve(defaults["backfill_threads"])
    gc.disable()
    for info in pkgutil.walk_packages(recalld.daemon.__path__, "recalld.daemon."):
        if not info.name.startswith(_FIRST_USE_SKIPPED):
            importlib.import_module(info.name)
    for name in ("aiohttp", "croniter"):
        importlib.import_module(name)
    if os.environ.get(DRIVER_MARKER) == "1":
        importlib.import_module("psycopg")
    import recalld.ipc

    for info in pkgutil.walk_packages(recalld.ipc.__path__, "recalld.ipc."):
        if not info.name.startswith(_CLI_SKIPPED):
            importlib.import_module(info.name)
    _fill_first_use_caches()
    gc.freeze()
    gc.enable()
    return main_mod


def _fill_first_use_caches() -> None:
    """Compile once, in the server, the patterns every daemon compiles at its first
    workspace path (whether a folder's name may hold a credential) and at its first
    schedule (croniter's, for the default dream cron): a few ms of CPU each time, in a
    daemon that lives for one test. Their answers are those of a daemon that compiles
    them itself (the schedule in UTC: a daemon's local zone is its own)."""
    from datetime import UTC, datetime

    from recalld.daemon.config import WorkspaceSettings
    from recalld.daemon.memory import secret_names, secret_rules
    from recalld.daemon.scheduler import CronSchedule

    secret_rules.rules_token_prefilter()
    secret_names.could_hold("memory")
    CronSchedule(WorkspaceSettings().dream_cron, "UTC").next_after(datetime.now(UTC))


def _child(main_mod: Any, request: dict[str, Any], log_fd: int, keep_closed: list[int]) -> None:
    """In the forked child: become the daemon the request describes; never returns."""

    def daemon() -> int:
        _leave_server(keep_closed)
        os.setsid()
        os.chdir(request["cwd"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.clear()
        os.environ.update(request["env"])
        # The C library read TZ once, in the server (its logging did): the daemon's own
        # TZ dates its notes, as in a daemon started afresh.
        time.tzset()
        _run_site_hooks()
        argv = request["argv"]
        return _daemon_main(main_mod, argv[argv.index("serve"):])

    _run_and_exit(daemon)


def _daemon_main(main_mod: Any, args: list[str]) -> int:
    """The daemon's ``main`` on ``args``, as ``python -m recalld.daemon.main`` runs it."""
    sys.argv = [main_mod.__file__, *args]
    # As under ``python -m``: the worker processes a daemon spawns import the main module
    # by this name.
    sys.modules["__main__"] = main_mod
    return int(main_mod.main(args))


def _new_stdio() -> None:
    """Text streams on descriptors 0-2 as an interpreter makes them at its start (the
    server's were made for its own descriptors: a file's seek position, no pipe)."""
    import io

    write_through = bool(os.environ.get("PYTHONUNBUFFERED"))
    encoding = sys.stdout.encoding
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding, sys.stdin.errors)
    for fd, name, errors in ((1, "stdout", sys.stdout.errors), (2, "stderr", "backslashreplace")):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(io.BufferedWriter(raw), encoding, errors,
                                  line_buffering=raw.isatty() or fd == 2,
                                  write_through=write_through)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _cli_child(main_mod: Any, request: dict[str, Any], stdio: list[int],
               keep_closed: list[int]) -> None:
    """In the forked child: run the ``recalld`` command as its console script does, on
    the request's arguments, environment and descriptors; never returns. ``recalld
    serve`` would ``exec`` the daemon's main in a fresh interpreter: it runs here, in
    place of that exec, as a daemon forked for the factory does."""

    def command() -> int:
        _leave_server(keep_closed)
        os.chdir(request["cwd"])
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()  # the command's own TZ shows its times (see the daemon's above)
        _new_stdio()
        _run_site_hooks()
        from recalld.ipc.cli import main, serve_arguments

        daemon_args = serve_arguments(request["argv"])
        if daemon_args is not None:
            return _daemon_main(main_mod, daemon_args)
        sys.argv = [str(Path(sys.executable).parent / "recalld"), *request["argv"]]
        return main()

    _run_and_exit(command)


def _run_site_hooks() -> None:
    """In a forked child, with its environment: what ``site`` does at an interpreter's
    start for the hook folders of ``PYTHONPATH`` (which chose no server): each put on
    ``sys.path`` where ``PYTHONPATH`` goes, the first one's ``sitecustomize`` run. The
    modules the server preloaded are already imported: a hook sets what they read at
    their use (a module that copied a value at its import keeps the server's)."""
    import importlib.util

    hooks = [e for e in _hook_folders(os.environ) if e not in sys.path]
    if not hooks:
        return
    sys.path[1:1] = hooks
    spec = importlib.util.spec_from_file_location(
        "sitecustomize", os.path.join(hooks[0], "sitecustomize.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _leave_server(keep_closed: list[int]) -> None:
    """The child's first step: the server's signal handling and descriptors dropped."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in keep_closed:
        os.close(fd)


def _run_and_exit(main: Callable[[], int]) -> None:
    """Run ``main`` as the interpreter runs a program and end as it ends: a SystemExit's
    code, 1 with a traceback for any other exception; then, in its order, wait for
    non-daemon threads, run the atexit handlers (logging's flush, multiprocessing's
    clean-up) and flush stdout and stderr (exit code 120 when that fails)."""
    code = 1
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        import atexit
        import threading

        try:
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            code = 120
        finally:
            os._exit(code)


def _serve(fd: int) -> None:
    main_mod = _preload()
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    status: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, wait_status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if pid in status:
                    fd_w = status.pop(pid)
                    with contextlib.suppress(BrokenPipeError):  # nobody waits for it now
                        os.write(fd_w, str(wait_status).encode())
                    os.close(fd_w)
        if sock in ready:
            msg, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST_BYTES, 4)
            if not msg:
                return
            *given, status_w = fds
            request = orjson.loads(msg)
            pid = os.fork()
            if pid == 0:
                keep_closed = [sock.fileno(), wake_r, wake_w, status_w, *status.values()]
                if request.get("cli"):
                    _cli_child(main_mod, request, given, keep_closed)
                _child(main_mod, request, given[0], keep_closed)
            for fd in given:
                os.close(fd)
            status[pid] = status_w
            # Opened before the child can be reaped (here, later): it names this child.
            pidfd = os.pidfd_open(pid)
            socket.send_fds(sock, [str(pid).encode()], [pidfd])
            os.close(pidfd)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
