"""Shared fixtures: real daemons in subprocesses with an isolated environment.

``daemon`` starts one ``python -m recalld.daemon.main serve`` on its defaults and waits
until it answers ``daemon.ping``. ``daemon_factory(config_text=None, **env)`` starts more,
with a config file and extra environment (``wait=False`` to observe a daemon that is
expected to exit, ``args=[...]`` for extra ``serve`` options). Every daemon gets its own
HOME / XDG_* dirs under tmp_path and a short XDG_RUNTIME_DIR under /tmp (AF_UNIX paths
must stay under 108 bytes); all are stopped and checked at teardown.

``fake`` is the scripted embedding and chat provider of tests/fakes/provider_server.py on
its defaults; a module that needs other dimensions, a key or a default answer defines a
``fake`` of its own, which pytest prefers there. ``bridge`` is a running ProviderBridge
(the daemon's thread for provider HTTP calls) on its defaults, for trio tests.

A daemon is a fork of the worker's fork server (tests/forkserver.py: an interpreter that
has done what ``recalld.daemon.main`` does before it serves, imports included), which
then runs ``main`` as ``python -m recalld.daemon.main serve`` would; a launcher,
inherited descriptors or a ``backfill_threads`` setting get a fresh interpreter, as does
every daemon with ``RECALLD_TESTS_EXEC_ONLY=1``, and another interpreter environment
gets a fork server of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import _bytecode  # first: the session's bytecode folder before the imports below
import orjson
import pytest
import trio
from clirun import use_fork_servers
from fakes.provider_server import FakeProvider
from forkserver import ForkedProcess, ForkServers, pidfds_work
from hypothesis import settings as hypothesis_settings

from recalld.daemon.providers.bridge import ProviderBridge
from recalld.ipc.errors import error_from_wire

# Generous caps: the suite runs on busy 2-core machines; passing tests never wait them out.
# Property tests draw the same examples at every run, here and in CI: a run never fails at
# random on an example no run before it met. HYPOTHESIS_PROFILE=explore draws new ones.
hypothesis_settings.register_profile("repeatable", derandomize=True)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0
CALL_TIMEOUT_S = 60.0
_STRIPPED_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS",
                 "LISTEN_FDNAMES")


class RawConnection:
    """A blocking JSON-RPC line connection, for tests that need control over bytes."""

    def __init__(self, path: Path, timeout: float = CALL_TIMEOUT_S) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except BaseException:
            self.sock.close()
            raise
        self._buffer = b""
        self._next_id = 0

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: Any) -> None:
        self.sock.sendall(orjson.dumps(message) + b"\n")

    def request(self, method: str, params: Any = None) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": self._next_id}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self._next_id

    def recv_line(self) -> bytes | None:
        """The next line, or None at EOF."""
        while b"\n" not in self._buffer:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def recv(self) -> Any:
        line = self.recv_line()
        if line is None:
            raise EOFError("daemon closed the connection")
        return orjson.loads(line)

    def recv_response(self) -> dict[str, Any]:
        """The next message that is not a notification."""
        while True:
            msg = self.recv()
            if isinstance(msg, list) or "id" in msg:
                return msg  # type: ignore[no-any-return]

    def call(self, method: str, params: Any = None) -> Any:
        id_ = self.request(method, params)
        msg = self.recv_response()
        if "error" in msg and msg.get("id") in (id_, None):
            raise error_from_wire(msg["error"])
        assert msg.get("id") == id_, msg
        return msg["result"]

    def at_eof(self, timeout: float = 30.0) -> bool:
        """True once the daemon closed the connection (reading whatever arrives first)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class DaemonHandle:
    proc: subprocess.Popen[bytes] | ForkedProcess
    socket_path: Path
    data_dir: Path
    config_path: Path
    env: dict[str, str]
    log_path: Path
    home: Path
    exit_code: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def connect(self, timeout: float = CALL_TIMEOUT_S) -> RawConnection:
        return RawConnection(self.socket_path, timeout)

    def call(self, method: str, params: Any = None, timeout: float = CALL_TIMEOUT_S) -> Any:
        """One call on a fresh connection; errors raise the typed recalld exception."""
        with self.connect(timeout) as conn:
            return conn.call(method, params)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self, deadline_s: float = START_DEADLINE_S, *, started: bool = True) -> None:
        """Until the daemon answers ``daemon.ping`` (it serves searches) and, ``started``,
        ``daemon.status`` (which waits for the whole start: every workspace's services)."""
        end = time.monotonic() + deadline_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError, EOFError):
                if self.call("daemon.ping", timeout=2.0).get("pong") is True:
                    if started:
                        self.call("daemon.status", timeout=max(1.0, end - time.monotonic()))
                    return
            if time.monotonic() > end:
                raise TimeoutError(f"daemon did not answer within {deadline_s} s:\n{self.log()}")
            time.sleep(0.02)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = STOP_DEADLINE_S) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.exit_code = self.proc.wait(timeout=timeout)
        return self.exit_code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_DEADLINE_S)


