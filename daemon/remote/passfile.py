"""Why the password sources a shared workspace's configuration names give libpq no
password: libpq passes over such a source without a word (``db.connect`` adds these
texts to the server's "no password supplied"); and the passwords a configuration gives,
which no logged or reported error may show (:func:`secrets`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

import psycopg

from recalld.daemon import dsn
from recalld.daemon.config import RemoteConfig
from recalld.ipc import paths


def unusable_password_sources(cfg: RemoteConfig, environ: Mapping[str, str]) -> list[str]:
    """Why the password sources of ``cfg`` give libpq no password, one text each (none
    when they are usable or unset). libpq ignores a password file that is missing, not a
    regular file or open to the group or others (it must be 0600 or stricter), and an
    unset variable gives nothing. The ``passfile`` set (in the table or the DSN) is
    checked as libpq reads it (the table's with its ``~`` expanded, as ``db.connect``
    passes it; the DSN's as written, since libpq expands no ``~``); else, where nothing
    else gives a password, the one libpq looks for by itself (``PGPASSFILE``,
    ``~/.pgpass``) when it is there but skipped."""
    out: list[str] = []
    given = dsn.params(cfg.dsn)  # connect() parsed it first
    if cfg.passfile:  # handed to libpq with its ~ expanded (db.connect)
        out += _passfile_unusable(expanded(cfg.passfile, environ), must_exist=True)
    elif given.get("passfile"):  # read by libpq as written: a ~ in it is no home
        out += _passfile_unusable(given["passfile"], must_exist=True)
    elif not (given.get("password") or environ.get("PGPASSWORD")
              or (cfg.password_env and environ.get(cfg.password_env))):
        default = environ.get("PGPASSFILE") or expanded("~/.pgpass", environ)
        out += _passfile_unusable(default, must_exist=False)
    if cfg.password_env and not environ.get(cfg.password_env):
        out.append(f"password_env names {cfg.password_env}, which is not set in the "
                   "daemon's environment")
    return out


def expanded(passfile: str, environ: Mapping[str, str]) -> str:
    """The table's ``passfile`` as handed to libpq: its ``~`` expanded by recalld's rule
    for every path (an empty ``HOME`` is no home: libpq too then looks up the user's);
    a ``~name`` of no user is left as written."""
    try:
        return str(paths.expand_home(passfile, "passfile", environ))
    except paths.PathError:
        return passfile


def _passfile_unusable(path: str, *, must_exist: bool) -> list[str]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path.startswith("~"):  # meant as a home folder, which libpq does not read it as
            return [f"passfile {path} does not exist: libpq does not expand ~ in a DSN's "
                    "passfile or in PGPASSFILE (give the full path)"]
        return [f"passfile {path} does not exist"] if must_exist else []
    except OSError as exc:
        return [f"passfile {path} cannot be read: {exc.strerror}"]
    if not stat.S_ISREG(st.st_mode):
        return [f"passfile {path} is not a regular file"]
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return [f"passfile {path} is ignored by libpq: its mode "
                f"{stat.S_IMODE(st.st_mode):04o} lets the group or others read it "
                "(chmod 600 it)"]
    if not os.access(path, os.R_OK):
        return [f"passfile {path} cannot be read: permission denied"]
    return []


def secrets(cfg: RemoteConfig) -> list[str]:
    """Passwords that must never appear in a logged or reported error (a DSN that cannot
    be used never reaches an error: :class:`db.BadDsn`)."""
    out: list[str] = []
    try:
        password = dsn.params(cfg.dsn).get("password")
    except dsn.UnusableDsn:
        password = None
    if password:
        out.append(str(password))
    if cfg.password_env and os.environ.get(cfg.password_env):
        out.append(os.environ[cfg.password_env])
    return out


def refused_login(exc: psycopg.OperationalError) -> bool:
    """Whether a failed connection is the server refusing the password it was sent."""
    # libpq gives a failed connection no SQLSTATE, and the server's words may be in
    # any language: it did ask for a password, was sent one, and ended the attempt.
    conn = exc.pgconn
    return conn is not None and conn.used_password and not conn.needs_password
