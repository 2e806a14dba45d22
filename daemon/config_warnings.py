"""What a configuration the daemon accepts yet should not hold, with the fix.

The daemon still starts on such a file (an older one that worked keeps working), but
``serve --check-config`` prints each warning (``recalld: warning: ...``, exit 0),
``recalld doctor`` shows them as a WARN of the config file, a start and a reload log
them and status shows them (``queues.config.warnings``, a problem of ``recalld status``):

* a ``[workspaces.X]`` table whose id looks like a credential (a key pasted as the
  table's name), which ``workspace.open`` refuses for a new workspace: the id names the
  workspace's folder and shows in every log line and status. The id is never shown.
* a ``[workspaces.X] qwenpaw_agent_json`` without a ``path``: the workspace is not the
  folder holding the agent.json but ``<data>/workspaces/X``, which is kept (a workspace
  configured so has its memory there) and said, with the ``path`` that serves the other.
"""

from __future__ import annotations

from typing import TypedDict

from recalld.daemon.config import DaemonConfig
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
