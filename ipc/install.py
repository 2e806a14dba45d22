"""Install and remove the systemd user units (``recalld install-service``).

The unit texts live here as templates, so a wheel carries them without package data;
``systemd/recalld.service`` and ``systemd/recalld.socket`` in the repository are the
same templates rendered with a placeholder path (a test keeps them identical).

``install_service`` writes both units to ``$XDG_CONFIG_HOME/systemd/user`` (default
``~/.config/systemd/user``) with ExecStart pointing at the ``recalld`` of the running
interpreter, then runs ``systemctl --user daemon-reload`` and ``enable --now``; with
``write_only`` it only writes the files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

SERVICE_NAME = "recalld.service"
SOCKET_NAME = "recalld.socket"
#: ExecStart used for the copies kept in the repository's systemd/ folder.
PLACEHOLDER_EXEC = "%h/.local/bin/recalld"
SYSTEMCTL_TIMEOUT_S = 60.0

SERVICE_TEMPLATE = """\
# recalld user service. `recalld install-service` writes this file with ExecStart
# pointing at the recalld of the Python environment it was run from.
[Unit]
Description=recalld: long-term Markdown memory for AI agents
Requires=recalld.socket
After=recalld.socket

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start} serve
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=2
# 2 = configuration error, 3 = another daemon owns the data: restarting cannot help.
RestartPreventExitStatus=2 3
WatchdogSec=30
TimeoutStartSec=120
TimeoutStopSec=30
UMask=0077
# Hardening that works in user units without privileges. Options that need a mount
# namespace (ProtectSystem, PrivateTmp, ...) are left out on purpose, and so is
# MemoryDenyWriteExecute: ctypes/libffi closures and some BLAS builds need W+X pages.
NoNewPrivileges=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
SystemCallArchitectures=native

[Install]
WantedBy=default.target
"""

SOCKET_TEMPLATE = """\
# recalld user socket: systemd listens and starts recalld.service on the first client.
[Unit]
Description=recalld socket

[Socket]
ListenStream=%t/recalld/recalld.sock
SocketMode=0600
DirectoryMode=0700

[Install]
WantedBy=sockets.target
"""


def _quote(arg: str) -> str:
    """Quote one ExecStart word the way systemd parses it."""
    if arg and not any(c in arg for c in ' \t"\'\\'):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def default_exec_start() -> str:
    """The ``recalld`` next to the running interpreter, else ``python -m`` the daemon."""
    script = Path(sys.executable).parent / "recalld"
    if script.is_file() and os.access(script, os.X_OK):
        return _quote(str(script))
    return f"{_quote(sys.executable)} -m recalld.daemon.main"


def render_units(exec_start: str | None = None) -> dict[str, str]:
    """File name -> unit text."""
    exe = exec_start if exec_start is not None else default_exec_start()
    return {
        SERVICE_NAME: SERVICE_TEMPLATE.format(exec_start=exe),
        SOCKET_NAME: SOCKET_TEMPLATE,
    }


def unit_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "systemd" / "user"


def _systemctl(*args: str, check: bool = True) -> None:
    subprocess.run(
        ["systemctl", "--user", *args], check=check, timeout=SYSTEMCTL_TIMEOUT_S,
        stdout=subprocess.DEVNULL,
    )


def install_service(*, write_only: bool) -> list[str]:
    """Write the units (atomically) and, unless ``write_only``, enable and start them."""
    target = unit_dir()
    target.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for name, text in render_units().items():
        path = target / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        written.append(str(path))
    if not write_only:
        _systemctl("daemon-reload")
        _systemctl("enable", "--now", SOCKET_NAME, SERVICE_NAME)
    return written


def uninstall_service(*, write_only: bool) -> None:
    """Stop and disable the units (unless ``write_only``), then remove their files."""
    if not write_only:
        _systemctl("disable", "--now", SERVICE_NAME, SOCKET_NAME, check=False)
    target = unit_dir()
    for name in (SERVICE_NAME, SOCKET_NAME):
        (target / name).unlink(missing_ok=True)
    if not write_only:
        _systemctl("daemon-reload", check=False)
