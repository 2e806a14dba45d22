"""``recalld serve`` becomes the daemon: it execs ``python -m recalld.daemon.main`` with
its arguments, the word "serve" taken out. The suite's forked commands
(tests/forkserver.py) run the daemon's ``main`` on those arguments in place of that
exec, so what the exec runs is checked here, and a real exec by the installed script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import SCRIPT
from conftest import DaemonFactory

from recalld.ipc import cli


class Execed(Exception):
    pass


@pytest.mark.parametrize("args", [
    ["serve"],
    ["--socket", "/tmp/ünï.sock", "serve", "--check-config"],
    ["--timeout", "3", "serve", "--log-file", "serve"],
    ["serve", "--config", "/etc/recalld/сервер.toml", "--help"],
])
def test_serve_execs_the_daemons_main_on_its_other_arguments(
        monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    seen: list[tuple[str, list[str]]] = []

    def execv(path: str, argv: list[str]) -> None:
        seen.append((path, list(argv)))
        raise Execed

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(Execed):
        cli.main(args)
    daemon_args = cli.serve_arguments(args)
    assert daemon_args is not None
    at = args.index("serve")
    assert daemon_args == args[:at] + args[at + 1:]
    assert seen == [(sys.executable, [sys.executable, "-m", "recalld.daemon.main",
                                      *daemon_args])]


def test_not_serve_has_no_daemon_arguments() -> None:
    for args in (["status"], ["--json", "status", "serve"], ["ping", "--socket", "serve"], []):
        assert cli.serve_arguments(args) is None, args


def test_the_installed_script_execs_the_daemon(daemon_factory: DaemonFactory,
                                               tmp_path: Path) -> None:
    # Through a real exec: the daemon's own refusal of its configuration, its own code.
    env = daemon_factory.environment()
    config = tmp_path / "bad.toml"
    config.write_text("[daemon]\nsocket = 7\n", encoding="utf-8")
    proc = subprocess.run([str(SCRIPT), "serve", "--check-config", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"recalld: configuration error: {config}: "), proc.stderr
    assert "Traceback" not in proc.stderr
