"""A test's hook for a daemon: a folder on ``PYTHONPATH`` holding only a
``sitecustomize.py``, run at the daemon's start (and in the processes it spawns), as an
interpreter's ``site`` runs it. A forked daemon runs it too, from the worker's one fork
server for its interpreter environment (tests/forkserver.py): the hook chooses no server.
"""

from __future__ import annotations

from pathlib import Path

from conftest import DaemonFactory
from forkserver import ForkServers, startup_environment

HOOK = """\
import os, sys
with open(os.environ["HOOK_MARKS"], "a") as f:
    f.write(f"{os.getpid()} {os.environ['HOOK_WORD']} {os.path.dirname(__file__) in sys.path}\\n")
"""


def test_a_hook_folder_runs_in_the_daemon_and_chooses_no_server(
        daemon_factory: DaemonFactory, fork_servers: ForkServers | None,
        tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOK, encoding="utf-8")
    marks = tmp_path / "marks"
    plain = daemon_factory()
    hooked = [daemon_factory(PYTHONPATH=str(hooks), HOOK_MARKS=str(marks), HOOK_WORD=word)
              for word in ("kestrel", "зяблик")]
    lines = [line.split() for line in marks.read_text(encoding="utf-8").splitlines()]
    # Each daemon ran it once, with its own environment, its folder on sys.path (the
    # processes a daemon spawns run it too: their lines are not counted here).
    for d, word in zip(hooked, ("kestrel", "зяблик"), strict=True):
        assert [line[1:] for line in lines if line[0] == str(d.pid)] == [[word, "True"]], lines
    assert startup_environment(hooked[0].env) == startup_environment(plain.env)
    if fork_servers is not None:
        assert fork_servers.running(hooked[1].env) is fork_servers.running(plain.env)
    # A folder holding anything else is another interpreter environment.
    (hooks / "other.py").write_text("", encoding="utf-8")
    assert startup_environment(hooked[0].env) != startup_environment(plain.env)


LOADED = """\
import json, os, sys
with open(os.environ["HOOK_MARKS"], "a") as f:
    f.write(json.dumps([os.getpid(), "psycopg" in sys.modules,
                        sorted(m for m in sys.modules if m.startswith("recalld.daemon.remote."))])
            + "\\n")
"""


def test_a_daemon_with_a_postgres_remote_finds_the_driver_loaded_and_runs_its_hook_first(
        daemon_factory: DaemonFactory, fork_servers: ForkServers | None,
        tmp_path: Path) -> None:
    # Forked from a server that imported the driver and no more of the remote package than
    # any daemon's: a hook sets what those modules copy at their import before it.
    import json
    import socket

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(LOADED, encoding="utf-8")
    marks = tmp_path / "marks"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    remote = (f'[workspaces.default]\nremote = {{ kind = "postgres", dsn = '
              f'"postgresql://postgres@127.0.0.1:{port}/postgres", name = "w", host = "h" }}\n')
    d = daemon_factory(remote, PYTHONPATH=str(hooks), HOOK_MARKS=str(marks))
    plain = daemon_factory(PYTHONPATH=str(hooks), HOOK_MARKS=str(marks))
    seen = {pid: (driver, remote_modules) for pid, driver, remote_modules in
            map(json.loads, marks.read_text(encoding="utf-8").splitlines())}
    assert "recalld.daemon.remote.chunks" not in seen[plain.pid][1]
    assert seen[d.pid][1] == seen[plain.pid][1] and seen[plain.pid][0] is False
    if fork_servers is not None:
        assert seen[d.pid][0] is True
