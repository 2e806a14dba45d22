"""What a configuration the daemon accepts yet should not hold, with the fix.

The daemon still starts on such a file (an older one that worked keeps working), but
``serve --check-config`` prints each warning (``recalld: warning: ...``, exit 0),
``recalld doctor`` shows them as a WARN of the config file, a start and a reload log
them and status shows them (``queues.config.warnings``, a problem of ``recalld status``):

* a ``[workspaces.X]`` table whose id looks like a credential (a key pasted as the
  table's name), which ``workspace.open`` refuses for a new workspace: the id names the
  workspace's folder and shows in every log line and status. The id is never shown.
* a ``shared_with`` entry that looks like a credential and is no table's id: no agent
  can open a workspace by it (``workspace.open`` refuses it in ``config.shared_with``).
* a ``[workspaces.X] qwenpaw_agent_json`` without a ``path``: the workspace is not the
  folder holding the agent.json but ``<data>/workspaces/X``, which is kept (a workspace
  configured so has its memory there) and said, with the ``path`` that serves the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypedDict

from recalld.daemon.config import ConfigError, DaemonConfig, WorkspaceSettings
from recalld.daemon.config_layout import LAYOUT_DIRS
from recalld.ipc.agent_ids import workspace_table


class ConfigWarning(TypedDict):
    what: str
    fix: str


#: The redaction rules take no id under 16 characters for a credential: an id shorter
#: than this is not looked at, so a start whose ids are all short (most) does not import
#: them (some 28 ms).
_SHORTEST_KEY = 12


def _looks_like_a_key(agent_id: str) -> bool:
    if len(agent_id) < _SHORTEST_KEY:
        return False
    from recalld.daemon.memory.redact import masked_in

    return masked_in(agent_id)


def config_warnings(cfg: DaemonConfig) -> list[ConfigWarning]:
    """Each warning: what (naming the table) and the fix."""
    out: list[ConfigWarning] = []
    for agent_id in sorted(cfg.workspaces.keys() | cfg.workspace_paths.keys()):
        if _looks_like_a_key(agent_id):
            from recalld.daemon.memory.redact import redact

            out.append({
                "what": f"{cfg.config_path}: {workspace_table(redact(agent_id))}: the agent "
                        "id looks like a credential (workspace.open refuses such an id; it "
                        "names the workspace's folder and shows in the log and status)",
                "fix": "rename the table to another agent id, with path set to the "
                       "workspace's folder to keep its memory"})
    for agent_id in sorted(cfg.workspaces.keys()):
        readers = cfg.workspaces[agent_id].shared_with
        if any(_looks_like_a_key(r) and r not in cfg.workspaces for r in readers):
            # One that names a table is warned of as the table's own id.
            out.append({
                "what": f"{cfg.config_path}: {workspace_table(agent_id)} shared_with names "
                        "an agent by what looks like a credential (no agent can open a "
                        "workspace by it; it shows in workspace.list)",
                "fix": "take it out of shared_with, or name the agent's id there"})
    for agent_id, folder in sorted(cfg.qwenpaw_folders.items()):
        served = cfg.workspace_path(agent_id)
        if folder == served or _looks_like_a_key(agent_id):
            continue
        out.append({
            "what": f"{cfg.config_path}: {workspace_table(agent_id)} qwenpaw_agent_json has "
                    f"no path: the workspace is {served}, not {folder} where the agent.json is",
            "fix": f'set path = "{folder}" to serve that folder\'s notes, or path = '
                   f'"{served}" to keep this one'})
    return out


def changed_folders(base: WorkspaceSettings, settings: WorkspaceSettings) -> dict[str, str]:
    """The folder settings of ``settings`` that ``base`` does not have, by name."""
    return {name: getattr(settings, name) for name in LAYOUT_DIRS
            if getattr(settings, name) != getattr(base, name)}


def secret_named(folders: Mapping[str, str]) -> str | None:
    """The first name of ``folders`` (a setting's or a param's, to a folder, relative or
    absolute) whose folder is named by what looks like a credential: a folder of the
    workspace so named would show it in clear in its settings, status, the watcher's roots
    and the log. None when none is (the rules are loaded only if there are folders)."""
    if not folders:
        return None
    from recalld.daemon.memory.secret_names import named_by_secret

    return next((name for name, folder in folders.items() if named_by_secret(folder)), None)


def checked_reload(load: Callable[[], DaemonConfig], old: DaemonConfig) -> DaemonConfig:
    """The configuration ``load`` reads, refused (ConfigError naming the table and the
    setting, never the value) if it gives a workspace a ``path`` or a folder setting
    named by what looks like a credential that ``old``, the running one, does not."""
    new = load()

    def refuse(table: str, setting: str | None) -> None:
        if setting is not None:
            raise ConfigError(
                f"{new.config_path}: {table} {setting}: the folder's name looks like a "
                "credential (it would show in status and the log); use another folder")

    # The defaults serve the workspaces opened without a table of their own too.
    refuse("[workspace_defaults]", secret_named(changed_folders(
        old.workspace_defaults, new.workspace_defaults)))
    for agent_id in sorted(new.workspaces.keys() | new.workspace_paths.keys()):
        folders = changed_folders(old.workspace_settings(agent_id),
                                  new.workspace_settings(agent_id))
        path = new.workspace_paths.get(agent_id)
        if path is not None and path != old.workspace_paths.get(agent_id):
            folders["path"] = str(path)
        if (named := secret_named(folders)) is not None:
            from recalld.daemon.memory.redact import redact

            refuse(workspace_table(redact(agent_id)), named)
    return new
