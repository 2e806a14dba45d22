"""Where recalld keeps its socket, configuration and data, per the XDG base directories.

Shared by the daemon and the clients so both agree without talking: a client finds the
socket the way the daemon chose it, reading the same configuration file
(``[daemon] socket_path``) with the same precedence. Nothing here creates a directory;
the daemon does that with the right modes (:mod:`recalld.ipc.folders`).

Precedence (first that is set):

- config file: ``--config``, ``RECALLD_CONFIG``, ``$XDG_CONFIG_HOME/recalld/config.toml``;
- socket: ``--socket``, ``RECALLD_SOCKET``, ``[daemon] socket_path``,
  ``$XDG_RUNTIME_DIR/recalld/recalld.sock``, ``/run/user/<uid>/recalld/recalld.sock`` when
  that runtime directory exists (``XDG_RUNTIME_DIR`` unset, as under cron or ``sudo -u``,
  while a systemd user service listens there), ``/tmp/recalld-<uid>/recalld.sock``;
- data: ``RECALLD_DATA_DIR``, ``[daemon] data_dir``, ``$XDG_DATA_HOME/recalld``.

``~`` is expanded everywhere. A relative path given on the command line is taken from the
current directory; one from the environment or the file is refused (:class:`PathError`),
since the daemon and its clients need not share a working directory. A relative
``XDG_*`` variable is ignored, as the XDG specification says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import socket
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from recalld.ipc import errors
from recalld.ipc.protocol import MAX_REQUEST_BYTES_RANGE
from recalld.ipc.regular_files import NotRegularFile as NotRegularFile
from recalld.ipc.regular_files import blocked_on_way, broken_link, not_a_folder, not_utf8
from recalld.ipc.regular_files import read_regular_file as read_regular_file

#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107

#: Where systemd-logind makes each user's runtime directory, ``XDG_RUNTIME_DIR`` of a login.
SYSTEMD_RUNTIME_ROOT = Path("/run/user")


#: What the command line calls the socket it is given, and what the client library calls it.
CLI_SOCKET, ARG_SOCKET = "--socket", "socket_path"


class PathError(ValueError):
    """A configured path is unusable or the config file unreadable; the message says where."""


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def xdg_dir(env: Mapping[str, str], name: str) -> str | None:
    """The XDG base directory variable ``name`` when it is set to an absolute path; a
    relative one is ignored as if unset, as the XDG base directory specification says
    (it would be taken from each process's own working directory)."""
    value = env.get(name)
    return value if value and os.path.isabs(value) else None


def home_dir(env: Mapping[str, str]) -> Path:
    """``HOME`` when absolute, else (unset, empty or relative: taken from each process's
    own working folder) the home the password database names; PathError if none."""
    home = env.get("HOME")
    if home and os.path.isabs(home):
        return Path(home)
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        raise PathError(f"HOME = {_shown(home)}: not an absolute path, and uid "
                        f"{os.getuid()} has no home in the password database; set HOME "
                        "to your home folder") from None


def expand_home(value: str | os.PathLike[str], where: str,
                environ: Mapping[str, str] | None = None) -> Path:
    """``value`` with a leading ``~`` or ``~name`` expanded, the one rule for every path
    recalld is given: ``~`` is :func:`home_dir` (an empty or relative ``HOME`` is not
    taken, so ``~/x`` never becomes ``/x`` or a folder of the working directory);
    PathError naming ``where`` when there is no home to expand to."""
    text = os.fspath(value)
    try:
        if text == "~" or text.startswith("~/"):
            return Path(str(home_dir(_env(environ))) + text[1:])
        return Path(text).expanduser()
    except RuntimeError:  # ``~name`` of no user
        raise PathError(f"{where} = {_shown(text)}: {text.split('/')[0]} names no "
                        "user's home directory") from None


def expand_param(value: str, name: str) -> Path:
    """:func:`expand_home` for a path a client sent as param ``name`` (the daemon's home
    is the one ``~`` names): InvalidParams where that has no home."""
    try:
        return expand_home(value, f"param {name!r}")
    except PathError as exc:
        raise errors.InvalidParams(str(exc)) from None


def checked_path(value: object, where: str, *, from_cli: bool = False,
                 environ: Mapping[str, str] | None = None) -> Path:
    """``value`` as an absolute path with ``~`` expanded, or PathError naming ``where``."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise PathError(f"{where} = {_shown(value)}: must be a non-empty path string")
    path = expand_home(value, where, environ)
    if not path.is_absolute():
        if not from_cli:
            raise PathError(f"{where} = {_shown(value)}: must be an absolute path "
                            "(or start with ~)")
        path = from_here(path, where, value)
    return utf8_path(path, where)


def from_here(path: Path, where: str, value: object) -> Path:
    """``path`` made absolute from the current directory, or PathError naming ``where``
    and ``value`` when that directory no longer exists (a shell left in a folder since
    removed): ``getcwd`` fails there, with a bare "No such file or directory"."""
    try:
        return path.absolute()
    except FileNotFoundError:
        raise PathError(f"{where} = {_shown(value)}: a relative path, but the current "
                        "directory no longer exists; give an absolute path, or cd to "
                        "a folder that exists") from None


def utf8_path(path: Path, where: str) -> Path:
    """``path``, or PathError when its name is not valid UTF-8 (bytes of another
    encoding, as an environment variable may hold): recalld shows and sends paths as
    text, and a daemon serving there could not say where it serves."""
    try:
        os.fsdecode(path).encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(path)
        shown = raw.decode("utf-8", "backslashreplace")
        if raw.decode("utf-8", "replace") == shown:  # valid UTF-8 the locale cannot read
            raise PathError(f"{where} = {shown}: this process reads file names as "
                            f"{sys.getfilesystemencoding()} (a C or POSIX locale with "
                            "Python's UTF-8 mode off), not UTF-8; run it with "
                            "PYTHONUTF8=1 or LC_ALL=C.UTF-8") from None
        raise PathError(f"{where} = {shown}: is not valid UTF-8; choose another path (or "
                        "rename the folder, e.g. convmv -f latin1 -t utf8)") from None
    return path


def _shown(value: object) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def _socket_checked(path: Path, where: str, named: str) -> Path:
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        own = named if named.startswith("-") else f"the {named} argument"
        raise PathError(f"{where} = {_shown(str(path))}: {size} bytes, longer than the "
                        f"{MAX_SOCKET_PATH_BYTES} bytes a Unix socket path may have; name "
                        f"a shorter one with {own}, RECALLD_SOCKET or [daemon] socket_path")
    return path


def config_path(explicit: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Path:
    """``--config``, else ``RECALLD_CONFIG``, else ``$XDG_CONFIG_HOME/recalld/config.toml``."""
    env = _env(environ)
    if explicit is not None:  # an empty one is refused, not taken as unset
        return checked_path(explicit, "--config", from_cli=True, environ=env)
    if env.get("RECALLD_CONFIG"):
        return checked_path(env["RECALLD_CONFIG"], "RECALLD_CONFIG", environ=env)
    base = xdg_dir(env, "XDG_CONFIG_HOME") or str(home_dir(env) / ".config")
    return utf8_path(Path(base).expanduser() / "recalld" / "config.toml",
                     "$XDG_CONFIG_HOME/recalld/config.toml" if xdg_dir(env, "XDG_CONFIG_HOME")
                     else "~/.config/recalld/config.toml")


def read_config(path: Path, *, required: bool = False) -> dict[str, object]:
    """The parsed TOML file at ``path``; ``{}`` when it does not exist and is not required.
    A FIFO, device or folder there is refused (:func:`read_regular_file`), not waited on."""
    try:
        data = read_regular_file(path)
    except OSError as exc:  # a link leading nowhere is not "no file": no silent defaults
        blocked = None if isinstance(exc, NotRegularFile) else blocked_on_way(path)
        if blocked is not None:
            why = broken_link(path) or f"{path}: {not_a_folder(blocked)}"
            raise PathError(f"{why}; mend it, or remove it for the defaults") from None
        if not isinstance(exc, FileNotFoundError):
            raise PathError(f"{path}: {exc}") from None
        if required:
            raise PathError(f"{path}: no such file") from None
        return {}
    try:
        # utf-8-sig: a byte order mark some editors put first is not TOML's business.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PathError(f"{path}: {not_utf8(data, exc)}") from None
    import tomllib  # here: most client calls find no file and need no TOML parser

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PathError(f"{path}: {exc}") from None


def daemon_table(path: Path, table: Mapping[str, object]) -> Mapping[str, object]:
    """The ``[daemon]`` table of a parsed config file (``{}`` when absent)."""
    daemon = table.get("daemon", {})
    if not isinstance(daemon, Mapping):
        raise PathError(f"{path}: daemon must be a table ([daemon]), not {daemon!r}")
    return daemon


def choose_socket(explicit: str | os.PathLike[str] | None, env: Mapping[str, str],
                  configured: object, config_file: Path, *, named: str = CLI_SOCKET) -> Path:
    """The socket by the precedence above; ``configured`` is ``[daemon] socket_path``.
    ``named`` is what the caller calls ``explicit`` (:data:`CLI_SOCKET` on the command
    line, :data:`ARG_SOCKET` in the client library): errors name what the user set."""
    if explicit is not None:  # an empty one is refused, not taken as unset
        path = checked_path(explicit, named, from_cli=True, environ=env)
        return _socket_checked(path, named, named)
    if env.get("RECALLD_SOCKET"):
        path = checked_path(env["RECALLD_SOCKET"], "RECALLD_SOCKET", environ=env)
        return _socket_checked(path, "RECALLD_SOCKET", named)
    if configured is not None:
        where = f"{config_file}: [daemon] socket_path"
        return _socket_checked(checked_path(configured, where, environ=env), where, named)
    runtime = xdg_dir(env, "XDG_RUNTIME_DIR")
    if runtime:
        where = "$XDG_RUNTIME_DIR/recalld/recalld.sock"
        return _socket_checked(utf8_path(Path(runtime) / "recalld" / "recalld.sock", where),
                               where, named)
    login_runtime = SYSTEMD_RUNTIME_ROOT / str(os.getuid())
    if _own_private_dir(login_runtime):
        return login_runtime / "recalld" / "recalld.sock"
    return Path(f"/tmp/recalld-{os.getuid()}") / "recalld.sock"  # noqa: S108 - private 0700 dir


def _own_private_dir(path: Path) -> bool:
    """Whether ``path`` is a real directory of this user that no one else may write in:
    the runtime directory logind made, which a session without ``XDG_RUNTIME_DIR`` still
    shares with the user's systemd services."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def choose_data_dir(env: Mapping[str, str], configured: object, config_file: Path) -> Path:
    """The data directory by the precedence above; ``configured`` is ``[daemon] data_dir``."""
    if env.get("RECALLD_DATA_DIR"):
        return checked_path(env["RECALLD_DATA_DIR"], "RECALLD_DATA_DIR", environ=env)
    if configured is not None:
        return checked_path(configured, f"{config_file}: [daemon] data_dir", environ=env)
    base = xdg_dir(env, "XDG_DATA_HOME") or str(home_dir(env) / ".local" / "share")
    return utf8_path(Path(base).expanduser() / "recalld",
                     "$XDG_DATA_HOME/recalld" if xdg_dir(env, "XDG_DATA_HOME")
                     else "~/.local/share/recalld")


def _configured(key: str, config: str | os.PathLike[str] | None,
                env: Mapping[str, str]) -> tuple[object, Path]:
    path = config_path(config, env)
    required = bool(config) or bool(env.get("RECALLD_CONFIG"))
    return daemon_table(path, read_config(path, required=required)).get(key), path


def socket_path(explicit: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None,
                *, config: str | os.PathLike[str] | None = None,
                lenient: bool = False, running: bool = True,
                named: str = CLI_SOCKET) -> Path:
    """The daemon's socket, found as the daemon finds it (the config file is read only
    when neither ``explicit`` nor ``RECALLD_SOCKET`` decides); ``running`` (not for
    where a daemon is to listen): or where the daemon that runs on the data directory
    serves, when it is not there (:func:`_socket_from_file`). ``lenient`` (the client
    library): a config file that cannot be read or parsed, or whose ``socket_path`` is
    unusable, is passed by with a warning and the default socket taken, so a typo in the
    file does not cut every agent off a daemon that still runs on the settings it read;
    the command line reports it instead (PathError). ``named``: as for :func:`choose_socket`."""
    if not lenient:
        return _socket_from_file(explicit, _env(environ), config, running=running,
                                 named=named)
    found, refused = socket_despite_file(explicit, environ, config=config, named=named)
    if refused is not None:
        logging.getLogger("recalld.ipc").warning(
            "recalld: configuration error: %s; looking for the daemon at %s", refused, found)
    return found


def _socket_from_file(explicit: str | os.PathLike[str] | None, env: Mapping[str, str],
                      config: str | os.PathLike[str] | None, *, running: bool = True,
                      named: str = CLI_SOCKET) -> Path:
    """The socket by the precedence above. ``running``: where no daemon answers at the
    socket the file names (or the default one), the socket the daemon of the data
    directory recorded, if one answers there: a daemon keeps the socket it started on
    until it is restarted, so a ``socket_path`` changed in the file since (reloaded or
    not) must not hide it."""
    if explicit is not None or env.get("RECALLD_SOCKET"):
        return choose_socket(explicit, env, None, Path(), named=named)
    configured, cfg = _configured("socket_path", config, env)
    found = choose_socket(None, env, configured, cfg, named=named)
    if running and not _socket_file(found):  # a daemon there (or a stale socket) wins
        recorded = _recorded_socket(env, cfg)
        if recorded is not None and recorded != found and answers(recorded):
            return recorded
    return found


def _socket_file(path: Path) -> bool:
    """Whether a socket file is at ``path`` (looked at, not connected to: that would be
    a connection more for the daemon)."""
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def socket_chosen(explicit: str | os.PathLike[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user chose the socket (``--socket``, ``RECALLD_SOCKET``, ``[daemon]
    socket_path``) rather than left it to the default of the session's folders."""
    env = _env(environ)
    if explicit is not None or env.get("RECALLD_SOCKET"):
        return True
    return _configured("socket_path", None, env)[0] is not None


def socket_despite_file(explicit: str | os.PathLike[str] | None = None,
                        environ: Mapping[str, str] | None = None,
                        *, config: str | os.PathLike[str] | None = None,
                        named: str = CLI_SOCKET) -> tuple[Path, PathError | None]:
    """The socket as :func:`socket_path` finds it, and None; when the config file cannot
    be read or parsed, or names a socket no daemon could use: the first of these places
    where a daemon answers, and why the file is refused: the socket its own
    ``socket_path`` line still names (:func:`_salvaged`), the one the daemon of the data
    directory recorded there (:func:`_recorded_socket`), the default one. When none
    answers, the first of them. A daemon that runs keeps the configuration it read, so
    a typo in the file, or a file gone or unreadable, must not hide it. ``--socket``
    and ``RECALLD_SOCKET`` are not the file's: one of them that is unusable raises
    PathError."""
    env = _env(environ)
    if explicit is not None or env.get("RECALLD_SOCKET"):
        return choose_socket(explicit, env, None, Path(), named=named), None
    try:
        return _socket_from_file(None, env, config, named=named), None
    except PathError as exc:
        refused = exc
    places: list[Path] = []
    try:
        cfg = config_path(config, env)
    except PathError:
        cfg = Path()
    with contextlib.suppress(PathError):  # the line is as unusable as the file
        line = _salvaged(cfg, "socket_path")
        if line is not None:
            places.append(choose_socket(None, env, line, cfg, named=named))
    recorded = _recorded_socket(env, cfg)
    if recorded is not None:
        places.append(recorded)
    places.append(choose_socket(None, env, None, Path(), named=named))
    return next((p for p in places if answers(p)), places[0]), refused


def _recorded_socket(env: Mapping[str, str], cfg: Path) -> Path | None:
    """The socket the daemon of the data directory (``RECALLD_DATA_DIR``, the config
    file's own ``data_dir`` line, the default) said it serves on, in its lock file's
    ``socket=`` line (the daemon's ``lock.SOCKET_NOTE``); None when there is none.
    A daemon killed leaves it behind: only a daemon answering there counts."""
    try:
        folder = choose_data_dir(env, _salvaged(cfg, "data_dir"), cfg)
    except PathError:
        try:
            folder = choose_data_dir(env, None, cfg)
        except PathError:
            return None
    try:
        text = read_regular_file(folder / "state" / "daemon.lock").decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines()[1:]:
        if line.startswith("socket="):
            try:
                value = json.loads(line.removeprefix("socket="))
            except ValueError:
                return None
            if isinstance(value, str) and os.path.isabs(value):
                return Path(value)
    return None


def answers(path: Path) -> bool:
    """Whether something listens on the socket at ``path`` (a connect that does not wait:
    a daemon whose backlog is full listens all the same)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK
                       | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(os.fsencode(path))
        except BlockingIOError:
            return True
        except OSError:
            return False
    return True


def _setting_line(key: str) -> re.Pattern[str]:
    """A line that sets ``[daemon] key`` inside the table (``key = ...``) or before any
    table (``daemon.key = ...``)."""
    return re.compile(rf"\s*(?:daemon\s*\.\s*)?{re.escape(key)}\s*=")


#: A table's header line (``[daemon]``).
_TABLE_LINE = re.compile(r"\s*\[\s*([^\[\]]*?)\s*\](?:\s*#.*)?\s*")


def _salvaged(path: Path, key: str) -> object | None:
    """The ``[daemon] key`` value of a config file that does not parse as a whole, read
    from its own line (None: none can be read). TOML's errors are local: a typo in
    another line leaves this one meaning what it meant when the daemon read it."""
    import tomllib

    try:
        text = read_regular_file(path).decode("utf-8-sig", errors="replace")
    except OSError:
        return None
    setting = _setting_line(key)
    table = ""
    for line in text.splitlines():
        header = _TABLE_LINE.fullmatch(line)
        if header is not None:
            table = header[1].strip('"\' ')
            continue
        if table not in ("", "daemon") or not setting.match(line):
            continue
        try:
            parsed: Mapping[str, object] = tomllib.loads(line)
        except tomllib.TOMLDecodeError:
            continue
        if table == "":
            inner = parsed.get("daemon")
            parsed = inner if isinstance(inner, Mapping) else {}
        if key in parsed:
            return parsed[key]
    return None


def data_dir(environ: Mapping[str, str] | None = None,
             *, config: str | os.PathLike[str] | None = None) -> Path:
    """The daemon's data directory, found as the daemon finds it."""
    env = _env(environ)
    if env.get("RECALLD_DATA_DIR"):
        return choose_data_dir(env, None, Path())
    configured, cfg = _configured("data_dir", config, env)
    return choose_data_dir(env, configured, cfg)


def max_request_bytes(environ: Mapping[str, str] | None = None,
                      *, config: str | os.PathLike[str] | None = None) -> int | None:
    """``[daemon] max_request_bytes`` of the config file the daemon reads, or None when
    the file does not set it, or sets something the daemon would not start with (the
    client then keeps the daemon's default limit)."""
    env = _env(environ)
    try:
        value, _ = _configured("max_request_bytes", config, env)
    except PathError:
        return None
    low, high = MAX_REQUEST_BYTES_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def local_path(value: str, option: str) -> Path:
    """A path given on the command line (``option``): ``~`` expanded, a relative one
    taken from the current directory; an empty one, a ``~name`` of no user, or ``-`` (read
    as standard input or output elsewhere: a file named ``-`` surprises) is a usage error
    (InvalidParams) rather than a traceback, a silent default or a stray file."""
    if value == "-":
        raise errors.InvalidParams(f"{option} -: a path is meant here, not standard input "
                                   "or output; name it (./- for one named -)")
    try:
        return checked_path(value, option, from_cli=True)
    except PathError as exc:
        raise errors.InvalidParams(str(exc)) from None


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (or, neither there, one path)."""
    try:
        return a.samefile(b)
    except OSError:
        return a.resolve() == b.resolve()
