"""Where the registry's workspaces lie and with which settings: the places of open,
configured and recorded workspaces, and the checks an open or a restore makes of a new
one's place against them. :class:`KnownPlaces` is the part of
:class:`~recalld.daemon.registry.WorkspaceRegistry` that answers those questions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import trio

from recalld.daemon.config import DaemonConfig, WorkspaceSettings, workspace_settings_from_params
from recalld.daemon.config_rules import valid_agent_id
from recalld.daemon.recordbook import RecordBook
from recalld.daemon.refusals import ReplicaTaken
from recalld.daemon.reload_sharing import Opened
from recalld.daemon.sharedplace import shared_twice
from recalld.daemon.workspace_places import (
    Place,
    check_daemon_folders,
    check_overlap,
    check_root,
    resolved,
)
from recalld.daemon.workspaces import Workspace
from recalld.ipc.errors import InvalidParams


class KnownPlaces:
    """The places and settings of the workspaces a registry knows (open, opening,
    failed, configured or recorded)."""

    _get_config: Callable[[], DaemonConfig]
    _records: RecordBook
    _workspaces: dict[str, Workspace]
    _opened: dict[str, Opened]
    #: By agent: the folder it served before the configuration moved it (:meth:`moved`).
    _left_behind: dict[str, str]

    def left_behind(self, agent_id: str) -> str | None:
        """The folder ``agent_id``'s workspace served before the configuration put it
        where it is open now, whose files it no longer serves (None: none)."""
        return self._left_behind.get(agent_id)

    async def moved(self, agent_id: str, root: Path) -> None:
        """Before ``agent_id``'s workspace is recorded at ``root``: if the configuration
        put it there while it was recorded at another folder that still holds files, say
        so (a WARNING, and :meth:`left_behind` for status): a path changed in the file by
        mistake would otherwise show as a memory emptied without a word."""
        record = self._records.entries.get(agent_id)
        self._left_behind.pop(agent_id, None)
        if (record is None or record["path"] == str(root)
                or agent_id not in self._get_config().configured_agents()):
            return
        before = record["path"]
        if not await trio.to_thread.run_sync(_holds_files, before):
            return  # moved along with its folder, or never wrote a file there
        self._left_behind[agent_id] = before
        logging.getLogger("recalld.daemon.workspaces").warning(
            "workspace %s opens at %s, where the configuration now puts it, and no longer "
            "serves %s, where it was before and whose files stay there; if the path was "
            "changed by mistake, put it back in the config file, then: recalld workspace "
            "close %s, and reload", agent_id, root, before, agent_id)

    async def moved_by(self, config: DaemonConfig) -> set[str]:
        """The open workspaces ``config`` puts in another folder than they opened in:
        one it names at another path than the configuration named when it opened, or
        one no configuration named then (opened at a path of its own) that ``config``
        names at another folder than its own (resolved, as an open resolves it). Each
        keeps its folder until it is opened again, then moves there."""
        moved = set()
        for ws in list(self._workspaces.values()):
            if (ws.state not in ("opening", "ready")
                    or ws.agent_id not in config.configured_agents()):
                continue
            place = config.workspace_path(ws.agent_id)
            opened = self._opened.get(ws.agent_id)
            if opened is not None and opened.place is not None:
                if place != opened.place:
                    moved.add(ws.agent_id)
                continue
            try:
                folder: Path | None = await trio.to_thread.run_sync(resolved, place)
            except InvalidParams:
                folder = None  # refused there: still not where it is
            if folder != ws.root:
                moved.add(ws.agent_id)
        return moved

    def settings_of(self, agent_id: str) -> WorkspaceSettings | None:
        """The settings of ``agent_id``'s workspace: its own while the registry has it
        (open, opening, failed), else those it would open with if it is configured or
        recorded; None for an agent with no workspace here."""
        ws = self._workspaces.get(agent_id)
        if ws is not None:
            return ws.settings
        config = self._get_config()
        record = self._records.entries.get(agent_id)
        if record is None and agent_id not in config.configured_agents():
            return None
        try:
            return workspace_settings_from_params(config.workspace_settings(agent_id),
                                                  record["config"] if record else None)
        except InvalidParams:
            return None  # recorded settings the file no longer takes: it cannot open

    def home(self, agent_id: str) -> Path:
        """Where ``agent_id``'s workspace opens when no path is given: where it is open;
        else at its configured place if the configuration names it, else where it is
        recorded; else at the default place (a start opens them there too)."""
        current = self._workspaces.get(agent_id)
        if current is not None and current.state in ("opening", "ready"):
            return current.root
        config = self._get_config()
        record = self._records.entries.get(agent_id)
        if record is not None and agent_id not in config.configured_agents():
            return Path(record["path"])
        return config.workspace_path(agent_id)

    def _places(self) -> dict[str, Path]:
        """Each configured or recorded workspace's folder: a configured one's where the
        configuration puts it, another where it is recorded."""
        config = self._get_config()
        places = {a: Path(rec["path"]) for a, rec in self._records.entries.items()}
        places.update((a, config.workspace_path(a)) for a in config.configured_agents())
        return places

    def places_inside(self, agent_id: str, root: Path) -> list[str]:
        """The folders, relative to ``root`` (absolute, resolved), of the other agents'
        workspaces (open, configured or recorded) that lie inside it: shared both ways
        (:func:`check_overlap`), theirs all the same, which a restore of ``agent_id``'s
        leaves alone."""
        places = self._places()
        places.update((w.agent_id, w.root) for w in self._workspaces.values())
        return sorted({place.relative_to(root).as_posix() for other, place in places.items()
                       if other != agent_id and place != root and place.is_relative_to(root)})

    async def check_place(self, agent_id: str, root: Path) -> None:
        """InvalidParams unless ``agent_id``'s workspace may lie at ``root`` (absolute,
        resolved), as :meth:`open` checks before it starts one: a restore checks the
        place of a workspace that is not open before writing anything there."""
        await trio.to_thread.run_sync(check_root, root)
        await self._check_default_place(agent_id, root)
        config = self._get_config()
        self._check_overlap(agent_id, root,
                            self.settings_of(agent_id) or config.workspace_settings(agent_id))
        await trio.to_thread.run_sync(check_daemon_folders, root, config)

    async def _check_default_place(self, agent_id: str, root: Path) -> None:
        """InvalidParams if ``root`` (absolute, resolved) is where another agent's
        workspace opens when it names no path (``<data>/workspaces/<other>``, that agent
        neither served, recorded nor configured: then :meth:`_check_overlap` says whose
        it is), unless ``agent_id``'s own is recorded or configured there: taken, it kept
        the other agent out, and what the other left there (closed with forget, its
        files stay) was served as the taker's."""
        other, config = root.name, self._get_config()
        record = self._records.entries.get(agent_id)
        if (other == agent_id or not valid_agent_id(other) or other in self._workspaces
                or other in self._records.entries or other in config.configured_agents()
                or (record is not None and record["path"] == str(root))
                or agent_id in config.workspace_paths):
            return
        place = config.workspace_path(other)
        if await trio.to_thread.run_sync(resolved, place) == root:
            raise InvalidParams(f"{root} is where the workspace of agent {other!r} opens "
                                "when it names no path; choose a folder of its own")

    def _check_overlap(self, agent_id: str, root: Path, settings: WorkspaceSettings) -> None:
        """:func:`check_overlap` against every other workspace, open or recorded to reopen
        (with the settings it has or would open with)."""
        others: dict[str, Place] = {
            a: (Path(rec["path"]), False) for a, rec in self._records.entries.items()}
        others.update((w.agent_id, (w.root, True)) for w in self._workspaces.values()
                      if w.state in ("opening", "ready"))
        check_overlap(agent_id, root, settings, others, self.settings_of)

    def _check_replicas(self, agent_id: str, settings: WorkspaceSettings) -> None:
        """InvalidParams if ``agent_id``'s ``remote`` names a shared workspace that an open
        or configured workspace replicates under the same host (:func:`shared_twice`, as
        the config file's workspaces are checked among themselves): the server holds a
        host's name for one session, so the two would take it from each other. Checked
        against the configured ones even before they open, so that at a start, where all
        open at once, a workspace opened by RPC is the one refused, never the config's."""
        config = self._get_config()
        others = {w.agent_id for w in self._workspaces.values()
                  if w.state in ("opening", "ready")} | set(config.configured_agents())
        for other in sorted(others - {agent_id}):
            theirs = self.settings_of(other)
            if theirs is not None and (twin := shared_twice(
                    {other: theirs.remote, agent_id: settings.remote})):
                raise ReplicaTaken(twin)

def _holds_files(folder: str) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except OSError:
        return False
