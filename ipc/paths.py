"""Where recalld keeps its socket, configuration and data, per the XDG base directories.

Shared by the daemon and the clients so both agree without talking. Nothing here
creates a directory; the daemon does that with the right modes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def socket_path(explicit: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Path:
    """``--socket``, else ``RECALLD_SOCKET``, else ``$XDG_RUNTIME_DIR/recalld/recalld.sock``,
    else ``/tmp/recalld-<uid>/recalld.sock``."""
    env = _env(environ)
    if explicit:
        return Path(explicit)
    if env.get("RECALLD_SOCKET"):
        return Path(env["RECALLD_SOCKET"])
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "recalld" / "recalld.sock"
    return Path(f"/tmp/recalld-{os.getuid()}") / "recalld.sock"  # noqa: S108 - private 0700 dir


def config_path(explicit: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Path:
    """``--config``, else ``RECALLD_CONFIG``, else ``$XDG_CONFIG_HOME/recalld/config.toml``."""
    env = _env(environ)
    if explicit:
        return Path(explicit)
    if env.get("RECALLD_CONFIG"):
        return Path(env["RECALLD_CONFIG"])
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "recalld" / "config.toml"


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``RECALLD_DATA_DIR``, else ``$XDG_DATA_HOME/recalld`` (``~/.local/share/recalld``)."""
    env = _env(environ)
    if env.get("RECALLD_DATA_DIR"):
        return Path(env["RECALLD_DATA_DIR"])
    base = env.get("XDG_DATA_HOME") or str(
        Path(env.get("HOME", "~")).expanduser() / ".local" / "share"
    )
    return Path(base) / "recalld"