#: A configuration with a shared workspace on PostgreSQL (its daemon imports the driver).
_POSTGRES_REMOTE = re.compile(r"""kind\s*=\s*["']postgres["']""")


class DaemonFactory:
    """Starts isolated daemons; see the module docstring."""

    def __init__(self, tmp_path: Path, pycache: Path | None = None,
                 forks: ForkServers | None = None) -> None:
        self.tmp_path = tmp_path
        self.pycache = pycache
        self.forks = forks
        self.handles: list[DaemonHandle] = []
        self._short_dirs: list[str] = []
        self._leaked: list[int] = []
        #: A daemon whose configuration names a PostgreSQL remote is forked from a server
        #: that has imported the driver (tests/forkserver.py); False: from one that has
        #: not, for a test that looks for the daemon's own import of it.
        self.preload_driver = True

    def environment(self, **env: str) -> dict[str, str]:
        n = len(self.handles)
        home = self.tmp_path / f"d{n}"
        runtime = tempfile.mkdtemp(prefix="rd-", dir="/tmp")  # short: AF_UNIX paths are limited
        os.chmod(runtime, 0o700)
        self._short_dirs.append(runtime)
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("RECALLD_") and k not in _STRIPPED_ENV}
        if self.pycache is not None:
            # Bytecode compiled by the first daemon serves every later one (an environment
            # that forbids writing it would have each start compile the package again).
            base.pop("PYTHONDONTWRITEBYTECODE", None)
            base["PYTHONPYCACHEPREFIX"] = str(self.pycache)
        base.update({
            "HOME": str(home),
            "XDG_RUNTIME_DIR": runtime,
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_CONFIG_HOME": str(home / "config"),
            "PYTHONUNBUFFERED": "1",
        })
        base.update(env)
        return base

    def __call__(
        self,
        config_text: str | None = None,
        *,
        wait: bool | Literal["searchable"] = True,
        args: Sequence[str] = (),
        launcher: Sequence[str] | None = None,
        pass_fds: Sequence[int] = (),
        **env: str,
    ) -> DaemonHandle:
        full_env = self.environment(**env)
        home = Path(full_env["HOME"])
        home.mkdir(parents=True, exist_ok=True)
        config_path = Path(full_env["XDG_CONFIG_HOME"]) / "recalld" / "config.toml"
        if config_text is not None:
            config_path.parent.mkdir(parents=True, exist_ok=True)
            config_path.write_text(config_text, encoding="utf-8")
        socket_path = Path(full_env.get("RECALLD_SOCKET")
                           or Path(full_env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock")
        data_dir = Path(full_env.get("RECALLD_DATA_DIR")
                        or Path(full_env["XDG_DATA_HOME"]) / "recalld")
        log_path = home / f"daemon-{len(self.handles)}.log"
        cmd = [*(launcher or (sys.executable, "-m", "recalld.daemon.main")), "serve", *args]
        proc: subprocess.Popen[bytes] | ForkedProcess
        if self.forks is not None and self._forkable(config_text, launcher, pass_fds):
            driver = self.preload_driver and _POSTGRES_REMOTE.search(config_text or "")
            proc = self.forks.spawn(cmd, full_env, log_path, driver=bool(driver))
        else:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    cmd, env=full_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    pass_fds=tuple(pass_fds), start_new_session=True,
                )
        handle = DaemonHandle(proc=proc, socket_path=socket_path, data_dir=data_dir,
                              config_path=config_path, env=full_env, log_path=log_path,
                              home=home)
        self.handles.append(handle)
        if wait:
            handle.wait_ready(started=wait is True)
        return handle

    def _forkable(self, config_text: str | None, launcher: Sequence[str] | None,
                  pass_fds: Sequence[int]) -> bool:
        """Whether a fork of the server can be this daemon (tests/forkserver.py)."""
        return (launcher is None and not pass_fds
                and "backfill_threads" not in (config_text or ""))

    def stop_all(self) -> None:
        """SIGTERM every daemon still running, then wait for each: they stop side by side.
        One that outlives ``STOP_DEADLINE_S`` is killed and reported by ``cleanup``."""
        running = [h for h in self.handles if h.proc.poll() is None]
        for handle in running:
            handle.proc.send_signal(signal.SIGTERM)
        for handle in running:
            try:
                handle.proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self._leaked.append(handle.pid)
                handle.kill()

    def cleanup(self) -> None:
        self.stop_all()
        for runtime in self._short_dirs:
            shutil.rmtree(runtime, ignore_errors=True)
        assert not self._leaked, f"daemon(s) ignored SIGTERM and had to be killed: {self._leaked}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """A test's daemons stop before its other fixtures end: a stop's last work (the flush
    of pending turns) meets the fake providers and servers it was configured with, not a
    closed port it would retry until ``graceful_timeout_s``."""
    factory = getattr(item, "funcargs", {}).get("daemon_factory")
    if isinstance(factory, DaemonFactory):
        factory.stop_all()
    yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests (``slow``) first, the rest in their order: a parallel run that
    reached one of them last would end with a worker running it alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A skip must say why (``pytest -ra`` lists the reasons): a bare one fails the test."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped:").strip()
        if reason in ("", "Skipped", "unconditional skip"):
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} was skipped without a reason"


def pytest_sessionstart(session: pytest.Session) -> None:
    _bytecode.import_own_share(session.config)


@pytest.fixture(scope="session")
def pycache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One bytecode cache for the session's daemons and client processes: the session's
    own (tests/_bytecode.py) where it has one."""
    return _bytecode.session_folder() or tmp_path_factory.mktemp("pycache")


@pytest.fixture(scope="session")
def fork_servers() -> Iterator[ForkServers | None]:
    """The worker's daemon fork servers (tests/forkserver.py); none when
    ``RECALLD_TESTS_EXEC_ONLY=1`` asks for every daemon to be a fresh interpreter, or
    where the kernel has no pidfds (before Linux 5.3)."""
    if os.environ.get("RECALLD_TESTS_EXEC_ONLY") == "1" or not pidfds_work():
        yield None
        return
    servers = ForkServers()
    use_fork_servers(servers)  # the ``recalld`` commands of tests/clirun.py too
    try:
        yield servers
    finally:
        use_fork_servers(None)
        servers.close()


@pytest.fixture
def daemon_factory(tmp_path: Path, pycache: Path,
                   fork_servers: ForkServers | None) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path, pycache, fork_servers)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A new folder under /tmp, removed after the test: a socket's path in it stays
    short (108 bytes at most, which a test's tmp_path can exceed)."""
    path = Path(tempfile.mkdtemp(prefix="rsd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(daemon_factory: DaemonFactory) -> DaemonHandle:
    return daemon_factory()


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


@pytest.fixture
async def bridge(nursery: trio.Nursery) -> ProviderBridge:
    b = ProviderBridge()
    await nursery.start(b.run)
    return b
