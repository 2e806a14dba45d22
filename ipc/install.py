"""Install and remove the systemd user units (``recalld install-service``).

The unit texts live here as templates, so a wheel carries them without package data;
``systemd/recalld.service`` and ``systemd/recalld.socket`` in the repository are the
same templates rendered with a placeholder path (a test keeps them identical).

``install_service`` first checks that a user systemd answers (``systemctl --user
show-environment``), then writes both units to ``$XDG_CONFIG_HOME/systemd/user`` (default
``~/.config/systemd/user``) with ExecStart pointing at the ``recalld`` of the running
interpreter, then runs ``systemctl --user daemon-reload`` and ``enable --now``; with
``write_only`` it only writes the files. A socket other than the default
(``%t/recalld/recalld.sock``) goes into both units: ``ListenStream=`` and
``serve --socket``. Both unit files are written (or removed, by ``uninstall_service``)
or neither is: a folder in the place of one is refused before either changes, and a
failure after the first puts it back. Failures raise :class:`ServiceError` with what to
do instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from recalld.ipc import folders, paths

SERVICE_NAME = "recalld.service"
SOCKET_NAME = "recalld.socket"
UNIT_NAMES = (SERVICE_NAME, SOCKET_NAME)
#: ExecStart used for the copies kept in the repository's systemd/ folder.
PLACEHOLDER_EXEC = "%h/.local/bin/recalld"
SYSTEMCTL_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 10.0
DEFAULT_LISTEN = "%t/recalld/recalld.sock"
#: What to run once a user systemd is there, after ``install-service --write-only``.
ENABLE_COMMANDS = ("systemctl --user daemon-reload",
                   f"systemctl --user enable --now {SOCKET_NAME} {SERVICE_NAME}")


class ServiceError(RuntimeError):
    """systemd could not do what was asked; the message says what to do instead."""

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
{environment}ExecStart={exec_start} serve{serve_args}
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=2
# 2 = configuration error or a folder only the user can mend (a file in the way, no
# permission), 3 = another daemon owns the data: restarting cannot help.
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
ListenStream={listen}
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


def _literal(path: str, *, argument: bool = False) -> str:
    """A path as systemd reads it literally: "%" starts a specifier ("%%" is one "%"),
    and in a command's arguments "$" starts a variable ("$$" is one "$"). One with a
    control character is refused as a configuration error (PathError, exit 2, as any
    path recalld cannot use): a newline would end the setting and make the rest of the
    path a line of its own, read as another setting."""
    bad = next((c for c in path if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise paths.PathError(f"{path!r} holds a control character ({bad!r}), which a unit "
                           "file cannot carry; choose a path without it")
    path = path.replace("%", "%%")
    return path.replace("$", "$$") if argument else path


def unit_value(unit: Path, key: str) -> str | None:
    """The one value of ``key=`` in the unit file (None: not there, or more than one)."""
    try:
        lines = paths.read_regular_file(unit).decode("utf-8").splitlines()  # not a FIFO
    except (OSError, UnicodeDecodeError):
        return None
    values = [line.split("=", 1)[1].strip() for line in lines
              if line.strip().startswith(f"{key}=")]
    return values[0] if len(values) == 1 else None


def specified(value: str, known: Mapping[str, str]) -> str | None:
    """``value`` with its systemd specifiers replaced, read left to right as systemd does
    (``%%`` is one ``%``, so ``%%h`` is a literal ``%h``); None for one not in ``known``."""
    table = {"%": "%", **known}
    try:
        return re.sub(r"%(.?)", lambda m: table[m.group(1)], value)
    except KeyError:  # a specifier not worth guessing
        return None


def default_exec_start() -> str:
    """The ``recalld`` next to the running interpreter, else ``python -m`` the daemon."""
    script = Path(sys.executable).parent / "recalld"
    if script.is_file() and os.access(script, os.X_OK):
        return _quote(_literal(str(script)))
    return f"{_quote(_literal(sys.executable))} -m recalld.daemon.main"


def render_units(exec_start: str | None = None, socket_path: Path | None = None,
                 environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """File name -> unit text; ``socket_path`` None means the default under ``%t``;
    ``environment``: variables the service gets (``Environment=``)."""
    exe = exec_start if exec_start is not None else default_exec_start()
    env = "".join(f"Environment={_quote(_literal(f'{k}={v}'))}\n"
                  for k, v in sorted((environment or {}).items()))
    if socket_path is None:
        serve_args, listen = "", DEFAULT_LISTEN
    else:
        serve_args = f" --socket {_quote(_literal(str(socket_path), argument=True))}"
        listen = _literal(str(socket_path))
        if listen.endswith(" "):
            # systemd strips a setting's value: it would listen on the path without the
            # blank, and the daemon, told the path with it, on a socket of its own.
            raise paths.PathError(f"{str(socket_path)!r} ends in white space, which "
                                  "systemd drops from ListenStream=; choose a socket path "
                                  "that does not")
    return {
        SERVICE_NAME: SERVICE_TEMPLATE.format(exec_start=exe, serve_args=serve_args,
                                              environment=env),
        SOCKET_NAME: SOCKET_TEMPLATE.format(listen=listen),
    }


def unit_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = paths.xdg_dir(env, "XDG_CONFIG_HOME") or str(paths.home_dir(env) / ".config")
    return Path(base) / "systemd" / "user"


def listen_path(socket_path: Path, environ: Mapping[str, str] | None = None, *,
                chosen: bool = True) -> Path | None:
    """None when ``socket_path`` is systemd's ``%t`` default: the one
    ``$XDG_RUNTIME_DIR`` names, or any socket the user did not choose (``chosen`` False:
    no ``--socket``, ``RECALLD_SOCKET`` or ``[daemon] socket_path``). A shell without
    ``XDG_RUNTIME_DIR`` falls back to ``/tmp/recalld-<uid>``; pinned in the units, the
    service would listen there while the clients of a login session, and those without
    the variable once the user manager has made ``/run/user/<uid>``, look under ``%t``."""
    if not chosen:
        return None
    env = os.environ if environ is None else environ
    runtime = paths.xdg_dir(env, "XDG_RUNTIME_DIR")
    if runtime and socket_path == Path(runtime) / "recalld" / "recalld.sock":
        return None
    return socket_path


def user_systemd_problem() -> str | None:
    """Why ``systemctl --user`` cannot be used here (None: it answers)."""
    if shutil.which("systemctl") is None:
        return "systemctl is not installed (no systemd on this machine)"
    try:
        proc = subprocess.run(["systemctl", "--user", "show-environment"], check=False,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl --user did not answer: {exc}"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no reason given"])[-1]
        return f"no user systemd answers ({why})"
    return None


def _no_systemd(problem: str, verb: str) -> ServiceError:
    return ServiceError(
        f"{problem}. Nothing was changed. Run `recalld {verb} --write-only` to "
        f"{'write' if verb == 'install-service' else 'remove'} the unit files only"
        + (", then in a session with a user systemd: " + "; ".join(ENABLE_COMMANDS)
           if verb == "install-service" else "")
        + "; or run the daemon without systemd: recalld serve")


def _systemctl(*args: str, check: bool = True) -> None:
    try:
        proc = subprocess.run(["systemctl", "--user", *args], check=False,
                              timeout=SYSTEMCTL_TIMEOUT_S, capture_output=True, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"systemctl --user {' '.join(args)} failed: {exc}") from None
    if check and proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ServiceError(f"systemctl --user {' '.join(args)} failed: {why}")


#: Variables that choose recalld's config file and data: a service started by systemd
#: does not see the installing shell's, so the units carry the ones set there.
SERVICE_ENV = ("RECALLD_CONFIG", "RECALLD_DATA_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME")


def install_service(*, write_only: bool, socket_path: Path | None = None,
                    environ: Mapping[str, str] | None = None) -> list[str]:
    """Write the units (atomically) and, unless ``write_only``, enable and start them.
    The service gets the :data:`SERVICE_ENV` variables set in ``environ`` (the running
    process's), so it reads the config file and data the CLI does.

    Without ``write_only`` a user systemd must answer first; otherwise nothing is written.
    PathError (nothing written) when ``RECALLD_DATA_DIR`` names one the daemon would
    refuse.
    """
    env = os.environ if environ is None else environ
    carried = {k: env[k] for k in SERVICE_ENV
               if (paths.xdg_dir(env, k) if k.startswith("XDG_") else env.get(k))}
    if carried.get("RECALLD_DATA_DIR"):
        # Read by the service as the daemon reads it: one it would refuse (a relative
        # path) is refused here (PathError), not in every start of the service.
        paths.choose_data_dir(env, None, Path())
    if not write_only:
        problem = user_systemd_problem()
        if problem is not None:
            raise _no_systemd(problem, "install-service")
    target = unit_dir(env)
    units = render_units(socket_path=socket_path, environment=carried)
    try:
        # 0700 when made here: units another user could drop in would run as this one.
        folders.make_dirs_private(target)
        with _all_or_nothing(target) as done:
            for name, text in units.items():
                write_unit(target / name, text)
                done.append(str(target / name))
    except OSError as exc:
        raise ServiceError(f"cannot write the unit files: {exc.filename}: "
                           f"{exc.strerror or exc}") from None
    if not write_only:
        _systemctl("daemon-reload")
        _systemctl("enable", "--now", SOCKET_NAME, SERVICE_NAME)
    return done


def _refuse_folders(target: Path) -> None:
    """IsADirectoryError when a folder is where a unit file goes in ``target``."""
    for name in UNIT_NAMES:
        if (target / name).is_dir():
            raise IsADirectoryError(errno.EISDIR, "a folder is in the place of the unit "
                                    "file: move it away", str(target / name))


@contextlib.contextmanager
def _all_or_nothing(target: Path) -> Iterator[list[str]]:
    """Change both unit files in ``target`` or neither: a folder in place of either is
    refused before anything changes, and a failure after one was written or removed puts
    the earlier ones back as they were. Yields the list the caller adds each changed
    file to."""
    _refuse_folders(target)
    before: dict[str, bytes | None] = {}
    for name in UNIT_NAMES:
        path = target / name
        try:
            before[name] = paths.read_regular_file(path)
        except FileNotFoundError:
            before[name] = None
    done: list[str] = []
    try:
        yield done
    except BaseException:
        for changed in reversed(done):
            old = before[Path(changed).name]
            with contextlib.suppress(OSError):
                if old is None:
                    os.unlink(changed)
                else:
                    write_unit(Path(changed), old)
        raise


def write_unit(path: Path, text: str | bytes) -> None:
    """Write ``path`` whole or not at all: a temp file of its own in the same folder,
    fsynced, renamed over it, the folder fsynced; the temp file removed on any failure."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text.encode("utf-8") if isinstance(text, str) else text)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def uninstall_service(*, write_only: bool,
                      environ: Mapping[str, str] | None = None) -> list[str]:
    """Stop and disable the units (unless ``write_only``), then remove their files from
    the folder :func:`install_service` writes them to for ``environ`` (the running
    process's): both or, on a failure, neither.

    Returns the unit files removed (empty: none were installed).
    """
    env = os.environ if environ is None else environ
    target = unit_dir(env)
    try:
        _refuse_folders(target)  # before systemd is told anything
        if not write_only:
            problem = user_systemd_problem()
            if problem is not None:
                raise _no_systemd(problem, "uninstall-service")
            _systemctl("disable", "--now", SERVICE_NAME, SOCKET_NAME, check=False)
        with _all_or_nothing(target) as removed:
            for name in UNIT_NAMES:
                path = target / name
                if path.exists() or path.is_symlink():
                    path.unlink()
                    removed.append(str(path))
    except OSError as exc:
        raise ServiceError(f"cannot remove the unit files: {exc.filename}: "
                           f"{exc.strerror or exc}") from None
    for name in UNIT_NAMES:
        # The links an earlier enable made (disable removes them; --write-only does not
        # run it): left, they would point at nothing.
        for wants in target.glob("*.wants"):
            link = wants / name
            if link.is_symlink() and not link.exists():
                with contextlib.suppress(OSError):
                    link.unlink()
    if not write_only:
        _systemctl("daemon-reload", check=False)
    return removed
