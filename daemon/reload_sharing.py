"""What a configuration reload changes in the open workspaces: who may read them at
once (:data:`SHARING`); their other settings and their path only when each is opened
again (:func:`reloaded` names those). No tasks, no I/O: the registry calls it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import NamedTuple

from recalld.daemon.config import DaemonConfig, WorkspaceSettings, workspace_settings_from_params
from recalld.daemon.jsontypes import JsonObject
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import InvalidParams

# Logged as the registry and its workspaces log.
log = logging.getLogger("recalld.daemon.workspaces")
#: The settings that say who may read a workspace: checked on every use, so a reload
#: changes them in open workspaces at once.
SHARING = ("shared_with", "memory_isolation")
#: Daemon settings a workspace's index and backfill take when it opens (open ones keep
#: theirs until they are opened again).
AT_OPEN = ("reconcile_interval_s", "persist_delay_s", "idle_trim_s", "chunk_max_chars",
           "backfill_backoff_s")
#: The ``config`` an agent's workspace is recorded with at a folder (None: none).
RecordedConfig = Callable[[str, Path], JsonObject | None]


def reloaded(workspaces: Iterable[Workspace], old: DaemonConfig, new: DaemonConfig,
             recorded_config: RecordedConfig, moved: Collection[str]) -> list[str]:
    """Give the open (and failed) ``workspaces`` the sharing ``new`` opens them with, at
    once (a revoked reader is refused from its next call on, not from the next open); return
    the ready ones whose other settings differ in ``new``, or that ``new`` puts in
    another folder (``moved``), which keep what they were opened with until they are
    opened again (not those ``new`` no longer names: :func:`unnamed`)."""
    changed = []
    gone = set(unnamed(workspaces, old, new))
    for ws in workspaces:
        if ws.state in ("opening", "ready", "failed"):
            # A failed one too: opening another one inside or around it is checked
            # against the sharing it has.
            share_as(ws, new, recorded_config)
        if ws.state == "ready" and ws.agent_id not in gone and (
                unshared(old.workspace_settings(ws.agent_id))
                != unshared(new.workspace_settings(ws.agent_id))
                or ws.agent_id in moved):
            changed.append(ws.agent_id)
    return changed


def unnamed(workspaces: Iterable[Workspace], old: DaemonConfig,
            new: DaemonConfig) -> list[str]:
    """The open ``workspaces`` that ``old`` names and ``new`` no longer does. Each stays
    open as it was opened; recorded at its folder, it opens there again (at the next
    start, or an open without a path), without the settings its table gave."""
    named = set(new.configured_agents())
    return [ws.agent_id for ws in workspaces if ws.state in ("opening", "ready")
            and ws.agent_id in old.configured_agents() and ws.agent_id not in named]


def share_as(ws: Workspace, config: DaemonConfig, recorded_config: RecordedConfig) -> None:
    """``ws`` shared as an open under ``config`` would share it."""
    try:
        would = workspace_settings_from_params(
            config.workspace_settings(ws.agent_id), recorded_config(ws.agent_id, ws.root))
    except InvalidParams:
        return  # its recorded settings no longer go with the file: kept as opened
    sharing = {name: getattr(would, name) for name in SHARING}
    if sharing != {name: getattr(ws.settings, name) for name in SHARING}:
        ws.settings = dataclasses.replace(ws.settings, **sharing)
        from recalld.daemon.memory.redact import redact

        # A key pasted into shared_with (warned of) is logged masked.
        log.info("workspace %s: shared_with = %s, memory_isolation = %s from now on",
                 ws.agent_id, [redact(r) for r in would.shared_with], would.memory_isolation)


def unshared(settings: WorkspaceSettings) -> WorkspaceSettings:
    """``settings`` but for who may read the workspace (:data:`SHARING`)."""
    return dataclasses.replace(settings, shared_with=(), memory_isolation=True)


class Opened(NamedTuple):
    """What an open workspace took when it opened."""

    #: Where the configuration put it (None: the configuration did not name it).
    place: Path | None
    #: The daemon settings it took (:data:`AT_OPEN`).
    daemon_settings: dict[str, object]


def opened(agent_id: str, config: DaemonConfig, in_force: DaemonConfig) -> Opened:
    """What workspace ``agent_id`` opened under ``config`` takes (``in_force``: the
    configuration when its services start, a reload having maybe run meanwhile)."""
    place = (config.workspace_path(agent_id) if agent_id in config.configured_agents()
             else None)
    return Opened(place, {name: getattr(in_force, name) for name in AT_OPEN})


def waiting(ws: Workspace, config: DaemonConfig, recorded_config: RecordedConfig,
            opened: Opened | None, moved: Collection[str]) -> list[str]:
    """The settings of the open ``ws`` that differ from those an open under ``config``
    would give it (``path``: ``config`` puts it in another folder, its agent in ``moved``; the
    daemon's :data:`AT_OPEN` ones: differ from those it took), which it keeps until it
    is opened again."""
    try:
        would = workspace_settings_from_params(
            config.workspace_settings(ws.agent_id), recorded_config(ws.agent_id, ws.root))
    except InvalidParams:
        return []  # its recorded settings no longer go with the file: it cannot reopen
    names = [f.name for f in dataclasses.fields(WorkspaceSettings)
             if f.name not in (*SHARING, "ignored_fields")
             and getattr(ws.settings, f.name) != getattr(would, f.name)]
    if opened is not None:
        names += [name for name, value in opened.daemon_settings.items()
                  if getattr(config, name) != value]
    if ws.agent_id in moved:
        names.append("path")
    return names
