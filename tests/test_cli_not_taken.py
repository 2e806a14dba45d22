"""An option a command accepts with the others but has no use for is a usage error
(exit status 2) naming it, never passed by: taken in silence, it looks obeyed while
nothing changes (``recalld --json serve`` printing no JSON, ``--timeout`` bounding
nothing)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import DaemonFactory
from test_cli import recalld


def _refused(args: tuple[str, ...], env: dict[str, str], option: str, command: str) -> None:
    proc = recalld(*args, env=env)
    assert proc.returncode == 2, (args, proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr, (args, proc)
    last = proc.stderr.splitlines()[-1]
    assert f"error: argument {option}: {command} does not take it (" in last, (args, last)


def test_serve_refuses_the_options_of_the_client_commands(
        daemon_factory: DaemonFactory) -> None:
    env = daemon_factory.environment()
    socket = Path(env["XDG_RUNTIME_DIR"]) / "recalld" / "recalld.sock"
    for args, option in ((("--json", "serve"), "--json"),
                         (("serve", "--json"), "--json"),
                         (("--timeout", "5", "serve"), "--timeout"),
                         (("serve", "--check-config", "--timeout", "0.5"), "--timeout"),
                         (("--json", "serve", "--check-config"), "--json")):
        _refused(args, env, option, "serve")
        assert not os.path.lexists(socket), f"{args}: a daemon started"
    # What serve does take is taken.
    proc = recalld("--socket", str(socket), "serve", "--check-config", env=env)
    assert proc.returncode == 0, proc.stderr


def test_commands_that_ask_the_daemon_nothing_refuse_its_options(
        daemon_factory: DaemonFactory) -> None:
    """``uninstall-service --socket`` read as removing the units of that socket, and
    ``mcp --timeout`` as bounding the bridge's calls; neither did anything."""
    env = daemon_factory.environment()
    units = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    written = recalld("install-service", "--write-only", env=env)
    assert written.returncode == 0 and (units / "recalld.service").is_file(), written.stderr
    for args, option, command in (
            (("uninstall-service", "--write-only", "--socket", "/tmp/s.sock"),
             "--socket", "uninstall-service"),
            (("--timeout", "3", "uninstall-service", "--write-only"),
             "--timeout", "uninstall-service"),
            (("install-service", "--write-only", "--timeout", "3"),
             "--timeout", "install-service"),
            (("--json", "mcp"), "--json", "mcp"),
            (("mcp", "--agent", "a", "--timeout", "2"), "--timeout", "mcp")):
        _refused(args, env, option, command)
    assert (units / "recalld.service").is_file(), "a refused uninstall removed the units"
    # What they do take is taken.
    removed = recalld("--json", "uninstall-service", "--write-only", env=env)
    assert removed.returncode == 0 and not (units / "recalld.service").exists(), removed
