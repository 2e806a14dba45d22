"""Where a restore puts the backed-up config file and the workspaces that are not open.

The backup's ``daemon/config.toml`` replaces this machine's only where that changes no
other agent's settings and moves no open workspace; a workspace that is not open is
restored where, and opened as, it will open from then on. Blocking helpers (the RPC
layer runs them in worker threads) of ``ops_methods.py``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

import orjson

from recalld.daemon import config as config_mod
from recalld.daemon import remembered
from recalld.daemon.backup_check import CheckedBackup, refuse
from recalld.daemon.config import DaemonConfig, WorkspaceSettings
from recalld.daemon.rpc.dispatch import DaemonState
from recalld.daemon.store.fsio import REAL, atomic_write, ensure_dir, temp_name
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import InvalidParams


def config_to_restore(state: DaemonState, checked: CheckedBackup,
                       chosen: list[str] | None) -> tuple[bytes | None, str | None]:
    """The backed-up config file if a restore puts it in place, and why not when it
    does not say so otherwise: where this daemon has none; else only if it kept its
    secrets (masked ones must not replace real ones) and the restore covers every
    workspace this daemon's file configures (the file is whole: another agent's settings
    must not go with it; ``chosen`` None: a rollback, which puts back what it replaced)."""
    data = checked.daemon_file("config.toml")
    if data is None or not state.config.config_path.exists():
        return data, None
    if not checked.meta.get("secrets"):
        return None, None
    if chosen is None:
        return data, None
    cfg = state.config
    others = sorted((set(cfg.workspaces) | set(cfg.workspace_paths)) - set(chosen))
    if others:
        return None, (f"kept this machine's config file: it also configures "
                      f"{', '.join(others)}, which this restore does not cover (copy what "
                      "the restored workspaces need from the backup's daemon/config.toml)")
    return data, None


def incoming_config(state: DaemonState, data: bytes) -> DaemonConfig:
    """The running configuration with the workspace settings (defaults, tables, paths) of
    config file ``data``: where the restored workspaces go and how they are opened. The
    daemon's own settings apply at the next reload or start. Raises ConfigError."""
    # A temp name: a kill before the unlink leaves it to the next start's tidying.
    probe = state.config.state_dir / temp_name("config-restore.toml")
    ensure_dir(REAL, probe.parent)
    try:
        atomic_write(REAL, probe, data)
        new = config_mod.load(config=probe)
    finally:
        probe.unlink(missing_ok=True)
    return dataclasses.replace(state.config, workspace_defaults=new.workspace_defaults,
                               workspaces=new.workspaces, workspace_paths=new.workspace_paths)


def drop_config(state: DaemonState) -> DaemonConfig:
    """Remove the config file (a rollback of the restore that added it); return the
    running configuration with the default workspace settings again."""
    cfg = incoming_config(state, b"")
    state.config.config_path.unlink(missing_ok=True)
    return cfg


def restore_config(state: DaemonState, data: bytes) -> None:
    target = state.config.config_path
    ensure_dir(REAL, target.parent)
    atomic_write(REAL, target, data)


def closed_home(cfg: DaemonConfig, agent_id: str, known: remembered.Remembered | None,
                 recorded: Mapping[str, object] | None,
                 ) -> tuple[Path, dict[str, object] | None]:
    """Where a workspace that is not open is restored to and opens, and the ``config``
    it opens with: a configured one at its configured place; one this daemon recorded at
    its recorded path; otherwise at the default place. Its config: the one this daemon
    recorded for it, else the one the backup recorded."""
    where = (Path(known["path"])
             if known is not None and agent_id not in cfg.configured_agents()
             else cfg.workspace_path(agent_id))
    config = known["config"] if known is not None else (recorded or {}).get("config")
    return where, dict(config) if isinstance(config, Mapping) else None


def closed_settings(cfg: DaemonConfig, path: Path, agent_id: str, ours: bool,
                    overrides: Mapping[str, object] | None) -> WorkspaceSettings:
    """The settings workspace ``agent_id``, not open, opens with after a restore of
    backup ``path``: ``overrides`` (:func:`closed_home`) over ``cfg``'s. Refused, the
    backup is (BackupInvalid) when they are the ones it recorded; InvalidParams when
    this daemon recorded them (``ours``)."""
    try:
        return config_mod.workspace_settings_from_params(cfg.workspace_settings(agent_id),
                                                         overrides)
    except InvalidParams as exc:  # its overrides: where they come from, and why
        if not ours:
            raise refuse(path, f"the settings it recorded for workspace {agent_id!r} are "
                               f"refused here ({exc.message})") from None
        raise InvalidParams(
            f"cannot restore workspace {agent_id!r}: the settings this daemon recorded for "
            f"it are refused here ({exc.message}); nothing was restored") from None


def moved_by(new: DaemonConfig, old: DaemonConfig,
              open_ws: Mapping[str, Workspace]) -> list[tuple[str, Path]]:
    """The open workspaces that config ``new``, not ``old``, opens at another folder at
    the next start (a configured one opens at its configured place), and where."""
    out = []
    for agent_id, ws in sorted(open_ws.items()):
        where = new.workspace_path(agent_id)
        # realpath: a loop of links is a place of its own, never RuntimeError (resolve)
        elsewhere = os.path.realpath(where) != os.path.realpath(ws.root)
        if agent_id in new.configured_agents() and elsewhere and (
                agent_id not in old.configured_agents() or where != old.workspace_path(agent_id)):
            out.append((agent_id, where))
    return out


def recorded_in(checked: CheckedBackup) -> dict[str, Mapping[str, object]]:
    """The backed-up workspace record (agent id -> {path, config, ...}), or empty; entries
    that are not objects are left out."""
    data = checked.daemon_file("workspaces.json")
    if data is None:
        return {}
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    entries = doc.get("workspaces") if isinstance(doc, dict) else None
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, dict)}
